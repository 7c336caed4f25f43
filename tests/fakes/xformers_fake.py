"""A stand-in for ``xformers.ops.memory_efficient_attention`` that enforces its documented contract, on the CPU.

This is not xformers. It checks what the real function demands of its inputs — BMK / BMHK / BMGHK layouts, equal
dtypes, last-dimension stride 1, additive tensor biases only (no bool), bias dtype equal to the query's, bias rows
8-aligned (cutlass' ``attn_bias.stride(-2) % 8`` rule, with its HINT), ``LowerTriangularMask`` as top-left causal —
and computes the documented result in float64. A row whose keys are all ``-inf`` comes back NaN, as fused kernels
may return it, so tests prove npu-port never hands it such a row.
"""

from __future__ import annotations

import importlib.machinery
import math
import types
from typing import Optional

import torch
from torch import Tensor


class LowerTriangularMask:
    """Causal bias: query ``i`` sees keys ``j <= i`` (top-left, as xformers materialises it with ``triu(1)``)."""


def _bias_tensor(attn_bias: object, query: Tensor, scores_shape) -> Optional[Tensor]:
    if attn_bias is None:
        return None
    q_len, key_len = scores_shape[-2:]
    if isinstance(attn_bias, LowerTriangularMask):
        masked = torch.ones(q_len, key_len, dtype=torch.bool).triu(1)
        return torch.zeros(q_len, key_len, dtype=torch.float64).masked_fill(masked, -math.inf)
    if not isinstance(attn_bias, Tensor):
        raise NotImplementedError(f"attn_bias type {type(attn_bias).__name__} is not emulated")
    if attn_bias.dtype == torch.bool:
        raise ValueError("attn_bias of dtype torch.bool is not supported: use an additive float bias")
    if attn_bias.dtype != query.dtype:
        raise ValueError(f"attn_bias dtype {attn_bias.dtype} must match query dtype {query.dtype}")
    if attn_bias.dim() >= 2 and attn_bias.shape[-2] > 1 and attn_bias.stride(-2) % 8 != 0:
        raise ValueError(
            "HINT: To use an `attn_bias` with a sequence length that is not a multiple of 8, you need to ensure "
            "memory is aligned by slicing a bigger tensor. Example: use `attn_bias = torch.zeros([1, 1, 5, 8])"
            "[:,:,:,:5]` instead of `torch.zeros([1, 1, 5, 5])`"
        )
    return attn_bias.double().expand(scores_shape)


def memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None, *, op=None, output_dtype=None):
    if op is not None or output_dtype is not None:
        raise NotImplementedError("op / output_dtype are not emulated")
    if not (query.dim() == key.dim() == value.dim()) or query.dim() not in (3, 4, 5):
        raise ValueError(
            f"query/key/value must all be BMK, BMHK or BMGHK; got {query.dim()}, {key.dim()}, {value.dim()} dims"
        )
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError("query, key and value must have the same dtype")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a last-dimension stride of 1; call .contiguous()")
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError("key and value must agree on every dimension but the last")
    bmk = query.dim() == 3
    if bmk:
        query, key, value = query[:, :, None], key[:, :, None], value[:, :, None]
    # (B, M, [G,] H, K) -> (B, [G,] H, M, K)
    q = query.movedim(1, -2).double()
    k = key.movedim(1, -2).double()
    v = value.movedim(1, -2).double()
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"batch/head dimensions differ: query {tuple(query.shape)}, key {tuple(key.shape)}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    bias = _bias_tensor(attn_bias, query, scores.shape)
    if bias is not None:
        scores = scores + bias
    probs = torch.softmax(scores, dim=-1)  # all -inf row -> NaN, as fused kernels may give
    if p > 0:
        probs = torch.nn.functional.dropout(probs, p=p, training=True)
    out = (probs @ v).movedim(-2, 1).to(query.dtype)  # back to (B, M, [G,] H, Kv)
    return out[:, :, 0] if bmk else out


def build_modules():
    """``(xformers, xformers.ops)`` module objects with proper specs, ready for ``sys.modules``."""
    package = types.ModuleType("xformers", "Test stand-in for xformers (npu-port tests); not the real package.")
    package.__spec__ = importlib.machinery.ModuleSpec("xformers", None, is_package=True)
    package.__path__ = []
    package.__version__ = "0.0.33+npu-port-fake"
    ops = types.ModuleType(
        "xformers.ops", "Stand-in for xformers.ops: memory_efficient_attention, LowerTriangularMask."
    )
    ops.__spec__ = importlib.machinery.ModuleSpec("xformers.ops", None)
    ops.memory_efficient_attention = memory_efficient_attention
    ops.LowerTriangularMask = LowerTriangularMask
    package.ops = ops
    return package, ops
