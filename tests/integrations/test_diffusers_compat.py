"""Projects that pin an old diffusers (Tune-A-Video and AnimateDiff pin 0.11.1; others 0.14) work with npu-port:
``classes.load()`` describes what the installed version has, diffusers' xformers switch routes every attention that
version computes (0.11's ``CrossAttention``, 0.12-0.14's processors, ``AttentionBlock``) and is undone exactly, and no
message tells the user to install a newer diffusers.

These tests run under every diffusers of CI's lanes (.ci/run: 0.11.1 and 0.14.0 in the oldest lanes, and the
newest and the locked set in the main suite); those about one layout carry ``diffusers_min`` / ``diffusers_below`` and are deselected under
the others. The models are our own tiny ones (:mod:`tests.fixtures.old_diffusers`), built from configs in each
version's own API; "reference" is the same model with diffusers' own attention, in float64.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import npu_port
from npu_port._optional import extra_hint
from npu_port.integrations.attention_block import is_attention_block_class
from npu_port.integrations.diffusers import RoutedAttnProcessor, classes
from npu_port.integrations.legacy_attention import (
    active_patches,
    original_function,
    patch_legacy_attention,
    xformers_route,
)

from ..fixtures.old_diffusers import run_pipeline, tiny_pipeline, tiny_unet, tiny_vae
from ..reference import reference_attention

PROJECT = Path(__file__).parents[1] / "fixtures" / "old_diffusers_project"
KERNEL = {"sdpa": "sdpa", "chunked": "chunked", "vanilla": "math"}
TOLERANCE = {torch.float64: 1e-10, torch.float32: 3e-5, torch.float16: 5e-3}
CROSS_ATTENTION_LAYOUT = (pytest.mark.diffusers_min("0.12"), pytest.mark.diffusers_below("0.15"))


def assert_matches(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.isfinite(got).all()
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), expected.double(), atol=tolerance, rtol=tolerance)


def attention_kinds():
    """Every class whose instances compute attention in the installed diffusers."""
    api = classes.load()
    return (*api.attention_module_classes, *(c for c in (api.LegacyCrossAttention, api.AttentionBlock) if c))


def class_state(*classes_):
    return {cls: dict(vars(cls)) for cls in classes_ if cls is not None}


def assert_same_state(before):
    for cls, attributes in before.items():
        assert vars(cls).keys() == attributes.keys(), cls
        assert all(vars(cls)[name] is value for name, value in attributes.items()), cls


# ---- what the installed diffusers has ------------------------------------------------------------------------------


@pytest.mark.diffusers_below("0.12")
def test_load_describes_a_diffusers_without_processors():
    import diffusers
    from diffusers.models import attention

    api = classes.load()
    assert (api.version, api.layout) == (diffusers.__version__, "attention")
    assert api.attention_module_classes == () and api.Attention is None and api.default_processor is None
    assert api.AttnProcessor is api.AttnProcessor2_0 is api.XFormersAttnProcessor is api.dispatch_attention_fn is None
    assert api.LegacyCrossAttention is attention.CrossAttention and api.AttentionBlock is attention.AttentionBlock
    assert api.DiffusionPipeline is diffusers.DiffusionPipeline
    assert importlib.util.find_spec("diffusers.models.attention_processor") is None  # nothing absent was imported
    assert api.describe() == (
        f"diffusers {diffusers.__version__}: no attention processors (before 0.12): CrossAttention's _attention is "
        "routed as legacy attention; AttentionBlock's inline attention routed"
    )


@CROSS_ATTENTION_LAYOUT[0]
@CROSS_ATTENTION_LAYOUT[1]
def test_load_describes_the_cross_attention_layout():
    import diffusers
    from diffusers.models import attention, cross_attention

    api = classes.load()
    assert (api.version, api.layout) == (diffusers.__version__, "cross_attention")
    assert api.Attention is cross_attention.CrossAttention and api.attention_module_classes == (api.Attention,)
    assert api.AttnProcessor is cross_attention.CrossAttnProcessor
    assert api.XFormersAttnProcessor is cross_attention.XFormersCrossAttnProcessor
    assert api.AttnProcessor2_0 is getattr(cross_attention, "AttnProcessor2_0", None)  # 0.13 onwards
    assert api.default_processor is (api.AttnProcessor2_0 or cross_attention.CrossAttnProcessor)
    assert api.FusedAttnProcessor2_0 is api.AttnProcessorNPU is api.AttentionModuleMixin is None
    assert api.LegacyCrossAttention is None and api.AttentionBlock is attention.AttentionBlock
    assert api.DiffusionPipeline is diffusers.DiffusionPipeline


@pytest.mark.diffusers_min("0.15")
def test_load_describes_the_attention_processor_layout():
    import diffusers
    from diffusers.models import attention_processor

    api = classes.load()
    assert (api.version, api.layout) == (diffusers.__version__, "attention_processor")
    assert api.Attention is attention_processor.Attention
    assert api.default_processor is api.AttnProcessor2_0 is attention_processor.AttnProcessor2_0
    assert api.LegacyCrossAttention is None
    assert api.AttentionBlock is getattr(importlib.import_module("diffusers.models.attention"), "AttentionBlock", None)
    assert "diffusers.models.cross_attention" not in sys.modules  # 0.15/0.16's deprecated alias is not imported


def _broken_load(monkeypatch, version, error):
    def detect():
        raise error

    monkeypatch.setattr(classes, "_detect", detect)
    monkeypatch.setattr(classes, "installed_version", lambda *names: version)
    with pytest.raises(ImportError) as info:
        classes.load()
    return str(info.value)


def test_an_installed_diffusers_that_cannot_be_imported_is_named_and_not_upgraded(monkeypatch):
    error = ImportError(
        "cannot import name 'cached_download' from 'huggingface_hub' (/site/huggingface_hub/__init__.py)"
    )
    assert _broken_load(monkeypatch, "0.11.1", error) == (
        "diffusers 0.11.1 is installed but cannot be imported (ImportError: cannot import name 'cached_download' "
        "from 'huggingface_hub' (/site/huggingface_hub/__init__.py)); fix that import (npu-port works with diffusers "
        "0.11 onwards; upgrading diffusers is not needed); an old diffusers needs the huggingface_hub of its time, "
        "e.g. pip install 'huggingface_hub<0.26'"
    )
    assert _broken_load(monkeypatch, "0.14.0", OSError("libhccl.so: cannot open shared object file")) == (
        "diffusers 0.14.0 is installed but cannot be imported (OSError: libhccl.so: cannot open shared object file); "
        "fix that import (npu-port works with diffusers 0.11 onwards; upgrading diffusers is not needed)"
    )


def test_a_missing_diffusers_gets_the_install_hint(monkeypatch):
    message = _broken_load(monkeypatch, None, ModuleNotFoundError("No module named 'diffusers'"))
    assert message == (
        "npu-port's diffusers integration needs diffusers, which is not installed (ModuleNotFoundError: No module "
        f"named 'diffusers'); {extra_hint('diffusers')}"
    )


# ---- AttentionBlock (0.11-0.16) -------------------------------------------------------------------------------------


@st.composite
def attention_block_cases(draw):
    from diffusers.models.attention import AttentionBlock

    channels = draw(st.sampled_from([8, 16, 32]))
    head_channels = draw(st.sampled_from([None, 4, 8]))
    groups = draw(st.sampled_from([1, 2, 4, 8]))
    block = AttentionBlock(channels, head_channels, norm_num_groups=groups, rescale_output_factor=draw(
        st.sampled_from([1.0, 2.0])))  # fmt: skip
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float64) * 0.5)
    width = draw(st.integers(2, 5))  # at least 2 positions: a group norm needs more than one value per group
    shape = (draw(st.integers(1, 2)), channels, draw(st.integers(1, 5)), width)
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    return block, torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype), dtype


def attention_block_reference(block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``AttentionBlock``'s computation in float64 throughout (the original's softmax is float32 even for float64
    inputs), from its own submodules: group norm, q/k/v projections, attention with scale 1/sqrt(channels/heads),
    output projection, residual, rescale."""
    block, hidden = copy.deepcopy(block).double(), hidden.double()
    batch, channels, height, width = hidden.shape
    heads = block.num_heads
    states = block.group_norm(hidden).view(batch, channels, height * width).transpose(1, 2)
    q, k, v = (
        project(states).view(batch, height * width, heads, channels // heads).transpose(1, 2)
        for project in (block.query, block.key, block.value)
    )
    out = reference_attention(q, k, v, scale=1 / math.sqrt(channels / heads))
    out = block.proj_attn(out.transpose(1, 2).reshape(batch, height * width, channels))
    return (out.transpose(-1, -2).reshape(hidden.shape) + hidden) / block.rescale_output_factor


@pytest.mark.diffusers_below("0.17")
@pytest.mark.parametrize("strategy", ["sdpa", "chunked", "vanilla"])
@settings(max_examples=25)
@given(case=attention_block_cases())
def test_routed_attention_block_equals_the_original(strategy, case):
    from diffusers.models.attention import AttentionBlock

    block, hidden, dtype = case
    original = original_function(vars(AttentionBlock)["forward"])
    with torch.no_grad():
        expected = attention_block_reference(block, hidden)
        assert_matches(original(copy.deepcopy(block).float(), hidden.float()), expected, torch.float32)  # same math
        block.to(dtype)
        with npu_port.attention_strategy(strategy, memory_budget=4096) as handle, patch_legacy_attention(block):
            assert vars(AttentionBlock)["forward"] is not original
            got = block(hidden)
    assert vars(AttentionBlock)["forward"] is original
    assert got.dtype == dtype and got.shape == hidden.shape
    assert_matches(got, expected, dtype)
    assert handle.calls == {KERNEL[strategy]: 1}


@pytest.mark.diffusers_below("0.17")
def test_attention_block_patch_is_undone_exactly_and_spares_a_forward_it_has_not_read():
    from diffusers.models.attention import AttentionBlock

    class OwnForward(AttentionBlock):
        def forward(self, hidden_states):
            return hidden_states

    class Inherits(AttentionBlock):
        pass

    assert is_attention_block_class(AttentionBlock) and is_attention_block_class(Inherits)
    assert not is_attention_block_class(OwnForward) and not is_attention_block_class(nn.Linear)
    before = class_state(AttentionBlock)
    vae = tiny_vae()
    blocks = [m for m in vae.modules() if isinstance(m, AttentionBlock)]
    blocks[0]._use_memory_efficient_attention_xformers = True
    patch = patch_legacy_attention(vae)
    assert (patch.classes, patch.instances, patch.flags_cleared) == (["AttentionBlock"], len(blocks), 1)
    assert active_patches() == ["AttentionBlock.forward"]
    with pytest.raises(ValueError, match="is not a legacy attention class"):
        patch_legacy_attention(OwnForward)
    patch.restore()
    assert_same_state(before)
    assert blocks[0]._use_memory_efficient_attention_xformers is True and active_patches() == []


# ---- the 0.12-0.14 processors ---------------------------------------------------------------------------------------


@st.composite
def cross_attention_calls(draw):
    from diffusers.models import cross_attention

    api = classes.load()
    names = [cls.__name__ for cls in (api.AttnProcessor, api.AttnProcessor2_0, api.XFormersAttnProcessor) if cls]
    processor = getattr(cross_attention, draw(st.sampled_from(names)))
    heads, dim_head = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([4, 8, 16]))
    self_attention = draw(st.booleans())
    query_dim = heads * dim_head  # AttnProcessor2_0 of these versions takes its head size from the query width
    options = {} if self_attention else {"cross_attention_dim": 12}
    if not self_attention and "cross_attention_norm" in cross_attention.CrossAttention.__init__.__code__.co_varnames:
        options["cross_attention_norm"] = draw(st.booleans())  # 0.13 onwards
    module = cross_attention.CrossAttention(query_dim, heads=heads, dim_head=dim_head, bias=True, **options)
    module.scale = draw(st.sampled_from([module.scale, 0.3]))
    module.set_processor(processor())
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float64) * 0.3)
    batch, q_len = draw(st.integers(1, 2)), draw(st.integers(1, 7))
    hidden = torch.randn(batch, q_len, query_dim, generator=gen, dtype=torch.float64)
    context = None if self_attention else torch.randn(batch, draw(st.integers(1, 6)), 12, generator=gen).double()
    mask = None
    if self_attention and draw(st.booleans()):  # these versions pad a mask to the query length: self-attention only
        rows = draw(st.sampled_from([1, q_len]))
        # 0.13 and 0.14 repeat a (batch, ...) mask over the heads; 0.12 expects it repeated already
        repeats = "batch_size" in inspect.signature(module.prepare_attention_mask).parameters
        folded = batch * draw(st.sampled_from([1, heads] if repeats else [heads]))
        keep = torch.rand(folded, rows, q_len, generator=gen) < 0.7
        keep[..., 0] = True
        bias = torch.randn(keep.shape, generator=gen, dtype=torch.float64) if draw(st.booleans()) else 0.0
        mask = torch.where(keep, bias, torch.tensor(-10000.0, dtype=torch.float64))
    return module, hidden, context, mask, draw(st.sampled_from([torch.float32, torch.float64]))


@CROSS_ATTENTION_LAYOUT[0]
@CROSS_ATTENTION_LAYOUT[1]
@pytest.mark.parametrize("strategy", ["sdpa", "chunked"])
@settings(max_examples=30)
@given(call=cross_attention_calls())
def test_a_cross_attention_processor_stands_in_exactly(strategy, call):
    module, hidden, context, mask, dtype = call
    api = classes.load()
    original = module.processor
    reference = copy.deepcopy(module).double()
    reference.set_processor(api.AttnProcessor())  # the baddbmm processor, in float64
    with torch.no_grad():
        expected = reference(hidden, context, attention_mask=mask)
        module.to(dtype)
        cast = [None if t is None else t.to(dtype) for t in (hidden, context, mask)]
        with npu_port.attention_strategy(strategy, target=module, memory_budget=4096) as handle:
            assert type(module.processor) is RoutedAttnProcessor
            stands_in_for = type(original) if type(original) is not api.XFormersAttnProcessor else api.default_processor
            assert module.processor.__class__ is stands_in_for
            got = module(cast[0], cast[1], attention_mask=cast[2])
    assert module.processor is original
    assert got.dtype == dtype
    assert_matches(got, expected, dtype)
    assert handle.calls == {KERNEL[strategy]: 1}


@CROSS_ATTENTION_LAYOUT[0]
@CROSS_ATTENTION_LAYOUT[1]
def test_cross_attention_kwargs_are_refused_as_the_originals_refuse_them():
    from diffusers.models.cross_attention import CrossAttention

    module = CrossAttention(8, heads=2, dim_head=4)
    hidden = torch.randn(1, 3, 8)
    with pytest.raises(TypeError, match="scale"):
        module(hidden, scale=0.5)  # the original processor
    with npu_port.attention_strategy("sdpa", target=module):
        name = module.processor.__class__.__name__
        with pytest.raises(TypeError) as info:
            module(hidden, scale=0.5)
    assert str(info.value) == f"{name}.__call__() got an unexpected argument: 'scale'"


def reference_run():
    """The tiny pipeline's outputs in float64 with diffusers' own attention, and the attention modules that ran (one
    per call), in order."""
    kinds = attention_kinds()
    reference = tiny_pipeline()
    reference.unet.double()
    reference.vae.double()
    ran = []
    handles = [m.register_forward_hook(lambda m, *_: ran.append(m)) for c in (reference.unet, reference.vae)
               for m in c.modules() if isinstance(m, kinds)]  # fmt: skip
    expected = run_pipeline(reference, dtype=torch.float64)
    for handle in handles:
        handle.remove()
    return expected, ran


# ---- strategies on targets whose attention is legacy ----------------------------------------------------------------


@pytest.mark.diffusers_below("0.17")
def test_a_strategy_on_a_pipeline_routes_its_legacy_attention_inside_it_only():
    """0.11's ``CrossAttention`` and ``AttentionBlock`` (0.11-0.16) have no processor: a strategy applied to the
    pipeline routes them through its kernels all the same, while the same classes outside the pipeline run their own
    code (not even the process-wide strategy)."""
    api = classes.load()
    legacy_kinds = tuple(cls for cls in (api.LegacyCrossAttention, api.AttentionBlock) if cls is not None)
    expected, ran = reference_run()

    pipe, outside = tiny_pipeline(), tiny_pipeline(seed=3)
    legacy = [m for c in (pipe.unet, pipe.vae) for m in c.modules() if isinstance(m, legacy_kinds)]
    expected_outside = run_pipeline(outside)
    before = class_state(*legacy_kinds)
    with (
        npu_port.attention_strategy("vanilla") as process,
        npu_port.attention_strategy("chunked", target=pipe) as handle,
    ):
        got = run_pipeline(pipe)
        got_outside = run_pipeline(outside)
        states = handle.applied.states()
    assert legacy and len(ran) == handle.calls["chunked"] and set(handle.calls) == {"chunked"}
    assert handle.applied.calls["legacy"] == sum(isinstance(m, legacy_kinds) for m in ran)
    assert sorted(s.processor for s in states if s.detail.startswith("legacy")) == sorted(
        type(m).__name__ for m in legacy
    )
    assert process.calls == {}
    for tensor, reference_tensor in zip(got, expected):
        assert_matches(tensor, reference_tensor, torch.float32)
    for tensor, original in zip(got_outside, expected_outside):
        assert torch.equal(tensor, original)
    assert_same_state(before)
    assert active_patches() == []


@pytest.mark.diffusers_below("0.35")
def test_a_process_wide_strategy_before_the_dispatcher_declines_nothing():
    """A release older than diffusers' attention dispatcher has no backend to choose: its absence is by design, so a
    process-wide strategy says nothing about it (no warning, no decline in the report)."""
    import warnings

    import diffusers  # noqa: F401  (the dispatcher's backend is chosen only once diffusers is imported)

    from npu_port.upstream import UpstreamDeclinedWarning, declines, forget_declines

    forget_declines()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UpstreamDeclinedWarning)
        with npu_port.attention_strategy("sdpa") as handle:
            report = handle.report()
    assert report["declines"] == [] and declines() == []


# ---- diffusers' xformers switch, whatever the version ---------------------------------------------------------------


def _processors(pipe):
    kinds = classes.load().attention_module_classes
    return {n: m.processor for c in (pipe.unet, pipe.vae) for n, m in c.named_modules() if isinstance(m, kinds)}


def test_enable_xformers_routes_every_attention_of_the_installed_diffusers_and_disable_undoes_it(xformers_hook):
    api = classes.load()
    expected, ran = reference_run()

    pipe = tiny_pipeline()
    before = class_state(api.LegacyCrossAttention, api.AttentionBlock)
    processors = _processors(pipe)
    with npu_port.attention_strategy("chunked") as handle:
        pipe.enable_xformers_memory_efficient_attention()
        route = xformers_route(pipe)
        got = run_pipeline(pipe)
    legacy = [cls.__name__ for cls in (api.LegacyCrossAttention, api.AttentionBlock) if cls is not None]
    assert (route.legacy.classes if route.legacy else []) == legacy
    assert (route.strategy is not None) == bool(api.attention_module_classes)
    if route.strategy is not None:
        assert all(type(p) is RoutedAttnProcessor for p in _processors(pipe).values())
    routed = handle.calls.get("chunked", 0) + (route.strategy.calls.get("chunked", 0) if route.strategy else 0)
    assert len(ran) == routed > 0 and set(handle.calls) <= {"chunked"}  # every attention computed was routed
    for tensor, reference_tensor in zip(got, expected):  # the noise prediction and the decoded image
        assert_matches(tensor, reference_tensor, torch.float32)

    pipe.disable_xformers_memory_efficient_attention()
    assert xformers_route(pipe) is None and active_patches() == []
    assert_same_state(before)
    assert all(_processors(pipe)[name] is p for name, p in processors.items())
    with npu_port.attention_strategy("chunked") as handle:
        again = run_pipeline(pipe)  # diffusers' own attention again: nothing reaches npu-port
    assert handle.calls == {}
    for tensor, reference_tensor in zip(again, expected):
        assert_matches(tensor, reference_tensor, torch.float32)


# ---- npu-port run on a project that pins its diffusers --------------------------------------------------------------


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The fixture project, the tiny models saved for it (this diffusers' format), and a clean environment."""
    root = tmp_path_factory.mktemp("old-diffusers-project")
    shutil.copytree(PROJECT, root / "project")
    tiny_unet().save_pretrained(str(root / "models" / "unet"))
    tiny_vae().save_pretrained(str(root / "models" / "vae"))
    env = {k: v for k, v in os.environ.items() if k not in ("NPU_PORT_DEVICE", "PYTHONPATH")}
    env.update(NPU_PORT_CACHE_DIR=str(root / "cache"), PYTHONWARNINGS="ignore")
    return root, env


def _generate(project, *arguments, npu_port_run=False, report=None):
    root, env = project
    run = ["-m", "npu_port", "run", "--device", "cpu", *(["--report", str(report)] if report else [])]
    command = [sys.executable, *(run if npu_port_run else []), "generate.py"]
    command += ["--models", str(root / "models"), *arguments]
    return subprocess.run(command, cwd=root / "project", env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.e2e
@pytest.mark.slow
def test_the_project_stops_with_its_own_error_without_npu_port(project):
    root, _ = project
    result = _generate(project, "--out", str(root / "plain.pt"))
    assert result.returncode != 0 and "Torch not compiled with CUDA enabled" in result.stderr
    assert not (root / "plain.pt").exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_under_npu_port_run_the_project_runs_unchanged_and_matches_the_float64_reference(project):
    import diffusers

    root, _ = project
    ours = _generate(project, "--out", str(root / "ours.pt"), npu_port_run=True, report=root / "run.json")
    assert ours.returncode == 0, ours.stderr[-4000:]
    said = [line for line in ours.stderr.splitlines() if line.startswith("npu-port")]
    assert any("GeneratePipeline.enable_xformers_memory_efficient_attention() -> " in line for line in said), said
    assert not any("pip install" in line for line in said), said
    report = json.loads((root / "run.json").read_text())
    # diffusers' own pre-processor attention is routed as soon as the project imports diffusers, like the project's
    expected_classes = {
        "0.11": ["diffusers.models.attention.CrossAttention", "diffusers.models.attention.AttentionBlock"],
        "0.14": ["diffusers.models.attention.AttentionBlock"],
    }.get(".".join(diffusers.__version__.split(".")[:2]), [])
    assert report["legacy_attention_classes"] == expected_classes
    assert [item["object"] for item in report["enable_xformers_routed"]] == ["GeneratePipeline"]
    routed_calls = [*report["attention_calls"].values(), *report["enable_xformers_routed"][0]["calls"].values()]
    assert sum(routed_calls) > 0 and report["exit_code"] == 0
    reference = _generate(project, "--out", str(root / "reference.pt"), "--device", "cpu", "--dtype", "float64")
    assert reference.returncode == 0, reference.stderr[-4000:]
    got, expected = torch.load(root / "ours.pt"), torch.load(root / "reference.pt")
    assert got["xformers"] is True and expected["xformers"] is False, diffusers.__version__  # the drop-in was seen
    for name in ("noise", "image"):
        assert got[name].dtype == torch.float32
        assert_matches(got[name], expected[name], torch.float32)
