"""``npu_port.attention(..., return_lse=True)``: every kernel that can return the log-sum-exp matches the float64
reference (the Ascend ops through the emulator), rows with no key give ``-inf``, and kernels that cannot refuse
with reason code ``lse`` instead of answering wrongly."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_port
from npu_port.attn import AttentionCall, get_kernel
from npu_port.errors import KernelUnavailableError

from ..conftest import all_stand_ins
from ..reference import assert_close_to_reference, reference_attention, reference_lse

#: |lse - ref| allowed: scores are formed from inputs rounded to the dtype; the lse itself is float32.
LSE_ATOL = {torch.float64: 1e-6, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 8e-2}

#: (kernel, dtypes it takes, whether it takes float masks, per-head masks)
KERNELS = [
    ("math", (torch.float64, torch.float32, torch.float16, torch.bfloat16), True, True),
    ("chunked", (torch.float64, torch.float32, torch.float16, torch.bfloat16), True, True),
    ("sdpa", (torch.float64, torch.float32, torch.float16, torch.bfloat16), True, True),
    ("npu_fusion", (torch.float32, torch.float16, torch.bfloat16), False, True),
    ("npu_fused_infer", (torch.float16, torch.bfloat16), False, False),
]


def _inputs(batch, heads, kv_heads, q_len, key_len, dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, q_len, dim, generator=gen).to(dtype)
    key = torch.randn(batch, kv_heads, key_len, dim, generator=gen).to(dtype)
    value = torch.randn(batch, kv_heads, key_len, dim, generator=gen).to(dtype)
    return query, key, value, gen


def _check(name, dtype, query, key, value, keep=None, bias=None, is_causal=False):
    mask = bias if bias is not None else keep
    gqa = query.shape[1] != key.shape[1]
    with all_stand_ins(), torch.no_grad():
        out, lse = npu_port.attention(
            query, key, value, mask, is_causal=is_causal, enable_gqa=gqa, kernel=name, return_lse=True
        )
    keep_ref = None if bias is None else torch.isfinite(bias)
    keep_ref = keep if keep is not None else keep_ref
    finite_bias = None if bias is None else bias.masked_fill(~torch.isfinite(bias), 0.0)
    expected = reference_lse(query, key, keep_ref, finite_bias, is_causal)
    assert lse.dtype == torch.float32 and lse.shape == query.shape[:-1]
    assert torch.equal(torch.isneginf(lse), torch.isneginf(expected)), f"{name}: -inf rows differ"
    finite = torch.isfinite(expected)
    err = (lse.double()[finite] - expected[finite]).abs().max().item() if finite.any() else 0.0
    assert err <= LSE_ATOL[dtype], f"{name} {dtype}: max |lse - reference| {err:.3g}"
    ref_out = reference_attention(query, key, value, keep_ref, finite_bias, is_causal)
    assert_close_to_reference(out, ref_out, dtype)


@pytest.mark.parametrize("name, dtypes, float_mask, per_head", KERNELS, ids=[k[0] for k in KERNELS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mask", ["none", "bool", "float"])
def test_every_kernel_matches_the_float64_lse(name, dtypes, float_mask, per_head, causal, mask):
    for dtype in dtypes:
        query, key, value, gen = _inputs(2, 4, 2, 24, 40, 16, dtype, seed=7)
        keep = bias = None
        if mask == "bool":
            keep = torch.rand(2, 1, 24, 40, generator=gen) > 0.3
            keep[1, 0, 5] = False  # a row with no key: -inf
        elif mask == "float":
            if not float_mask:
                continue
            bias = torch.randn(2, 1, 24, 40, generator=gen).to(dtype)
            bias[0, 0, 3] = -math.inf
        _check(name, dtype, query, key, value, keep, bias, causal)


def test_the_lse_merges_blocks_as_ring_attention_does():
    """Two halves of the keys, merged with exp(lse_i - lse), give the whole: what the lse is for."""
    query, key, value, _ = _inputs(1, 2, 2, 8, 20, 16, torch.float64, seed=1)
    out, lse = npu_port.attention(query, key, value, kernel="math", return_lse=True)
    parts = [
        npu_port.attention(query, key[:, :, s], value[:, :, s], kernel="chunked", return_lse=True)
        for s in (slice(0, 9), slice(9, 20))
    ]
    total = torch.logaddexp(parts[0][1], parts[1][1])
    merged = sum(torch.exp(part_lse - total).unsqueeze(-1).double() * o for o, part_lse in parts)
    torch.testing.assert_close(total, lse)
    torch.testing.assert_close(merged, out)


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 2),
    kv_heads=st.integers(1, 2),
    group=st.integers(1, 3),
    q_len=st.integers(1, 20),
    key_len=st.integers(1, 20),
    dim=st.sampled_from([16, 32]),
    causal=st.booleans(),
    masked=st.booleans(),
    name=st.sampled_from(["math", "chunked", "sdpa", "npu_fusion", "npu_fused_infer"]),
    seed=st.integers(0, 2**16),
)
def test_lse_property_over_shapes(batch, kv_heads, group, q_len, key_len, dim, causal, masked, name, seed):
    dtype = torch.float16 if name == "npu_fused_infer" else torch.float32
    query, key, value, gen = _inputs(batch, kv_heads * group, kv_heads, q_len, key_len, dim, dtype, seed)
    keep = torch.rand(batch, 1, q_len, key_len, generator=gen) > 0.4 if masked else None
    _check(name, dtype, query, key, value, keep=keep, is_causal=causal)


def test_chunked_lse_is_exact_across_many_key_blocks():
    query, key, value, gen = _inputs(1, 2, 1, 13, 37, 16, torch.float64, seed=3)
    keep = torch.rand(1, 1, 13, 37, generator=gen) > 0.5
    kernel = get_kernel("chunked", query_block=4, key_block=5)
    out, lse = npu_port.attention(
        query, key, value, keep, is_causal=True, enable_gqa=True, kernel=kernel, return_lse=True
    )
    torch.testing.assert_close(lse.double(), reference_lse(query, key, keep, is_causal=True), atol=1e-6, rtol=0)


def test_return_lse_false_is_unchanged():
    query, key, value, _ = _inputs(1, 2, 2, 8, 8, 16, torch.float32, seed=2)
    out = npu_port.attention(query, key, value, kernel="chunked")
    assert isinstance(out, torch.Tensor)
    # the lse path takes the online softmax even for one key block: equal to rounding, not bit for bit
    torch.testing.assert_close(out, npu_port.attention(query, key, value, kernel="chunked", return_lse=True)[0])


def test_a_kernel_that_cannot_refuses_with_reason_code_lse():
    query, key, value, _ = _inputs(1, 2, 2, 8, 8, 16, torch.float32, seed=2)
    with all_stand_ins(), pytest.raises(KernelUnavailableError) as info:
        npu_port.attention(query, key, value, kernel="xformers", return_lse=True)
    assert (
        "  - return_lse=True but xformers does not return the log-sum-exp of its rows; use a kernel that does "
        "(math, chunked; sdpa on cpu; the Ascend kernels)" in str(info.value)
    )
    call = AttentionCall.from_arguments(query.requires_grad_(), key, value, return_lse=True)
    (reason,) = get_kernel("sdpa").reasons(call)
    assert reason.code == "lse"
    assert str(reason) == (
        "return_lse=True: sdpa cannot return the log-sum-exp here (its log-sum-exp carries no gradient); use math or "
        "chunked"
    )


def test_selection_picks_only_kernels_that_return_the_lse():
    query, key, value, _ = _inputs(1, 2, 2, 8, 8, 16, torch.float32, seed=2)
    query.requires_grad_()
    out, lse = npu_port.attention(query, key, value, return_lse=True)  # sdpa refuses (grad): the next one runs
    assert lse.requires_grad
    torch.testing.assert_close(lse.detach().double(), reference_lse(query.detach(), key), atol=1e-5, rtol=0)


def test_empty_calls_give_minus_inf():
    query = torch.randn(2, 3, 0, 8)
    key = torch.randn(2, 3, 0, 8)
    out, lse = npu_port.attention(torch.randn(2, 3, 4, 8), key, key, return_lse=True)
    assert lse.shape == (2, 3, 4) and torch.isneginf(lse).all() and not out.any()
    out, lse = npu_port.attention(query, torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8), return_lse=True)
    assert lse.shape == (2, 3, 0)


def _fusion_lse_error(module) -> float:
    """max |softmax_max + log(softmax_sum) - reference lse| of npu_fusion_attention, and that the (B, N, Sq, 8)
    statistics repeat one value over the last axis (the layout the op documents and the kernel reads lane 0 of)."""
    query, key, _, gen = _inputs(1, 2, 2, 6, 9, 16, torch.float32, seed=5)
    keep = torch.rand(1, 1, 6, 9, generator=gen) > 0.3
    keep[..., 0] = True
    outputs = module.npu_fusion_attention(query, key, key, 2, "BNSD", atten_mask=~keep, scale=0.25)
    softmax_max, softmax_sum = outputs[1], outputs[2]
    assert softmax_max.shape == softmax_sum.shape == (1, 2, 6, 8)
    assert torch.equal(softmax_max, softmax_max[..., :1].expand_as(softmax_max))
    lse = softmax_max[..., 0] + torch.log(softmax_sum[..., 0])
    return (lse.double() - reference_lse(query, key, keep, scale=0.25)).abs().max().item()


def test_the_emulators_softmax_statistics_give_the_lse():
    with all_stand_ins():
        import torch_npu  # the emulator

        assert _fusion_lse_error(torch_npu) < 1e-5


@pytest.mark.parametrize("mutant", ["unshifted sum", "max ignores the mask"])
def test_a_broken_emulators_softmax_statistics_fail(mutant, monkeypatch):
    from ..emulators import torch_npu_emulator as emu

    real = emu._attend

    def broken(q, k, v, keep, scale, keep_prob, fix_invalid_rows, pse=None):
        result = real(q, k, v, keep, scale, keep_prob, fix_invalid_rows, pse)
        if mutant == "unshifted sum":
            return emu._Attended(result.out, result.row_max, result.row_sum * torch.exp(result.row_max))
        scores = torch.matmul(q.double(), k.double().transpose(-2, -1)) * scale
        return emu._Attended(result.out, scores.amax(dim=-1, keepdim=True), result.row_sum)

    monkeypatch.setattr(emu, "_attend", broken)
    with all_stand_ins():
        import torch_npu

        assert _fusion_lse_error(torch_npu) > 1e-3
