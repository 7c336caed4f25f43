"""Old import paths keep working for one release, each with a DeprecationWarning that names the new place.

``npu_port.shims`` was split into ``npu_port.dropins`` and ``npu_port.fallbacks`` (issue 14): every old module path
still imports, and gives the very module object of its new place (state such as the registered stand-ins is shared).
"""

from __future__ import annotations

import importlib
import sys

import pytest

#: Every module path ``npu_port.shims`` had before the split, and where it lives now (the promise, written out).
OLD_SHIMS_PATHS = {
    "npu_port.shims._attention": "npu_port.dropins._attention",
    "npu_port.shims.alt_cuda_corr": "npu_port.fallbacks.alt_cuda_corr",
    "npu_port.shims.dropins": "npu_port.dropins.install",
    "npu_port.shims.fallbacks": "npu_port.fallbacks.registry",
    "npu_port.shims.finder": "npu_port.dropins.finder",
    "npu_port.shims.flash_attn_bert_padding": "npu_port.dropins.flash_attn_bert_padding",
    "npu_port.shims.flash_attn_impl": "npu_port.dropins.flash_attn_impl",
    "npu_port.shims.safe_math": "npu_port.fallbacks.safe_math",
    "npu_port.shims.xformers_attn_bias_impl": "npu_port.dropins.xformers_attn_bias_impl",
    "npu_port.shims.xformers_fmha_impl": "npu_port.dropins.xformers_fmha_impl",
    "npu_port.shims.xformers_impl": "npu_port.dropins.xformers_impl",
    "npu_port.shims.xformers_ops_impl": "npu_port.dropins.xformers_ops_impl",
}
SHIMS_WARNING = (
    "npu_port.shims is deprecated; use npu_port.dropins (flash_attn / xformers drop-ins, the import hook) or "
    "npu_port.fallbacks (compiled-extension fallbacks, safe math)"
)


@pytest.fixture
def fresh_shims(monkeypatch):
    """Forget the old paths (put back after the test), so that importing one runs its stub again."""
    for name in [n for n in sys.modules if n == "npu_port.shims" or n.startswith("npu_port.shims.")]:
        monkeypatch.delitem(sys.modules, name)


def test_the_shims_package_warns_naming_both_new_packages(fresh_shims):
    with pytest.warns(DeprecationWarning) as record:
        import npu_port.shims  # noqa: F401
    assert [str(w.message) for w in record] == [SHIMS_WARNING]
    assert record[0].filename == __file__  # the warning points at the code that imports the old path


@pytest.mark.parametrize("old", sorted(OLD_SHIMS_PATHS))
def test_each_old_shims_path_warns_and_gives_the_module_of_its_new_place(old, fresh_shims):
    new = OLD_SHIMS_PATHS[old]
    expected = importlib.import_module(new)
    with pytest.warns(DeprecationWarning) as record:
        __import__(old)  # an import statement's own route (importlib.import_module adds a frame of its own)
    assert sys.modules[old] is expected and getattr(sys.modules["npu_port.shims"], old.rpartition(".")[2]) is expected
    assert [str(w.message) for w in record] == [SHIMS_WARNING, f"{old} is deprecated; use {new}"]
    assert all(w.filename == __file__ for w in record)


def test_from_import_of_an_old_path_gives_the_same_objects(fresh_shims):
    with pytest.warns(DeprecationWarning) as record:
        from npu_port.shims.fallbacks import register_fallback
    assert str(record[-1].message) == "npu_port.shims.fallbacks is deprecated; use npu_port.fallbacks.registry"
    from npu_port.fallbacks import register_fallback as new

    assert register_fallback is new


def test_the_stub_table_covers_exactly_the_old_paths(fresh_shims):
    with pytest.warns(DeprecationWarning):
        shims = importlib.import_module("npu_port.shims")
    assert {f"npu_port.shims.{name}": new for name, new in shims.MOVED.items()} == OLD_SHIMS_PATHS


def test_npu_ports_own_deprecation_warnings_are_errors_in_the_suite():
    """pyproject's filterwarnings turns them into errors, so no test (and no code it runs) uses an old path."""
    import warnings

    with pytest.raises(DeprecationWarning, match="^npu_port.shims is deprecated"):
        warnings.warn(SHIMS_WARNING, DeprecationWarning, stacklevel=1)


# ---- the top level: about 20 names; the others moved to their sub-packages ----

#: Every top-level name that was public before issue 14 and moved, and its new place (the promise, written out).
MOVED_NAMES = {
    "AttentionCall": "npu_port.attn",
    "get_kernel": "npu_port.attn",
    "kernel_names": "npu_port.attn",
    "runnable_kernels": "npu_port.attn",
    "Strategy": "npu_port.strategy.spec",
    "StrategyHandle": "npu_port.strategy.api",
    "get_strategy": "npu_port.strategy.registry",
    "load_strategy_file": "npu_port.strategy.registry",
    "unregister_strategy": "npu_port.strategy.registry",
    "CudaRedirect": "npu_port.device.redirect",
    "NpuOptionsReport": "npu_port.device.npu_options",
    "Activation": "npu_port.runtime",
    "override": "npu_port.runtime",
    "unregister_fallback": "npu_port.fallbacks",
    "AttentionInputError": "npu_port.errors",
    "DeviceError": "npu_port.errors",
    "KernelOptionError": "npu_port.errors",
    "KernelRuntimeError": "npu_port.errors",
    "KernelUnavailableError": "npu_port.errors",
    "NoKernelError": "npu_port.errors",
    "NpuOptionError": "npu_port.errors",
    "RedirectError": "npu_port.errors",
    "RunError": "npu_port.errors",
    "StrategyError": "npu_port.errors",
    "StrategyFileError": "npu_port.errors",
    "UnknownKernelError": "npu_port.errors",
    "UnknownStrategyError": "npu_port.errors",
}


@pytest.mark.parametrize("name", sorted(MOVED_NAMES))
def test_each_moved_top_level_name_warns_naming_its_new_place_and_gives_the_same_object(name):
    import npu_port

    new_place = MOVED_NAMES[name]
    expected = getattr(importlib.import_module(new_place), name)
    with pytest.warns(DeprecationWarning) as record:
        value = getattr(npu_port, name)
    assert value is expected
    assert [str(w.message) for w in record] == [f"npu_port.{name} is deprecated; use {new_place}.{name}"]
    assert record[0].filename == __file__  # points at the code that uses the old name
    assert name not in npu_port.__all__ and name not in dir(npu_port)


def test_a_moved_name_warns_on_every_use_and_from_import_too():
    import npu_port

    with pytest.warns(DeprecationWarning) as record:
        npu_port.get_kernel("math")
        npu_port.get_kernel("math")
    assert [str(w.message) for w in record] == ["npu_port.get_kernel is deprecated; use npu_port.attn.get_kernel"] * 2
    with pytest.warns(DeprecationWarning) as record:
        from npu_port import StrategyError  # noqa: F401  (the import system asks twice: same message, same line)
    assert {(str(w.message), w.filename) for w in record} == {
        ("npu_port.StrategyError is deprecated; use npu_port.errors.StrategyError", __file__)
    }


def test_the_moved_table_covers_exactly_the_promised_names():
    import npu_port

    assert npu_port._MOVED == MOVED_NAMES
    assert set(npu_port._MOVED).isdisjoint(npu_port._PUBLIC)


def test_an_unknown_name_is_an_attribute_error():
    import npu_port

    with pytest.raises(AttributeError) as info:
        npu_port.get_kernels  # noqa: B018
    assert str(info.value) == "module 'npu_port' has no attribute 'get_kernels'"
