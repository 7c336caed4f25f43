"""Recording: every routed call and every unrouted SDPA call is counted once, under the right signature; the run
computes what it would without the recording; everything patched is put back."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

import npu_port
from npu_port.errors import PlanError
from npu_port.plan import record_calls
from npu_port.plan.signature import MaskForm
from tests.reference import reference_attention

ORIGINAL_SDPA = F.scaled_dot_product_attention


class CountSdpa(TorchFunctionMode):
    """Counts torch's SDPA as torch dispatches it: independent of how npu-port patched or routed anything."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is ORIGINAL_SDPA:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def _qkv(batch=1, heads=2, q_len=8, key_len=8, dim=16, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, dim, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(batch, heads, key_len, dim, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(batch, heads, key_len, dim, generator=gen, dtype=torch.float64).to(dtype)
    return q, k, v


def test_routed_calls_are_counted_and_still_computed_exactly():
    q, k, v = _qkv(dtype=torch.float64)
    keep = torch.ones(1, 1, 1, 8, dtype=torch.bool)
    keep[..., -3:] = False
    outputs = []

    def run():
        for _ in range(3):
            outputs.append(npu_port.attention(q, k, v))
        outputs.append(npu_port.attention(q, k, v, keep, is_causal=True))
        return "done"

    recording = record_calls(run)
    assert recording.result == "done" and recording.calls == 4 and recording.routed == 4
    assert [e.count for e in recording.entries] == [3, 1]
    first, second = (e.signature for e in recording.entries)
    assert first.mask is None and not first.causal and first.routed
    assert second.mask == MaskForm("bool", (1, 1, 1, 8), "key-padding") and second.causal
    for out in outputs[:3]:
        torch.testing.assert_close(out, reference_attention(q, k, v), rtol=0, atol=1e-12)
    torch.testing.assert_close(outputs[3], reference_attention(q, k, v, keep, is_causal=True), rtol=0, atol=1e-12)


def test_an_unrouted_sdpa_call_is_found_with_its_place_and_kernels_are_not_counted_twice():
    q, k, v = _qkv()
    with CountSdpa() as counted:
        recording = record_calls(lambda: (npu_port.attention(q, k, v), F.scaled_dot_product_attention(q, k, v)))
    assert counted.calls == 2 == recording.calls  # the sdpa kernel's own SDPA call is not a second call
    routed, unrouted = recording.entries
    assert routed.signature.routed and not unrouted.signature.routed
    assert routed.signature == dataclasses.replace(unrouted.signature, routed=True)
    assert len(unrouted.sites) == 1 and unrouted.sites[0].startswith(f"{__file__}:")
    line = int(unrouted.sites[0].rsplit(":", 1)[1])
    assert "F.scaled_dot_product_attention(q, k, v)" in open(__file__).read().splitlines()[line - 1]


def test_everything_is_put_back_also_when_the_run_raises():
    from npu_port.attn import select

    selector = select.current_selector()

    def run():
        assert F.scaled_dot_product_attention is not ORIGINAL_SDPA
        raise RuntimeError("the model broke")

    with pytest.raises(RuntimeError, match="the model broke"):
        record_calls(run)
    assert F.scaled_dot_product_attention is ORIGINAL_SDPA
    assert "scaled_dot_product_attention" not in vars(F) or vars(F)["scaled_dot_product_attention"] is ORIGINAL_SDPA
    assert select.current_selector() is selector


def test_a_model_target_is_routed_and_restored_with_the_same_processors():
    from npu_port.integrations.diffusers.tiny import run_tiny, tiny_unet

    model = tiny_unet()
    before = dict(model.attn_processors)
    forwards = Counter()
    attention_modules = [m for m in model.modules() if type(m).__name__ == "Attention"]
    hooks = [m.register_forward_hook(lambda *_: forwards.update(["call"])) for m in attention_modules]
    expected = run_tiny(model)
    with torch.no_grad():
        recording = record_calls(lambda: run_tiny(model), target_model=model)
    for hook in hooks:
        hook.remove()
    assert forwards["call"] == 2 * recording.calls > 0  # one forward without, one with the recording
    assert recording.routed == recording.calls
    assert all(model.attn_processors[name] is proc for name, proc in before.items())
    torch.testing.assert_close(recording.result, expected, rtol=1e-5, atol=1e-5)


def test_custom_processor_strategies_route_nothing_to_plan():
    with pytest.raises(PlanError) as caught:
        record_calls(lambda: None, strategy="custom-processor")
    assert str(caught.value) == (
        "strategy 'custom-processor' installs a processor class and routes no call to a kernel: there is nothing to "
        "plan; give a kernel strategy (npu, auto, sdpa, ...)"
    )


@pytest.mark.parametrize(
    "mask, form",
    [
        (torch.tensor([0.0, 0.0, float("-inf")]), MaskForm("float", (1, 1, 1, 3), "key-padding", True, "0/-inf")),
        (torch.tensor([0.0, torch.finfo(torch.float32).min, 0.0]),
         MaskForm("float", (1, 1, 1, 3), "key-padding", True, "0/finfo(float32).min")),
        (torch.tensor([0.0, -10000.0, 0.0]), MaskForm("float", (1, 1, 1, 3), "key-padding", False, "0/-10000")),
        (torch.tensor([[0.5, -1.0, 2.0], [0.0, 1.0, 3.0]]), MaskForm("float", (1, 1, 2, 3), "full", False, "bias")),
        (torch.ones(2, 2, 3, dtype=torch.bool), MaskForm("bool", (1, 2, 2, 3), "per-head")),
    ],
)  # fmt: skip
def test_masks_are_told_apart_by_kind_layout_and_values(mask, form):
    q = torch.randn(1, 2, 2, 4)
    k = torch.randn(1, 2, 3, 4)
    recording = record_calls(lambda: npu_port.attention(q, k, k, mask))
    assert [e.signature.mask for e in recording.entries] == [form]


def test_the_grad_flag_is_the_call_as_recorded():
    q, k, v = (t.requires_grad_() for t in _qkv())
    recording = record_calls(lambda: npu_port.attention(q, k, v).sum().backward())
    assert [e.signature.grad for e in recording.entries] == [True]
    assert q.grad is not None and torch.isfinite(q.grad).all()
    with torch.no_grad():
        quiet = record_calls(lambda: npu_port.attention(q, k, v))
    assert [e.signature.grad for e in quiet.entries] == [False]


SHAPES = [(1, 2, 8, 8, 16), (2, 2, 8, 4, 16), (1, 4, 8, 8, 32)]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(range(len(SHAPES))), st.booleans(), st.booleans(), st.booleans()),
        min_size=0,
        max_size=12,
    )
)
def test_grouping_counts_equal_the_calls_made(plan):
    """Counted independently: the test's own tally of (shape, causal, masked, routed) against the recording's."""

    def run():
        for index, causal, masked, routed in plan:
            batch, heads, q_len, key_len, dim = SHAPES[index]
            q, k, v = _qkv(batch, heads, q_len, key_len, dim)
            mask = torch.ones(q_len, key_len, dtype=torch.bool) if masked else None
            if routed:
                npu_port.attention(q, k, v, mask, is_causal=causal)
            else:
                F.scaled_dot_product_attention(q, k, v, mask, is_causal=causal)

    with CountSdpa() as counted:
        recording = record_calls(run)
    assert recording.calls == len(plan) == counted.calls
    found = Counter()
    for entry in recording.entries:
        s = entry.signature
        shape = SHAPES.index((s.query[0], s.query[1], s.query[2], s.key[2], s.query[3]))
        found[(shape, s.causal, s.mask is not None, s.routed)] += entry.count
    assert found == Counter(plan)
    assert all(math.isclose(e.signature.scale, e.signature.query[-1] ** -0.5) for e in recording.entries)


def test_a_recording_keeps_no_activations_and_its_own_copy_of_the_mask():
    q, k, v = _qkv(q_len=64, key_len=64)
    mask = torch.zeros(64, 64)
    mask[:, -4:] = float("-inf")
    recording = record_calls(lambda: npu_port.attention(q, k, v, mask))
    mask.fill_(1.0)  # the model reuses its buffer for the next batch
    kept = recording.entries[0].call
    assert kept.query.shape == q.shape and kept.query.stride() == (0, 0, 0, 0)  # no data behind it
    assert kept.key.stride() == kept.value.stride() == (0, 0, 0, 0)
    assert torch.isneginf(kept.mask.bias[..., -4:]).all() and (kept.mask.bias[..., :-4] == 0).all()
