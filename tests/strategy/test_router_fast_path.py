"""The router's per-signature fast path: a repeated unmasked call skips building an AttentionCall, yet gives the
same result, counts the same, and still refuses what validation refuses."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_port.attn.call import AttentionCall
from npu_port.errors import AttentionInputError
from npu_port.strategy.registry import get_strategy
from npu_port.strategy.router import StrategyRouter

from ..reference import assert_close_to_reference, reference_attention
from ..strategies import attention_cases


def router(name):
    return StrategyRouter(get_strategy(name))


class CountingFromArguments:
    """Counts AttentionCall constructions (the slow path) while installed."""

    def __init__(self, monkeypatch):
        self.count = 0
        original = AttentionCall.from_arguments.__func__

        def counted(cls, *args, **kwargs):
            self.count += 1
            return original(cls, *args, **kwargs)

        monkeypatch.setattr(AttentionCall, "from_arguments", classmethod(counted))


@settings(max_examples=60, deadline=None)
@given(attention_cases(forms=("none",)), st.integers(2, 4))
def test_repeated_calls_match_the_float64_reference_and_the_first_call(case, repeats):
    r = router("sdpa")
    kwargs = dict(is_causal=case.is_causal, scale=case.scale, enable_gqa=case.enable_gqa)
    ref = reference_attention(case.query, case.key, case.value, is_causal=case.is_causal, scale=case.scale)
    first = r(case.query, case.key, case.value, **kwargs)
    assert_close_to_reference(first, ref, case.dtype)
    for _ in range(repeats):
        assert torch.equal(r(case.query, case.key, case.value, **kwargs), first)
    assert r.calls == {"sdpa": repeats + 1}


def test_a_seen_signature_skips_validation_and_a_new_one_does_not(monkeypatch):
    counting = CountingFromArguments(monkeypatch)
    r = router("sdpa")
    q = k = v = torch.randn(2, 2, 8, 16)
    for _ in range(3):
        r(q, k, v, scale=0.25)
    assert counting.count == 1 and r.calls == {"sdpa": 3}
    r(q, k, v, scale=0.5)  # another scale: another signature
    r(q[:1], k[:1], v[:1], scale=0.25)  # another shape
    r(q, k, v, torch.ones(8, 8, dtype=torch.bool), scale=0.25)  # masked calls always take the full path
    r(q, k, v, torch.ones(8, 8, dtype=torch.bool), scale=0.25)
    assert counting.count == 5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(is_causal=1), "is_causal must be True or False, got 1"),
        (dict(enable_gqa=0), "enable_gqa must be True or False, got 0"),
        (dict(dropout_p=False), "dropout_p must be a number in [0, 1], got False"),
    ],
)
def test_values_equal_to_a_cached_signature_but_of_the_wrong_type_are_still_refused(kwargs, message):
    r = router("sdpa")
    q = k = v = torch.randn(1, 2, 4, 8)
    r(q, k, v, is_causal=True, enable_gqa=False, dropout_p=0.0)  # 1 == True, 0 == False == 0.0: a cached signature
    r(q, k, v, is_causal=False, enable_gqa=False, dropout_p=0.0)
    with pytest.raises(AttentionInputError) as info:
        r(q, k, v, **{**dict(is_causal=False, enable_gqa=False, dropout_p=0.0), **kwargs})
    assert str(info.value) == message


def test_gradients_flow_through_the_fast_path_and_no_grad_is_its_own_signature():
    r = router("sdpa")
    q, k, v = (torch.randn(1, 2, 6, 8, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        r(q, k, v)
        r(q, k, v)
    for _ in range(2):
        out = r(q, k, v)
        assert out.requires_grad
    out.sum().backward()
    ref_q, ref_k, ref_v = (t.detach().double().requires_grad_() for t in (q, k, v))
    reference_attention(ref_q, ref_k, ref_v).sum().backward()
    for ours, theirs in ((q, ref_q), (k, ref_k), (v, ref_v)):
        assert_close_to_reference(ours.grad, theirs.grad, torch.float32, what="gradient")
    assert len(r._prepared) == 2


def test_kernels_without_a_prepared_runner_always_take_the_full_path(monkeypatch):
    counting = CountingFromArguments(monkeypatch)
    r = router("chunked")
    q = k = v = torch.randn(1, 2, 8, 16)
    first = r(q, k, v)
    assert torch.equal(r(q, k, v), first) and counting.count == 2 and not r._prepared


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (([1.0], None, None), {}, "query must be a torch.Tensor, got list"),
        ((None, None, None), {"scale": [0.5]}, "scale must be None or a finite number, got [0.5]"),
    ],
)
def test_inputs_the_signature_cannot_hold_get_validations_message(args, kwargs, message):
    r = router("sdpa")
    q = torch.randn(1, 1, 2, 4)
    args = tuple(q if a is None else a for a in args)
    with pytest.raises(AttentionInputError) as info:
        r(*args, **kwargs)
    assert str(info.value) == message


def test_the_table_of_prepared_signatures_is_bounded(monkeypatch):
    from npu_port.strategy import router as router_module

    monkeypatch.setattr(router_module, "MAX_PREPARED", 3)
    r = router("sdpa")
    for length in range(1, 8):  # a growing sequence: a new signature every call
        q = torch.randn(1, 1, length, 4)
        r(q, q, q)
        assert len(r._prepared) <= 3
    assert r.calls == {"sdpa": 7}
