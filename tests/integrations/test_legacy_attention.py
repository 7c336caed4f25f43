"""Legacy attention: diffusers <= 0.14-era ``_attention`` code routed through npu-port's strategy, and diffusers'
xformers switches hooked — the same results, no xformers, no CUDA, and everything undone by identity.

The legacy module is our own fixture (:mod:`tests.fixtures.legacy_attention`). "Reference" is always the fixture's
original, un-patched method run in float64 (upcast flags off: in float64 they would only downcast), captured below
before anything is patched.
"""

from __future__ import annotations

import copy
import gc
import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from diffusers import DiffusionPipeline, ModelMixin
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import npu_port
from npu_port.hits import PROJECT
from npu_port.integrations.diffusers import RoutedAttnProcessor, tiny
from npu_port.integrations.legacy_attention import (
    LegacyPatch,
    active_patches,
    find_legacy_attention,
    hook_enable_xformers,
    hook_hits,
    is_legacy_attention_class,
    patch_legacy_attention,
    unhook_enable_xformers,
    xformers_route,
)
from npu_port.integrations.legacy_attention.contract import XFORMERS_SETTER
from npu_port.integrations.legacy_attention.xformers_hook import ENABLE
from npu_port.strategy.api import StrategyHandle

from ..conftest import HOOKED
from ..fixtures.legacy_attention import (
    FrameAttention,
    LegacyCrossAttention,
    LegacyTransformer,
    LegacyTransformerBlock,
    legacy_model_mixin_class,
)

METHODS = ("_attention", "_sliced_attention", "get_attention_scores", "set_use_memory_efficient_attention_xformers")
ORIGINAL = {name: vars(LegacyCrossAttention)[name] for name in METHODS}
KERNEL = {"sdpa": "sdpa", "chunked": "chunked", "vanilla": "math"}
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 4e-2}
BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "legacy_attention_memory.py"
#: Tests on today's ``Attention`` and the ``tiny`` models (built with the API of the diffusers extra's floor); the
#: rest also run under the old diffusers of CI's oldest lanes (.ci/run: oldest-0.11, oldest-0.14).
NEW_DIFFUSERS = pytest.mark.diffusers_min("0.27")
try:
    from diffusers.models.attention_processor import Attention
except ImportError:  # diffusers < 0.15, in the compatibility matrix: the tests that use it are NEW_DIFFUSERS
    Attention = None


# ---- random legacy calls -----------------------------------------------------------------------------------------


@st.composite
def legacy_calls(draw, dtypes=(torch.float32, torch.float64)):
    """A legacy module and a ``(batch*heads, seq, dim)`` call with an additive mask in one of the legacy forms:
    ``(batch*heads, 1, key_len)`` or ``(batch*heads, q_len, key_len)``, masked with -inf, -10000 or finfo.min, or a
    finite bias with -inf. Every query row keeps at least one key (see the fully-masked test for the rest)."""
    batch, heads = draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 3, 4]))
    q_len, key_len, dim = draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.sampled_from([1, 4, 8, 16]))
    dtype = draw(st.sampled_from(dtypes))
    module = LegacyCrossAttention(
        heads * dim,
        heads=heads,
        dim_head=dim,
        upcast_attention=draw(st.booleans()),
        upcast_softmax=draw(st.booleans()),
    )
    if draw(st.booleans()):
        module.scale = draw(st.sampled_from([0.05, 0.7, 2.0]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q, k, v = (
        torch.randn(batch * heads, n, dim, generator=gen, dtype=torch.float64) for n in (q_len, key_len, key_len)
    )
    form = draw(st.sampled_from(["none", "keys", "full"]))
    mask = None
    if form != "none":
        rows = 1 if form == "keys" else q_len
        keep = torch.rand(batch * heads, rows, key_len, generator=gen) < 0.7
        keep[torch.arange(batch * heads)[:, None], torch.arange(rows)[None, :], torch.randint(key_len, (rows,))] = True
        fill = draw(st.sampled_from(["-inf", "-10000", "finfo.min", "bias"]))
        masked = {"-inf": -math.inf, "-10000": -10000.0, "finfo.min": torch.finfo(dtype).min, "bias": -math.inf}[fill]
        kept = torch.randn(keep.shape, generator=gen, dtype=torch.float64) if fill == "bias" else 0.0
        mask = torch.where(keep, kept, torch.tensor(masked, dtype=torch.float64))
    cast = [None if t is None else t.to(dtype) for t in (q, k, v, mask)]
    return module, *cast


def reference(method: str, module: LegacyCrossAttention, *args):
    """The original method in float64, upcast flags off; float tensors converted, other arguments as given."""
    flags = module.upcast_attention, module.upcast_softmax
    module.upcast_attention = module.upcast_softmax = False
    try:
        converted = [a.double() if isinstance(a, torch.Tensor) else a for a in args]
        return ORIGINAL[method](module, *converted)
    finally:
        module.upcast_attention, module.upcast_softmax = flags


def assert_matches(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), expected, atol=tol, rtol=tol)


# ---- the contract --------------------------------------------------------------------------------------------------


class RenamedArguments(nn.Module):
    heads, scale = 2, 0.5

    def _attention(self, q, k, v, mask=None):
        return q

    def reshape_batch_dim_to_heads(self, tensor):
        return tensor.reshape(-1, self.heads)


class NoHeadsOrScale(nn.Module):
    def _attention(self, query, key, value, attention_mask=None):
        return torch.bmm(query, key.transpose(1, 2)).softmax(-1) @ value

    def reshape_batch_dim_to_heads(self, tensor):
        return tensor


@NEW_DIFFUSERS
def test_the_legacy_contract_is_recognised_precisely():
    assert is_legacy_attention_class(LegacyCrossAttention)
    assert is_legacy_attention_class(FrameAttention)  # inherits _attention
    assert not is_legacy_attention_class(Attention)  # diffusers' current Attention: processors, no _attention
    for other in (LegacyTransformerBlock, RenamedArguments, NoHeadsOrScale, nn.Linear, int, "LegacyCrossAttention"):
        assert not is_legacy_attention_class(other), other
    model = LegacyTransformer(layers=1)
    assert [name for name, _ in find_legacy_attention(model)] == ["blocks.0.attn1", "blocks.0.attn2"]
    assert find_legacy_attention(tiny.tiny_unet()) == []


@NEW_DIFFUSERS
def test_targets_without_legacy_attention_are_refused():
    with pytest.raises(ValueError, match="no legacy attention"):
        patch_legacy_attention(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="not a legacy attention class"):
        patch_legacy_attention(Attention)
    with pytest.raises(TypeError, match="expects a torch.nn.Module"):
        patch_legacy_attention(object())
    assert active_patches() == []


# ---- parity --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["sdpa", "chunked", "vanilla"])
@settings(max_examples=60)
@given(call=legacy_calls())
def test_routed_attention_equals_the_original(strategy, call):
    module, q, k, v, mask = call
    expected = reference("_attention", module, q, k, v, mask)
    with (
        npu_port.attention_strategy(strategy, memory_budget=4096) as handle,
        patch_legacy_attention(LegacyCrossAttention),
    ):
        got = module._attention(q, k, v, mask)
    assert got.shape == expected.shape and got.dtype == v.dtype  # (batch, q_len, heads*dim), the value's dtype
    assert_matches(got, expected, q.dtype)
    assert handle.calls == {KERNEL[strategy]: 1}


@settings(max_examples=40)
@given(call=legacy_calls(dtypes=(torch.float16, torch.bfloat16)))
def test_half_precision_calls_with_upcast_flags_match_the_float64_original(call):
    module, q, k, v, mask = call
    expected = reference("_attention", module, q, k, v, mask)
    with npu_port.attention_strategy("chunked"), patch_legacy_attention(LegacyCrossAttention):
        got = module._attention(q, k, v, mask)
    assert got.dtype == v.dtype
    assert_matches(got, expected, q.dtype)


@settings(max_examples=40)
@given(call=legacy_calls(dtypes=(torch.float32, torch.float64, torch.float16)))
def test_get_attention_scores_still_returns_the_probabilities(call):
    module, q, k, _, mask = call
    expected = reference("get_attention_scores", module, q, k, mask)
    with patch_legacy_attention(LegacyCrossAttention):
        got = module.get_attention_scores(q, k, mask)
    assert got.shape == expected.shape and got.dtype == q.dtype
    upcast = module.upcast_attention or module.upcast_softmax  # .float(), as the original: float64 goes down too
    assert_matches(got, expected, torch.float32 if upcast and q.dtype == torch.float64 else q.dtype)


@settings(max_examples=40)
@given(call=legacy_calls(), slice_size=st.integers(1, 9))
def test_sliced_attention_equals_the_original_loop(call, slice_size):
    module, q, k, v, mask = call
    module.set_attention_slice(min(slice_size, module.heads))
    module._slice_size = slice_size  # also sizes that leave rows uncomputed (the original leaves them zero)
    args = (q.shape[1], module.heads * v.shape[-1], mask)
    expected = reference("_sliced_attention", module, q, k, v, *args)
    with npu_port.attention_strategy("chunked"), patch_legacy_attention(LegacyCrossAttention):
        got = module._sliced_attention(q, k, v, *args)
    assert got.shape == expected.shape and got.dtype == q.dtype
    assert_matches(got, expected, q.dtype)


def test_a_row_with_every_key_masked_gives_zeros_where_the_original_gives_nan():
    module = LegacyCrossAttention(8, heads=2, dim_head=4)
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    mask = torch.zeros(2, 3, 5)
    mask[1, 2] = -math.inf
    assert ORIGINAL["_attention"](module, q, k, v, mask)[0, 2, 4:].isnan().all()
    with patch_legacy_attention(LegacyCrossAttention):
        got = module._attention(q, k, v, mask)
        probs = module.get_attention_scores(q, k, mask)
    assert (got[0, 2, 4:] == 0).all() and not got.isnan().any()
    assert (probs[1, 2] == 0).all() and not probs.isnan().any()
    assert_matches(got[:, :2], reference("_attention", module, q, k, v, mask)[:, :2], torch.float32)


def test_half_mask_under_upcast_attention_works_where_the_original_raises():
    module = LegacyCrossAttention(8, heads=2, dim_head=4, upcast_attention=True)
    q, k = torch.randn(2, 3, 4, dtype=torch.float16), torch.randn(2, 5, 4, dtype=torch.float16)
    mask = torch.zeros(2, 1, 5, dtype=torch.float16)
    mask[..., 0] = -10000.0
    with pytest.raises(RuntimeError):
        ORIGINAL["get_attention_scores"](module, q, k, mask)  # baddbmm(half mask, float q, float k)
    with patch_legacy_attention(LegacyCrossAttention):
        probs = module.get_attention_scores(q, k, mask)
    assert_matches(probs, reference("get_attention_scores", module, q, k, mask), torch.float16)


def test_gradients_equal_the_originals():
    module = LegacyCrossAttention(16, heads=4, dim_head=4)
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(8, n, 4, generator=gen, dtype=torch.float64) for n in (6, 7, 7)]
    mask = torch.zeros(8, 1, 7, dtype=torch.float64)
    mask[:, :, -2:] = -10000.0
    grads = []
    for routed in (False, True):
        leaves = [t.clone().requires_grad_() for t in inputs]
        with npu_port.attention_strategy("chunked", memory_budget=2048), patch_legacy_attention(module) as patch:
            if not routed:
                patch.restore()
            out = module._attention(*leaves, mask)
        (out * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)).sum().backward()
        grads.append([t.grad for t in leaves])
    for got, expected in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)


# ---- modules, flags, setters, restore ------------------------------------------------------------------------------


def _inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden, context = torch.randn(2, 10, 32, generator=gen), torch.randn(2, 5, 16, generator=gen)
    mask = torch.zeros(2, 1, 10)
    mask[1, :, -3:] = -10000.0
    return hidden, context, mask


def _legacy_modules(model):
    return [m for m in model.modules() if isinstance(m, LegacyCrossAttention)]


def test_xformers_flag_is_cleared_and_forward_runs_on_cpu():
    torch.manual_seed(0)
    model = LegacyTransformer()
    hidden, context, mask = _inputs()
    with torch.no_grad():
        expected = model(hidden, context, mask)
        for module in _legacy_modules(model):
            module._use_memory_efficient_attention_xformers = True
        with pytest.raises(ModuleNotFoundError, match="xformers"):
            model(hidden, context, mask)
        with npu_port.attention_strategy("chunked") as handle, patch_legacy_attention(model) as patch:
            assert (patch.instances, patch.flags_cleared) == (4, 4)
            assert sorted(patch.classes) == ["FrameAttention", "LegacyCrossAttention"]
            assert not any(m._use_memory_efficient_attention_xformers for m in _legacy_modules(model))
            got = model(hidden, context, mask)
            model.blocks[0].attn1.set_attention_slice(2)  # the sliced path is routed too
            sliced = model(hidden, context, mask)
    assert handle.calls == {"chunked": 8}
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sliced, expected, atol=1e-5, rtol=1e-5)
    assert all(m._use_memory_efficient_attention_xformers for m in _legacy_modules(model))  # flags given back


def test_repo_local_xformers_setters_become_no_ops_that_say_so(caplog):
    model = LegacyTransformer()
    for owner in (model.blocks[0], model.blocks[0].attn2):
        with pytest.raises(ValueError, match="torch.cuda.is_available"):
            owner.set_use_memory_efficient_attention_xformers(True)
    with patch_legacy_attention(model) as patch:
        assert sorted(patch.setters) == ["FrameAttention", "LegacyCrossAttention", "LegacyTransformerBlock"]
        with caplog.at_level(logging.INFO, logger="npu_port.legacy"):
            for block in model.blocks:
                block.set_use_memory_efficient_attention_xformers(True)
        assert [r.getMessage() for r in caplog.records] == [
            "npu-port: LegacyTransformerBlock.set_use_memory_efficient_attention_xformers ignored; "
            "attention runs through npu-port's strategy"
        ]
        assert not any(m._use_memory_efficient_attention_xformers for m in _legacy_modules(model))
    with pytest.raises(ValueError, match="torch.cuda.is_available"):
        model.blocks[0].set_use_memory_efficient_attention_xformers(True)


def test_restore_gives_back_the_very_functions_and_flags():
    classes = (LegacyCrossAttention, FrameAttention, LegacyTransformerBlock)
    before = {cls: dict(vars(cls)) for cls in classes}
    model = LegacyTransformer()
    model.blocks[1].attn2._use_memory_efficient_attention_xformers = True
    patch = patch_legacy_attention(model)
    assert isinstance(patch, LegacyPatch) and patch.flags_cleared == 1
    assert vars(LegacyCrossAttention)["_attention"] is not ORIGINAL["_attention"]
    assert "_attention" in vars(FrameAttention)  # patched on the class itself, so restore can take it off again
    patch.restore()
    patch.restore()  # twice is safe
    for cls, attrs in before.items():
        assert vars(cls).keys() == attrs.keys(), cls
        assert all(vars(cls)[name] is value for name, value in attrs.items()), cls
    assert model.blocks[1].attn2._use_memory_efficient_attention_xformers is True
    assert active_patches() == []


def test_a_class_patched_twice_stays_routed_until_both_are_restored():
    first = patch_legacy_attention(LegacyCrossAttention)
    routed = vars(LegacyCrossAttention)["_attention"]
    second = patch_legacy_attention(LegacyTransformer())
    assert vars(LegacyCrossAttention)["_attention"] is routed
    first.restore()
    assert vars(LegacyCrossAttention)["_attention"] is routed
    second.restore()
    assert vars(LegacyCrossAttention)["_attention"] is ORIGINAL["_attention"]


def test_patching_a_class_routes_instances_built_later():
    with npu_port.attention_strategy("sdpa") as handle, patch_legacy_attention(LegacyCrossAttention) as patch:
        assert (patch.classes, patch.instances) == (["LegacyCrossAttention"], 0)
        module = LegacyCrossAttention(8, heads=2, dim_head=4)
        module(torch.randn(1, 3, 8))
    assert handle.calls == {"sdpa": 1}


# ---- a strategy applied to a model that holds legacy attention --------------------------------------------------------

LEGACY_CLASSES = (LegacyCrossAttention, FrameAttention, LegacyTransformerBlock)


def reference_model(model):
    """A float64 copy of ``model`` running its own code (nothing is patched yet where it is called)."""
    return copy.deepcopy(model).double()


def _class_state():
    return {cls: dict(vars(cls)) for cls in LEGACY_CLASSES}


def _assert_class_state(before):
    for cls, attributes in before.items():
        assert vars(cls).keys() == attributes.keys(), cls
        assert all(vars(cls)[name] is value for name, value in attributes.items()), cls


def test_a_strategy_on_a_model_routes_its_legacy_attention_and_nothing_outside_it():
    torch.manual_seed(0)
    model, outside = LegacyTransformer(), LegacyTransformer()
    hidden, context, mask = _inputs()
    before = _class_state()
    with torch.no_grad():
        expected = reference_model(model)(hidden.double(), context.double(), mask.double())
        expected_outside = outside(hidden, context, mask)
        model.blocks[0].attn1._use_memory_efficient_attention_xformers = True
        with (
            npu_port.attention_strategy("vanilla") as process,
            npu_port.attention_strategy("chunked", target=model) as handle,
        ):
            got = model(hidden, context, mask)
            got_outside = outside(hidden, context, mask)
            states = [(s.name, s.processor, s.state) for s in handle.applied.states()]
            described = handle.applied.describe().splitlines()
            with pytest.raises(ValueError, match="torch.cuda.is_available"):  # the repo's setter: not ours to change
                model.blocks[0].set_use_memory_efficient_attention_xformers(True)
    assert handle.calls == {"chunked": 4} and handle.applied.calls == {"legacy": 4}
    assert process.calls == {}  # outside the target the original code ran: not even the process-wide strategy
    assert_matches(got, expected, torch.float32)
    assert torch.equal(got_outside, expected_outside)
    assert states == [
        (f"blocks.{i}.{name}", kind, "routed")
        for i in (0, 1)
        for name, kind in (("attn1", "FrameAttention"), ("attn2", "LegacyCrossAttention"))
    ]
    assert described[:3] == [
        "LegacyTransformer: 0 diffusers and 4 legacy attention modules (active)",
        "  routed: 4 (2 x FrameAttention, 2 x LegacyCrossAttention): processor kept; its attention core is routed",
        "    FrameAttention: legacy attention (no processor): its class's attention method routed inside this target "
        "(2 modules)",
    ]
    _assert_class_state(before)
    assert model.blocks[0].attn1._use_memory_efficient_attention_xformers is True and active_patches() == []


def test_a_target_strategy_and_patch_legacy_attention_share_the_classes_in_either_order():
    hidden, context, mask = _inputs()
    before = _class_state()
    for target_first in (True, False):
        model, outside = LegacyTransformer(), LegacyTransformer()
        with torch.no_grad(), npu_port.attention_strategy("vanilla") as process:
            expected_outside = outside(hidden, context, mask)
            if target_first:
                handle = npu_port.set_attention_strategy("chunked", target=model)
                patch = patch_legacy_attention(outside)
            else:
                patch = patch_legacy_attention(outside)
                handle = npu_port.set_attention_strategy("chunked", target=model)
            model(hidden, context, mask)
            outside(hidden, context, mask)
            assert (handle.calls, process.calls) == ({"chunked": 4}, {"math": 4})
            patch.restore()  # the target's routing still holds the classes, for its own modules only
            assert vars(LegacyCrossAttention)["_attention"] is not ORIGINAL["_attention"]
            assert torch.equal(outside(hidden, context, mask), expected_outside)
            model(hidden, context, mask)
            assert (handle.calls, process.calls) == ({"chunked": 8}, {"math": 4})
            handle.restore()
        _assert_class_state(before)
        assert active_patches() == []


def test_a_strategy_applied_twice_routes_to_the_newest_until_it_is_restored():
    model = LegacyTransformer()
    hidden, context, mask = _inputs()
    with torch.no_grad():
        older = npu_port.set_attention_strategy("chunked", target=model)
        newer = npu_port.set_attention_strategy("sdpa", target=model)
        model(hidden, context, mask)
        assert (older.calls, newer.calls) == ({}, {"sdpa": 4})
        newer.restore()
        model(hidden, context, mask)
        assert older.calls == {"chunked": 4}
        older.restore()
    assert active_patches() == []


def test_a_model_with_legacy_attention_dropped_without_restore_gives_its_patches_back():
    model = LegacyTransformer()
    handle = npu_port.set_attention_strategy("chunked", target=model)
    assert active_patches() == ["FrameAttention._attention", "FrameAttention._sliced_attention",
                                "FrameAttention.get_attention_scores", "LegacyCrossAttention._attention",
                                "LegacyCrossAttention._sliced_attention", "LegacyCrossAttention.get_attention_scores"]  # fmt: skip
    del model
    gc.collect()
    assert active_patches() == [] and handle.target is None
    handle.restore()  # nothing left to undo: safe


def test_custom_processors_cannot_go_on_legacy_attention():
    class Processor:
        def __call__(self, attn, hidden_states, **kwargs):
            return hidden_states

    with pytest.raises(ValueError) as info:
        npu_port.set_attention_strategy(Processor, target=LegacyTransformer())
    assert str(info.value) == (
        "LegacyTransformer has no diffusers attention module to install a custom processor on: its attention modules "
        "(FrameAttention, LegacyCrossAttention) are legacy attention, which has no processor; apply a kernel strategy "
        "to it instead (they are routed)"
    )
    assert active_patches() == []


@NEW_DIFFUSERS
def test_a_controlvideo_style_unet_has_every_attention_routed_by_a_strategy_on_it():
    """The families' mixed model: legacy ``FullyFrameAttention`` beside diffusers ``Attention`` in each block."""
    from npu_port.integrations.legacy_attention.tiny import FullyFrameAttention, TinyControlVideoUNet

    torch.manual_seed(0)
    model = TinyControlVideoUNet(channels=(16, 32), heads=2, text_dim=12)
    gen = torch.Generator().manual_seed(1)
    sample, text = torch.randn(2, 4, 3, 4, 4, generator=gen), torch.randn(2, 5, 12, generator=gen)
    original = vars(FullyFrameAttention)["_attention"]
    with torch.no_grad():
        expected = reference_model(model)(sample.double(), text.double())
        with npu_port.attention_strategy("chunked", target=model) as handle:
            got = model(sample, text)
            described = handle.applied.describe().splitlines()[0]
    assert handle.calls == {"chunked": 4} and handle.applied.calls == {"legacy": 2, "processor": 2}
    assert described == "TinyControlVideoUNet: 2 diffusers and 2 legacy attention modules (active)"
    assert_matches(got, expected, torch.float32)
    assert vars(FullyFrameAttention)["_attention"] is original and active_patches() == []

    class Processor:
        def __call__(self, attn, hidden_states, encoder_hidden_states=None, **kwargs):
            return hidden_states

    with npu_port.attention_strategy(Processor, target=model) as handle:
        states = [(s.name, s.processor, s.state) for s in handle.applied.states()]
    assert states == [
        ("down.block.attn2", "Processor", "custom"),
        ("mid.block.attn2", "Processor", "custom"),
        ("down.block.attn1", "FullyFrameAttention", "kept"),
        ("mid.block.attn1", "FullyFrameAttention", "kept"),
    ]


# ---- diffusers' xformers switches ------------------------------------------------------------------------------------


def _processors(model):
    return {name: m.processor for name, m in model.named_modules() if isinstance(m, Attention)}


@NEW_DIFFUSERS
def test_enable_xformers_fails_here_without_the_hook():
    with pytest.raises((ModuleNotFoundError, ValueError)):
        tiny.tiny_unet().enable_xformers_memory_efficient_attention()
    with pytest.raises(ValueError, match="torch.cuda.is_available"):
        legacy_model_mixin_class()().enable_xformers_memory_efficient_attention()


@NEW_DIFFUSERS
def test_hooked_enable_on_a_model_installs_the_active_strategy_and_disable_restores(xformers_hook, caplog):
    unet = tiny.tiny_unet()
    before = _processors(unet)
    baseline = tiny.run_tiny(unet)
    with npu_port.attention_strategy("chunked"):
        with caplog.at_level(logging.WARNING, logger="npu_port.legacy"):
            unet.enable_xformers_memory_efficient_attention()
        route = xformers_route(unet)
        assert route.strategy.strategy.name == "chunked" and route.legacy is None
        assert all(type(p) is RoutedAttnProcessor for p in _processors(unet).values())
        torch.testing.assert_close(tiny.run_tiny(unet), baseline, atol=2e-5, rtol=1e-4)
        assert route.strategy.calls == {"chunked": 8}
    assert len(caplog.records) == 1 and "instead of xformers" in caplog.records[0].getMessage()
    unet.disable_xformers_memory_efficient_attention()
    assert xformers_route(unet) is None
    assert all(_processors(unet)[name] is p for name, p in before.items())


@NEW_DIFFUSERS
def test_hooked_enable_on_a_pipeline_uses_auto_and_set_use_false_restores(xformers_hook):
    pipe = tiny.tiny_dit_pipeline()
    before = {name: _processors(getattr(pipe, name)) for name in ("transformer", "vae")}
    baseline = tiny.run_tiny_pipeline(pipe)
    pipe.enable_xformers_memory_efficient_attention(attention_op=object())
    route = xformers_route(pipe)
    assert isinstance(route.strategy, StrategyHandle) and route.strategy.strategy.name == "auto"
    for name in before:
        assert all(type(p) is RoutedAttnProcessor for p in _processors(getattr(pipe, name)).values())
    torch.testing.assert_close(tiny.run_tiny_pipeline(pipe), baseline, atol=2e-4, rtol=1e-3)
    pipe.enable_xformers_memory_efficient_attention()  # again: the first route stays
    assert xformers_route(pipe) is route
    pipe.set_use_memory_efficient_attention_xformers(False)
    assert xformers_route(pipe) is None
    for name, processors in before.items():
        assert all(_processors(getattr(pipe, name))[n] is p for n, p in processors.items())


def test_hooked_enable_routes_a_model_holding_legacy_attention(xformers_hook):
    model = legacy_model_mixin_class()()
    hidden, context, _ = _inputs()
    with torch.no_grad():
        expected = model(hidden, context)
        with npu_port.attention_strategy("sdpa") as handle:
            model.enable_xformers_memory_efficient_attention()
            route = xformers_route(model)
            assert route.strategy is None and sorted(route.legacy.classes) == ["FrameAttention", "LegacyCrossAttention"]
            assert "LegacyTransformerBlock" in route.legacy.setters
            got = model(hidden, context)
    assert handle.calls == {"sdpa": 4}
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    model.disable_xformers_memory_efficient_attention()
    assert active_patches() == []


@NEW_DIFFUSERS
def test_unhook_restores_the_routes_and_the_diffusers_methods():
    originals = {(cls, name): vars(cls)[name] for cls in (ModelMixin, DiffusionPipeline) for name in HOOKED}
    hook = hook_enable_xformers("sdpa")
    assert hook_enable_xformers() is hook  # hooked once
    model = legacy_model_mixin_class()()
    unet = tiny.tiny_unet()
    before = _processors(unet)
    line = sys._getframe().f_lineno
    unet.enable_xformers_memory_efficient_attention()
    model.set_use_memory_efficient_attention_xformers(True)
    model.set_use_memory_efficient_attention_xformers(False)  # switching off handles nothing: not counted
    model.set_use_memory_efficient_attention_xformers(True)
    assert xformers_route(unet).strategy.strategy.name == "sdpa" and active_patches()
    assert hook_hits().counts == {ENABLE: 1, XFORMERS_SETTER: 2}  # what npu-port run lists as NPU120
    assert {key: [place for _, place in where] for key, where in hook_hits().places.items()} == {  # this file's
        (ENABLE, PROJECT): [(__file__, line + 1)],
        (XFORMERS_SETTER, PROJECT): [(__file__, line + 2), (__file__, line + 4)],
    }
    hook()  # the hook is its own undo callable (what npu_port.activate keeps)
    unhook_enable_xformers()  # nothing left to do: safe
    assert all(vars(cls)[name] is original for (cls, name), original in originals.items())
    assert all(_processors(unet)[name] is p for name, p in before.items())
    assert active_patches() == [] and xformers_route(unet) is None


# ---- the benchmark script ------------------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow
def test_memory_benchmark_runs_at_a_tiny_size(tmp_path):
    command = [sys.executable, str(BENCHMARK), "--batch", "1", "--heads", "2", "--dim", "16", "--seq", "256"]
    command += ["--legacy-seq", "128", "--check-rows", "64", "--out", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "legacy_attention_memory_cpu.json").read_text())
    assert report["machine"]["cpu_count"] >= 1 and report["config"]["seq"] == 256
    assert report["legacy_formulation"]["peak_bytes"] == 2 * 2 * 256 * 256 * 4
    assert [(row["strategy"], row["seq"]) for row in report["rows"]] == [
        ("chunked", 256),
        ("auto", 256),
        ("legacy", 128),
    ]
    for row in report["rows"]:
        assert row["max_abs_diff_vs_original"] <= 1e-5 and row["output_shape"] == [1, row["seq"], 32], row
