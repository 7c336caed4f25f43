"""Compiled-extension fallbacks: ``import alt_cuda_corr`` served when the extension is missing or broken, RAFT's
correlation computed as its CUDA kernel does (checked against RAFT's ``CorrBlock`` and against the kernel written out
as loops), ``register_fallback`` for a user's own extensions, and the safe-math switch."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
import math
import sys
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_port.dropins.finder import Replacement, register, unregister
from npu_port.errors import FallbackError, NpuPortError
from npu_port.fallbacks import alt_cuda_corr as corr_impl
from npu_port.fallbacks.registry import (
    BUILTIN_FALLBACKS,
    OBJECTS_PACKAGE,
    install_builtin_fallbacks,
    register_fallback,
    registered_fallbacks,
    uninstall_builtin_fallbacks,
    unregister_fallback,
)
from npu_port.fallbacks.safe_math import force_safe_math

from ..fixtures import raft_corr
from ..memory_tracker import AllocationTracker

UNDEFINED_SYMBOL = (
    "/opt/raft/alt_cuda_corr.cpython-311-x86_64-linux-gnu.so: undefined symbol: "
    "_ZNK3c1010TensorImpl36is_contiguous_nondefault_policy_implENS_12MemoryFormatE"
)


def _forget_modules() -> None:
    for name in list(sys.modules):
        top = name.partition(".")[0]
        if top in BUILTIN_FALLBACKS or top.startswith("npu_port_test_fb") or name.startswith(OBJECTS_PACKAGE):
            del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A clean slate: no fallback registered, no extension imported, a directory on sys.path for fake extensions."""
    had_builtins = any(handle.builtin for handle in registered_fallbacks().values())
    for name in list(registered_fallbacks()):
        unregister_fallback(name)
    _forget_modules()
    directory = tmp_path / "site-packages"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    yield directory
    for name in list(registered_fallbacks()):
        unregister_fallback(name)
    _forget_modules()
    if had_builtins:
        install_builtin_fallbacks()


# --- serving alt_cuda_corr -------------------------------------------------------------------------------------------


def test_alt_cuda_corr_imports_only_with_the_fallback(site):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("alt_cuda_corr")
    assert install_builtin_fallbacks() == ["alt_cuda_corr", "raft_alt_cuda_corr"]
    module = importlib.import_module("alt_cuda_corr")
    assert module.__npu_port_stand_in__ == "npu_port.fallbacks.alt_cuda_corr"
    assert module.__spec__.origin == "npu-port stand-in (npu_port.fallbacks.alt_cuda_corr)"
    assert module.forward is corr_impl.forward and module.backward is corr_impl.backward
    assert importlib.import_module("raft_alt_cuda_corr").forward is corr_impl.forward  # RAFT's packaged name
    handle = registered_fallbacks()["alt_cuda_corr"]
    assert handle.builtin and handle.served and handle.reason == "not installed" and handle.mode == "broken"
    uninstall_builtin_fallbacks()
    uninstall_builtin_fallbacks()  # twice is fine
    assert "alt_cuda_corr" not in sys.modules and registered_fallbacks() == {}
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("alt_cuda_corr")


def test_a_broken_extension_is_replaced_and_the_failure_logged(site, caplog):
    (site / "alt_cuda_corr.py").write_text(f"raise ImportError({UNDEFINED_SYMBOL!r})\n")
    with pytest.raises(ImportError, match="undefined symbol"):
        importlib.import_module("alt_cuda_corr")
    sys.modules.pop("alt_cuda_corr", None)
    install_builtin_fallbacks()
    with caplog.at_level(logging.WARNING, logger="npu_port.shims"):
        module = importlib.import_module("alt_cuda_corr")
    assert module.forward is corr_impl.forward
    assert f"npu-port: alt_cuda_corr failed to load (ImportError: {UNDEFINED_SYMBOL}); using npu-port's fallback" in (
        caplog.text
    )
    assert registered_fallbacks()["alt_cuda_corr"].reason == (
        f"the real module failed to load (ImportError: {UNDEFINED_SYMBOL})"
    )


def test_a_shared_object_that_cannot_load_is_replaced(site, caplog):
    """A compiled extension file the dynamic loader refuses (here: not an ELF file at all) fails in create_module."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (site / f"alt_cuda_corr{suffix}").write_bytes(b"built for CUDA 12.1 and torch 2.1, not for this machine\n")
    install_builtin_fallbacks()
    with caplog.at_level(logging.WARNING, logger="npu_port.shims"):
        module = importlib.import_module("alt_cuda_corr")
    assert module.forward is corr_impl.forward
    assert "npu-port: alt_cuda_corr failed to load (ImportError:" in caplog.text


def test_a_working_extension_wins_in_broken_mode_and_always_forces_the_fallback(site):
    (site / "alt_cuda_corr.py").write_text("def forward(*args):\n    return 'real kernel'\n")
    install_builtin_fallbacks()
    assert importlib.import_module("alt_cuda_corr").forward() == "real kernel"
    assert not registered_fallbacks()["alt_cuda_corr"].served
    uninstall_builtin_fallbacks()
    sys.modules.pop("alt_cuda_corr")
    with register_fallback("alt_cuda_corr", "npu_port.fallbacks.alt_cuda_corr", mode="always") as handle:
        assert importlib.import_module("alt_cuda_corr").forward is corr_impl.forward
        assert handle.served
    assert "alt_cuda_corr" not in sys.modules and not handle.active
    assert importlib.import_module("alt_cuda_corr").forward() == "real kernel"


def test_missing_mode_leaves_a_broken_extension_failing(site):
    (site / "alt_cuda_corr.py").write_text(f"raise ImportError({UNDEFINED_SYMBOL!r})\n")
    install_builtin_fallbacks(mode="missing")
    with pytest.raises(ImportError, match="undefined symbol"):
        importlib.import_module("alt_cuda_corr")


def _unbuilt_folder(parent):
    """RAFT's ``alt_cuda_corr/`` before ``python setup.py install``: sources and a setup.py, no ``__init__.py``."""
    folder = parent / "alt_cuda_corr"
    folder.mkdir()
    (folder / "setup.py").write_text("from setuptools import setup\n")
    (folder / "correlation_kernel.cu").write_text("// corr_forward_kernel, corr_backward_kernel\n")
    return folder


def test_an_unbuilt_source_folder_is_reported_as_not_built_once_and_only_on_import(site, caplog):
    folder = _unbuilt_folder(site)
    assert importlib.import_module("alt_cuda_corr").__path__  # as it is: an empty namespace package
    sys.modules.pop("alt_cuda_corr")
    install_builtin_fallbacks()
    handle = registered_fallbacks()["alt_cuda_corr"]
    with caplog.at_level(logging.WARNING, logger="npu_port.shims"):
        assert importlib.util.find_spec("alt_cuda_corr").origin.startswith("npu-port stand-in")
        assert caplog.records == [] and handle.reason is None  # a look-up alone says nothing
        assert importlib.import_module("alt_cuda_corr").forward is corr_impl.forward
        sys.modules.pop("alt_cuda_corr")
        importlib.import_module("alt_cuda_corr")  # imported again: still said once
    assert [record.getMessage() for record in caplog.records] == [
        f"npu-port: alt_cuda_corr is not built ({folder} holds its unbuilt sources); using npu-port's fallback"
    ]
    assert handle.served and handle.reason == f"not built ({folder} holds its unbuilt sources)"


def test_an_empty_folder_is_not_built_either_and_a_built_extension_later_on_the_path_wins(site, tmp_path, caplog):
    (site / "alt_cuda_corr").mkdir()
    install_builtin_fallbacks()
    with caplog.at_level(logging.WARNING, logger="npu_port.shims"):
        importlib.import_module("alt_cuda_corr")
    assert registered_fallbacks()["alt_cuda_corr"].reason == (
        f"not built ({site / 'alt_cuda_corr'} has no __init__.py and no compiled module)"
    )
    uninstall_builtin_fallbacks()
    built = tmp_path / "built"
    built.mkdir()
    (built / "alt_cuda_corr.py").write_text("def forward(*args):\n    return 'real kernel'\n")
    sys.path.append(str(built))  # after the source folder, as an installed extension is
    try:
        install_builtin_fallbacks()
        assert importlib.import_module("alt_cuda_corr").forward() == "real kernel"
        assert not registered_fallbacks()["alt_cuda_corr"].served
    finally:
        sys.path.remove(str(built))


# --- register_fallback -----------------------------------------------------------------------------------------------


def _corr_like_module(name: str, answer: str) -> types.ModuleType:
    module = types.ModuleType(name, "a user's replacement for their CUDA extension")
    module.forward = lambda *args: answer
    module.backward = lambda *args: answer + " backward"
    return module


def test_register_fallback_with_a_module_path(site):
    (site / "npu_port_test_fb_impl.py").write_text("def forward(*args):\n    return 'from a path'\n")
    handle = register_fallback("npu_port_test_fb_ext", "npu_port_test_fb_impl")
    assert handle.implementation == "npu_port_test_fb_impl" and handle.mode == "broken" and not handle.builtin
    assert importlib.import_module("npu_port_test_fb_ext").forward() == "from a path"
    unregister_fallback("npu_port_test_fb_ext")
    assert "npu_port_test_fb_ext" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("npu_port_test_fb_ext")


def test_register_fallback_with_a_module_object(site):
    handle = register_fallback("npu_port_test_fb_ext", _corr_like_module("my_corr", "from a module"))
    assert handle.implementation == f"{OBJECTS_PACKAGE}.npu_port_test_fb_ext"
    module = importlib.import_module("npu_port_test_fb_ext")
    assert module.forward() == "from a module" and module.backward() == "from a module backward"
    assert module.__doc__ == "a user's replacement for their CUDA extension"
    handle.restore()
    handle.restore()  # twice is fine
    assert handle.implementation not in sys.modules and "npu_port_test_fb_ext" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("npu_port_test_fb_ext")


def test_register_fallback_with_a_mapping_and_registering_again_replaces(site):
    register_fallback("npu_port_test_fb_ext", {"forward": lambda *args: "first"})
    assert importlib.import_module("npu_port_test_fb_ext").forward() == "first"
    register_fallback("npu_port_test_fb_ext", {"forward": lambda *args: "second"}, mode="always")
    assert "npu_port_test_fb_ext" not in sys.modules  # the old stand-in went with the old registration
    module = importlib.import_module("npu_port_test_fb_ext")
    assert module.forward() == "second" and registered_fallbacks()["npu_port_test_fb_ext"].mode == "always"
    unregister_fallback("npu_port_test_fb_ext")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("npu_port_test_fb_ext")


def test_a_users_fallback_outlives_the_builtins(site):
    mine = register_fallback("alt_cuda_corr", {"forward": lambda *args: "mine"})
    assert install_builtin_fallbacks() == ["raft_alt_cuda_corr"]
    uninstall_builtin_fallbacks()
    assert mine.active and importlib.import_module("alt_cuda_corr").forward() == "mine"


@pytest.mark.parametrize(
    "module_name, replacement, mode, message",
    [
        (
            3,
            "npu_port.fallbacks.alt_cuda_corr",
            "broken",
            "module_name must be the name a project imports, as a str (like 'alt_cuda_corr'); got int",
        ),
        (
            "alt-cuda-corr",
            "npu_port.fallbacks.alt_cuda_corr",
            "broken",
            "module_name 'alt-cuda-corr' is not a module name; give the top-level name a project imports, "
            "like 'alt_cuda_corr'",
        ),
        (
            "mmcv._ext",
            "npu_port.fallbacks.alt_cuda_corr",
            "broken",
            "module_name 'mmcv._ext' is a submodule; fallbacks are registered for top-level modules "
            "(like 'alt_cuda_corr'), which is how setup.py-built CUDA extensions are imported",
        ),
        (
            "npu_port",
            "npu_port.fallbacks.alt_cuda_corr",
            "broken",
            "module_name 'npu_port' is npu-port itself and cannot be replaced",
        ),
        (
            "npu_port_test_fb_ext",
            42,
            "broken",
            "replacement must be a dotted module path (str), a module object, or a mapping of names to callables; "
            "got int",
        ),
        (
            "npu_port_test_fb_ext",
            "my corr",
            "broken",
            "replacement 'my corr' is not a dotted module path (like 'mypkg.corr_torch')",
        ),
        (
            "npu_port_test_fb_ext",
            "npu_port_test_fb_nowhere",
            "broken",
            "replacement module 'npu_port_test_fb_nowhere' cannot be found",
        ),
        (
            "npu_port_test_fb_ext",
            "npu_port_test_fb_ext.torch_impl",
            "broken",
            "replacement 'npu_port_test_fb_ext.torch_impl' is inside 'npu_port_test_fb_ext' itself; give a module of "
            "your own",
        ),
        (
            "npu_port_test_fb_ext",
            {},
            "broken",
            "the replacement mapping for 'npu_port_test_fb_ext' is empty; give it the names to serve",
        ),
        (
            "npu_port_test_fb_ext",
            {"__version__": "1.0"},
            "broken",
            "replacement mapping keys must be plain attribute names (not dunder names); got '__version__'",
        ),
        (
            "npu_port_test_fb_ext",
            {"RADIUS": 4},
            "broken",
            "replacement mapping values must be callables; 'RADIUS' is a int",
        ),
        (
            "npu_port_test_fb_ext",
            "npu_port.fallbacks.alt_cuda_corr",
            "sometimes",
            "fallback mode must be one of missing, broken, always; got 'sometimes'",
        ),
    ],
)
def test_bad_registrations_name_the_valid_forms(site, module_name, replacement, mode, message):
    with pytest.raises(FallbackError) as caught:
        register_fallback(module_name, replacement, mode=mode)
    assert str(caught.value) == message
    assert isinstance(caught.value, NpuPortError) and isinstance(caught.value, ValueError)
    assert registered_fallbacks() == {} and not any(name.startswith(OBJECTS_PACKAGE) for name in sys.modules)


def test_unregistering_an_unknown_name_and_shadowing_a_drop_in_are_refused(site):
    register_fallback("npu_port_test_fb_ext", {"forward": print})
    with pytest.raises(FallbackError) as caught:
        unregister_fallback("npu_port_test_fb_other")
    assert str(caught.value) == (
        "no fallback is registered for 'npu_port_test_fb_other'; registered fallbacks: npu_port_test_fb_ext"
    )
    register(Replacement("npu_port_test_fb_dropin", {"npu_port_test_fb_dropin": "npu_port.fallbacks.alt_cuda_corr"}))
    try:
        with pytest.raises(FallbackError) as caught:
            register_fallback("npu_port_test_fb_dropin", {"forward": print})
        assert str(caught.value) == (
            "'npu_port_test_fb_dropin' is already served by another npu-port stand-in (a drop-in); uninstall it "
            "before registering a fallback for that name"
        )
    finally:
        unregister("npu_port_test_fb_dropin")


# --- alt_cuda_corr: what the CUDA kernel computes --------------------------------------------------------------------


def _random_inputs(gen, batch, n, h1, w1, h2, w2, channels, radius, spread=3.0):
    fmap1 = torch.randn(batch, h1, w1, channels, generator=gen)
    fmap2 = torch.randn(batch, h2, w2, channels, generator=gen)
    # Targets from well outside fmap2 (whole windows of zeros) to inside, with some exact integers (dx = dy = 0).
    low = torch.tensor([-radius - spread, -radius - spread])
    span = torch.tensor([w2 + 2 * (radius + spread), h2 + 2 * (radius + spread)])
    coords = low + span * torch.rand(batch, n, h1, w1, 2, generator=gen)
    coords[:, :, ::2, ::3] = coords[:, :, ::2, ::3].round()
    return fmap1, fmap2, coords


@pytest.mark.parametrize(
    "batch, n, h1, w1, h2, w2, channels, radius",
    [(1, 1, 3, 4, 3, 4, 1, 0), (2, 2, 4, 3, 5, 2, 3, 1), (1, 1, 5, 5, 3, 3, 32, 2), (1, 1, 2, 6, 1, 1, 2, 1)],
)
def test_forward_and_backward_match_the_cuda_kernels_written_as_loops(batch, n, h1, w1, h2, w2, channels, radius):
    gen = torch.Generator().manual_seed(radius * 10 + channels)
    fmap1, fmap2, coords = _random_inputs(gen, batch, n, h1, w1, h2, w2, channels, radius)
    result = corr_impl.forward(fmap1, fmap2, coords, radius)
    assert isinstance(result, list) and len(result) == 1  # pybind11 returns the std::vector as a list
    (corr,) = result
    assert corr.shape == (batch, n, (2 * radius + 1) ** 2, h1, w1) and corr.dtype == torch.float32
    torch.testing.assert_close(corr, raft_corr.kernel_forward_loops(fmap1, fmap2, coords, radius).float())

    corr_grad = torch.randn(corr.shape, generator=gen)
    grads = corr_impl.backward(fmap1, fmap2, coords, corr_grad, radius)
    assert isinstance(grads, list) and [g.shape for g in grads] == [fmap1.shape, fmap2.shape, coords.shape]
    expected = raft_corr.kernel_backward_loops(fmap1, fmap2, coords, corr_grad)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want.float())
    assert not grads[2].any()  # the kernel never writes coords_grad


def test_chunking_changes_nothing(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    fmap1, fmap2, coords = _random_inputs(gen, 2, 1, 6, 7, 5, 4, 8, 3)
    corr_grad = torch.randn(2, 1, 49, 6, 7, generator=gen)
    whole = [corr_impl.forward(fmap1, fmap2, coords, 3)[0], *corr_impl.backward(fmap1, fmap2, coords, corr_grad, 3)]
    monkeypatch.setattr(corr_impl, "_CHUNK_ELEMENTS", 1)
    chunked = [corr_impl.forward(fmap1, fmap2, coords, 3)[0], *corr_impl.backward(fmap1, fmap2, coords, corr_grad, 3)]
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_memory_is_bounded_by_the_chunk_budget_not_the_all_pairs_volume():
    batch, channels, height, width, radius = 1, 32, 96, 96, 4
    fmap1 = torch.randn(batch, height, width, channels)
    coords = torch.rand(batch, 1, height, width, 2) * height
    all_pairs_bytes = batch * (height * width) ** 2 * 4  # what CorrBlock builds: 340 MiB here
    with torch.no_grad(), AllocationTracker() as tracker:
        (corr,) = corr_impl.forward(fmap1, fmap1, coords, radius)
    output_bytes = corr.numel() * 4
    budget_bytes = corr_impl._CHUNK_ELEMENTS * 4  # the gathered rows and their product with fmap1
    assert tracker.largest <= max(budget_bytes // 2, output_bytes)
    assert tracker.peak <= budget_bytes + 3 * output_bytes + (4 << 20)
    assert tracker.peak < all_pairs_bytes / 10


def test_bad_arguments_are_refused_with_the_layout():
    fmap = torch.zeros(1, 4, 4, 8)
    with pytest.raises(FallbackError) as caught:
        corr_impl.forward(fmap.permute(0, 3, 1, 2)[0], fmap, torch.zeros(1, 1, 4, 4, 2), 2)
    assert str(caught.value) == (
        "alt_cuda_corr: fmap1 must be a 4-D floating-point tensor, got shape (8, 4, 4) torch.float32 "
        "(fmap1 (B, H1, W1, C), fmap2 (B, H2, W2, C), coords (B, N, H1, W1, 2), channels-last)"
    )
    with pytest.raises(FallbackError) as caught:
        corr_impl.forward(fmap, fmap, torch.zeros(1, 4, 4, 2), 2)
    assert "coords must be a 5-D floating-point tensor" in str(caught.value)
    with pytest.raises(FallbackError) as caught:
        corr_impl.forward(fmap, fmap, torch.zeros(1, 1, 4, 5, 2), 2)
    assert str(caught.value) == (
        "alt_cuda_corr: coords must have shape (B, N, H1, W1, 2) = (1, N, 4, 4, 2), got (1, 1, 4, 5, 2)"
    )
    with pytest.raises(FallbackError, match=r"radius must be an int >= 0, got 2.0"):
        corr_impl.forward(fmap, fmap, torch.zeros(1, 1, 4, 4, 2), 2.0)
    with pytest.raises(FallbackError) as caught:
        corr_impl.backward(fmap, fmap, torch.zeros(1, 1, 4, 4, 2), torch.zeros(1, 1, 9, 4, 4), 2)
    assert str(caught.value) == (
        "alt_cuda_corr: corr_grad must have forward's shape (B, N, (2r+1)^2, H1, W1) = (1, 1, 25, 4, 4), "
        "got (1, 1, 9, 4, 4)"
    )


# --- parity with RAFT's CorrBlock ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served_alt_cuda_corr():
    """``import alt_cuda_corr`` (what RAFT's AlternateCorrBlock does) answered by the built-in fallback."""
    had = "alt_cuda_corr" in registered_fallbacks()
    install_builtin_fallbacks()
    yield importlib.import_module("alt_cuda_corr")
    if not had:
        uninstall_builtin_fallbacks()


def _raft_inputs(seed, batch, channels, height, width, flow_scale):
    gen = torch.Generator().manual_seed(seed)
    fmap1 = torch.randn(batch, channels, height, width, generator=gen)
    fmap2 = torch.randn(batch, channels, height, width, generator=gen)
    # RAFT's coords1 = coords0 + flow; large flows send the window partly or wholly outside the image.
    flow = flow_scale * torch.randn(batch, 2, height, width, generator=gen)
    coords = raft_corr.coords_grid(batch, height, width) + flow
    coords[:, :, ::3] = coords[:, :, ::3].round()
    return fmap1, fmap2, coords


@settings(max_examples=150)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 2),
    channels=st.sampled_from([1, 3, 8, 32]),
    num_levels=st.integers(1, 4),
    radius=st.integers(1, 4),
    extra_height=st.integers(0, 5),
    extra_width=st.integers(0, 5),
    flow_scale=st.sampled_from([0.0, 1.5, 6.0, 30.0]),
)
def test_alternate_corr_block_equals_corr_block(
    served_alt_cuda_corr, seed, batch, channels, num_levels, radius, extra_height, extra_width, flow_scale
):
    # AlternateCorrBlock pools num_levels times: each side needs 2**num_levels pixels (and CorrBlock's
    # bilinear_sampler divides by side - 1 at its coarsest level).
    height, width = 2**num_levels + extra_height, 2**num_levels + extra_width
    fmap1, fmap2, coords = _raft_inputs(seed, batch, channels, height, width, flow_scale)
    leaves = [t.clone().requires_grad_(True) for t in (fmap1, fmap2)]
    expected = raft_corr.CorrBlock(fmap1, fmap2, num_levels, radius)(coords)
    got = raft_corr.AlternateCorrBlock(*leaves, num_levels, radius)(coords)
    assert got.shape == expected.shape == (batch, num_levels * (2 * radius + 1) ** 2, height, width)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)

    # Gradients for the feature maps match autograd through the all-pairs volume.
    ref_leaves = [t.clone().requires_grad_(True) for t in (fmap1, fmap2)]
    expected = raft_corr.CorrBlock(*ref_leaves, num_levels, radius)(coords)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(seed + 1))
    want = torch.autograd.grad(expected, ref_leaves, grad)
    have = torch.autograd.grad(got, leaves, grad)
    for a, b in zip(have, want):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("radius", [1, 3, 4])
def test_backward_matches_autograd_through_corr_block(served_alt_cuda_corr, radius):
    """``alt_cuda_corr.backward`` (RAFT never calls it, but its kernel defines it) vs CorrBlock at one level."""
    batch, channels, height, width = 2, 8, 9, 7
    fmap1, fmap2, coords = _raft_inputs(radius, batch, channels, height, width, flow_scale=4.0)
    ref_leaves = [t.clone().requires_grad_(True) for t in (fmap1, fmap2, coords)]
    expected = raft_corr.CorrBlock(*ref_leaves[:2], num_levels=1, radius=radius)(ref_leaves[2])
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(7))
    want = torch.autograd.grad(expected * math.sqrt(channels), ref_leaves, grad)

    channels_last = [t.permute(0, 2, 3, 1).contiguous() for t in (fmap1, fmap2)]
    coords5 = coords.permute(0, 2, 3, 1).reshape(batch, 1, height, width, 2).contiguous()
    (corr,) = served_alt_cuda_corr.forward(*channels_last, coords5, radius)
    torch.testing.assert_close(corr.squeeze(1), expected.detach() * math.sqrt(channels), atol=2e-5, rtol=1e-5)
    fmap1_grad, fmap2_grad, coords_grad = served_alt_cuda_corr.backward(
        *channels_last, coords5, grad.unsqueeze(1), radius
    )
    torch.testing.assert_close(fmap1_grad.permute(0, 3, 1, 2), want[0], atol=5e-5, rtol=1e-4)
    torch.testing.assert_close(fmap2_grad.permute(0, 3, 1, 2), want[1], atol=5e-5, rtol=1e-4)
    # The CUDA kernel returns zeros for coords (CorrBlock's grid_sample has a real coords gradient; RAFT detaches
    # coords every iteration, so neither is used).
    assert coords_grad.shape == (batch, 1, height, width, 2) and not coords_grad.any() and want[2].abs().sum() > 0
    coords_leaf = coords5.clone().requires_grad_(True)
    (tracked,) = served_alt_cuda_corr.forward(*channels_last, coords_leaf, radius)
    assert tracked.grad_fn is None  # nothing to differentiate: the result is not tracked for coords alone


# --- force_safe_math -------------------------------------------------------------------------------------------------


def _math_settings():
    matmul = torch.backends.cuda.matmul
    values = {
        "cublas_tf32": matmul.allow_tf32,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "fp16_reduction": matmul.allow_fp16_reduced_precision_reduction,
        "bf16_reduction": matmul.allow_bf16_reduced_precision_reduction,
    }
    getter = getattr(torch._C, "_get_fp32_precision_getter", None)
    if getter is not None:
        for pair in [("generic", "all"), ("cuda", "matmul"), ("cuda", "conv"), ("cuda", "rnn"), ("mkldnn", "matmul")]:
            values[pair] = getter(*pair)
    return values


@pytest.fixture
def tf32_on():
    before = _math_settings()
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # what many training scripts do
    yield
    torch.set_float32_matmul_precision(previous)
    for key, value in before.items():  # the per-backend settings that call touched, as they were
        if isinstance(key, tuple):
            torch._C._set_fp32_precision_setter(*key, value)
    assert _math_settings() == before


def test_force_safe_math_turns_off_tf32_and_autocast_and_restores_everything(tf32_on):
    autocast_init = torch.amp.autocast_mode.autocast.__dict__["__init__"]
    before = _math_settings()
    assert before["cublas_tf32"] and before["matmul_precision"] == "high"
    a, b = torch.randn(8, 8), torch.randn(8, 8)

    handle = force_safe_math()
    now = _math_settings()
    assert (now["cublas_tf32"], now["cudnn_tf32"], now["matmul_precision"]) == (False, False, "highest")
    assert not now["fp16_reduction"] and not now["bf16_reduction"]
    assert handle.changed["float32_matmul_precision"] == ("high", "highest")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ b).dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
    with torch.amp.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=True):
        assert (a @ b).dtype == torch.float32
    with pytest.warns(FutureWarning), torch.cpu.amp.autocast(dtype=torch.bfloat16):
        assert (a @ b).dtype == torch.float32

    handle.restore()
    handle.restore()  # twice is fine
    assert torch.amp.autocast_mode.autocast.__dict__["__init__"] is autocast_init
    assert _math_settings() == before
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ b).dtype == torch.bfloat16


def test_force_safe_math_options_leave_their_part_alone(tf32_on):
    autocast_init = torch.amp.autocast_mode.autocast.__dict__["__init__"]
    before = _math_settings()
    with force_safe_math(tf32=True) as handle:
        assert _math_settings()["cublas_tf32"] and _math_settings()["matmul_precision"] == "high"
        assert "torch.autocast" in handle.changed
    with force_safe_math(fp32=False):
        assert torch.amp.autocast_mode.autocast.__dict__["__init__"] is autocast_init
        assert _math_settings()["matmul_precision"] == "highest" and _math_settings()["fp16_reduction"]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16
    assert _math_settings() == before


def test_nested_safe_math_restored_out_of_order_still_restores_autocast():
    autocast_init = torch.amp.autocast_mode.autocast.__dict__["__init__"]
    before = _math_settings()
    guard = force_safe_math()
    outer, inner = force_safe_math(), force_safe_math()
    outer.restore()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.float32  # inner (and guard) still force
    inner.restore()
    assert torch.amp.autocast_mode.autocast.__dict__["__init__"] is guard._autocast_patch.replacement
    guard.restore()
    assert torch.amp.autocast_mode.autocast.__dict__["__init__"] is autocast_init
    assert _math_settings() == before
