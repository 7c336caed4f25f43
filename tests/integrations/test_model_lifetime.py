"""A strategy holds for a model's whole life: the model is freed when dropped (no ``restore()`` needed), every
processor set on it later is routed through the strategy's kernel, and what cannot be routed is said to be.

"Routed" is counted at the kernel: the strategy used here runs a registered test kernel that counts its calls (the
math kernel's result), so a call that took diffusers' own ``baddbmm`` path is a call missing from the count. "Matches"
means the unpatched model with the very same processors, to a float32 model-level tolerance.
"""

from __future__ import annotations

import copy
import gc
import math
import sys
import weakref
from typing import Iterator, List

import pytest
import torch
from diffusers import UNet2DConditionModel
from diffusers.models.attention_processor import (
    Attention,
    AttnAddedKVProcessor,
    AttnProcessor,
    AttnProcessor2_0,
    CustomDiffusionAttnProcessor,
    IPAdapterAttnProcessor,
    SanaLinearAttnProcessor2_0,
    SlicedAttnAddedKVProcessor,
    SlicedAttnProcessor,
    XFormersAttnProcessor,
)

import npu_port
from npu_port._patching import PatchLeftInPlace
from npu_port.attn import get_kernel
from npu_port.integrations.diffusers import RoutedAttnProcessor, apply_to_target, patches, tiny, watch
from npu_port.integrations.diffusers.applied import layered_modules
from npu_port.integrations.diffusers.scores import rewrite_call
from npu_port.integrations.legacy_attention import active_patches as legacy_patches
from npu_port.integrations.legacy_attention import hook_enable_xformers, patch_legacy_attention
from npu_port.strategy.registry import unregister_strategy

from ..fixtures.legacy_attention import LegacyTransformer

pytestmark = pytest.mark.diffusers_min("0.27")

KERNEL = "test_counting_math"
STRATEGY = "test-counting"
ATOL, RTOL = 2e-5, 1e-4
ORIGINAL_CALLS = {cls: vars(cls)["__call__"] for cls in (AttnProcessor, SlicedAttnProcessor, XFormersAttnProcessor)}


class CountingKernel(npu_port.Kernel):
    """The math kernel, counting the calls (and their batch x heads) that reach it."""

    name = KERNEL
    summary = "math, counted (test)"
    calls: List[tuple] = []

    def run(self, call):
        CountingKernel.calls.append(tuple(call.query.shape))
        return get_kernel("math").run(call)


@pytest.fixture
def counted() -> Iterator[List[tuple]]:
    """A registered kernel and a strategy that runs it; yields the list of calls that reached it."""
    from npu_port.attn import registry

    npu_port.register_kernel(CountingKernel)
    npu_port.register_strategy(STRATEGY, kernel=KERNEL, description="counted math (test)")
    CountingKernel.calls = []
    try:
        yield CountingKernel.calls
    finally:
        unregister_strategy(STRATEGY)
        registry._KERNELS.pop(KERNEL, None)
        registry._DEFAULTS.pop(KERNEL, None)


@pytest.fixture(autouse=True)
def _nothing_left_behind():
    watched, layered = watch.watched_modules(), layered_modules()
    yield
    gc.collect()
    assert patches.active_patches() == [], "a test left globals or processor classes patched"
    assert watch.wrapped_classes() == [] and watch.watched_modules() == watched
    assert layered_modules() == layered
    assert all(vars(cls)["__call__"] is fn for cls, fn in ORIGINAL_CALLS.items())


def close(out: torch.Tensor, base: torch.Tensor) -> None:
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, base, atol=ATOL, rtol=RTOL)


def unet_with_heads(seed: int = 0) -> UNet2DConditionModel:
    """The tiny UNet with 2 and 4 heads, so that ``set_attention_slice("auto")`` (heads // 2) slices are >= 1."""
    return tiny.tiny_unet(seed, heads=(2, 4))


def added_kv_unet(seed: int = 0) -> UNet2DConditionModel:
    """A UNet whose attention has added key/value projections (``AttnAddedKVProcessor*``): 4 modules."""
    torch.manual_seed(seed)
    model = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("SimpleCrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "SimpleCrossAttnUpBlock2D"),
        mid_block_type="UNetMidBlock2DSimpleCrossAttn",
        block_out_channels=(16, 32),
        layers_per_block=1,
        norm_num_groups=8,
        cross_attention_dim=tiny.TEXT_DIM,
        attention_head_dim=8,
    )
    return tiny._reseed(model, seed)


def attention_modules(model: torch.nn.Module) -> List[Attention]:
    return [m for m in model.modules() if isinstance(m, Attention)]


# ---- freed when dropped ------------------------------------------------------------------------------------------


def _unet_target():
    unet = tiny.tiny_unet()
    handle = npu_port.set_attention_strategy("sdpa", target=unet)
    tiny.run_tiny(unet)
    unet.set_default_attn_processor()  # a processor set later: hooks, class patches and the shared lease
    tiny.run_tiny(unet)
    return unet, handle


def _pipeline_target():
    pipe = tiny.tiny_dit_pipeline()
    handle = npu_port.set_attention_strategy("sdpa", target=pipe)
    tiny.run_tiny_pipeline(pipe, steps=1)
    return pipe, handle


def _attention_target():
    attn = Attention(query_dim=16, heads=2, dim_head=8)
    handle = npu_port.set_attention_strategy("chunked", target=attn)
    attn(torch.randn(1, 3, 16))
    attn.set_processor(SlicedAttnProcessor(1))
    attn(torch.randn(1, 3, 16))
    return attn, handle


def _kept_processor_target():
    sd3 = tiny.tiny_sd3_transformer()  # joint attention: kept, its SDPA call routed through patched globals
    handle = npu_port.set_attention_strategy("sdpa", target=sd3)
    tiny.run_tiny(sd3)
    assert patches.active_patches() != []
    return sd3, handle


def _legacy_target():
    model = LegacyTransformer()
    handle = patch_legacy_attention(model)
    model(torch.randn(1, 4, 32), torch.randn(1, 3, 16))
    return model, handle


def _xformers_switch_target():
    hook = hook_enable_xformers("sdpa")
    unet = tiny.tiny_unet()
    unet.enable_xformers_memory_efficient_attention()  # under the hook: the strategy instead of xformers
    tiny.run_tiny(unet)
    return unet, hook


TARGETS = {
    "model": _unet_target,
    "pipeline": _pipeline_target,
    "attention": _attention_target,
    "kept-processor model": _kept_processor_target,
    "legacy module": _legacy_target,
    "enable_xformers under the hook": _xformers_switch_target,
}


@pytest.mark.parametrize("kind", list(TARGETS))
def test_a_model_dropped_without_restore_is_freed_and_takes_its_routing_with_it(kind):
    target, handle = TARGETS[kind]()
    gone = weakref.ref(target)
    components = [weakref.ref(m) for m in getattr(target, "components", {}).values() if isinstance(m, torch.nn.Module)]
    del target
    gc.collect()
    try:
        assert gone() is None, f"{kind}: npu-port's bookkeeping keeps the model alive"
        assert all(ref() is None for ref in components)
        if kind in ("model", "pipeline", "attention", "kept-processor model"):
            assert handle.target is None and "freed" in repr(handle)
            assert patches.active_patches() == []  # the last module gone released the shared patches
    finally:
        handle.restore()  # with the model gone: nothing to put back, and no error
    assert legacy_patches() == []


def test_the_watcher_table_does_not_grow_with_models_that_are_gone():
    before = watch.watched_modules()
    handles = []
    for seed in range(3):
        unet = tiny.tiny_unet(seed)
        handles.append(npu_port.set_attention_strategy("sdpa", target=unet))
        assert watch.watched_modules() == before + 8
        del unet
        gc.collect()
        assert watch.watched_modules() == before
    assert watch.wrapped_classes() == []  # the last watched module gone: set_processor is the original again
    assert Attention.set_processor is vars(Attention)["set_processor"]
    assert all("freed" in handle.explain() or "(freed" in repr(handle) for handle in handles)


def test_a_handle_kept_alive_still_restores_a_live_model_exactly():
    unet = tiny.tiny_unet()
    saved = {n: m.processor for n, m in unet.named_modules() if isinstance(m, Attention)}
    base = tiny.run_tiny(unet)
    handle = npu_port.set_attention_strategy("sdpa", target=unet)
    gc.collect()  # nothing of ours may have been collected while the model lives
    assert handle.target is unet
    handle.restore()
    assert all(m.processor is saved[n] for n, m in unet.named_modules() if isinstance(m, Attention))
    assert torch.equal(tiny.run_tiny(unet), base)


# ---- every later processor routed ----------------------------------------------------------------------------


def test_set_default_attn_processor_after_the_strategy_routes_every_call(counted):
    unet = tiny.tiny_unet()
    handle = npu_port.set_attention_strategy(STRATEGY, target=unet)
    unet.set_default_attn_processor()  # AttnProcessor: baddbmm scores in diffusers
    assert all(type(p) is AttnProcessor for p in unet.attn_processors.values())  # the user's objects, as set
    reference = tiny.tiny_unet()
    reference.set_default_attn_processor()
    base = tiny.run_tiny(reference)
    counted.clear()
    close(tiny.run_tiny(unet), base)
    assert len(counted) == len(attention_modules(unet)) == 8
    assert handle.applied.calls == {"scores": 8}
    text = handle.explain()
    assert "routed: 8 (8 x AttnProcessor)" in text and "replaced" not in text.split("attention modules now:")[1]
    assert "AttnProcessor: get_attention_scores -> bmm at line" in text
    handle.restore()
    assert vars(AttnProcessor)["__call__"] is ORIGINAL_CALLS[AttnProcessor]
    assert torch.equal(tiny.run_tiny(unet), tiny.run_tiny(unet)) and handle.applied.calls == {"scores": 8}


def test_attention_slicing_auto_routes_one_slice_at_a_time_and_matches(counted):
    unet = unet_with_heads()
    reference = unet_with_heads()
    reference.set_attention_slice("auto")
    base = tiny.run_tiny(reference)
    with npu_port.attention_strategy(STRATEGY, target=unet) as handle:
        unet.set_attention_slice("auto")
        assert all(type(p) is SlicedAttnProcessor for p in unet.attn_processors.values())
        counted.clear()
        close(tiny.run_tiny(unet), base)
        modules = attention_modules(unet)
        # every slice of batch*heads rows is one call of the strategy's kernel, never the whole batch*heads at once
        expected = sum(math.ceil(2 * m.heads / m.processor.slice_size) for m in modules)
        assert len(counted) == expected == handle.applied.calls["scores"]
        sizes = {m.processor.slice_size for m in modules}
        assert {shape[0] * shape[1] for shape in counted} <= sizes  # one slice of batch*heads per call
        assert "SlicedAttnProcessor: get_attention_scores -> bmm" in handle.explain()


@pytest.mark.parametrize("when", ["before", "after"])
def test_added_kv_processors_are_routed_whenever_they_were_set(counted, when):
    unet = added_kv_unet()
    reference = added_kv_unet()
    reference.set_default_attn_processor()  # AttnAddedKVProcessor everywhere
    base = tiny.run_tiny(reference)
    if when == "before":
        unet.set_default_attn_processor()
    with npu_port.attention_strategy(STRATEGY, target=unet) as handle:
        if when == "after":
            unet.set_default_attn_processor()
        assert all(type(p) is AttnAddedKVProcessor for p in unet.attn_processors.values())
        counted.clear()
        close(tiny.run_tiny(unet), base)
        assert len(counted) == len(attention_modules(unet)) == 4
        if when == "before":
            assert handle.applied.counts()["routed"] == 4  # it was kept and unrouted at apply time before
        for module in attention_modules(unet):  # and sliced, one slice at a time
            module.set_attention_slice(1)
        assert all(type(p) is SlicedAttnAddedKVProcessor for p in unet.attn_processors.values())
        counted.clear()
        reference.set_attention_slice(1)
        close(tiny.run_tiny(unet), tiny.run_tiny(reference))
        assert len(counted) == sum(2 * m.heads for m in attention_modules(unet))


def _custom_diffusion_processors(unet: UNet2DConditionModel, seed: int = 1) -> dict:
    torch.manual_seed(seed)
    processors = {}
    for name in unet.attn_processors:
        attn = unet.get_submodule(name.rsplit(".processor", 1)[0])
        cross = name.endswith("attn2.processor")
        processors[name] = CustomDiffusionAttnProcessor(
            train_kv=cross,
            train_q_out=False,
            hidden_size=attn.inner_dim,
            cross_attention_dim=tiny.TEXT_DIM if cross else None,
        )
    return processors


def test_custom_diffusion_processors_set_later_are_routed_and_keep_their_weights(counted):
    unet = tiny.tiny_unet()
    reference = tiny.tiny_unet()
    processors = _custom_diffusion_processors(reference)
    ours = copy.deepcopy(processors)  # the same weights (set_attn_processor empties the dict it is given)
    reference.set_attn_processor(processors)
    base = tiny.run_tiny(reference)
    with npu_port.attention_strategy(STRATEGY, target=unet) as handle:
        unet.set_attn_processor(ours)
        counted.clear()
        close(tiny.run_tiny(unet), base)
        assert len(counted) == 8 and handle.applied.calls == {"scores": 8}
        states = {s.state for s in handle.applied.states()}
        assert states == {"routed"}


def test_an_xformers_processor_set_later_runs_off_cuda_through_the_strategy(counted):
    unet = tiny.tiny_unet()
    base = tiny.run_tiny(tiny.tiny_unet())
    with npu_port.attention_strategy(STRATEGY, target=unet) as handle:
        unet.set_attn_processor(XFormersAttnProcessor())  # would import xformers (absent here) at the first call
        counted.clear()
        close(tiny.run_tiny(unet), base)
        assert len(counted) == 8
        assert "runs AttnProcessor2_0's steps with the attention core routed" in handle.explain()
    assert vars(XFormersAttnProcessor)["__call__"] is ORIGINAL_CALLS[XFormersAttnProcessor]


def test_ip_adapter_processor_without_sdpa_has_all_three_pairs_rewritten():
    routed, how = rewrite_call(vars(IPAdapterAttnProcessor)["__call__"])
    assert routed is not None and how.startswith("get_attention_scores -> bmm at line ")
    assert len(how.split("line ")[1].split(", ")) == 3  # the text attention and both IP-Adapter branches
    code_names = set(routed.__code__.co_names) | set(routed.__code__.co_freevars)
    assert "get_attention_scores" not in routed.__code__.co_names and "__npu_port_attend_scores__" in code_names


# ---- what cannot be routed is said to be -------------------------------------------------------------------


class KeepsTheMaps:
    """A user processor in diffusers' style that keeps the attention probabilities (prompt-to-prompt style)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **kwargs):
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        query = attn.head_to_batch_dim(attn.to_q(hidden_states))
        key = attn.head_to_batch_dim(attn.to_k(context))
        value = attn.head_to_batch_dim(attn.to_v(context))
        attention_probs = attn.get_attention_scores(query, key, attention_mask)
        hidden_states = torch.bmm(attention_probs, value)
        self.maps = attention_probs
        return attn.to_out[1](attn.to_out[0](attn.batch_to_head_dim(hidden_states)))


class InlineScores:
    """A user processor that computes attention inline: baddbmm, softmax, bmm."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **kwargs):
        query = attn.head_to_batch_dim(attn.to_q(hidden_states))
        key = attn.head_to_batch_dim(attn.to_k(hidden_states))
        value = attn.head_to_batch_dim(attn.to_v(hidden_states))
        empty = torch.empty(query.shape[0], query.shape[1], key.shape[1])
        probs = torch.baddbmm(empty, query, key.transpose(1, 2), beta=0, alpha=attn.scale).softmax(-1)
        return attn.to_out[0](attn.batch_to_head_dim(torch.bmm(probs, value)))


class FollowsDiffusers:
    """A user processor in diffusers' style whose probabilities are used only by the bmm: routed."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **kwargs):
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        query = attn.head_to_batch_dim(attn.to_q(hidden_states))
        key = attn.head_to_batch_dim(attn.to_k(context))
        value = attn.head_to_batch_dim(attn.to_v(context))
        probs = attn.get_attention_scores(query, key, attention_mask)
        out = torch.bmm(probs, value)
        return attn.to_out[1](attn.to_out[0](attn.batch_to_head_dim(out)))


@pytest.mark.parametrize(
    ("processor", "state", "detail"),
    [
        (KeepsTheMaps, "kept", "'attention_probs' (the probabilities) is also read at line"),
        (InlineScores, "kept", "computes attention inline (baddbmm / matmul + softmax)"),
        (FollowsDiffusers, "routed", "get_attention_scores -> bmm at line"),
        (SanaLinearAttnProcessor2_0, "linear", "linear attention (not softmax attention): nothing to route"),
    ],
)
def test_each_module_is_reported_as_it_is_now(counted, processor, state, detail):
    attn = Attention(query_dim=16, heads=2, dim_head=8)
    hidden = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        attn.set_processor(processor())
        base = attn(hidden)
        attn.set_processor(AttnProcessor2_0())
        with npu_port.attention_strategy(STRATEGY, target=attn) as handle:
            assert handle.applied.states()[0].state == "replaced"
            attn.set_processor(processor())
            counted.clear()
            close(attn(hidden), base)
            (now,) = handle.applied.states()
            assert (now.processor, now.state) == (processor.__name__, state) and detail in now.detail
            assert len(counted) == (1 if state == "routed" else 0)
            text = handle.explain()
            assert f"{state}: 1 (1 x {processor.__name__})" in text and detail in text
            if state == "kept":
                assert "NOT routed" in text


class MapsAttention(Attention):
    """A project's Attention subclass with its own get_attention_scores (storing the maps)."""

    def get_attention_scores(self, query, key, attention_mask=None):
        self.maps = super().get_attention_scores(query, key, attention_mask)
        return self.maps


def test_a_project_get_attention_scores_keeps_running_and_is_counted_as_declined(counted):
    attn = MapsAttention(query_dim=16, heads=2, dim_head=8, processor=AttnProcessor())
    hidden = torch.randn(1, 4, 16)
    with torch.no_grad():
        base = attn(hidden)
        with npu_port.attention_strategy(STRATEGY, target=attn) as handle:
            attn.maps = None
            attn.set_processor(AttnProcessor())
            counted.clear()
            assert torch.equal(attn(hidden), base)
            assert attn.maps is not None and counted == []
            assert list(handle.applied.declined.values()) == [1]
            assert "MapsAttention.get_attention_scores is the project's own" in handle.explain()


def test_a_later_patch_of_a_processor_class_by_someone_else_stays(counted):
    unet = tiny.tiny_unet()
    handle = npu_port.set_attention_strategy(STRATEGY, target=unet)
    unet.set_default_attn_processor()
    ours = vars(AttnProcessor)["__call__"]
    assert ours is not ORIGINAL_CALLS[AttnProcessor] and ours.__wrapped__ is ORIGINAL_CALLS[AttnProcessor]

    def theirs(self, *args, **kwargs):
        return ORIGINAL_CALLS[AttnProcessor](self, *args, **kwargs)

    AttnProcessor.__call__ = theirs
    try:
        with pytest.warns(PatchLeftInPlace, match=r"AttnProcessor\.__call__ was replaced by someone else"):
            handle.restore()
        assert vars(AttnProcessor)["__call__"] is theirs
    finally:
        AttnProcessor.__call__ = ORIGINAL_CALLS[AttnProcessor]


def test_our_processor_coming_back_removes_the_hooks():
    unet = tiny.tiny_unet()
    with npu_port.attention_strategy("sdpa", target=unet):
        ours = {n: p for n, p in unet.attn_processors.items()}
        assert all(type(p) is RoutedAttnProcessor for p in ours.values())
        unet.set_attn_processor(AttnProcessor())
        assert all(m._forward_pre_hooks for m in attention_modules(unet))
        unet.set_attn_processor(ours)
        assert not any(m._forward_pre_hooks or m._forward_hooks for m in attention_modules(unet))


def test_apply_to_target_on_a_model_with_a_later_processor_restores_the_user_objects():
    unet = tiny.tiny_unet()
    applied = apply_to_target(unet, npu_port.attention)
    unet.set_default_attn_processor()
    later = dict(unet.attn_processors)
    applied.restore()
    assert all(unet.attn_processors[n] is p for n, p in later.items())  # theirs stay: set after ours
    assert len(applied.left_alone) == 8


PROCESSOR_SOURCE = """
import torch


class FileProcessor:
    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **kwargs):
        query = attn.head_to_batch_dim(attn.to_q(hidden_states))
        key = attn.head_to_batch_dim(attn.to_k(hidden_states))
        value = attn.head_to_batch_dim(attn.to_v(hidden_states))
        probs = attn.get_attention_scores(query, key, attention_mask)
        out = torch.bmm(probs, value)
        return attn.to_out[0](attn.batch_to_head_dim(out))
"""


def test_a_processor_file_edited_since_its_import_is_not_rewritten(tmp_path, monkeypatch):
    import importlib
    import linecache

    (tmp_path / "edited_processor.py").write_text(PROCESSOR_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("edited_processor")
    try:
        loaded = vars(module.FileProcessor)["__call__"]
        edited = PROCESSOR_SOURCE.replace("out = torch.bmm(probs, value)", "out = torch.bmm(probs, value * 2)")
        edited = edited.replace("return attn.to_out[0]", "scaled = 1\n        return attn.to_out[0]")
        (tmp_path / "edited_processor.py").write_text(edited, encoding="utf-8")
        linecache.checkcache(str(tmp_path / "edited_processor.py"))
        routed, why = rewrite_call(loaded)
        assert routed is None
        assert why == "the source of FileProcessor.__call__ on disk differs from the code loaded: not rewritten"
    finally:
        sys.modules.pop("edited_processor", None)


class DeletesTheProbs:
    """Frees the probabilities right after the bmm (``del probs``): rewriting would leave ``del`` a name never bound."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **kwargs):
        query = attn.head_to_batch_dim(attn.to_q(hidden_states))
        key = attn.head_to_batch_dim(attn.to_k(hidden_states))
        value = attn.head_to_batch_dim(attn.to_v(hidden_states))
        probs = attn.get_attention_scores(query, key, attention_mask)
        out = torch.bmm(probs, value)
        del probs
        return attn.to_out[0](attn.batch_to_head_dim(out))


class ValueReadsTheProbs:
    """The bmm's value operand reads the probabilities' name (rebound by the bmm): the routed call could not."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **kwargs):
        query = attn.head_to_batch_dim(attn.to_q(hidden_states))
        key = attn.head_to_batch_dim(attn.to_k(hidden_states))
        value = attn.head_to_batch_dim(attn.to_v(hidden_states))
        probs = attn.get_attention_scores(query, key, attention_mask)
        probs = torch.bmm(probs, value * probs.amax())
        return attn.to_out[0](attn.batch_to_head_dim(probs))


class DefaultFromTheClassBody:
    """A default that names something of the class body: evaluating it again outside the class would fail."""

    GAIN = 1.0

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, gain=GAIN, **kwargs):
        query = attn.head_to_batch_dim(attn.to_q(hidden_states))
        key = attn.head_to_batch_dim(attn.to_k(hidden_states))
        value = attn.head_to_batch_dim(attn.to_v(hidden_states))
        probs = attn.get_attention_scores(query, key, attention_mask)
        out = torch.bmm(probs, value)
        return attn.to_out[0](attn.batch_to_head_dim(out)) * gain


@pytest.mark.parametrize(
    ("processor", "state", "detail"),
    [
        (DeletesTheProbs, "kept", "'probs' (the probabilities) is also deleted at line"),
        (ValueReadsTheProbs, "kept", "the bmm's value operand reads 'probs'"),
        (DefaultFromTheClassBody, "routed", "get_attention_scores -> bmm at line"),
    ],
)
def test_pairs_that_cannot_be_rewritten_exactly_are_left_as_written(counted, processor, state, detail):
    attn = Attention(query_dim=16, heads=2, dim_head=8)
    other = Attention(query_dim=16, heads=2, dim_head=8, processor=processor())  # no strategy on this one
    hidden = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        attn.set_processor(processor())
        base, other_base = attn(hidden), other(hidden)
        with npu_port.attention_strategy(STRATEGY, target=attn) as handle:
            counted.clear()
            close(attn(hidden), base)
            assert torch.equal(other(hidden), other_base)  # the class is shared: untargeted instances run as written
            (now,) = handle.applied.states()
            assert now.state == state and detail in now.detail
            assert len(counted) == (1 if state == "routed" else 0)


def test_a_get_attention_scores_set_on_the_instance_runs_and_is_declined(counted):
    attn = Attention(query_dim=16, heads=2, dim_head=8, processor=AttnProcessor())
    maps = []
    diffusers_scores = attn.get_attention_scores

    def storing(query, key, attention_mask=None):
        maps.append(diffusers_scores(query, key, attention_mask))
        return maps[-1]

    attn.get_attention_scores = storing  # an attention-map hook set on the module itself
    hidden = torch.randn(1, 4, 16)
    with torch.no_grad():
        base = attn(hidden)
        with npu_port.attention_strategy(STRATEGY, target=attn) as handle:
            counted.clear()
            assert torch.equal(attn(hidden), base) and len(maps) == 2 and counted == []
            assert list(handle.applied.declined.values()) == [1]


class RemembersItsModule:
    """A processor that keeps a reference to its module (``self.attn = attn``)."""

    def __call__(self, attn, hidden_states, *args, **kwargs):
        self.attn = attn
        return AttnProcessor2_0()(attn, hidden_states, *args, **kwargs)


@pytest.mark.parametrize("strategy", ["sdpa", "custom-processor"])
def test_a_processor_that_refers_to_its_module_does_not_keep_a_dropped_model_alive(strategy):
    unet = tiny.tiny_unet()
    if strategy == "custom-processor":
        handle = npu_port.set_attention_strategy(strategy, target=unet, processor=RemembersItsModule)
    else:
        unet.set_attn_processor(RemembersItsModule())
        handle = npu_port.set_attention_strategy(strategy, target=unet)
    tiny.run_tiny(unet)
    modules = [weakref.ref(m) for m in attention_modules(unet)]
    del unet, handle
    gc.collect()
    assert [ref() for ref in modules] == [None] * 8


def test_a_processor_assigned_without_set_processor_is_reported_as_not_routed(counted):
    unet = tiny.tiny_unet()
    with npu_port.attention_strategy(STRATEGY, target=unet) as handle:
        module = attention_modules(unet)[0]
        module.processor = AttnProcessor2_0()  # what diffusers' PAG pipelines do: no set_processor, no watcher
        counted.clear()
        tiny.run_tiny(unet)
        assert len(counted) == 7  # that module's call went to diffusers
        state = handle.applied.states()[0]
        assert state.state == "kept" and "set without set_processor" in state.detail


def test_a_copy_or_a_saved_model_with_route_hooks_does_not_route_into_the_application(counted, tmp_path):
    unet = tiny.tiny_unet()
    with npu_port.attention_strategy(STRATEGY, target=unet) as handle:
        unet.set_default_attn_processor()  # kept processors: hooks on every attention module
        twin = copy.deepcopy(unet)
        torch.save(unet, tmp_path / "unet.pt")  # hooks are objects now: the model pickles
        counted.clear()
        close(tiny.run_tiny(twin), tiny.run_tiny(unet))
        assert handle.applied.calls == {"scores": 8}  # the copy's 8 calls are not counted here: its hooks are inert
    loaded = torch.load(tmp_path / "unet.pt", weights_only=False)
    assert torch.equal(tiny.run_tiny(loaded), tiny.run_tiny(unet))
