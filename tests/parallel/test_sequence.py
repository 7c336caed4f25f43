"""The pieces of sequence-parallel attention that need no process group: the key-mask forms a context-parallel call
takes (and the one-line errors for those it cannot split), the log-sum-exp merge of ring attention against a float64
reference, and the refusals of what it cannot compute faithfully."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_port.errors import ParallelError
from npu_port.parallel.sequence import check_call, key_mask, merge_partials

from ..reference import reference_attention, reference_lse

SPLIT_ONLY_KEYS = (
    "under context parallelism: only key masks can be split with the sequence — (batch, keys), (batch, 1, keys) or "
    "(batch, 1 or heads, 1, keys); a mask that varies per query needs the whole sequence on one device"
)


# ---- key masks --------------------------------------------------------------------------------------------------


def test_key_mask_forms_are_widened_to_four_dimensions():
    keep = torch.tensor([[True, False, True, True]])
    assert key_mask(None, 1, 4, 4) is None
    assert torch.equal(key_mask(keep, 1, 4, 4), keep[:, None, None, :])
    assert torch.equal(key_mask(keep[:, None], 1, 4, 4), keep[:, None, None, :])
    per_head = torch.ones(2, 4, 1, 4, dtype=torch.bool)
    assert key_mask(per_head, 2, 4, 4) is per_head
    one_for_the_batch = torch.ones(1, 1, 1, 4, dtype=torch.bool)
    assert key_mask(one_for_the_batch, 2, 4, 4) is one_for_the_batch


@pytest.mark.parametrize(
    "shape",
    [
        (1, 4, 8),  # (batch, queries, keys): varies per query
        (4, 8),  # (queries, keys)
        (1, 1, 4, 8),
        (1, 3, 1, 8),  # 3 heads of 4
        (1, 1, 1, 1, 8),
    ],
)
def test_key_mask_refuses_masks_it_cannot_split_with_the_shape_given(shape):
    with pytest.raises(ParallelError) as info:
        key_mask(torch.ones(shape, dtype=torch.bool), 1, 4, 8)
    assert str(info.value) == f"attention mask of shape {shape} {SPLIT_ONLY_KEYS}"


def test_key_mask_names_a_batch_that_does_not_match():
    with pytest.raises(ParallelError) as info:
        key_mask(torch.ones(2, 1, 1, 8, dtype=torch.bool), 1, 4, 8)
    assert str(info.value) == "attention mask of shape (2, 1, 1, 8) is for a batch of 2, but the call's batch is 1"


def test_key_mask_refuses_a_mask_over_the_whole_sequence():
    with pytest.raises(ParallelError) as info:
        key_mask(torch.ones(1, 16, dtype=torch.bool), 1, 4, 8)
    assert str(info.value) == (
        "attention mask covers 16 keys but this rank holds 8: under context parallelism the mask must be split with "
        "the sequence (list it in the model's _cp_plan, as diffusers' QwenImage does with encoder_hidden_states_mask)"
    )


# ---- the log-sum-exp merge ------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    q_len=st.integers(1, 9),
    key_len=st.integers(2, 17),
    data=st.data(),
    masked=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_merging_two_halves_gives_the_whole(q_len, key_len, data, masked, seed):
    """Split the keys anywhere: the halves' float64 (out, lse), merged, equal the whole call's — rows with no key
    in one half take the other half's result, rows with no key at all stay zeros with lse -inf."""
    split = data.draw(st.integers(1, key_len - 1), label="split")
    gen = torch.Generator().manual_seed(seed)
    query, key, value = (torch.randn(2, 3, n, 8, generator=gen, dtype=torch.float64) for n in (q_len, key_len, key_len))
    keep = None
    if masked:
        keep = torch.rand(2, 1, q_len, key_len, generator=gen) > 0.5
        keep[0, 0, 0] = False  # a row with no key at all
        keep[1, 0, -1, :split] = False  # a row with keys in the second half only
    halves = [slice(0, split), slice(split, key_len)]
    parts = []
    for keys in halves:
        part_keep = None if keep is None else keep[..., keys]
        parts.append(
            (
                reference_attention(query, key[:, :, keys], value[:, :, keys], part_keep),
                reference_lse(query, key[:, :, keys], part_keep),
            )
        )
    out, lse = merge_partials(parts[0][0], parts[0][1], parts[1][0], parts[1][1])
    torch.testing.assert_close(out, reference_attention(query, key, value, keep), atol=1e-12, rtol=1e-10)
    expected_lse = reference_lse(query, key, keep)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(expected_lse))
    finite = torch.isfinite(expected_lse)
    torch.testing.assert_close(lse[finite], expected_lse[finite], atol=1e-12, rtol=1e-10)
    if masked:
        assert torch.isneginf(lse[0, :, 0]).all() and not out[0, :, 0].any()


def test_nan_stays_nan_through_the_merge():
    out = torch.ones(1, 1, 3, 2)
    lse = torch.zeros(1, 1, 3)
    part_out = torch.ones(1, 1, 3, 2)
    part_out[0, 0, 0, 0] = math.nan
    part_lse = torch.tensor([[[0.0, math.nan, -math.inf]]])
    part_out[0, 0, 2] = math.nan  # no key in this part (lse -inf), but NaN in its output: still NaN
    merged, merged_lse = merge_partials(out, lse, part_out, part_lse)
    assert torch.isnan(merged[0, 0, 0, 0]) and merged[0, 0, 0, 1] == 1.0
    assert torch.isnan(merged[0, 0, 1]).all() and torch.isnan(merged_lse[0, 0, 1])
    assert torch.isnan(merged[0, 0, 2]).all() and merged_lse[0, 0, 2] == 0.0


# ---- what the sequence-parallel path refuses ------------------------------------------------------------------


def _qkv(heads=4, kv_heads=4, grad=False):
    shape = (1, 8, heads, 16)
    query = torch.randn(shape, requires_grad=grad)
    return query, torch.randn(1, 8, kv_heads, 16), torch.randn(1, 8, kv_heads, 16)


GROUPS = SimpleNamespace(ulysses=2, ulysses_anything=False)


@pytest.mark.parametrize(
    "qkv, options, text",
    [
        (
            _qkv(),
            dict(is_causal=True),
            "is_causal=True under context parallelism is not supported: each rank holds a slice of the sequence; run "
            "causal attention without enable_parallelism, or pass an explicit key mask",
        ),
        (
            _qkv(),
            dict(dropout_p=0.1),
            "attention dropout (0.1) under context parallelism is not supported (inference)",
        ),
        (
            _qkv(kv_heads=2),
            {},
            "grouped-query attention (4 query heads, 2 key heads) under context parallelism is not supported; repeat "
            "the key/value heads first",
        ),
        (
            _qkv(grad=True),
            {},
            "context-parallel attention through npu-port is inference-only (no backward); run under torch.no_grad()",
        ),
        (
            _qkv(heads=3, kv_heads=3),
            {},
            "3 attention heads cannot be split over ulysses degree 2: valid ulysses degrees for this model: 1, 3 (or "
            "ulysses_anything=True)",
        ),
    ],
)
def test_check_call_refusals(qkv, options, text):
    call = dict(dropout_p=0.0, is_causal=False, enable_gqa=False)
    call.update(options)
    with pytest.raises(ParallelError) as info:
        check_call(*qkv, call["dropout_p"], call["is_causal"], call["enable_gqa"], GROUPS)
    assert str(info.value) == text


def test_check_call_passes_what_it_can_compute():
    query, key, value = _qkv(heads=3, kv_heads=3, grad=True)
    with torch.no_grad():
        check_call(query, key, value, 0.0, False, False, SimpleNamespace(ulysses=2, ulysses_anything=True))
    check_call(*_qkv(), 0.0, False, False, GROUPS)
