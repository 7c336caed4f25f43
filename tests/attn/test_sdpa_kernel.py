"""The sdpa kernel: SDPA never sees a row without keys; pinned backends are predicted, or fail with a clear error."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import npu_port
from npu_port.attn import AttentionCall, get_kernel
from npu_port.errors import KernelRuntimeError, KernelUnavailableError


def test_sdpa_never_receives_a_row_without_keys(monkeypatch):
    """Fused SDPA backends have returned NaN for such rows (pytorch#103749, #109517); we never hand them one."""
    seen = []

    def strict_sdpa(query, key, value, attn_mask=None, **kwargs):
        seen.append(attn_mask)
        if attn_mask is not None:
            allowed = attn_mask if attn_mask.dtype == torch.bool else attn_mask > float("-inf")
            assert allowed.any(dim=-1).all(), "an empty row reached SDPA"
        return original(query, key, value, attn_mask=attn_mask, **kwargs)

    original = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", strict_sdpa)
    query = key = value = torch.randn(1, 2, 4, 8)
    keep = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    keep[..., 1, :] = False
    bias = torch.zeros(1, 1, 4, 4).masked_fill(~keep, float("-inf"))
    for mask in (keep, bias):
        out = npu_port.attention(query, key, value, mask, kernel="sdpa")
        assert torch.equal(out[:, :, 1], torch.zeros(1, 2, 8))
    # causality combined with a mask that leaves row 0 without its only visible key
    keep_causal = torch.ones(4, 4, dtype=torch.bool)
    keep_causal[:, 0] = False
    out = npu_port.attention(query, key, value, keep_causal, is_causal=True, kernel="sdpa")
    assert torch.equal(out[:, :, 0], torch.zeros(1, 2, 8)) and not torch.isnan(out).any()
    assert len(seen) == 3


def test_causal_without_a_mask_stays_is_causal_for_the_fused_backends(monkeypatch):
    calls = []
    original = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(k) or original(*a, **k))
    query = key = value = torch.randn(1, 2, 4, 8)
    npu_port.attention(query, key, value, is_causal=True, kernel="sdpa")
    assert calls[0]["is_causal"] is True and calls[0]["attn_mask"] is None


def test_pinned_backends_that_cannot_run_are_reasons():
    query = key = value = torch.randn(1, 2, 4, 8)
    call = AttentionCall.from_arguments(query, key, value, dropout_p=0.1)
    flash_only = get_kernel("sdpa", backends=["flash"])
    assert [str(r) for r in flash_only.reasons(call)] == [
        "none of the pinned SDPA backends can run this call (flash: the cpu flash kernel does not support dropout)"
    ]
    efficient = get_kernel("sdpa", backends="efficient")
    with pytest.raises(KernelUnavailableError, match=r"efficient: not available on cpu"):
        npu_port.attention(query, key, value, kernel=efficient)
    with_math = get_kernel("sdpa", backends=["flash", "math"])
    assert with_math.reasons(call) == []
    torch.manual_seed(0)
    out = npu_port.attention(query, key, value, kernel=flash_only)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(query, key, value))


def test_a_pinned_backend_failing_at_run_time_names_the_pinning(monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("No available kernel.  Aborting execution.")

    monkeypatch.setattr(F, "scaled_dot_product_attention", failing)
    query = key = value = torch.randn(1, 2, 4, 8)
    with pytest.raises(KernelRuntimeError) as info:
        npu_port.attention(query, key, value, kernel=get_kernel("sdpa", backends=["flash"]))
    assert str(info.value).startswith("SDPA pinned to flash could not run this call (query (1, 2, 4, 8) float32")
    assert str(info.value).endswith(
        ": No available kernel.  Aborting execution.; allow more backends (e.g. add 'math') or use the chunked kernel"
    )


def test_pinning_uses_the_current_context_manager_and_restores_flags():
    before = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    query = key = value = torch.randn(1, 2, 4, 8)
    npu_port.attention(query, key, value, kernel=get_kernel("sdpa", backends=["math"]))
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before
