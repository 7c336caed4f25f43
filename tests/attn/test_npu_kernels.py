"""The Ascend kernels through the emulator: what they pass to the ops (layout, polarity, sparse mode) and why they
refuse what the ops' documents rule out."""

from __future__ import annotations

import pytest
import torch

import npu_port
from npu_port.attn import AttentionCall, get_kernel
from npu_port.attn.kernels import _ascend

from ..conftest import emulated_torch_npu
from ..reference import assert_close_to_reference, reference_attention


class Spy:
    """Wraps an emulated op and records every call's keyword arguments."""

    def __init__(self, module, name):
        self.module, self.name, self.calls = module, name, []
        self.original = getattr(module, name)
        setattr(module, name, self)

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.original(*args, **kwargs)


def _qkv(*shape, dtype=torch.float16, kv_heads=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    batch, heads, length, dim = shape
    query = torch.randn(batch, heads, length, dim, generator=gen).to(dtype)
    kv_shape = (batch, kv_heads or heads, length, dim)
    return query, torch.randn(kv_shape, generator=gen).to(dtype), torch.randn(kv_shape, generator=gen).to(dtype)


@pytest.mark.parametrize(
    "name, op", [("npu_fusion", "npu_fusion_attention"), ("npu_fused_infer", "npu_fused_infer_attention_score")]
)
def test_causal_goes_through_the_compressed_mask_and_sparse_mode_2_never_dropped(name, op):
    query, key, value = _qkv(1, 2, 40, 16)
    with emulated_torch_npu() as module, torch.no_grad():
        spy = Spy(module, op)
        out = npu_port.attention(query, key, value, is_causal=True, kernel=name)
    ((_, kwargs),) = spy.calls
    assert kwargs["sparse_mode"] == 2
    assert kwargs["atten_mask"].shape == (2048, 2048) and kwargs["atten_mask"].dtype == torch.bool
    assert torch.equal(kwargs["atten_mask"], torch.ones(2048, 2048, dtype=torch.bool).triu(1))  # True = masked
    assert kwargs["input_layout"] == "BNSD"
    assert_close_to_reference(out, reference_attention(query, key, value, is_causal=True), torch.float16)


def test_masks_are_passed_in_ascend_polarity_with_empty_rows_unmasked_then_zeroed():
    query, key, value = _qkv(2, 2, 6, 16)
    keep = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(3)) > 0.4
    keep[0, 0, 2] = False  # an empty row: the op never sees it, the output row is zero
    with emulated_torch_npu() as module, torch.no_grad():
        spy = Spy(module, "npu_fusion_attention")
        out = npu_port.attention(query, key, value, keep, kernel="npu_fusion")
    ((_, kwargs),) = spy.calls
    passed = kwargs["atten_mask"]
    assert passed.shape == (2, 1, 6, 6) and kwargs["sparse_mode"] == 0
    expected = ~keep
    expected[0, 0, 2] = False  # unmasked for the op
    assert torch.equal(passed, expected)
    assert torch.equal(out[0, :, 2], torch.zeros(2, 16, dtype=torch.float16))
    assert_close_to_reference(out, reference_attention(query, key, value, keep=keep), torch.float16)


def test_without_the_unmasking_the_emulated_op_returns_nan_rows():
    """The emulator makes undefined 'invalid rows' NaN: this is the failure the kernels protect against."""
    query, key, value = _qkv(1, 1, 4, 16)
    masked = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    masked[0, 0, 1] = True
    with emulated_torch_npu() as module:
        out = module.npu_fusion_attention(
            query, key, value, head_num=1, input_layout="BNSD", atten_mask=masked, scale=0.25
        )[0]
    assert torch.isnan(out[0, 0, 1]).all() and not torch.isnan(out[0, 0, 0]).any()


def test_gqa_is_native_and_dropout_becomes_keep_prob():
    query, key, value = _qkv(1, 4, 8, 16, kv_heads=2)
    with emulated_torch_npu() as module, torch.no_grad():
        fused = Spy(module, "npu_fused_infer_attention_score")
        npu_port.attention(query, key, value, enable_gqa=True, kernel="npu_fused_infer")
        fusion = Spy(module, "npu_fusion_attention")
        npu_port.attention(query, key, value, enable_gqa=True, dropout_p=0.25, kernel="npu_fusion")
    assert fused.calls[0][1]["num_heads"] == 4 and fused.calls[0][1]["num_key_value_heads"] == 2
    assert fused.calls[0][0][1].shape == (1, 2, 8, 16)  # key passed with its own 2 heads, not repeated
    assert fusion.calls[0][1]["head_num"] == 4 and fusion.calls[0][1]["keep_prob"] == 0.75


def test_single_query_causal_on_the_inference_op_gets_an_explicit_mask():
    """With q_len == 1 the op ignores sparse_mode; top-left causal means that query sees key 0 only."""
    query, key, value = _qkv(1, 2, 5, 16)
    query = query[:, :, :1]
    with emulated_torch_npu() as module, torch.no_grad():
        spy = Spy(module, "npu_fused_infer_attention_score")
        out = npu_port.attention(query, key, value, is_causal=True, kernel="npu_fused_infer")
    kwargs = spy.calls[0][1]
    assert kwargs["sparse_mode"] == 0
    assert kwargs["atten_mask"].tolist() == [[[[False, True, True, True, True]]]]
    torch.testing.assert_close(out, value[:, :, :1], atol=1e-3, rtol=1e-3)


def test_per_head_masks_are_expanded_over_the_batch_for_the_training_op():
    query, key, value = _qkv(2, 3, 4, 16)
    keep = torch.rand(1, 3, 4, 4, generator=torch.Generator().manual_seed(5)) > 0.3
    keep[..., 0] = True
    with emulated_torch_npu() as module, torch.no_grad():
        spy = Spy(module, "npu_fusion_attention")
        npu_port.attention(query, key, value, keep, kernel="npu_fusion")
    assert spy.calls[0][1]["atten_mask"].shape == (2, 3, 4, 4)  # 1NSS is not a documented form; BNSS is


@pytest.mark.parametrize(
    "name, make, code, text",
    [
        (
            "npu_fused_infer",
            lambda: (_qkv(1, 2, 4, 16, dtype=torch.float32), {}),
            "dtype",
            "dtype float32 is not supported by npu_fused_infer (supported: float16, bfloat16)",
        ),
        (
            "npu_fused_infer",
            lambda: (_qkv(1, 2, 4, 40), {}),
            "head-dim",
            "head_dim 40 is not a multiple of 16 (npu_fused_infer_attention_score needs 16-aligned head_dim for float16/bfloat16 when q_len > 1)",
        ),
        (
            "npu_fused_infer",
            lambda: (_qkv(1, 2, 4, 16), {"dropout_p": 0.1}),
            "dropout",
            "dropout_p=0.1 but npu_fused_infer applies no dropout; pass dropout_p=0.0 at inference (dropout_p=p if training else 0.0) or use a kernel that supports it",
        ),
        (
            "npu_fused_infer",
            lambda: (_qkv(1, 2, 4, 16), {"attn_mask": torch.ones(1, 2, 4, 4, dtype=torch.bool)}),
            "mask",
            "per-head mask (1, 2, 4, 4): npu_fused_infer_attention_score takes (batch|1, 1, q_len, key_len) masks only",
        ),
        ("npu_fusion", lambda: (_qkv(1, 2, 4, 800), {}), "head-dim", "head_dim 800 > 768 (npu_fusion limit)"),
        (
            "npu_fusion",
            lambda: (_qkv(1, 300, 2, 16), {}),
            "heads",
            "300 query heads > 256 (npu_fusion_attention limit)",
        ),
        (
            "npu_fusion",
            lambda: (_qkv(1, 2, 4, 16), {"attn_mask": torch.full((4, 4), 0.25, requires_grad=True)}),
            "mask",
            "float mask (1, 1, 4, 4) is a bias that requires grad: npu_fusion passes it as npu_fusion_attention's pse, and no gradient for pse is documented; use a kernel that adds it to the scores (sdpa, chunked, math)",
        ),
        (
            "npu_fusion",
            lambda: (_qkv(1, 2, 4, 16), {"dropout_p": 1.0}),
            "dropout",
            "dropout_p=1 would be keep_prob=0; npu_fusion_attention needs keep_prob in (0, 1]",
        ),
    ],
)
def test_documented_limits_are_reasons_with_values_and_limits(name, make, code, text):
    (query, key, value), kwargs = make()
    with emulated_torch_npu():
        call = AttentionCall.from_arguments(query, key, value, **kwargs)
        reasons = get_kernel(name).reasons(call)
    assert [(r.code, str(r)) for r in reasons] == [(code, text)]


def test_inference_op_refuses_gradients_and_training_op_gives_them():
    query, key, value = (t.requires_grad_(True) for t in _qkv(1, 2, 8, 16, dtype=torch.float32))
    with emulated_torch_npu():
        call = AttentionCall.from_arguments(query.half(), key.half(), value.half())
        assert [r.code for r in get_kernel("npu_fused_infer").reasons(call)] == ["grad"]
        out = npu_port.attention(query, key, value, is_causal=True, kernel="npu_fusion")
        grads = torch.autograd.grad(out.sum(), (query, key, value))
    assert all(torch.isfinite(g).all() for g in grads)


def test_npu_kernels_refuse_cpu_tensors_on_a_real_install():
    """Outside the test stand-in, the kernels serve npu tensors only (device_types is restored after the emulator)."""
    with emulated_torch_npu():
        pass
    assert get_kernel("npu_fusion").device_types == ("npu",)
    assert _ascend.compressed_causal_mask(torch.device("cpu")) is _ascend.compressed_causal_mask(torch.device("cpu"))
