"""A stand-in for ``flash_attn_npu`` (flash-attn-npu 0.4.2.post1's flash-attn 2 API), written from its documentation.

This is not flash-attn-npu. It has the package's public functions with their exact signatures (its
``flash_attn_npu/flash_attn_npu_interface.py``), makes the argument checks its README "Constraints" and its
``csrc/ascend910/flash_attn_npu/flash_api.cpp`` make — with their messages, as the ``RuntimeError`` a ``TORCH_CHECK``
raises — and computes the documented result in float64 on whatever device the tensors are on (there is no NPU here):

- causal and windows aligned bottom-right (query ``i`` sees keys in ``[i + Sk - Sq - left, i + Sk - Sq + right]``,
  a side >= Sk unbounded, causal = right 0), rows without keys give zeros and a log-sum-exp of +inf;
- softcap: ``softcap * tanh(scores * scale / softcap)``; ALiBi: ``- slope * |i + Sk - Sq - j|`` added after it;
- dropout on the probabilities (``p_dropout`` in [0, 1)); ``return_attn_probs=True`` returns ``(out, softmax_lse,
  S_dmask)``, ``S_dmask`` empty unless ``dropout_p > 0`` (the Python layer asks the kernel for it only then);
- ``flash_attn_with_kvcache``: appends ``k`` / ``v`` in place at ``cache_seqlens``, reads ``cache_batch_idx`` and
  paged caches (``block_table``), refuses rotary embeddings and ``cache_leftpad``.

Its import does what the package's ``__init__`` does: ``import torch_npu``, ask ``torch_npu.npu.get_device_name()``
and raise ``RuntimeError("Unsupported Ascend device: ...")`` unless the name contains "Ascend910". :func:`installed`
serves it through an import hook (so ``find_spec`` answers and a failing import fails like the real one), with the
torch_npu emulator given a device name, and lets npu-port's routing take CPU tensors meanwhile. Every call is recorded
with its bound arguments (:class:`Recorder`).

One check is the stand-in's own: ``cu_seqlens_*`` must be int32. The real v2 kernel does not check; it reads them as
int32 (the README says they "must be int32"), so int64 offsets would be read wrongly there: failing loudly here is
how a test notices a drop-in that passes them.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import inspect
import math
import sys
import types
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from ..emulators import torch_npu_emulator

VERSION = "0.4.2.post1"
#: The public functions of ``flash_attn_npu`` on a 910 (its ``__init__``).
FUNCTIONS = (
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "get_scheduler_metadata",
)


class Recorder:
    """What the stand-in was asked: ``calls`` = ``[(function, {argument: value})]`` (defaults filled in), the value
    each call returned, and how often the package was imported (its ``__init__`` ran)."""

    def __init__(self) -> None:
        self.calls: List[Tuple[str, Dict[str, Any]]] = []
        self.results: List[Any] = []
        self.imports = 0
        self.module: Optional[types.ModuleType] = None


def _check(condition: bool, message: str) -> None:
    """``TORCH_CHECK``: a RuntimeError with the kernel's message."""
    if not condition:
        raise RuntimeError(message)


def _check_common(q, k, v, dtype_message: str, dropout_p: float, softcap: float) -> None:
    _check(q.dtype in (torch.float16, torch.bfloat16), dtype_message)
    _check(k.dtype == q.dtype, "query and key must have the same dtype")
    _check(v.dtype == q.dtype, "query and value must have the same dtype")
    _check(softcap >= 0.0, "softcap must be non-negative (0.0 disables softcap)")
    _check(0.0 <= dropout_p < 1.0, "p_dropout must be in [0.0, 1.0)")


def _check_heads(head_dim: int, heads: int, kv_heads: int) -> None:
    _check(1 <= head_dim <= 256, "FlashAttention only supports head dimension in [1, 256]")
    _check(heads % kv_heads == 0, "Number of heads in key/value must divide number of heads in query")


def _check_alibi(alibi_slopes, batch: int, heads: int) -> None:
    if alibi_slopes is None:
        return
    _check(alibi_slopes.dtype == torch.float32, "ALiBi slopes must have dtype fp32")
    _check(alibi_slopes.stride(-1) == 1, "ALiBi slopes tensor must have contiguous last dimension")
    _check(
        tuple(alibi_slopes.shape) in ((heads,), (batch, heads)),
        "ALiBi slopes must have shape [num_heads] or [batch, num_heads]",
    )


def _bounds(causal: bool, window_size, key_len: int) -> Tuple[int, int]:
    """``flash_api.cpp``'s normalisation: a side >= seqlen_k is unbounded; causal = right 0."""
    left, right = (int(w) for w in window_size)
    if key_len > 0 and left >= key_len:
        left = -1
    if key_len > 0 and right >= key_len:
        right = -1
    if causal:
        right = 0
    return left, right


def _attend_one(q, k, v, *, scale, left, right, softcap, slopes, dropout_p, probs_out=None):
    """One sequence, float64: ``q`` ``(Sq, H, D)``, ``k`` / ``v`` ``(Sk, Hk, D)`` -> ``(out (Sq, H, D), lse (H, Sq))``."""
    q_len, heads, _ = q.shape
    key_len, kv_heads, _ = k.shape
    group = heads // kv_heads
    qd = q.double().transpose(0, 1)
    kd = k.double().transpose(0, 1).repeat_interleave(group, dim=0)
    vd = v.double().transpose(0, 1).repeat_interleave(group, dim=0)
    scores = qd @ kd.transpose(-1, -2)
    if softcap > 0:
        scores = softcap * torch.tanh(scores * scale / softcap)
    else:
        scores = scores * scale
    rows = torch.arange(q_len, device=q.device)[:, None]
    cols = torch.arange(key_len, device=q.device)[None, :]
    aligned = rows + key_len - q_len
    if slopes is not None:
        scores = scores - slopes.double().view(-1, 1, 1) * (aligned - cols).abs()
    keep = torch.ones(q_len, key_len, dtype=torch.bool, device=q.device)
    if right >= 0:
        keep &= cols <= aligned + right
    if left >= 0:
        keep &= cols >= aligned - left
    scores = scores.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)  # -inf where a row keeps nothing
    probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    if dropout_p > 0:
        kept = torch.rand(probs.shape, device=probs.device) >= dropout_p
        if probs_out is not None:
            probs_out.copy_(torch.where(kept, probs, -probs))  # "negative means that location was dropped"
        probs = probs * kept / (1.0 - dropout_p)
    out = (probs @ vd).transpose(0, 1)
    lse = torch.where(torch.isinf(lse), torch.full_like(lse, math.inf), lse)  # flash-attn: +inf for empty rows
    return out, lse


def _scale(softmax_scale, head_dim: int) -> float:
    return head_dim ** (-0.5) if softmax_scale is None else softmax_scale


def _recorded(method):
    """Record each call — the function's name and its arguments as given, defaults filled in — before running it
    (a call that raises is recorded too), and what it returned."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def recording(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        del arguments["self"]
        self.recorder.calls.append((method.__name__, arguments))
        result = method(self, *args, **kwargs)
        self.recorder.results.append(result)
        return result

    return recording


class _Package:
    """The functions of one imported stand-in, each recording into ``recorder``."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder

    # ---- dense ---------------------------------------------------------------------------------------------------

    def _dense(self, q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs):
        _check_common(q, k, v, "FlashAttention only support fp16 and bf16 data type", dropout_p, softcap)
        batch, q_len, heads, head_dim = q.shape
        key_len, kv_heads = k.shape[1], k.shape[2]
        _check(batch > 0, "batch size must be positive")
        _check_heads(head_dim, heads, kv_heads)
        _check_alibi(alibi_slopes, batch, heads)
        left, right = _bounds(causal, window_size, key_len)
        scale = _scale(softmax_scale, head_dim)
        want_probs = return_attn_probs and dropout_p > 0
        s_dmask = q.new_zeros((batch, heads, q_len, key_len)) if want_probs else q.new_empty((0,))
        outs, lses = [], []
        for b in range(batch):
            slopes = None if alibi_slopes is None else (alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b])
            out, lse = _attend_one(
                q[b],
                k[b],
                v[b],
                scale=scale,
                left=left,
                right=right,
                softcap=softcap,
                slopes=slopes,
                dropout_p=dropout_p,
                probs_out=s_dmask[b] if want_probs else None,
            )
            outs.append(out)
            lses.append(lse)
        out = torch.stack(outs).to(q.dtype)
        if return_attn_probs:
            return out, torch.stack(lses).float(), s_dmask
        return out

    @_recorded
    def flash_attn_qkvpacked_func(
        self,
        qkv,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
    ):
        q, k, v = qkv.unbind(dim=2)
        return self._dense(
            q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs
        )

    @_recorded
    def flash_attn_kvpacked_func(
        self,
        q,
        kv,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
    ):
        k, v = kv.unbind(dim=2)
        return self._dense(
            q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs
        )

    @_recorded
    def flash_attn_func(
        self,
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
        return self._dense(
            q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs
        )

    # ---- varlen --------------------------------------------------------------------------------------------------

    def _varlen(
        self,
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        return_attn_probs,
        block_table=None,
    ):
        _check_common(q, k, v, "NPU FlashAttention only supports Float16 or BFloat16.", dropout_p, softcap)
        for name, offsets in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            _check(offsets.dtype == torch.int32, f"{name} must have dtype int32")  # the stand-in's own check
        if block_table is not None:
            _check(block_table.dtype == torch.int32, "block_table must have dtype int32")
        total_q, heads, head_dim = q.shape
        kv_heads = k.shape[-2]
        batch = cu_seqlens_q.numel() - 1
        _check_heads(head_dim, heads, kv_heads)
        _check_alibi(alibi_slopes, batch, heads)
        left, right = _bounds(causal, window_size, max_seqlen_k)
        scale = _scale(softmax_scale, head_dim)
        q_off, k_off = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        out = torch.zeros(total_q, heads, head_dim, dtype=torch.float64, device=q.device)
        lse = torch.full((heads, total_q), math.inf, dtype=torch.float64, device=q.device)
        want_probs = return_attn_probs and dropout_p > 0
        s_dmask = q.new_zeros((batch, heads, max_seqlen_q, max_seqlen_k)) if want_probs else q.new_empty((0,))
        for b in range(batch):
            qs = slice(q_off[b], q_off[b + 1])
            key_len = k_off[b + 1] - k_off[b]
            if block_table is not None:  # k / v: (blocks, page, Hk, D); the sequence's keys are its pages in order
                keys = torch.cat([k[int(i)] for i in block_table[b]], dim=0)[:key_len]
                values = torch.cat([v[int(i)] for i in block_table[b]], dim=0)[:key_len]
            else:
                keys, values = k[k_off[b] : k_off[b + 1]], v[k_off[b] : k_off[b + 1]]
            if qs.stop == qs.start:
                continue
            slopes = None if alibi_slopes is None else (alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b])
            probs = s_dmask[b, :, : qs.stop - qs.start, :key_len] if want_probs else None
            out[qs], lse[:, qs] = _attend_one(
                q[qs],
                keys,
                values,
                scale=scale,
                left=left,
                right=right,
                softcap=softcap,
                slopes=slopes,
                dropout_p=dropout_p,
                probs_out=probs,
            )
        out = out.to(q.dtype)
        return (out, lse.float(), s_dmask) if return_attn_probs else out

    @_recorded
    def flash_attn_varlen_qkvpacked_func(
        self,
        qkv,
        cu_seqlens,
        max_seqlen,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
    ):
        q, k, v = qkv.unbind(dim=1)
        return self._varlen(
            q,
            k,
            v,
            cu_seqlens,
            cu_seqlens,
            max_seqlen,
            max_seqlen,
            dropout_p,
            softmax_scale,
            causal,
            window_size,
            softcap,
            alibi_slopes,
            return_attn_probs,
        )

    @_recorded
    def flash_attn_varlen_kvpacked_func(
        self,
        q,
        kv,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
    ):
        k, v = kv.unbind(dim=1)
        return self._varlen(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            dropout_p,
            softmax_scale,
            causal,
            window_size,
            softcap,
            alibi_slopes,
            return_attn_probs,
        )

    @_recorded
    def flash_attn_varlen_func(
        self,
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
        block_table=None,
    ):
        return self._varlen(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            dropout_p,
            softmax_scale,
            causal,
            window_size,
            softcap,
            alibi_slopes,
            return_attn_probs,
            block_table,
        )

    # ---- KV cache ------------------------------------------------------------------------------------------------

    @_recorded
    def flash_attn_with_kvcache(
        self,
        q,
        k_cache,
        v_cache,
        k=None,
        v=None,
        rotary_cos=None,
        rotary_sin=None,
        cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
        cache_batch_idx: Optional[torch.Tensor] = None,
        cache_leftpad: Optional[torch.Tensor] = None,
        block_table: Optional[torch.Tensor] = None,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        rotary_interleaved=True,
        alibi_slopes=None,
        num_splits=0,
        scheduler_metadata=None,
        return_softmax_lse=False,
    ):
        assert k_cache.stride(-1) == 1, "k_cache must have contiguous last dimension"
        assert v_cache.stride(-1) == 1, "v_cache must have contiguous last dimension"
        _check(q.dtype in (torch.float16, torch.bfloat16), "FlashAttention only supports FP16 and BF16 data types")
        _check(k_cache.dtype == q.dtype, "query and key_cache must have the same dtype")
        _check(v_cache.dtype == q.dtype, "query and value_cache must have the same dtype")
        if block_table is not None:
            _check(block_table.dtype == torch.int32, "block_table must have dtype int32")
        batch, q_len, heads, head_dim = q.shape
        if isinstance(cache_seqlens, int):
            cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=k_cache.device)
        if cache_seqlens is not None:
            _check(cache_seqlens.dtype == torch.int32, "seqlens_k must have dtype int32")
        _check(cache_leftpad is None, "NPU FlashAttention does not support leftpad_k")
        _check(rotary_cos is None, "NPU FlashAttention does not support rotary embedding")
        _check(rotary_sin is None, "NPU FlashAttention does not support rotary embedding")
        _check(softcap >= 0.0, "softcap must be non-negative (0.0 disables softcap)")
        _check(
            num_splits <= 1 or block_table is not None,
            "NPU FlashAttention num_splits>1 currently requires paged KV cache and BSND kvcache layout",
        )
        kv_heads = k_cache.shape[2]
        _check(batch > 0, "batch size must be positive")
        _check_heads(head_dim, heads, kv_heads)
        _check_alibi(alibi_slopes, batch, heads)
        page = k_cache.shape[1]
        capacity = page * block_table.shape[1] if block_table is not None else k_cache.shape[1]
        lengths = [k_cache.shape[1]] * batch if cache_seqlens is None else [int(n) for n in cache_seqlens.tolist()]
        new = 0
        if k is not None:
            _check(
                cache_seqlens is not None,
                "append-KV requires seqlens_k (cache_seqlens) with the per-batch cached lengths",
            )
            _check(k.dtype == q.dtype and v.dtype == q.dtype, "k/v must have the same dtype as q")
            _check(head_dim % 16 == 0, "append-KV requires head dim to be a multiple of 16")
            new = k.shape[1]
        rows = [int(i) for i in cache_batch_idx.tolist()] if cache_batch_idx is not None else list(range(batch))

        def slots(b: int, positions) -> List[Tuple[int, int]]:  # (tensor index along 0, index along 1)
            if block_table is None:
                return [(rows[b], p) for p in positions]
            return [(int(block_table[b, p // page]), p % page) for p in positions]

        left, right = _bounds(causal, window_size, max(n + new for n in lengths))
        if k is not None:
            _check(
                not ((left >= 0 or right >= 0) and not (left < 0 and right == 0)),
                "NPU FlashAttention append-KV does not support sliding-window attention (window_size) yet",
            )
            for b in range(batch):
                _check(lengths[b] + new <= capacity, f"append-KV: batch {b} exceeds cache capacity {capacity}")
                for j, (i, p) in enumerate(slots(b, range(lengths[b], lengths[b] + new))):
                    k_cache[i, p] = k[b, j]
                    v_cache[i, p] = v[b, j]
        scale = _scale(softmax_scale, head_dim)
        outs, lses = [], []
        for b in range(batch):
            length = lengths[b] + new
            where = slots(b, range(length))
            keys = (
                torch.stack([k_cache[i, p] for i, p in where]) if where else k_cache.new_zeros((0, kv_heads, head_dim))
            )
            values = torch.stack([v_cache[i, p] for i, p in where]) if where else keys
            slopes = None if alibi_slopes is None else (alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b])
            out, lse = _attend_one(
                q[b], keys, values, scale=scale, left=left, right=right, softcap=softcap, slopes=slopes, dropout_p=0.0
            )
            outs.append(out)
            lses.append(lse)
        out = torch.stack(outs).to(q.dtype)
        return (out, torch.stack(lses).float()) if return_softmax_lse else out

    @_recorded
    def get_scheduler_metadata(
        self,
        batch_size,
        max_seqlen_q,
        max_seqlen_k,
        num_heads_q,
        num_heads_kv,
        headdim,
        cache_seqlens: torch.Tensor,
        qkv_dtype=torch.bfloat16,
        headdim_v=None,
        cu_seqlens_q: Optional[torch.Tensor] = None,
        page_size: Optional[int] = None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        softmax_scale=None,
        alibi_slopes_batch_stride=0,
        num_splits=0,
    ):
        raise NotImplementedError("the flash_attn_npu stand-in does not emulate get_scheduler_metadata (AICPU tiling)")


def build_module(recorder: Recorder) -> types.ModuleType:
    """A ``flash_attn_npu`` module as its ``__init__`` builds it: asks torch_npu for the device name first."""
    import torch_npu  # the real __init__'s first import: the emulator here

    recorder.imports += 1
    device_name = torch_npu.npu.get_device_name()
    if "Ascend910" not in device_name:
        raise RuntimeError(f"Unsupported Ascend device: {torch_npu.npu.get_device_name()}")
    module = types.ModuleType(
        "flash_attn_npu", "STAND-IN for flash-attn-npu 0.4.2.post1's flash_attn_npu (npu-port tests); not the package."
    )
    module.__version__ = VERSION
    module.NPU_PORT_STAND_IN = True
    package = _Package(recorder)
    for name in FUNCTIONS:
        setattr(module, name, getattr(package, name))
    recorder.module = module
    return module


class _Loader(importlib.abc.Loader):
    def __init__(self, recorder: Recorder):
        self.recorder = recorder

    def create_module(self, spec):
        return build_module(self.recorder)  # raises as the real import does, before anything is in sys.modules

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    """Serves ``flash_attn_npu`` (only that name) and counts how often it was looked for."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.asked = 0

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "flash_attn_npu":
            return None
        self.asked += 1
        return importlib.machinery.ModuleSpec(fullname, _Loader(self.recorder), origin="flash_attn_npu stand-in")


@contextlib.contextmanager
def installed(device_name: str = "Ascend910B3", *, chip_visible: bool = True, cpu: bool = True):
    """The stand-in, importable as ``flash_attn_npu``, on an emulated NPU called ``device_name``.

    ``chip_visible``: ``torch.npu.get_device_name()`` answers too (npu-port's chip table sees the chip; without it the
    package's own import is what finds out). ``cpu``: npu-port's routing takes CPU tensors as NPU tensors. Yields
    ``(recorder, finder)``; everything is undone after, and npu-port's record of the package is dropped both ways.
    """
    from npu_port.dropins import flash_attn_npu as route

    recorder = Recorder()
    finder = _Finder(recorder)
    emulator = torch_npu_emulator.build_module()
    emulator.npu = types.SimpleNamespace(get_device_name=lambda device=None: device_name)
    saved_modules = {name: sys.modules.get(name) for name in ("torch_npu", "flash_attn_npu")}
    had_npu, saved_npu = hasattr(torch, "npu"), getattr(torch, "npu", None)
    saved_types = route.DEVICE_TYPES
    sys.modules["torch_npu"] = emulator
    sys.modules.pop("flash_attn_npu", None)
    if chip_visible:
        torch.npu = types.SimpleNamespace(is_available=lambda: True, get_device_name=lambda device=0: device_name)
    if cpu:
        route.DEVICE_TYPES = saved_types + ("cpu",)
    sys.meta_path.insert(0, finder)
    route.forget()
    route.ROUTES.clear()
    try:
        yield recorder, finder
    finally:
        sys.meta_path.remove(finder)
        route.DEVICE_TYPES = saved_types
        if had_npu:
            torch.npu = saved_npu
        elif hasattr(torch, "npu"):
            del torch.npu
        for name, module in saved_modules.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        route.forget()
