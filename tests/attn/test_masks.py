"""Mask conversions: polarity in the name, exact outputs, exact errors for ambiguous input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import npu_port
from npu_port import masks
from npu_port.errors import AttentionInputError


def test_polarity_conversions_are_exact_inverses():
    keep = torch.tensor([[True, False, True], [False, False, True]])
    assert torch.equal(masks.masked_from_keep(keep), ~keep)
    assert torch.equal(masks.keep_from_masked(masks.masked_from_keep(keep)), keep)
    assert torch.equal(masks.keep_from_masked(torch.tensor([[0, 1, 0], [1, 1, 0]], dtype=torch.uint8)), keep)
    assert torch.equal(masks.keep_from_binary(torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])), keep)
    additive = masks.additive_from_keep(keep, torch.float16)
    assert additive.dtype == torch.float16
    assert torch.equal(additive, torch.tensor([[0, -math.inf, 0], [-math.inf, -math.inf, 0]], dtype=torch.float16))
    assert torch.equal(masks.keep_from_additive(additive), keep)


def test_finfo_min_counts_as_masked_in_every_dtype_but_minus_10000_does_not_by_default():
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        mask = torch.tensor([0.0, torch.finfo(dtype).min, -1.0], dtype=dtype)
        assert masks.keep_from_additive(mask).tolist() == [True, False, True]
    diffusers_style = torch.tensor([0.0, -10000.0])
    assert masks.keep_from_additive(diffusers_style).tolist() == [True, True]  # a finite bias, as SDPA reads it
    assert masks.keep_from_additive(diffusers_style, masked_at_or_below=-10000.0).tolist() == [True, False]
    assert masks.MASKED_AT_OR_BELOW == torch.finfo(torch.float16).min / 2


def test_key_padding_mask_becomes_per_batch_keep_mask():
    padding = torch.tensor([[1, 1, 0], [1, 0, 0]])
    keep = masks.keep_from_key_padding(padding)
    assert keep.shape == (2, 1, 1, 3)
    assert keep[:, 0, 0].tolist() == [[True, True, False], [True, False, False]]


def test_key_padding_mask_is_not_read_as_q_by_key_when_batch_equals_q_len():
    """(B, Skv) with B == Sq broadcasts silently as (Sq, Skv) in SDPA; the helper makes the meaning explicit."""
    gen = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 1, 2, 4, generator=gen) for _ in range(3))
    padding = torch.tensor([[1, 0], [1, 1]])
    out = npu_port.attention(query, key, value, masks.keep_from_key_padding(padding))
    expected_b0 = npu_port.attention(query[:1], key[:1, :, :1], value[:1, :, :1])
    torch.testing.assert_close(out[:1], expected_b0)


def test_unfold_heads_keeps_batch_major_order():
    legacy = torch.arange(2 * 3 * 1 * 4, dtype=torch.float32).reshape(6, 1, 4)  # repeat_interleave order
    unfolded = masks.unfold_heads(legacy, heads=3)
    assert unfolded.shape == (2, 3, 1, 4)
    assert torch.equal(unfolded[1, 2, 0], legacy[1 * 3 + 2, 0])


@given(q_len=st.integers(1, 9), key_len=st.integers(1, 9), start=st.integers(0, 5), key_start=st.integers(0, 5))
def test_causal_keep_blocks_tile_the_full_mask(q_len, key_len, start, key_start):
    full = masks.causal_keep(start + q_len, key_start + key_len)
    block = masks.causal_keep(q_len, key_len, q_start=start, key_start=key_start)
    assert torch.equal(block, full[start:, key_start:])
    assert torch.equal(full, torch.ones(start + q_len, key_start + key_len, dtype=torch.bool).tril())


def test_canonical_form_keeps_broadcast_shape_and_bias():
    bias = torch.tensor([[0.5, -math.inf, 0.0]])
    canon = masks.canonicalize(bias, (2, 4, 1, 3), torch.device("cpu"))
    assert canon.kind == "float" and canon.shape == (1, 1, 1, 3)
    assert canon.keep.tolist() == [[[[True, False, True]]]]
    assert canon.bias is not None and not canon.per_head
    assert masks.canonicalize(None, (1, 1, 1, 1), torch.device("cpu")) is None


def test_integer_masks_are_refused_as_ambiguous():
    query = key = value = torch.randn(1, 1, 2, 4)
    with pytest.raises(AttentionInputError) as info:
        npu_port.attention(query, key, value, torch.ones(2, 2, dtype=torch.uint8))
    assert str(info.value) == (
        "attn_mask dtype uint8 is ambiguous: pass a bool mask (True = take part) or a float additive mask "
        "(0 = keep, -inf = masked). Convert with npu_port.masks.keep_from_masked(mask) if 1 means masked "
        "(Ascend ops), or npu_port.masks.keep_from_binary(mask) if 1 means keep (tokenizer attention_mask)"
    )


def test_unbroadcastable_masks_name_the_helper_that_fits():
    query = torch.randn(2, 4, 3, 8)
    key = value = torch.randn(2, 4, 5, 8)
    with pytest.raises(AttentionInputError) as info:
        npu_port.attention(query, key, value, torch.ones(8, 3, 5, dtype=torch.bool))
    assert str(info.value) == (
        "attn_mask of shape (8, 3, 5) does not broadcast to the scores' shape (2, 4, 3, 5) (batch, heads, q_len, "
        "key_len); masks broadcast from the right, as in torch.nn.functional.scaled_dot_product_attention; for a "
        "legacy (batch*heads, q_len, key_len) mask use npu_port.masks.unfold_heads(mask, heads=4)"
    )
    with pytest.raises(AttentionInputError, match=r"use npu_port.masks.keep_from_key_padding\(mask\)$"):
        npu_port.attention(query, key, value, torch.ones(2, 5, dtype=torch.bool))


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: masks.keep_from_key_padding(torch.ones(2, 1, 3)),
            "keep_from_key_padding expects a (batch, key_len) mask, got shape (2, 1, 3)",
        ),
        (
            lambda: masks.unfold_heads(torch.ones(5, 1, 3), heads=2),
            "unfold_heads: the mask's first dimension (5) is not a multiple of heads=2",
        ),
        (
            lambda: masks.unfold_heads(torch.ones(4, 3), heads=2),
            "unfold_heads expects a (batch*heads, q_len, key_len) mask, got shape (4, 3)",
        ),
        (lambda: masks.unfold_heads(torch.ones(4, 1, 3), heads=0), "heads must be a positive int, got 0"),
        (
            lambda: masks.keep_from_masked(torch.zeros(3)),
            "keep_from_masked expects a bool or 0/1 integer mask (True/1 = masked), got float32; for an additive float mask use keep_from_additive",
        ),
        (
            lambda: masks.keep_from_additive(torch.ones(3, dtype=torch.bool)),
            "keep_from_additive expects a float additive mask, got bool",
        ),
        (lambda: masks.masked_from_keep(torch.ones(3)), "masked_from_keep expects a bool keep-mask, got float32"),
        (lambda: masks.additive_from_keep([True]), "keep must be a torch.Tensor, got list"),
    ],
)
def test_helper_errors_name_the_problem(call, message):
    with pytest.raises(AttentionInputError) as info:
        call()
    assert str(info.value) == message


def test_float16_finfo_min_mask_never_overflows_to_nan():
    """finfo(float16).min + a negative score is -inf in float16; every kernel must still give finite output."""
    query = torch.full((1, 1, 2, 4), 4.0, dtype=torch.float16)
    key = torch.full((1, 1, 3, 4), -4.0, dtype=torch.float16)  # scores of -32: min + (-32) overflows in float16
    value = torch.randn(1, 1, 3, 4).half()
    mask = torch.tensor([[0.0, torch.finfo(torch.float16).min, 0.0], [torch.finfo(torch.float16).min] * 3]).half()
    for name in ("math", "sdpa", "chunked"):
        out = npu_port.attention(query, key, value, mask, kernel=name)
        assert torch.isfinite(out).all(), name
        assert torch.equal(out[0, 0, 1], torch.zeros(4, dtype=torch.float16)), name
