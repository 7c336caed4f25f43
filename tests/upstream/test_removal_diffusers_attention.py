"""Each piece of the diffusers adapter's attention area taken away, as a release that moved it would: the pipelines
still make the same image, with what needed the piece on diffusers' own path, one warning naming diffusers, its
version and the piece, and ``explain()`` / ``report()`` saying what was not routed. Nothing raises in a forward.

Two kinds of pipelines:

* the tiny pipelines of ``npu-port infer`` (``tiny``: Stable Diffusion with a CLIP text encoder; ``tiny-dit``;
  ``tiny-flux``: FluxAttention modules and a dispatcher-calling processor), through ``generate`` as a user runs them.
  Each piece runs on the pipelines where it is at work (``RUNS``: the attention classes and ``AttnProcessor2_0`` on
  all three, the mixin and the dispatcher on Flux's), and the pieces no tiny pipeline uses (the other standard
  processors, ``deprecate``) on ``tiny-dit``, the quickest: their decline is made when the strategy is applied;
* the old-diffusers fixture (a UNet and a VAE built from configs every diffusers since 0.11 accepts), for every
  piece the installed release should have — the one test that also runs under the old diffusers of the
  compatibility matrix, where ``AttentionBlock``, 0.11's ``CrossAttention`` and the 0.12-0.14 names are at work.

Same image: uint8-equal to the run with every piece in place for the tiny pipelines. The old-diffusers fixture's
outputs are compared as tensors: there a piece taken away can move a module from npu-port's kernel to diffusers'
own computation (``AttentionBlock``'s ``baddbmm`` with a float32 softmax, 0.11's ``CrossAttention``), which rounds
differently; the tolerance (``CLOSE``) is the float32 one the compatibility tests use against diffusers' own
attention, and where the routed and the unrouted computation are the same kernel the outputs are equal.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

import npu_port
from npu_port.upstream import UpstreamDeclinedWarning, UpstreamMissingError, declines
from npu_port.upstream.diffusers import ADAPTER
from npu_port.upstream.diffusers import attention as upstream

from .removal import in_era, one_decline, remove

pytest.importorskip("diffusers")

pytestmark = pytest.mark.slow

FEATURES = (
    upstream.MODULES,
    upstream.STANDARD,
    upstream.DISPATCH,
    upstream.SCALE,
    upstream.PIPELINES,
    upstream.XFORMERS,
    upstream.LEGACY,
)
PIECES = [p.name for p in ADAPTER.pieces() if p.feature in FEATURES]
TINY = ("tiny", "tiny-dit", "tiny-flux")
#: The tiny pipelines each piece is taken away from (see the module docstring); the others: below.
RUNS = {
    "Attention": TINY,
    "AttentionModuleMixin": ("tiny-flux",),
    "AttnProcessor": ("tiny-dit",),
    "AttnProcessor2_0": TINY,
    "FusedAttnProcessor2_0": ("tiny-dit",),
    "XFormersAttnProcessor": ("tiny-dit",),
    "AttnProcessorNPU": ("tiny-dit",),
    upstream.STEPS: ("tiny", "tiny-dit"),
    "dispatch_attention_fn": ("tiny-flux",),
    "deprecate": ("tiny-dit",),
    "DiffusionPipeline": ("tiny", "tiny-dit"),
}
#: Pieces with a scenario of their own: the xformers hook (``ModelMixin``; ``DiffusionPipeline`` too), the process-
#: wide routing of diffusers' legacy classes (``npu-port run``); they are at work only in releases up to 0.16.
ELSEWHERE = {"ModelMixin", "AttentionBlock", "CrossAttention"}
CLOSE = {"atol": 3e-5, "rtol": 3e-5}


def test_every_piece_has_a_scenario():
    assert sorted(PIECES) == sorted(set(RUNS) | ELSEWHERE)


def _pixels(image):
    return (np.clip(image, 0.0, 1.0) * 255).round().astype(np.uint8)


# ---- the tiny pipelines ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``tiny(name)``: the tiny pipeline ``name`` (loaded once per module), the request (``sdpa``, 2 steps) and its
    image with every piece in place."""
    pytest.importorskip("transformers")
    from npu_port.infer.models import load_pipeline
    from npu_port.infer.run import GenerationRequest, generate

    cache = str(tmp_path_factory.mktemp("npu-port-models"))
    loaded = {}

    def get(name):
        if name not in loaded:
            saved = os.environ.get("NPU_PORT_CACHE_DIR")
            os.environ["NPU_PORT_CACHE_DIR"] = cache
            try:
                pipeline = load_pipeline(name, torch.device("cpu"), torch.float32, progress_bar=False)
            finally:
                if saved is None:
                    os.environ.pop("NPU_PORT_CACHE_DIR", None)
                else:
                    os.environ["NPU_PORT_CACHE_DIR"] = saved
            request = GenerationRequest(strategy="sdpa", steps=2, seed=0)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                intact = generate(pipeline, request)
            assert not [w for w in caught if issubclass(w.category, UpstreamDeclinedWarning)]
            # text encoders are transformers' (routed from the versions npu_port/support.py names): not this test's
            diffusers_lines = [x for x in intact.strategy_explanation.splitlines() if "text_encoder" not in x]
            assert not [x for x in diffusers_lines if "not routed" in x]
            loaded[name] = (pipeline, request, _pixels(intact.image))
        return loaded[name]

    return get


@pytest.mark.diffusers_min("0.35")
@pytest.mark.parametrize("name,model", [(name, model) for name in RUNS for model in RUNS[name]])
def test_without_the_piece_the_tiny_pipeline_makes_the_same_image_with_one_warning(tiny, monkeypatch, name, model):
    from npu_port.infer.run import generate

    loaded, request, expected = tiny(model)
    remove(monkeypatch, ADAPTER, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = generate(loaded, request)
    message = one_decline(caught, ADAPTER, name)
    feature = ADAPTER.piece(name).feature
    assert message.startswith(f"{feature}: diffusers {ADAPTER.version()} has no {name} (")
    assert f"not routed: {message}" in result.strategy_explanation
    assert np.array_equal(_pixels(result.image), expected)


@pytest.mark.diffusers_min("0.35")
@pytest.mark.parametrize("name", ["ModelMixin", "DiffusionPipeline"])
def test_without_the_piece_the_xformers_switches_of_the_other_class_still_route_the_same(tiny, monkeypatch, name):
    """``npu-port run``'s hook on diffusers' xformers switches: with one of the two classes gone, its switches stay
    diffusers' own (declined) and the other class's still install the strategy: the pipeline's switch without
    ``ModelMixin``, the models' switches without ``DiffusionPipeline`` (a pipeline's own switch, diffusers', would
    then reach the attention modules' switches, which need xformers)."""
    from npu_port.infer.run import call_arguments
    from npu_port.integrations.legacy_attention import hook_enable_xformers, xformers_route

    loaded, request, _ = tiny("tiny-dit")
    pipe = loaded.pipe
    switched = [pipe] if name == "ModelMixin" else [pipe.transformer, pipe.vae]

    def run():
        hook = hook_enable_xformers("sdpa")
        try:
            for obj in switched:
                obj.enable_xformers_memory_efficient_attention()
            routed = [obj for obj in (pipe, pipe.transformer, pipe.vae) if xformers_route(obj) is not None]
            with torch.no_grad():
                output = pipe(**call_arguments(loaded, request, torch.Generator("cpu").manual_seed(request.seed)))
            for obj in switched:
                obj.disable_xformers_memory_efficient_attention()
        finally:
            hook.restore()
        return _pixels(np.asarray(output.images[0], dtype=np.float32)), routed

    expected, routed = run()
    assert routed == switched
    remove(monkeypatch, ADAPTER, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, routed = run()
    message = one_decline(caught, ADAPTER, name)
    assert message.startswith(f"{upstream.XFORMERS}: diffusers {ADAPTER.version()} has no {name} (")
    assert routed == switched
    assert any(str(d) == message for d in declines())
    assert np.array_equal(got, expected)


# ---- the old-diffusers fixture: every release of the matrix ----------------------------------------------------------


def _old_outputs(pipe):
    from ..fixtures.old_diffusers import run_pipeline

    return run_pipeline(pipe)


@pytest.mark.parametrize("name", [in_era(name) for name in sorted(set(PIECES) - {"CrossAttention"})])
def test_without_the_piece_a_strategy_on_the_old_fixture_declines_and_computes_the_same(monkeypatch, name):
    from ..fixtures.old_diffusers import tiny_pipeline

    pipe = tiny_pipeline()
    with npu_port.attention_strategy("sdpa", target=pipe) as handle:
        expected = _old_outputs(pipe)
        assert handle.report()["declines"] == []
    remove(monkeypatch, ADAPTER, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if name == "ModelMixin":  # only the xformers hook takes it: applying a strategy needs no ModelMixin
            from npu_port.integrations.legacy_attention import hook_enable_xformers

            hook_enable_xformers("sdpa").restore()
        with npu_port.attention_strategy("sdpa", target=pipe) as handle:
            got = _old_outputs(pipe)
            report, explanation = handle.report(), handle.explain()
    message = one_decline(caught, ADAPTER, name)
    if name != "ModelMixin":
        assert [d["message"] for d in report["declines"]] == [message]
        assert f"not routed: {message}" in explanation
    for tensor, reference in zip(got, expected):
        torch.testing.assert_close(tensor, reference, **CLOSE)


@pytest.mark.parametrize("name", [in_era("CrossAttention"), in_era("AttentionBlock")])
def test_without_the_piece_npu_port_run_routes_the_other_legacy_class_and_declines(monkeypatch, name):
    """``npu-port run`` routes diffusers' own legacy classes process-wide (``diffusers_legacy_classes``): one gone,
    the other is still routed and the pipeline computes the same."""
    from npu_port.integrations.legacy_attention import patch_legacy_attention
    from npu_port.runtime.activate import diffusers_legacy_classes

    from ..fixtures.old_diffusers import tiny_pipeline

    pipe = tiny_pipeline()

    def run():
        patches = [patch_legacy_attention(cls) for cls in diffusers_legacy_classes()]
        try:
            with npu_port.attention_strategy("sdpa"):
                return _old_outputs(pipe), [p.classes for p in patches]
        finally:
            for patch in patches:
                patch.restore()

    expected, routed = run()
    assert name in [cls for classes in routed for cls in classes]
    remove(monkeypatch, ADAPTER, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, routed = run()
    message = one_decline(caught, ADAPTER, name)
    assert message.startswith(f"{upstream.LEGACY}: diffusers {ADAPTER.version()} has no {name} (")
    assert name not in [cls for classes in routed for cls in classes]
    assert any(message in str(d) for d in declines())
    for tensor, reference in zip(got, expected):
        torch.testing.assert_close(tensor, reference, **CLOSE)


# ---- what declining must not do --------------------------------------------------------------------------------------


@pytest.mark.diffusers_min(upstream.ERAS["Attention"][0])
def test_a_custom_processor_asked_for_where_the_attention_classes_are_gone_is_refused_before_any_change(monkeypatch):
    from ..fixtures.old_diffusers import tiny_unet

    processor = upstream.get("AttnProcessor")
    unet = tiny_unet()
    before = dict(unet.attn_processors)
    for name in upstream.expected("Attention", "AttentionModuleMixin"):
        remove(monkeypatch, ADAPTER, name)
    with pytest.raises(UpstreamMissingError, match=f"^{upstream.MODULES} needs Attention"):
        npu_port.set_attention_strategy(processor, target=unet)
    assert all(unet.attn_processors[name] is processor for name, processor in before.items())


@pytest.mark.diffusers_min("0.15")
def test_a_module_without_something_the_processor_steps_read_keeps_its_processor_and_computes_the_same():
    """An attention module that lacks an attribute npu-port's processor reads (a release that renamed it) is not
    stood in on: its own processor runs, routed where its code calls SDPA — never an AttributeError in a forward."""
    from ..fixtures.old_diffusers import run_pipeline, tiny_pipeline

    pipe = tiny_pipeline()
    with npu_port.attention_strategy("sdpa", target=pipe) as handle:
        expected = run_pipeline(pipe)
        assert handle.applied.counts()["replaced"] == len(handle.applied.modules)
    selves = [
        m
        for m in pipe.unet.modules()
        if isinstance(m, upstream.attention_module_classes()) and not m.is_cross_attention
    ]
    for module in selves:
        del module.norm_cross  # read by npu-port's steps; diffusers' reads it for cross-attention only
    with npu_port.attention_strategy("sdpa", target=pipe) as handle:
        got = run_pipeline(pipe)
        states = handle.applied.states()
    assert sum(s.state == "routed" for s in states) == len(selves) > 0
    for tensor, reference in zip(got, expected):
        assert torch.equal(tensor, reference)
