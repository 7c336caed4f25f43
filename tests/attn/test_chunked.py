"""The chunked kernel stays inside its memory budget, forward and backward, at real problem sizes."""

from __future__ import annotations

import pytest
import torch

import npu_port
from npu_port.attn import AttentionCall, get_kernel
from npu_port.attn.kernels.chunked import MIN_BLOCK

from ..memory_tracker import AllocationTracker

MiB = 1 << 20


def _call(*shape_q, key_len=None, dtype=torch.float32, device="cpu", **kwargs):
    batch, heads, q_len, dim = shape_q
    query = torch.empty(batch, heads, q_len, dim, dtype=dtype, device=device)
    key = torch.empty(batch, heads, key_len or q_len, dim, dtype=dtype, device=device)
    return AttentionCall.from_arguments(query, key, key, **kwargs)


def test_controlvideo_shape_never_materialises_the_112_gib_score_tensor():
    """ControlVideo at 512x512, 15 frames: CFG batch 2 x 8 heads x 61440 tokens, float16 (run on the meta device)."""
    query = torch.empty(2, 8, 61440, 64, dtype=torch.float16, device="meta")
    full_scores = 2 * 8 * 61440 * 61440 * 2
    assert full_scores == 112.5 * (1 << 30)  # the allocation in the bug report
    kernel = get_kernel("chunked", max_bytes=1 << 30)
    with torch.no_grad(), AllocationTracker() as tracker:
        out = npu_port.attention(query, query, query, kernel=kernel)
    assert out.shape == (2, 8, 61440, 64) and out.dtype == torch.float16
    assert tracker.largest <= 1 << 30
    inputs_and_output = 4 * query.numel() * 2 + 2 * query.numel() * 4  # output, upcast K/V (float32)
    assert tracker.peak <= (1 << 30) + inputs_and_output + 64 * MiB


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_run_stays_within_budget_and_matches_sdpa(causal):
    gen = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 8, 2048, 64, generator=gen) for _ in range(3))
    kernel = get_kernel("chunked", max_bytes=4 * MiB)
    with torch.no_grad(), AllocationTracker() as tracker:
        out = npu_port.attention(query, key, value, is_causal=causal, kernel=kernel)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=causal)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)
    output_bytes = out.numel() * 4
    assert tracker.largest <= 4 * MiB
    assert tracker.peak <= 4 * MiB + output_bytes + 4 * MiB  # + query-block copies and row statistics
    with torch.no_grad(), AllocationTracker() as reference:
        npu_port.attention(query, key, value, is_causal=causal, kernel="math")
    assert reference.largest == 8 * 2048 * 2048 * 4  # what chunked avoids


def test_backward_recomputes_block_by_block_within_budget():
    gen = torch.Generator().manual_seed(1)
    query, key, value = (torch.randn(1, 4, 1024, 32, generator=gen, requires_grad=True) for _ in range(3))
    kernel = get_kernel("chunked", max_bytes=2 * MiB)
    with AllocationTracker() as tracker:
        out = npu_port.attention(query, key, value, kernel=kernel)
        grads = torch.autograd.grad(out.square().sum(), (query, key, value))
    ref_inputs = [t.detach().clone().requires_grad_(True) for t in (query, key, value)]
    ref_out = torch.nn.functional.scaled_dot_product_attention(*ref_inputs)
    ref_grads = torch.autograd.grad(ref_out.square().sum(), ref_inputs)
    for grad, ref in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref, atol=1e-4, rtol=1e-3)
    full_scores = 4 * 1024 * 1024 * 4
    assert tracker.largest <= 2 * MiB < full_scores


def test_causal_blocks_skip_the_keys_they_cannot_see():
    """Top-left causal: a block of queries i < stop never multiplies keys j >= stop (about half the work)."""
    query = torch.randn(1, 2, 256, 16)
    computed = {}
    original = torch.baddbmm
    for causal in (False, True):
        counts = []

        def counting(*args, _counts=counts, **kwargs):
            result = original(*args, **kwargs)
            _counts.append(result.numel())
            return result

        torch.baddbmm = counting
        try:
            npu_port.attention(query, query, query, is_causal=causal, kernel=get_kernel("chunked", query_block=32))
        finally:
            torch.baddbmm = original
        computed[causal] = sum(counts)
    assert computed[False] == 2 * 256 * 256
    assert computed[True] == sum(2 * 32 * stop for stop in range(32, 257, 32))  # 56 % of the full product


def test_plan_prefers_query_blocks_and_splits_keys_only_when_needed():
    kernel = get_kernel("chunked", max_bytes=64 * MiB)
    plan = kernel.plan(_call(1, 8, 16384, 64))
    assert plan.key_block == 16384 and plan.query_block == 64 * MiB // (8 * 4 * 16384)
    assert plan.block_bytes <= 64 * MiB
    tight = get_kernel("chunked", max_bytes=256 * 1024).plan(_call(2, 8, 16384, 64))
    assert tight.query_block <= MIN_BLOCK and tight.key_block < 16384
    assert tight.block_bytes <= 256 * 1024
    small = kernel.plan(_call(1, 2, 10, 8, key_len=7))
    assert (small.query_block, small.key_block) == (10, 7)  # fits: one block, the math kernel's computation
    assert "queries x" in plan.describe() and "MiB budget" in plan.describe()


def test_budget_too_small_is_a_reason_not_a_crash():
    kernel = get_kernel("chunked", max_bytes=16)
    call = _call(2, 8, 4, 8)
    (reason,) = kernel.reasons(call)
    assert reason.code == "budget"
    assert str(reason) == (
        "max_bytes=16 cannot hold one query x one key for all 2 x 8 batch x heads (64 bytes); raise max_bytes"
    )


def test_default_budget_comes_from_free_memory_with_a_cap(monkeypatch):
    from npu_port.attn.kernels import chunked

    monkeypatch.setattr(chunked, "free_memory_bytes", lambda device: 100 * MiB)
    assert chunked.default_budget(torch.device("cpu")) == 25 * MiB
    monkeypatch.setattr(chunked, "free_memory_bytes", lambda device: 64 << 30)
    assert chunked.default_budget(torch.device("cpu")) == 128 * MiB
    monkeypatch.setattr(chunked, "free_memory_bytes", lambda device: None)
    assert chunked.default_budget(torch.device("meta")) == 2048 * MiB


def test_reasons_do_not_ask_the_device_for_free_memory(monkeypatch):
    """reasons() runs on every call that selects a kernel: with the default budget it must not probe the device."""
    from npu_port.attn.kernels import chunked

    probes = []
    monkeypatch.setattr(chunked, "free_memory_bytes", lambda device: probes.append(device) or 64 << 30)
    call = _call(2, 8, 4096, 64)
    assert get_kernel("chunked").reasons(call) == []
    assert probes == []
    get_kernel("chunked").run(_call(1, 1, 8, 8))  # running sizes the blocks: one probe
    assert len(probes) == 1
