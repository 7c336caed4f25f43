"""A stand-in for ``flash_attn.flash_attn_func`` (FlashAttention 2) that enforces its documented contract, on CPU.

This is not flash-attn. It checks the inputs the real function checks — ``(B, S, H, D)`` layout, float16/bfloat16
only, last-dimension stride 1, head_dim <= 256 and equal for q/k/v, query heads a multiple of key/value heads — and
computes the documented result in float64, including causal masks aligned to the *bottom-right* corner when
q_len != key_len (flash-attn >= 2.1), which is why npu-port refuses that case for SDPA-semantics calls.
"""

from __future__ import annotations

import importlib.machinery
import math
import types

import torch


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    if tuple(window_size) != (-1, -1) or softcap or alibi_slopes is not None or return_attn_probs:
        raise NotImplementedError("window_size / softcap / alibi_slopes / return_attn_probs are not emulated")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError("query and key must have the same dtype")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise RuntimeError("flash_attn_func expects (batch, seqlen, nheads, headdim) tensors")
    for t in (q, k, v):
        if t.stride(-1) != 1:
            raise RuntimeError("Input tensor must have contiguous last dimension")
    batch, q_len, heads, dim = q.shape
    _, key_len, kv_heads, _ = k.shape
    if k.shape != v.shape or k.shape[-1] != dim:
        raise RuntimeError("k and v must have the same shape, and head dims must match q")
    if dim > 256:
        raise RuntimeError("FlashAttention forward only supports head dimension at most 256")
    if heads % kv_heads:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")
    group = heads // kv_heads
    qd = q.double().transpose(1, 2)
    kd = k.double().transpose(1, 2).repeat_interleave(group, dim=1)
    vd = v.double().transpose(1, 2).repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(dim) if softmax_scale is None else softmax_scale
    scores = (qd @ kd.transpose(-1, -2)) * scale
    if causal:  # bottom-right: query i sees keys j <= i + (key_len - q_len)
        rows = torch.arange(q_len)[:, None]
        cols = torch.arange(key_len)[None, :]
        scores = scores.masked_fill(cols > rows + (key_len - q_len), -math.inf)
    probs = torch.softmax(scores, dim=-1)
    if dropout_p > 0:
        probs = torch.nn.functional.dropout(probs, p=dropout_p, training=True)
    return (probs @ vd).transpose(1, 2).to(q.dtype)


def build_module():
    """A ``flash_attn`` module object with a proper spec, ready for ``sys.modules``."""
    module = types.ModuleType("flash_attn", "Test stand-in for flash_attn (npu-port tests); not the real package.")
    module.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    module.__version__ = "2.8.3+npu-port-fake"
    module.flash_attn_func = flash_attn_func
    return module
