"""The flash_attn and xformers drop-ins: flash-attn's and xformers' documented semantics (bottom-right causal,
windows, packed sequences, bias classes) checked against the float64 reference, the refusals, and what importing
them does to a process (in child processes, so this one's ``sys.modules`` stays clean)."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from typing import List, Optional, Sequence
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_port.dropins import _attention
from npu_port.dropins import flash_attn_bert_padding as bert_padding
from npu_port.dropins import flash_attn_impl as fa
from npu_port.dropins import xformers_fmha_impl as fmha
from npu_port.dropins import xformers_ops_impl as xops
from npu_port.dropins.xformers_attn_bias_impl import (
    BlockDiagonalCausalFromBottomRightMask,
    BlockDiagonalCausalMask,
    BlockDiagonalMask,
    LocalAttentionFromBottomRightMask,
    LowerTriangularFromBottomRightMask,
    LowerTriangularMask,
    LowerTriangularMaskWithTensorBias,
)
from npu_port.errors import AttentionInputError, DropInError, NpuPortError

from ..reference import assert_close_to_reference, reference_attention

DTYPES = (torch.float32, torch.float32, torch.float16, torch.bfloat16)


# ---- ground truth, written from the packages' documentation (no npu_port code) ------------------------------------


def flash_keep(
    q_len: int, key_len: int, causal: bool, window: Sequence[int] = (-1, -1), seqlen_k: Optional[int] = None
) -> torch.Tensor:
    """flash-attn's rule: query i sees keys in [i + key_len - q_len - left, i + key_len - q_len + right], -1 =
    unbounded, causal = right 0. With ``seqlen_k`` (what flash-attn's ``mha_fwd`` compares the window with: the key
    length, ``max_seqlen_k`` in varlen, the cache length with a KV cache), a side >= seqlen_k is unbounded first
    (``if (window_size_left >= seqlen_k) window_size_left = -1``, the same for the right)."""
    left, right = window
    if seqlen_k:
        left, right = (-1 if side >= seqlen_k else side for side in (left, right))
    if causal:
        right = 0
    keep = torch.ones(q_len, key_len, dtype=torch.bool)
    for i in range(q_len):
        aligned = i + key_len - q_len
        for j in range(key_len):
            if (right >= 0 and j > aligned + right) or (left >= 0 and j < aligned - left):
                keep[i, j] = False
    return keep


def top_left_causal(q_len: int, key_len: int) -> torch.Tensor:
    return torch.ones(q_len, key_len, dtype=torch.bool).tril()


def reference_bshd(q, k, v, keep=None, bias=None, scale=None) -> torch.Tensor:
    """The float64 reference for (B, S, H, D) tensors."""
    out = reference_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), keep=keep, bias=bias, scale=scale
    )
    return out.transpose(1, 2)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """``assert_close_to_reference`` that also accepts empty outputs (a packed batch of empty sequences)."""
    if ref.numel() == 0:
        assert out.shape == ref.shape
    else:
        assert_close_to_reference(out, ref, dtype)


def offsets(lengths: Sequence[int]) -> List[int]:
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    return starts


def reference_packed(q, k, v, q_lens, k_lens, keep_for, scale=None) -> torch.Tensor:
    """Per-sequence reference for packed (total, H, D) tensors; rows past the last sequence are zeros."""
    q_starts, k_starts = offsets(q_lens), offsets(k_lens)
    out = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=torch.float64)
    for b, (q_len, key_len) in enumerate(zip(q_lens, k_lens)):
        qs, ks = slice(q_starts[b], q_starts[b + 1]), slice(k_starts[b], k_starts[b + 1])
        if q_len and key_len:
            out[qs] = reference_bshd(q[None, qs], k[None, ks], v[None, ks], keep_for(q_len, key_len), scale=scale)[0]
    return out


# ---- random inputs ------------------------------------------------------------------------------------------------


def _randn(gen: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(dtype)


@st.composite
def windows(draw):
    return draw(st.one_of(st.just((-1, -1)), st.tuples(st.integers(-1, 6), st.integers(-1, 6))))


@st.composite
def dense_cases(draw, max_len: int = 12):
    dtype = draw(st.sampled_from(DTYPES))
    batch, kv_heads, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from((1, 1, 2, 3)))
    q_len, key_len = draw(st.integers(1, max_len)), draw(st.integers(1, max_len))
    dim = draw(st.sampled_from((8, 16)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = _randn(gen, batch, q_len, kv_heads * group, dim, dtype=dtype)
    k = _randn(gen, batch, key_len, kv_heads, dim, dtype=dtype)
    v = _randn(gen, batch, key_len, kv_heads, dim, dtype=dtype)
    scale = draw(st.one_of(st.none(), st.floats(0.1, 1.0)))
    return q, k, v, scale


@st.composite
def packed_cases(draw, same_lengths: bool = False, max_seqs: int = 4, max_len: int = 8):
    dtype = draw(st.sampled_from(DTYPES))
    kv_heads, group = draw(st.integers(1, 2)), draw(st.sampled_from((1, 2)))
    q_lens = draw(st.lists(st.integers(0, max_len), min_size=1, max_size=max_seqs))
    if same_lengths:
        k_lens = list(q_lens)
    else:
        k_lens = draw(st.lists(st.integers(0, max_len), min_size=len(q_lens), max_size=len(q_lens)))
    q_spare = 0 if same_lengths else draw(st.integers(0, 2))  # tokens past the last sequence (flash leaves them)
    dim = draw(st.sampled_from((8, 16)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = _randn(gen, sum(q_lens) + q_spare, kv_heads * group, dim, dtype=dtype)
    k = _randn(gen, sum(k_lens), kv_heads, dim, dtype=dtype)
    v = _randn(gen, sum(k_lens), kv_heads, dim, dtype=dtype)
    return q, k, v, q_lens, k_lens


def _cu(lengths: Sequence[int]) -> torch.Tensor:
    return torch.tensor(offsets(lengths), dtype=torch.int32)


#: ``packed_path`` only patches a module constant, which is the same for every hypothesis example.
PATCHED = dict(suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(params=["one call, block-diagonal mask", "one call per sequence"])
def packed_path(request):
    limit = _attention.PACKED_MASK_MAX_ELEMENTS if request.param.startswith("one call,") else 0
    with mock.patch.object(_attention, "PACKED_MASK_MAX_ELEMENTS", limit):
        yield request.param


# ---- flash_attn ---------------------------------------------------------------------------------------------------


@settings(max_examples=150)
@given(case=dense_cases(), causal=st.booleans(), window=windows())
def test_flash_attn_func_matches_reference(case, causal, window):
    q, k, v, scale = case
    out = fa.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window)
    ref = reference_bshd(q, k, v, flash_keep(q.shape[1], k.shape[1], causal, window, k.shape[1]), scale=scale)
    assert out.dtype == q.dtype and out.is_contiguous()
    assert_close_to_reference(out, ref, q.dtype)


def test_flash_causal_is_bottom_right_when_lengths_differ():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, s, 2, 8, generator=gen) for s in (2, 5, 5))
    out = fa.flash_attn_func(q, k, v, causal=True)
    # query 0 sees keys 0..3, query 1 all five: the bottom-right corner, not SDPA's top-left
    keep = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert_close_to_reference(out, reference_bshd(q, k, v, keep), torch.float32)
    top_left = reference_bshd(q, k, v, top_left_causal(2, 5))
    assert not torch.allclose(out.double(), top_left, atol=1e-3)


def test_flash_rows_without_keys_give_zeros():
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 6, 2, 8, generator=gen), torch.randn(1, 2, 2, 8, generator=gen), torch.randn(1, 2, 2, 8)
    out = fa.flash_attn_func(q, k, v, causal=True)  # query i sees keys j <= i - 4: the first four see none
    assert torch.equal(out[:, :4], torch.zeros_like(out[:, :4]))
    assert not torch.isnan(out).any() and out[:, 4:].abs().sum() > 0


def test_a_window_side_as_long_as_the_keys_is_unbounded_as_in_flash_attn():
    """flash-attn's mha_fwd (and flash-attn-npu's) turns a window side >= seqlen_k into -1 before aligning the window:
    with more queries than keys, early rows then see every key, not none, unlike the docstring formula alone."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(1, 6, 2, 8, generator=gen), torch.randn(1, 2, 2, 8, generator=gen), torch.randn(1, 2, 2, 8)
    out = fa.flash_attn_func(q, k, v, window_size=(0, 2))  # right 2 >= 2 keys: unbounded; left 0: keys j >= i - 4
    keep = torch.tensor([[1, 1]] * 5 + [[0, 1]], dtype=torch.bool)
    assert_close_to_reference(out, reference_bshd(q, k, v, keep), torch.float32)
    cu = _cu([6])
    packed = fa.flash_attn_varlen_func(q[0], k[0], v[0], cu, _cu([2]), 6, 2, window_size=(0, 2))
    assert_close_to_reference(packed, reference_bshd(q, k, v, keep)[0], torch.float32)


@settings(max_examples=60)
@given(case=dense_cases(), causal=st.booleans(), window=windows())
def test_flash_packed_variants_match_reference(case, causal, window):
    q, k, v, scale = case
    keep = flash_keep(q.shape[1], k.shape[1], causal, window, k.shape[1])
    kv_out = fa.flash_attn_kvpacked_func(
        q, torch.stack([k, v], dim=2), softmax_scale=scale, causal=causal, window_size=window
    )
    assert_close_to_reference(kv_out, reference_bshd(q, k, v, keep, scale=scale), q.dtype)
    k_same, v_same = q[:, :, : k.shape[2]], q.flip(1)[:, :, : k.shape[2]]  # one length for the qkv-packed form
    heads = k.shape[2]
    qkv = torch.stack([q[:, :, :heads], k_same, v_same], dim=2)
    qkv_out = fa.flash_attn_qkvpacked_func(qkv, softmax_scale=scale, causal=causal, window_size=window)
    q_len = q.shape[1]
    ref = reference_bshd(q[:, :, :heads], k_same, v_same, flash_keep(q_len, q_len, causal, window, q_len), scale=scale)
    assert_close_to_reference(qkv_out, ref, q.dtype)


@settings(max_examples=100, **PATCHED)
@given(case=packed_cases(), causal=st.booleans(), window=windows(), scale=st.one_of(st.none(), st.floats(0.1, 1.0)))
def test_flash_varlen_matches_per_sequence_reference(packed_path, case, causal, window, scale):
    q, k, v, q_lens, k_lens = case
    out = fa.flash_attn_varlen_func(
        q,
        k,
        v,
        _cu(q_lens),
        _cu(k_lens),
        max(q_lens),
        max(k_lens),
        softmax_scale=scale,
        causal=causal,
        window_size=window,
    )
    longest = max(k_lens)  # max_seqlen_k bounds the window (mha_varlen_fwd)
    ref = reference_packed(q, k, v, q_lens, k_lens, lambda sq, sk: flash_keep(sq, sk, causal, window, longest), scale)
    assert_close(out, ref, q.dtype)


@settings(max_examples=50, **PATCHED)
@given(case=packed_cases(same_lengths=True), causal=st.booleans())
def test_flash_varlen_packed_variants(packed_path, case, causal):
    q, k, v, lens, _ = case
    cu, longest = _cu(lens), max(lens)
    ref = reference_packed(q, k, v, lens, lens, lambda sq, sk: flash_keep(sq, sk, causal))
    out = fa.flash_attn_varlen_kvpacked_func(q, torch.stack([k, v], dim=1), cu, cu, longest, longest, causal=causal)
    assert_close(out, ref, q.dtype)
    heads = k.shape[1]
    qkv = torch.stack([q[:, :heads], k, v], dim=1)
    out = fa.flash_attn_varlen_qkvpacked_func(qkv, cu, longest, causal=causal)
    ref = reference_packed(q[:, :heads], k, v, lens, lens, lambda sq, sk: flash_keep(sq, sk, causal))
    assert_close(out, ref, q.dtype)


def test_varlen_mask_is_built_without_host_sync():
    cu_q, cu_k = _cu([3, 0, 4]), _cu([2, 1, 5])
    sync = AssertionError("host sync while building the packed mask")
    with (
        mock.patch.object(torch.Tensor, "tolist", side_effect=sync),
        mock.patch.object(torch.Tensor, "item", side_effect=sync),
        mock.patch.object(torch.Tensor, "__bool__", side_effect=sync),
    ):
        keep = _attention.packed_keep(cu_q, cu_k, 8, 8, 1, 0, bottom_right=True, device=torch.device("cpu"))
    expected = torch.zeros(8, 8, dtype=torch.bool)
    expected[0:3, 0:2] = flash_keep(3, 2, True, (1, 0))
    expected[3:7, 3:8] = flash_keep(4, 5, True, (1, 0))  # row 7 is past the last sequence: sees nothing
    assert torch.equal(keep, expected)


def test_flash_dropout_changes_the_output_and_keeps_its_shape():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 6, 2, 8, generator=gen) for _ in range(3))
    plain = fa.flash_attn_func(q, k, v)
    assert torch.equal(plain, fa.flash_attn_func(q, k, v, dropout_p=0.0))
    dropped = fa.flash_attn_func(q, k, v, dropout_p=0.5)
    assert dropped.shape == plain.shape and not torch.allclose(dropped, plain)
    cu = _cu([6, 6])
    packed = fa.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 6, 6, dropout_p=0.5)
    assert packed.shape == (12, 2, 8) and not torch.allclose(packed, plain.flatten(0, 1))


def test_flash_gradients_flow():
    q, k, v = (torch.randn(1, 5, 2, 8, requires_grad=True) for _ in range(3))
    fa.flash_attn_func(q, k, v, causal=True, window_size=(2, 0)).sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


@settings(max_examples=60)
@given(
    case=dense_cases(max_len=4),
    cache_len=st.integers(6, 10),
    fill=st.lists(st.integers(0, 5), min_size=2, max_size=2),
    causal=st.booleans(),
    window=windows(),
    append=st.booleans(),
)
def test_flash_attn_with_kvcache_matches_reference(case, cache_len, fill, causal, window, append):
    q, k_new, v_new, scale = case
    batch, q_len, _, dim = q.shape
    fill = (fill * batch)[:batch]  # keys already in each item's cache
    new = k_new.shape[1] if append and max(fill) + k_new.shape[1] <= cache_len else 0
    gen = torch.Generator().manual_seed(7)
    k_cache = torch.randn(batch, cache_len, k_new.shape[2], dim, generator=gen).to(q.dtype)
    v_cache = torch.randn(k_cache.shape, generator=gen).to(q.dtype)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    for b, filled in enumerate(fill):
        k_expected[b, filled : filled + new] = k_new[b, :new]
        v_expected[b, filled : filled + new] = v_new[b, :new]
    out = fa.flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        k_new if new else None,
        v_new if new else None,
        cache_seqlens=torch.tensor(fill, dtype=torch.int32),
        softmax_scale=scale,
        causal=causal,
        window_size=window,
    )
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)  # new keys written in place
    for b, filled in enumerate(fill):
        length = filled + new  # each item attends to its filled length, the band aligned bottom-right to it
        keep = torch.zeros(q_len, cache_len, dtype=torch.bool)
        keep[:, :length] = flash_keep(q_len, length, causal, window, cache_len)  # mha_fwd_kvcache: the cache length
        ref = reference_bshd(q[b : b + 1], k_expected[b : b + 1], v_expected[b : b + 1], keep, scale=scale)
        assert_close_to_reference(out[b : b + 1], ref, q.dtype)


def test_flash_attn_with_kvcache_refusals():
    q, cache = torch.randn(1, 1, 2, 8), torch.zeros(1, 4, 2, 8)
    with pytest.raises(DropInError, match=r"^flash_attn_with_kvcache\(rotary_cos=\.\.\.\) is not supported"):
        fa.flash_attn_with_kvcache(q, cache, cache, rotary_cos=torch.ones(4, 4), cache_seqlens=1)
    with pytest.raises(DropInError, match=r"^flash_attn_with_kvcache\(return_softmax_lse=True\)"):
        fa.flash_attn_with_kvcache(q, cache, cache, return_softmax_lse=True)
    with pytest.raises(AttentionInputError, match="pass cache_seqlens to say where k and v go"):
        fa.flash_attn_with_kvcache(q, cache, cache, q, q)


UNSUPPORTED = {
    "alibi_slopes": (
        dict(alibi_slopes=torch.ones(2)),
        "flash_attn_func(alibi_slopes=...) is not supported by npu-port's flash_attn drop-in: it does not add ALiBi "
        "biases. Build the bias yourself and pass it as attn_mask to npu_port.attention(q, k, v, attn_mask=bias) with "
        "(batch, heads, seqlen, head_dim) tensors, or install a working flash-attn build (an installed flash-attn "
        "takes precedence over the drop-in).",
    ),
    "return_attn_probs": (
        dict(return_attn_probs=True),
        "flash_attn_func(return_attn_probs=True) is not supported by npu-port's flash_attn drop-in: it returns the "
        "attention output only, not the softmax log-sum-exp or the attention probabilities. Call it with "
        "return_attn_probs=False, or install a working flash-attn build (an installed flash-attn takes precedence "
        "over the drop-in).",
    ),
    "softcap": (
        dict(softcap=30.0),
        "flash_attn_func(softcap=30.0) is not supported by npu-port's flash_attn drop-in: it does not soft-cap the "
        "attention logits. Call it with softcap=0.0, or install a working flash-attn build (an installed flash-attn "
        "takes precedence over the drop-in).",
    ),
}


@pytest.mark.parametrize("argument", list(UNSUPPORTED))
def test_unsupported_flash_arguments_raise_clearly(argument):
    kwargs, message = UNSUPPORTED[argument]
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(DropInError) as info:
        fa.flash_attn_func(q, q, q, **kwargs)
    assert str(info.value) == message
    assert isinstance(info.value, NpuPortError) and isinstance(info.value, NotImplementedError)
    cu = _cu([4])
    with pytest.raises(DropInError, match=r"^flash_attn_varlen_func\("):
        fa.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 4, 4, **kwargs)


def test_paged_kv_and_flash_internals_raise_clearly():
    q, cu = torch.randn(4, 2, 8), _cu([4])
    with pytest.raises(DropInError, match=r"block_table=\.\.\.\) is not supported .* does not read paged key/value"):
        fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(DropInError, match="softmax log-sum-exp"):
        fa._wrapped_flash_attn_forward(q, q, q, 0.0, 1.0, False, -1, -1, 0.0, None, False)


# ---- flash_attn.bert_padding --------------------------------------------------------------------------------------


def test_unpad_and_pad_round_trip():
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 5, 2, 4, generator=gen)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    packed, indices, cu_seqlens, max_seqlen, used = bert_padding.unpad_input(hidden, mask)
    assert packed.shape == (8, 2, 4) and torch.equal(packed, hidden.flatten(0, 1)[mask.flatten().bool()])
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 3, 8, 8]
    assert max_seqlen == 5 and isinstance(max_seqlen, int) and used.tolist() == [3, 5, 0]
    restored = bert_padding.pad_input(packed, indices, 3, 5)
    assert torch.equal(restored, hidden * mask[:, :, None, None])


def test_unpad_keeps_unused_tokens_but_does_not_count_them_as_used():
    hidden = torch.arange(8.0).reshape(2, 4, 1)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    unused = torch.tensor([[0, 0, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    packed, indices, cu_seqlens, max_seqlen, used = bert_padding.unpad_input(hidden, mask, unused)
    assert packed.flatten().tolist() == [0.0, 1.0, 2.0, 4.0] and indices.tolist() == [0, 1, 2, 4]
    assert cu_seqlens.tolist() == [0, 3, 4] and max_seqlen == 3 and used.tolist() == [2, 1]


def test_unpad_attend_pad_equals_masked_attention():
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(2, 6, 2, 8, generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    packed, indices, cu, longest, _ = bert_padding.unpad_input(q, mask)
    out = bert_padding.pad_input(
        fa.flash_attn_varlen_func(packed, packed, packed, cu, cu, longest, longest), indices, 2, 6
    )
    keep = mask.bool()[:, None, None, :]  # key padding
    ref = reference_bshd(q, q, q, keep) * mask[:, :, None, None]
    assert_close_to_reference(out, ref, torch.float32)


# ---- xformers -----------------------------------------------------------------------------------------------------


@st.composite
def bmhk_cases(draw, max_len: int = 12):
    dtype = draw(st.sampled_from(DTYPES))
    batch, heads = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    q_len, key_len, dim = draw(st.integers(1, max_len)), draw(st.integers(1, max_len)), draw(st.sampled_from((8, 16)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = _randn(gen, batch, q_len, heads, dim, dtype=dtype)
    k = _randn(gen, batch, key_len, heads, dim, dtype=dtype)
    v = _randn(gen, batch, key_len, heads, dim, dtype=dtype)
    return q, k, v, gen, draw(st.one_of(st.none(), st.floats(0.1, 1.0)))


def _random_bias(gen, shape, dtype, masked_p=0.3):
    keep = torch.rand(shape, generator=gen) > masked_p
    values = torch.randn(shape, generator=gen)
    return values.masked_fill(~keep, -math.inf).to(dtype), keep, values.masked_fill(~keep, 0.0).double()


@settings(max_examples=150)
@given(
    case=bmhk_cases(),
    form=st.sampled_from(
        ["none", "tensor", "lower_triangular", "with_tensor_bias", "bottom_right", "local_bottom_right"]
    ),
)
def test_memory_efficient_attention_matches_reference(case, form):
    q, k, v, gen, scale = case
    batch, q_len, heads, _ = q.shape
    key_len = k.shape[1]
    keep = bias = attn_bias = None
    if form == "tensor":
        attn_bias, keep, bias = _random_bias(gen, (batch, heads, q_len, key_len), q.dtype)
    elif form == "lower_triangular":
        attn_bias, keep = LowerTriangularMask(), top_left_causal(q_len, key_len)
    elif form == "with_tensor_bias":
        tensor, tensor_keep, bias = _random_bias(gen, (1, heads, q_len, key_len), q.dtype)
        attn_bias = LowerTriangularMask().add_bias(tensor)
        keep = tensor_keep & top_left_causal(q_len, key_len)
        assert isinstance(attn_bias, LowerTriangularMaskWithTensorBias)
    elif form == "bottom_right":
        attn_bias, keep = LowerTriangularFromBottomRightMask(), flash_keep(q_len, key_len, True)
    elif form == "local_bottom_right":
        attn_bias, keep = LocalAttentionFromBottomRightMask(2, 1), flash_keep(q_len, key_len, False, (2, 1))
    out = xops.memory_efficient_attention(q, k, v, attn_bias=attn_bias, scale=scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_close_to_reference(out, reference_bshd(q, k, v, keep, bias, scale=scale), q.dtype)
    if attn_bias is not None and not isinstance(attn_bias, torch.Tensor):
        materialized = attn_bias.materialize((batch, heads, q_len, key_len), dtype=torch.float32)
        assert torch.equal(materialized > -math.inf, keep.expand(batch, heads, q_len, key_len))


def test_lower_triangular_mask_is_top_left():
    mask = LowerTriangularMask().materialize((2, 4))
    assert torch.equal(mask, torch.tensor([[0.0, -math.inf, -math.inf, -math.inf], [0.0, 0.0, -math.inf, -math.inf]]))
    bottom_right = LowerTriangularFromBottomRightMask().materialize((2, 4))
    assert torch.equal(bottom_right > -math.inf, torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool))


def test_bmk_and_bmghk_layouts():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(6, 5, 8, generator=gen) for _ in range(3))  # BMK: (batch*heads, seq, K)
    bias, keep, values = _random_bias(gen, (6, 5, 5), torch.float32)
    out = xops.memory_efficient_attention(q, k, v, attn_bias=bias)
    ref = reference_attention(q[:, None], k[:, None], v[:, None], keep[:, None], values[:, None])[:, 0]
    assert out.shape == (6, 5, 8)
    assert_close_to_reference(out, ref, torch.float32)
    # BMGHK with key/value expanded over the heads of each group (diffusers' grouped-query form)
    q5 = torch.randn(2, 5, 2, 3, 8, generator=gen)
    k4, v4 = torch.randn(2, 7, 2, 8, generator=gen), torch.randn(2, 7, 2, 8, generator=gen)
    out = xops.memory_efficient_attention(
        q5,
        k4[:, :, :, None].expand(-1, -1, -1, 3, -1),
        v4[:, :, :, None].expand(-1, -1, -1, 3, -1),
        attn_bias=LowerTriangularMask(),
    )
    ref = reference_bshd(q5.flatten(2, 3), k4, v4, top_left_causal(5, 7))
    assert out.shape == (2, 5, 2, 3, 8)
    assert_close_to_reference(out.flatten(2, 3), ref, torch.float32)


@settings(max_examples=100, **PATCHED)
@given(
    case=packed_cases(max_seqs=4),
    kind=st.sampled_from(["block_diagonal", "block_diagonal_causal", "from_bottom_right"]),
    separate_kv=st.booleans(),
)
def test_block_diagonal_masks_match_per_sequence_reference(packed_path, case, kind, separate_kv):
    q, k, v, q_lens, k_lens = case
    q = q[: sum(q_lens)]  # xformers packs exactly the sequences
    if not separate_kv:
        k_lens, k, v = q_lens, q[:, : k.shape[1]], q.flip(0)[:, : k.shape[1]]
    heads = k.shape[1]
    q = q[:, :heads]  # BMHK biases take equal heads
    mask = BlockDiagonalMask.from_seqlens(q_lens, k_lens if separate_kv else None)
    keep_for = {
        "block_diagonal": lambda sq, sk: torch.ones(sq, sk, dtype=torch.bool),
        "block_diagonal_causal": top_left_causal,
        "from_bottom_right": lambda sq, sk: flash_keep(sq, sk, True),
    }[kind]
    if kind == "block_diagonal_causal":
        mask = mask.make_causal()
        assert isinstance(mask, BlockDiagonalCausalMask)
    elif kind == "from_bottom_right":
        mask = mask.make_causal_from_bottomright()
        assert isinstance(mask, BlockDiagonalCausalFromBottomRightMask)
    out = xops.memory_efficient_attention(q[None], k[None], v[None], attn_bias=mask)
    ref = reference_packed(q, k, v, q_lens, k_lens, keep_for)
    assert out.shape == (1,) + tuple(q.shape)
    assert_close(out[0], ref, q.dtype)
    dense = mask.materialize((sum(q_lens), sum(k_lens))) > -math.inf
    expected = torch.zeros(sum(q_lens), sum(k_lens), dtype=torch.bool)
    for (q0, q1), (k0, k1) in zip(mask.q_seqinfo.intervals(), mask.k_seqinfo.intervals()):
        expected[q0:q1, k0:k1] = keep_for(q1 - q0, k1 - k0)
    assert torch.equal(dense, expected)


def test_block_diagonal_from_tensor_list_and_split():
    tensors = [torch.randn(1, 3, 2, 8), torch.randn(2, 4, 2, 8)]
    mask, packed = BlockDiagonalMask.from_tensor_list(tensors)
    assert packed.shape == (1, 11, 2, 8) and mask.q_seqinfo.seqstart_py == [0, 3, 7, 11]
    out = xops.memory_efficient_attention(packed, packed, packed, attn_bias=mask)
    pieces = mask.split(out)
    assert [p.shape for p in pieces] == [(1, 3, 2, 8), (2, 4, 2, 8)]
    for tensor, piece in zip(tensors, pieces):
        assert_close_to_reference(piece, reference_bshd(tensor, tensor, tensor), torch.float32)


def test_block_diagonal_needs_packed_inputs():
    mask = BlockDiagonalMask.from_seqlens([2, 3])
    with pytest.raises(AttentionInputError, match="batch must be 1"):
        xops.memory_efficient_attention(*(torch.randn(2, 5, 1, 8) for _ in range(3)), attn_bias=mask)
    with pytest.raises(AttentionInputError, match="covers 5 query and 5 key tokens, but the inputs have 6 and 6"):
        xops.memory_efficient_attention(*(torch.randn(1, 6, 1, 8) for _ in range(3)), attn_bias=mask)


def test_xformers_refusals_and_ignored_op(caplog):
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(AttentionInputError, match="attn_bias must be an additive float tensor"):
        xops.memory_efficient_attention(q, q, q, attn_bias=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(DropInError, match="attn_bias of type object is not supported by npu-port's xformers drop-in"):
        xops.memory_efficient_attention(q, q, q, attn_bias=object())
    with caplog.at_level("DEBUG", logger="npu_port.shims"):
        out = xops.memory_efficient_attention(q, q, q, op=xops.MemoryEfficientAttentionFlashAttentionOp)
    assert "op=" in caplog.text and "ignored" in caplog.text
    assert_close_to_reference(out, reference_bshd(q, q, q), torch.float32)
    assert xops.memory_efficient_attention(q, q, q, output_dtype=torch.float64).dtype == torch.float64
    assert xops.fmha.memory_efficient_attention is fmha.memory_efficient_attention


def test_xformers_dropout_changes_the_output_and_keeps_its_shape():
    q, k, v = (torch.randn(2, 6, 2, 8) for _ in range(3))
    plain = xops.memory_efficient_attention(q, k, v)
    dropped = xops.memory_efficient_attention(q, k, v, p=0.5)
    assert dropped.shape == plain.shape and not torch.allclose(dropped, plain)


# ---- importing the drop-ins (child processes) ---------------------------------------------------------------------


def _run_child(script: str, tmp_path, extra_path: Optional[str] = None) -> str:
    prelude = "import sys\n" + (f"sys.path.insert(0, {extra_path!r})\n" if extra_path else "")
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, f"child failed:\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


@pytest.mark.e2e
@pytest.mark.slow
def test_dropins_import_like_the_real_packages_and_go_away(tmp_path):
    out = _run_child(
        """
        import importlib, importlib.metadata, importlib.util
        import torch
        from npu_port.dropins.install import install_dropins, uninstall_dropins

        assert importlib.util.find_spec("flash_attn") is None and importlib.util.find_spec("xformers") is None
        assert install_dropins() == ["flash_attn", "xformers"]
        import flash_attn
        import diffusers
        import transformers
        from diffusers.models import attention_dispatch
        from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn
        from diffusers.models.attention_processor import AttnProcessor2_0, XFormersAttnProcessor
        from transformers.modeling_flash_attention_utils import is_flash_attn_available

        assert attention_dispatch._CAN_USE_FLASH_ATTN and attention_dispatch._CAN_USE_XFORMERS_ATTN
        assert attention_dispatch.flash_attn_func is flash_attn.flash_attn_func
        assert importlib.util.find_spec("flash_attn") is not None
        assert importlib.metadata.version("flash-attn") == "2.7.4" == flash_attn.__version__
        from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
        from flash_attn.bert_padding import pad_input, unpad_input
        from flash_attn.flash_attn_interface import flash_attn_func as interface_func
        assert interface_func is flash_attn_func
        q = torch.randn(1, 4, 2, 8)
        assert flash_attn_func(q, q, q, causal=True).shape == (1, 4, 2, 8)

        import xformers
        import xformers.ops
        from xformers.ops import fmha, MemoryEfficientAttentionFlashAttentionOp
        from xformers.ops.fmha.attn_bias import BlockDiagonalMask, LowerTriangularMask
        assert xformers.ops.fmha.BlockDiagonalMask is BlockDiagonalMask is fmha.BlockDiagonalMask
        assert importlib.metadata.version("xformers") == xformers.__version__
        assert xformers.ops.memory_efficient_attention(q, q, q, LowerTriangularMask()).shape == (1, 4, 2, 8)

        uninstall_dropins()
        for name in ("flash_attn", "flash_attn.bert_padding", "xformers", "xformers.ops"):
            assert name not in sys.modules, name
            try:
                importlib.import_module(name)
            except ModuleNotFoundError:
                pass
            else:
                raise AssertionError(f"{name} still imports after uninstall_dropins()")
        try:
            importlib.metadata.version("flash-attn")
        except importlib.metadata.PackageNotFoundError:
            print("OK")
        """,
        tmp_path,
    )
    assert out.strip().endswith("OK")


@pytest.mark.e2e
@pytest.mark.slow
def test_a_real_package_wins_unless_forced(tmp_path):
    real = tmp_path / "site"
    (real / "flash_attn").mkdir(parents=True)
    (real / "flash_attn" / "__init__.py").write_text("REAL = True\n__version__ = '9.9.9'\n")
    out = _run_child(
        """
        import importlib.metadata
        from npu_port.dropins.install import install_dropins, uninstall_dropins

        install_dropins()
        import flash_attn
        assert getattr(flash_attn, "REAL", False) and flash_attn.__version__ == "9.9.9", flash_attn
        import xformers.ops  # not installed here: the drop-in is served
        uninstall_dropins()
        sys.modules.pop("flash_attn", None)

        install_dropins(force=True)
        import flash_attn
        assert not hasattr(flash_attn, "REAL") and flash_attn.__version__ == "2.7.4"
        assert importlib.metadata.version("flash-attn") == "2.7.4"
        uninstall_dropins()
        sys.modules.pop("flash_attn", None)
        import flash_attn
        assert flash_attn.REAL
        print("OK")
        """,
        tmp_path,
        extra_path=str(real),
    )
    assert out.strip().endswith("OK")


def test_each_registration_records_its_own_importers_and_hits():
    """A registration copied from the templates starts with empty records (they used to share ``imported_by``, so a
    second ``npu-port run`` in one process named the first one's importer)."""
    import dataclasses

    from npu_port.dropins.install import DROP_INS

    first = dataclasses.replace(DROP_INS[0], served=[])
    first.imported_by["flash_attn"] = "earlier.module"
    first.log.hit("flash_attn")
    second = dataclasses.replace(DROP_INS[0], served=[])
    assert (second.imported_by, second.log.counts) == ({}, {})
    assert (DROP_INS[0].imported_by, DROP_INS[0].log.counts) == ({}, {})
