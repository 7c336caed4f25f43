"""Emulator of the documented contract of two torch_npu 2.13.0 attention operators -- for tests only.

What this is
    A plain-PyTorch stand-in for ``torch_npu.npu_fusion_attention`` and
    ``torch_npu.npu_fused_infer_attention_score``, written from the operators' own documentation
    (``torch_npu/_op_plugin_docs.py`` in the torch_npu 2.13.0 wheel, which tests/torch_npu_docs.py fetches
    and reads).  It is NOT the Ascend kernels and says nothing about
    their speed, memory, or bit-level numerics.  It exists so that npu-port's NPU attention code paths -- layout
    conversion, mask polarity and shape, sparse_mode choice, GQA, scale, the 7-tuple -- can be tested on a
    machine without Ascend hardware.  The test suite checks the emulator itself against the reference
    computations printed in those same docs (tests/attn/test_torch_npu_emulator.py).

How to use it in a test
        import sys
        from tests.emulators import torch_npu_emulator
        monkeypatch.setitem(sys.modules, "torch_npu", torch_npu_emulator.build_module())
    ``import torch_npu`` then yields a module with ``__version__ == "2.13.0"``, ``NPU_PORT_EMULATOR is True``
    and the two functions.  ``install(monkeypatch)`` does exactly that and returns the module.

What is emulated (the doc sentence each rule comes from is quoted at the code)
    * layouts -- npu_fusion_attention: BSH, SBH, BSND, BNSD; npu_fused_infer_attention_score: BSH, BSND, BNSD,
      BNSD_BSND (BNSD in, BSND out; Q_S > 1 only).  For 3-D layouts D = H / N.
    * mask polarity: True / 1 = masked (not computed).  Mask dtypes: fusion bool/uint8, FIA bool/int8/uint8.
    * atten_mask=None means no mask at all: sparse_mode, pre_tockens and next_tockens are then ignored, so a
      "causal" call without a mask silently computes full attention (the documented trap).  Exception, also
      documented: FIA with Q_S > 1 and sparse_mode 2/3/4 raises without a mask.
    * sparse_mode 0 (mask AND the pre/next band counted from the top-left: query i keeps key j when
      i - pre <= j <= i + next), 1 (mask only), 2 (leftUpCausal: j <= i), 3 (rightDownCausal:
      j <= i + Skv - Sq), 4 (band from the bottom-right:
      i + Skv - Sq - pre <= j <= i + Skv - Sq + next).  Modes 2/3/4 require the compressed 2048x2048 mask
      triu(ones, diagonal=1); the emulator checks both its shape and its content (the real op only says a
      wrong mask gives wrong results -- failing loudly is the useful emulation of that).
    * pse (npu_fusion_attention), formats BNSS, BN1Skv and 1NSS, in the query's dtype, not with sparse_mode 7/8.
      The docs give two formulas: softmax(Mask(scale * (pse + q.k^T))) in the description and
      softmax(scale * q.k^T + pse) as the example's reference; they agree only when scale == 1, so only that case
      is emulated (scores = q.k^T + pse) and any other scale with a pse raises NpuContractError -- a caller that
      passes the test never relies on which formula the hardware follows.  A pse that needs a gradient raises
      NotImplementedError (no dpse is documented); the alibi-compressed pse (last 1024 rows) is not emulated.
    * scale on q.k^T; dropout with keep_prob in (0, 1] on the softmax probabilities, rescaled by 1/keep_prob
      and drawn from torch's RNG (fusion only).
    * GQA: query heads per key/value head = Nq / Nkv, a positive integer; consecutive query heads share a
      key/value head (``repeat_interleave`` order).
    * FIA actual_seq_lengths_kv (keys past the length are masked; per batch, also shifts the bottom-right
      origin of modes 3/4) and actual_seq_lengths (query rows past the length come back as zeros).
    * FIA with Q_S == 1: sparse_mode, pre_tokens, next_tokens and actual_seq_lengths are ignored; the mask,
      if any, is a plain mask of shape (B, KV_S), (B, 1, 1, KV_S), (1, 1, KV_S) or (1, 1, 1, KV_S).
    * documented limits, checked with clear errors (dtypes, head dims, head counts, shapes, mask forms).

Accepted atten_mask shapes
    npu_fusion_attention, sparse_mode 0/1: (B, N, Sq, Skv), (B, 1, Sq, Skv), (1, 1, Sq, Skv), (Sq, Skv) --
    exact sizes.  FIA, sparse_mode 0/1 (or any mode when Q_S == 1): (1, Q_S, KV_S), (B, 1, Q_S, KV_S),
    (1, 1, Q_S, KV_S), plus (Q_S, KV_S) when Q_S > 1 and (B, KV_S) when Q_S == 1; the two S sizes may be
    larger than the real ones (the docs allow padding them up to 16/32 alignment) and only the leading
    part is used; a per-head (B, N, Q_S, KV_S) mask with N > 1 is refused.  Both ops, sparse_mode 2/3/4:
    (2048, 2048), (1, 2048, 2048), (1, 1, 2048, 2048).

Invalid rows (a query row whose keys are all masked)
    The docs only say precision is lost unless the invalid-row correction is on (fusion: inner_precise == 2;
    FIA: bit 1 of inner_precise, i.e. 2 or 3).  The emulator takes the worst case: such rows are NaN without
    the correction and zeros with it.  npu_fusion_attention also turns the correction on by itself for
    sparse_mode 3 with Sq > Skv, as its docs say the op does.  A FIA batch whose key length is 0 gives zeros.

Outputs
    npu_fusion_attention -> (attention_out in the input layout and dtype, softmax_max, softmax_sum,
    reserved empty tensor, seed, offset, dropout-mask length).  softmax_max / softmax_sum are float32 of shape
    (B, N, Sq, 8), the row max of the scaled masked scores and the sum of exp(score - max), repeated over the
    last axis as the real op lays them out (-inf / 0 for invalid rows).  seed and offset are 0 without dropout;
    with dropout they are ``torch.initial_seed()`` and 0 (not Philox values -- don't rely on them).  The length
    is B*N*Sq*Skv.  npu_fused_infer_attention_score -> (attention_out, softmax_lse): lse is float32
    zeros([1]) unless softmax_lse_flag, then (B, N, Q_S, 1) logsumexp of the scaled masked scores (-inf for
    invalid rows, 0 for query rows past actual_seq_lengths).

Errors
    Calls outside the documented contract raise ``NpuContractError`` (a RuntimeError, like the real op's
    TORCH_CHECK failures).  Documented features this emulator does not implement raise NotImplementedError
    (also a RuntimeError) naming the argument: layout TND (varlen), fusion sparse_mode 5-8, alibi-compressed pse, padding_mask,
    prefix, actual_seq_qlen/actual_seq_kvlen; FIA sparse_mode 9, int8 query, int8/int4 key/value, pse_shift,
    every quantisation / antiquantisation argument and mode, block_table / block_size (page attention),
    query/kv padding sizes, shared prefix, query_rope / key_rope.

Computation
    float64 throughout, cast to the input dtype at the end; npu_fusion_attention is differentiable by autograd
    (it is the training op); softmax_max / softmax_sum / lse are detached, as in the real op.
"""

from __future__ import annotations

import functools
import importlib.machinery
import sys
import types
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

__all__ = [
    "NpuContractError",
    "build_module",
    "install",
    "npu_fusion_attention",
    "npu_fused_infer_attention_score",
]

TORCH_NPU_VERSION = "2.13.0"
INT_MAX = 2147483647
COMPRESSED_MASK_SIDE = 2048
SOFTMAX_STAT_LANES = 8  # softmax_max / softmax_sum are (B, N, Sq, 8) on the real op

FUSION = "npu_fusion_attention"
FIA = "npu_fused_infer_attention_score"
FUSION_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD")
FIA_LAYOUTS = ("BSH", "BSND", "BNSD", "BNSD_BSND")
THREE_D_LAYOUTS = ("BSH", "SBH")


class NpuContractError(RuntimeError):
    """A call outside the documented contract of the emulated op (the real op rejects it or misbehaves)."""


# ----------------------------------------------------------------------------------------------------------
# small checks


def _require(condition: bool, op: str, message: str) -> None:
    if not condition:
        raise NpuContractError(f"{op}: {message}")


def _reject_features(op: str, **features) -> None:
    """NotImplementedError for the first documented feature argument that is set; None means 'not used'."""
    for name, value in features.items():
        if value is not None:
            raise NotImplementedError(
                f"{op}: argument {name!r} is part of the torch_npu contract but is not emulated "
                f"(tests/emulators/torch_npu_emulator.py covers plain attention, masks, sparse modes, GQA, scale)"
            )


def _reject_modes(op: str, **modes: int) -> None:
    """NotImplementedError for a non-default quantisation / page-attention mode (those features are not emulated)."""
    for name, value in modes.items():
        if value != 0:
            raise NotImplementedError(f"{op}: {name}={value!r} selects a feature that is not emulated")


def _check_mask_dtype(op: str, mask: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    names = "/".join(str(d).replace("torch.", "") for d in allowed)
    _require(
        mask.dtype in allowed,
        op,
        f"atten_mask dtype must be {names} (True / 1 = masked), got {mask.dtype}; "
        "a float additive mask is not accepted by this op",
    )


# ----------------------------------------------------------------------------------------------------------
# layouts: everything is computed in BNSD


def _expected_ndim(layout: str) -> int:
    return 3 if layout in THREE_D_LAYOUTS else 4


def _to_bnsd(x: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    """(B, N, S, D) view of ``x``; ``heads`` is only used to split H of the 3-D layouts (D = H / N)."""
    if layout in ("BNSD", "BNSD_BSND"):
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout == "BSH":
        b, s, h = x.shape
        return x.reshape(b, s, heads, h // heads).transpose(1, 2)
    if layout == "SBH":
        s, b, h = x.shape
        return x.reshape(s, b, heads, h // heads).permute(1, 2, 0, 3)
    raise AssertionError(layout)


def _from_bnsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """Inverse of _to_bnsd for the output; BNSD_BSND: "当输入为BNSD, 输出格式为BSND"."""
    b, n, s, d = x.shape
    if layout == "BNSD":
        return x.contiguous()
    if layout in ("BSND", "BNSD_BSND"):
        return x.transpose(1, 2).contiguous()
    if layout == "BSH":
        return x.transpose(1, 2).reshape(b, s, n * d)
    if layout == "SBH":
        return x.permute(2, 0, 1, 3).reshape(s, b, n * d)
    raise AssertionError(layout)


def _check_ndims(op: str, layout: str, **tensors: torch.Tensor) -> None:
    ndim = _expected_ndim(layout)
    for name, t in tensors.items():
        _require(t.dim() == ndim, op, f"input_layout {layout} needs {ndim}-D {name}, got shape {tuple(t.shape)}")


def _split_three_d(op: str, query, key, value, layout: str, q_heads: int, kv_heads: Optional[int]):
    """Split H of BSH/SBH into heads.  ``kv_heads`` None means 'derive it as H_kv / D' (fusion has no kv-head arg)."""
    hq = query.shape[-1]
    _require(hq % q_heads == 0, op, f"query H={hq} is not divisible by the head count {q_heads} (D = H / N)")
    d = hq // q_heads
    hk = key.shape[-1]
    if kv_heads is None:
        _require(hk % d == 0, op, f"key H={hk} is not a multiple of the head dim D={d} (= query H / head_num)")
        kv_heads = hk // d
    else:
        _require(hk == kv_heads * d, op, f"key H={hk} != num_key_value_heads ({kv_heads}) * D ({d})")
    _require(
        kv_heads >= 1 and value.shape[-1] % kv_heads == 0,
        op,
        f"value H={value.shape[-1]} is not divisible by the key/value head count {kv_heads}",
    )
    return (_to_bnsd(query, layout, q_heads), _to_bnsd(key, layout, kv_heads), _to_bnsd(value, layout, kv_heads))


def _check_heads_and_dims(op: str, q, k, v, *, max_heads: int, max_ratio: Optional[int]) -> None:
    """Batch, head-count and GQA rules shared by both ops, on BNSD views."""
    _require(
        q.shape[0] == k.shape[0] == v.shape[0],
        op,
        f"batch sizes differ: query {q.shape[0]}, key {k.shape[0]}, value {v.shape[0]}",
    )
    _require(
        k.shape[1] == v.shape[1] and k.shape[2] == v.shape[2],
        op,
        f"key and value must have the same N and S, got key {tuple(k.shape)} value {tuple(v.shape)} (BNSD)",
    )
    nq, nkv = q.shape[1], k.shape[1]
    # fusion: "Nq/Nkv必须是非0整数, Nq取值范围1~256"; FIA: "num_heads整除num_key_value_heads, 比值不能大于64", "N轴小于等于256"
    _require(1 <= nq <= max_heads, op, f"query head count must be in 1..{max_heads}, got {nq}")
    _require(
        nkv >= 1 and nq % nkv == 0, op, f"query heads ({nq}) must be a positive multiple of key/value heads ({nkv})"
    )
    if max_ratio is not None:
        _require(nq // nkv <= max_ratio, op, f"num_heads / num_key_value_heads must be <= {max_ratio}, got {nq // nkv}")
    _require(q.shape[3] == k.shape[3], op, f"query and key head dims differ: {q.shape[3]} vs {k.shape[3]}")


# ----------------------------------------------------------------------------------------------------------
# masks: built as boolean "keep" tensors broadcastable to (B, N, Sq, Skv)


def _band_keep(sq: int, skv: int, pre: int, nxt: int, origins: torch.Tensor, device) -> torch.Tensor:
    """Keys j kept by a pre/next band around the diagonal ``i + origin``; shape (len(origins), 1, Sq, Skv).

    origin 0 is the top-left start (sparse_mode 0, 2); origin Skv - Sq the bottom-right one (sparse_mode 3, 4).
    """
    i = torch.arange(sq, device=device).view(1, 1, sq, 1) + origins.to(device).view(-1, 1, 1, 1)
    j = torch.arange(skv, device=device).view(1, 1, 1, skv)
    return (j >= i - pre) & (j <= i + nxt)


@functools.lru_cache(maxsize=8)
def _compressed_triangle(device: str) -> torch.Tensor:
    return torch.ones(COMPRESSED_MASK_SIDE, COMPRESSED_MASK_SIDE, dtype=torch.bool, device=device).triu(1)


def _check_compressed_mask(op: str, mask: torch.Tensor, sparse_mode: int) -> None:
    """Modes 2/3/4 take the "优化后的压缩下三角矩阵(2048*2048)": shape (2048,2048)/(1,2048,2048)/(1,1,2048,2048)."""
    side = COMPRESSED_MASK_SIDE
    shapes = ((side, side), (1, side, side), (1, 1, side, side))
    _require(
        tuple(mask.shape) in shapes,
        op,
        f"sparse_mode={sparse_mode} needs the compressed {side}x{side} mask of shape (2048, 2048), "
        f"(1, 2048, 2048) or (1, 1, 2048, 2048), got {tuple(mask.shape)}",
    )
    triangle = _compressed_triangle(str(mask.device))
    _require(
        torch.equal(mask.reshape(side, side).bool(), triangle),
        op,
        f"sparse_mode={sparse_mode} needs the compressed mask torch.triu(torch.ones(2048, 2048), diagonal=1) "
        "(True above the diagonal = masked); the mask given is not that triangle",
    )


def _fusion_plain_masked(mask: torch.Tensor, b: int, n: int, sq: int, skv: int) -> torch.Tensor:
    """npu_fusion_attention mask "shape类型支持BNSS格式、B1SS格式、11SS格式、SS格式" -> bool (.., .., Sq, Skv)."""
    forms = {(b, n, sq, skv): "BNSS", (b, 1, sq, skv): "B1SS", (1, 1, sq, skv): "11SS", (sq, skv): "SS"}
    _require(
        tuple(mask.shape) in forms,
        FUSION,
        f"atten_mask shape {tuple(mask.shape)} is none of BNSS {(b, n, sq, skv)}, B1SS {(b, 1, sq, skv)}, "
        f"11SS {(1, 1, sq, skv)}, SS {(sq, skv)}",
    )
    masked = mask.bool()
    return masked if masked.dim() == 4 else masked.view(1, 1, sq, skv)


def _fia_plain_masked(mask: torch.Tensor, b: int, sq: int, skv: int) -> torch.Tensor:
    """FIA mask for sparse_mode 0/1 (or any mode when Q_S == 1) -> bool (B|1, 1, Q_S, KV_S).

    Docs: "支持shape传入(1,Q_S,KV_S)、(B,1,Q_S,KV_S)、(1,1,Q_S,KV_S)。... Q_S为1可支持传入(B,KV_S)，Q_S大于1时可支持
    传入(Q_S,KV_S)。如果Q_S、KV_S非16或32对齐，可以向上取到对齐的S。" -- so S sizes may be padded; the leading part
    is used.
    """
    shape = tuple(mask.shape)
    accepted = (
        f"(1, Q_S, KV_S), (B, 1, Q_S, KV_S), (1, 1, Q_S, KV_S) or "
        f"{'(B, KV_S)' if sq == 1 else '(Q_S, KV_S)'} with B={b}, Q_S>={sq}, KV_S>={skv}"
    )
    if mask.dim() == 4:
        _require(shape[1] == 1, FIA, f"atten_mask shape {shape}: a per-head mask is not accepted, use {accepted}")
        ok, lead = shape[0] in (1, b), shape[0]
    elif mask.dim() == 3:
        ok, lead = shape[0] == 1, 1
        mask = mask.unsqueeze(0)
    elif mask.dim() == 2 and sq == 1:
        ok, lead = shape[0] == b, b
        mask = mask.view(shape[0], 1, 1, shape[1])
    elif mask.dim() == 2:
        ok, lead = True, 1
        mask = mask.view(1, 1, *shape)
    else:
        ok, lead = False, 1
    _require(
        ok and mask.shape[2] >= sq and mask.shape[3] >= skv,
        FIA,
        f"atten_mask shape {shape} is not accepted; use {accepted}",
    )
    return mask[:lead, :, :sq, :skv].bool()


def _fusion_keep(atten_mask, sparse_mode: int, pre: int, nxt: int, b: int, n: int, sq: int, skv: int, device):
    """Boolean keep mask for npu_fusion_attention, or None for 'compute everything'."""
    if atten_mask is None:
        # "当atten_mask输入为None时, sparse_mode, pre_tockens, next_tockens参数不生效, 固定为全计算."
        return None
    _check_mask_dtype(FUSION, atten_mask, (torch.bool, torch.uint8))
    origin0 = torch.zeros(1, dtype=torch.long)
    if sparse_mode in (0, 1):
        keep = ~_fusion_plain_masked(atten_mask.to(device), b, n, sq, skv)
        if sparse_mode == 0:
            # "sparse_mode为0时, 代表defaultMask模式" with pre/next: "pre_tockens和next_tockens之间的部分需要计算"
            keep = keep & _band_keep(sq, skv, pre, nxt, origin0, device)
        # "sparse_mode为1时, 代表allMask ... 忽略next_tockens、pre_tockens取值"
        return keep
    _check_compressed_mask(FUSION, atten_mask, sparse_mode)
    return _compressed_mode_keep(sparse_mode, pre, nxt, sq, skv, torch.full((1,), skv - sq), device)


def _compressed_mode_keep(sparse_mode: int, pre: int, nxt: int, sq: int, skv: int, bottom_right, device):
    """Modes 2/3/4 as bands: 2 leftUpCausal ("参数起点为左上角"), 3 rightDownCausal ("参数起点为右下角"),
    4 band ("计算pre_tockens和next_tockens之间的部分, 参数起点为右下角"); ``bottom_right`` = per-batch Skv - Sq."""
    if sparse_mode == 2:
        return _band_keep(sq, skv, INT_MAX, 0, torch.zeros(1, dtype=torch.long), device)
    if sparse_mode == 3:
        return _band_keep(sq, skv, INT_MAX, 0, bottom_right, device)
    return _band_keep(sq, skv, pre, nxt, bottom_right, device)


# ----------------------------------------------------------------------------------------------------------
# the computation


@dataclass
class _Attended:
    out: torch.Tensor  # (B, N, Sq, Dv) float64
    row_max: torch.Tensor  # (B, N, Sq, 1) float64, detached; -inf on invalid rows
    row_sum: torch.Tensor  # (B, N, Sq, 1) float64, detached; 0 on invalid rows


def _attend(
    q, k, v, keep: Optional[torch.Tensor], scale: float, keep_prob: float, fix_invalid_rows: bool, pse=None
) -> _Attended:
    """softmax(Mask(scale * q k^T + pse)) (dropout) v in float64, with the documented invalid-row behaviour (the
    caller allows a pse only with scale == 1, where the two documented formulas agree).

    An invalid row (every key masked) divides 0 by 0 and so comes out NaN -- the emulated "precision loss" --
    unless ``fix_invalid_rows``, where it is 0.  exp is taken against a detached, finite row max, so the
    gradients of valid rows stay exact and no NaN leaks into them through masked entries.
    """
    if k.shape[2] == 0:  # no keys at all: nothing to attend to (FIA: "S2为0 ... 则填充全零")
        rows = (*q.shape[:3], 1)
        return _Attended(
            out=q.new_zeros(*q.shape[:3], v.shape[3], dtype=torch.float64),
            row_max=q.new_full(rows, float("-inf"), dtype=torch.float64),
            row_sum=q.new_zeros(rows, dtype=torch.float64),
        )
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)  # query head h uses key head h // group
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.matmul(q.double(), k.transpose(-2, -1)) * scale
    if pse is not None:
        scores = scores + pse.double()
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    invalid = torch.isneginf(row_max)
    weights = torch.exp(scores - torch.where(invalid, torch.zeros_like(row_max), row_max))
    row_sum = weights.sum(dim=-1, keepdim=True)
    denominator = torch.where(invalid, torch.ones_like(row_sum), row_sum) if fix_invalid_rows else row_sum
    probs = weights / denominator
    if keep_prob < 1.0:
        kept = torch.rand(probs.shape, dtype=probs.dtype, device=probs.device) < keep_prob
        probs = probs * kept / keep_prob
    return _Attended(out=torch.matmul(probs, v), row_max=row_max, row_sum=row_sum.detach())


def _softmax_stat(x: torch.Tensor) -> torch.Tensor:
    """(B, N, Sq, 1) -> float32 (B, N, Sq, 8), the value repeated over the lanes like the real op."""
    return x.float().expand(*x.shape[:-1], SOFTMAX_STAT_LANES).contiguous()


# ----------------------------------------------------------------------------------------------------------
# npu_fusion_attention


def _fusion_validate_scalars(input_layout, keep_prob, inner_precise, sparse_mode, softmax_layout) -> None:
    if input_layout == "TND":
        raise NotImplementedError(f"{FUSION}: input_layout 'TND': TND/varlen is not emulated")
    _require(
        input_layout in FUSION_LAYOUTS,
        FUSION,
        f"input_layout must be one of {', '.join(FUSION_LAYOUTS)} (or TND), got {input_layout!r}",
    )
    # "softmax_layout ... 当前仅在input_layout=“TND”时进行配置"
    _require(softmax_layout == "", FUSION, f"softmax_layout is only for input_layout TND, got {softmax_layout!r}")
    # "keep_prob ... 取值范围为(0, 1]"
    _require(0.0 < keep_prob <= 1.0, FUSION, f"keep_prob must be in (0, 1], got {keep_prob}")
    # "当前0、1为保留配置值, 2为使能无效行计算"
    _require(inner_precise in (0, 1, 2), FUSION, f"inner_precise must be 0, 1 or 2, got {inner_precise}")
    if sparse_mode in (5, 6, 7, 8):
        raise NotImplementedError(f"{FUSION}: sparse_mode={sparse_mode} (prefix / varlen modes) is not emulated")
    _require(sparse_mode in (0, 1, 2, 3, 4), FUSION, f"sparse_mode must be 0..8, got {sparse_mode}")


def _fusion_validate_tensors(query, key, value, head_num: int, layout: str):
    """Dtype and shape rules of npu_fusion_attention; returns BNSD views of q, k, v."""
    allowed = (torch.float16, torch.bfloat16, torch.float32)
    _require(query.dtype in allowed, FUSION, f"query dtype must be float16, bfloat16 or float32, got {query.dtype}")
    # "输入query、key、value、pse的数据类型必须一致."
    _require(
        key.dtype == query.dtype and value.dtype == query.dtype,
        FUSION,
        f"query, key and value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}",
    )
    _require(head_num >= 1, FUSION, f"head_num must be >= 1, got {head_num}")
    _check_ndims(FUSION, layout, query=query, key=key, value=value)
    if layout in THREE_D_LAYOUTS:
        q, k, v = _split_three_d(FUSION, query, key, value, layout, head_num, None)
    else:
        q, k, v = (_to_bnsd(t, layout, head_num) for t in (query, key, value))
        _require(q.shape[1] == head_num, FUSION, f"head_num={head_num} but query has N={q.shape[1]} ({layout})")
    _check_heads_and_dims(FUSION, q, k, v, max_heads=256, max_ratio=None)
    dk, dv = k.shape[3], v.shape[3]
    # "D: Head Dim必须满足Dq=Dk和Dk≥Dv，取值范围1~768."
    _require(
        1 <= dk <= 768 and 1 <= dv <= dk,
        FUSION,
        f"head dims must satisfy 1 <= Dv <= Dq = Dk <= 768, got Dq=Dk={dk}, Dv={dv}",
    )
    # "S: sequence length, 取值范围1~1M."
    _require(q.shape[2] >= 1 and k.shape[2] >= 1, FUSION, "sequence lengths must be >= 1")
    return q, k, v


#: The two documented ways npu_fusion_attention scales pse (description formula, example reference).
PSE_FORMULAS = (
    "softmax(Mask(scale * (pse + q k^T))) (the formula) and softmax(scale * q k^T + pse) (the pse example's reference)"
)


def _fusion_check_pse(pse, query, scale: float, b: int, n: int, sq: int, skv: int) -> None:
    """The documented pse rules, and the one case in which its scaling is documented without contradiction."""
    # "输入query、key、value、pse的数据类型必须一致."
    _require(pse.dtype == query.dtype, FUSION, f"pse dtype {pse.dtype} must equal the query's, {query.dtype}")
    _require(pse.device == query.device, FUSION, f"pse is on {pse.device} but query is on {query.device}")
    # "非varlen场景支持四维输入, 包含BNSS格式、BN1Skv格式、1NSS格式."
    forms = {(b, n, sq, skv): "BNSS", (b, n, 1, skv): "BN1Skv", (1, n, sq, skv): "1NSS"}
    shape = tuple(pse.shape)
    if sq > 1024 and len(shape) == 4 and shape[2] == 1024 and shape not in forms:
        # "可使能alibi位置编码压缩, 此时只需要输入原始PSE最后1024行"
        raise NotImplementedError(f"{FUSION}: an alibi-compressed pse {shape} (last 1024 rows) is not emulated")
    _require(
        shape in forms,
        FUSION,
        f"pse shape {shape} is none of BNSS {(b, n, sq, skv)}, BN1Skv {(b, n, 1, skv)}, 1NSS {(1, n, sq, skv)}",
    )
    _require(
        scale == 1.0,
        FUSION,
        f"pse with scale={scale:g}: the docs scale pse two ways, {PSE_FORMULAS}, which agree only when scale == 1",
    )
    if pse.requires_grad and torch.is_grad_enabled():
        raise NotImplementedError(f"{FUSION}: a pse that requires grad: no gradient for pse is documented")


def npu_fusion_attention(
    query,
    key,
    value,
    head_num,
    input_layout,
    pse=None,
    padding_mask=None,
    atten_mask=None,
    scale=1.0,
    keep_prob=1.0,
    pre_tockens=2147483647,
    next_tockens=2147483647,
    inner_precise=0,
    prefix=None,
    actual_seq_qlen=None,
    actual_seq_kvlen=None,
    sparse_mode=0,
    gen_mask_parallel=True,
    sync=False,
    softmax_layout="",
):
    """Emulated ``torch_npu.npu_fusion_attention`` (see the module docstring for what is and is not emulated).

    Returns ``(attention_out, softmax_max, softmax_sum, reserved, seed, offset, dropout_mask_length)``.
    ``gen_mask_parallel`` and ``sync`` only steer how the real op generates its dropout mask; they change nothing.
    """
    _reject_features(
        FUSION,
        padding_mask=padding_mask,
        prefix=prefix,
        actual_seq_qlen=actual_seq_qlen,
        actual_seq_kvlen=actual_seq_kvlen,
    )
    # "sparse_mode配置为7、8时，不支持可选参数pse." (checked first: modes 7 and 8 themselves are not emulated)
    _require(pse is None or sparse_mode not in (7, 8), FUSION, f"pse is not supported with sparse_mode={sparse_mode}")
    _fusion_validate_scalars(input_layout, keep_prob, inner_precise, sparse_mode, softmax_layout)
    q, k, v = _fusion_validate_tensors(query, key, value, head_num, input_layout)
    b, n, sq, skv = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if pse is not None:
        _fusion_check_pse(pse, query, float(scale), b, n, sq, skv)
    keep = _fusion_keep(atten_mask, sparse_mode, pre_tockens, next_tockens, b, n, sq, skv, query.device)
    # "2为使能无效行计算 ... 如果算子可判断出存在无效行场景, 会自动使能无效行计算, 例如sparse_mode为3, Sq > Skv场景."
    fix_invalid_rows = inner_precise == 2 or (atten_mask is not None and sparse_mode == 3 and sq > skv)
    result = _attend(q, k, v, keep, float(scale), float(keep_prob), fix_invalid_rows, pse)
    out = _from_bnsd(result.out.to(query.dtype), input_layout)
    dropping = keep_prob < 1.0
    seed, offset = (int(torch.initial_seed()), 0) if dropping else (0, 0)
    reserved = torch.empty(0, dtype=query.dtype, device=query.device)  # "第4个输出为Tensor, 预留参数, 暂未使用."
    return (out, _softmax_stat(result.row_max), _softmax_stat(result.row_sum), reserved, seed, offset, b * n * sq * skv)


# ----------------------------------------------------------------------------------------------------------
# npu_fused_infer_attention_score


def _fia_validate_dtypes(query, key, value) -> None:
    # query: "数据类型支持float16、bfloat16、int8"; int8 needs the quantisation arguments, which are not emulated
    if query.dtype == torch.int8:
        raise NotImplementedError(f"{FIA}: int8 query (quantised attention) is not emulated")
    _require(
        query.dtype in (torch.float16, torch.bfloat16),
        FIA,
        f"query dtype must be float16 or bfloat16 (float32 is not supported by this op), got {query.dtype}",
    )
    for name, t in (("key", key), ("value", value)):
        if t.dtype in (torch.int8, torch.int32):
            raise NotImplementedError(f"{FIA}: {t.dtype} {name} (antiquant / int4 packing) is not emulated")
        _require(t.dtype == query.dtype, FIA, f"{name} dtype {t.dtype} differs from query dtype {query.dtype}")


def _fia_heads(query, key, value, layout: str, num_heads: int, num_key_value_heads: int):
    """BNSD views, applying the head-count rules: num_heads = query N; num_key_value_heads 0 means 'same as N'."""
    _require(num_heads >= 1, FIA, f"num_heads must be >= 1, got {num_heads}")
    _require(num_key_value_heads >= 0, FIA, f"num_key_value_heads must be >= 0, got {num_key_value_heads}")
    # "参数key、value中对应tensor的shape需要完全一致"
    _require(
        tuple(key.shape) == tuple(value.shape),
        FIA,
        f"key and value shapes must be identical, got {tuple(key.shape)} and {tuple(value.shape)}",
    )
    _check_ndims(FIA, layout, query=query, key=key, value=value)
    kv_heads = num_key_value_heads or num_heads  # "默认值0, 表示key/value和query的head个数相等"
    if layout == "BSH":
        return _split_three_d(FIA, query, key, value, layout, num_heads, kv_heads)
    q, k, v = (_to_bnsd(t, layout, num_heads) for t in (query, key, value))
    # "num_heads ... 需要与shape中的query的N轴shape值相同"; num_key_value_heads "需要与shape中的key/value的N轴shape值相同"
    _require(q.shape[1] == num_heads, FIA, f"num_heads={num_heads} but query has N={q.shape[1]} ({layout})")
    _require(
        k.shape[1] == kv_heads,
        FIA,
        f"key/value have N={k.shape[1]} but num_key_value_heads={num_key_value_heads} means {kv_heads} "
        "(0 = same as num_heads); pass num_key_value_heads for GQA",
    )
    return q, k, v


def _fia_validate_shapes(q, k, v, layout: str, inner_precise: int) -> None:
    _check_heads_and_dims(FIA, q, k, v, max_heads=256, max_ratio=64)
    sq, d = q.shape[2], q.shape[3]
    _require(v.shape[3] == d, FIA, f"value head dim {v.shape[3]} must equal query/key head dim {d}")
    _require(1 <= d <= 512, FIA, f"head dim D must be <= 512, got {d}")  # "支持D轴小于等于512"
    _require(sq >= 1, FIA, "query sequence length must be >= 1")
    if sq > 1:
        # "输入类型全为float16、bfloat16时, D轴需16对齐."
        _require(d % 16 == 0, FIA, f"head dim D={d} must be a multiple of 16 when Q_S > 1 (float16/bfloat16)")
        if layout in ("BSH", "BSND"):  # "input_layout为BSH或者BSND时, 要求N*D小于65535"
            _require(q.shape[1] * d < 65535, FIA, f"N*D must be < 65535 for {layout}, got {q.shape[1] * d}")
    else:
        # "其中BNSD_BSND含义指当输入为BNSD, 输出格式为BSND, 仅支持Q_S大于1."
        _require(layout != "BNSD_BSND", FIA, "input_layout BNSD_BSND needs Q_S > 1")
    # "inner_precise: 整型, 一共4种模式: 0、1、2、3 ... Q_S为1时该参数仅支持innerPrecise为0和1"
    allowed = (0, 1, 2, 3) if sq > 1 else (0, 1)
    _require(
        inner_precise in allowed, FIA, f"inner_precise must be one of {allowed} when Q_S={sq}, got {inner_precise}"
    )


def _per_batch_lengths(name: str, lengths, batch: int, full: int) -> torch.Tensor:
    """Lengths per batch: "传入长度为1时, 每个Batch使用相同seqlen; 传入长度大于等于Batch时取seqlen的前Batch个数. 其他长度不支持"."""
    if lengths is None:
        return torch.full((batch,), full, dtype=torch.long)
    values = [int(x) for x in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
    _require(
        len(values) == 1 or len(values) >= batch, FIA, f"{name} must have 1 or >= B={batch} entries, got {len(values)}"
    )
    values = values * batch if len(values) == 1 else values[:batch]
    _require(all(0 <= x <= full for x in values), FIA, f"{name} entries must be in 0..{full}, got {values}")
    return torch.tensor(values, dtype=torch.long)


def _fia_keep(atten_mask, sparse_mode: int, pre: int, nxt: int, q_lens, kv_lens, b: int, sq: int, skv: int, device):
    """Boolean keep mask (B|1, 1, Q_S, KV_S) for FIA: mask / sparse mode AND the keys within actual_seq_lengths_kv."""
    keep = torch.arange(skv, device=device).view(1, 1, 1, skv) < kv_lens.to(device).view(-1, 1, 1, 1)
    if atten_mask is not None:
        _check_mask_dtype(FIA, atten_mask, (torch.bool, torch.int8, torch.uint8))
    if sq == 1:
        # "sparse_mode ... Q_S为1且不带rope输入时该参数无效"; pre/next: "Q_S为1时该参数无效"
        return keep if atten_mask is None else keep & ~_fia_plain_masked(atten_mask.to(device), b, sq, skv)
    if sparse_mode == 9:
        raise NotImplementedError(f"{FIA}: sparse_mode=9 (treeMask, MLA only) is not emulated")
    # "参数sparse_mode当前仅支持值为0、1、2、3、4的场景, 取其它值时会报错."
    _require(sparse_mode in (0, 1, 2, 3, 4), FIA, f"sparse_mode must be 0..4, got {sparse_mode}")
    if atten_mask is None:
        # "sparse_mode=2、3、4时, atten_mask的shape需要为(S, S)... 不传入atten_mask或者传入的shape不正确报错."
        _require(sparse_mode in (0, 1), FIA, f"sparse_mode={sparse_mode} needs the compressed 2048x2048 atten_mask")
        # "sparse_mode为0时, ... 如果atten_mask未传入则不做mask操作, 忽略pre_tokens和next_tokens"
        return keep
    if sparse_mode in (0, 1):
        keep = keep & ~_fia_plain_masked(atten_mask.to(device), b, sq, skv)
        if sparse_mode == 0:
            keep = keep & _band_keep(sq, skv, pre, nxt, torch.zeros(1, dtype=torch.long), device)
        return keep
    _check_compressed_mask(FIA, atten_mask, sparse_mode)
    return keep & _compressed_mode_keep(sparse_mode, pre, nxt, sq, skv, kv_lens - q_lens, device)


def npu_fused_infer_attention_score(
    query,
    key,
    value,
    *,
    pse_shift=None,
    atten_mask=None,
    actual_seq_lengths=None,
    actual_seq_lengths_kv=None,
    dequant_scale1=None,
    quant_scale1=None,
    dequant_scale2=None,
    quant_scale2=None,
    quant_offset2=None,
    antiquant_scale=None,
    antiquant_offset=None,
    block_table=None,
    query_padding_size=None,
    kv_padding_size=None,
    key_antiquant_scale=None,
    key_antiquant_offset=None,
    value_antiquant_scale=None,
    value_antiquant_offset=None,
    key_shared_prefix=None,
    value_shared_prefix=None,
    actual_shared_prefix_len=None,
    query_rope=None,
    key_rope=None,
    key_rope_antiquant_scale=None,
    num_heads=1,
    scale=1.0,
    pre_tokens=2147483647,
    next_tokens=2147483647,
    input_layout="BSH",
    num_key_value_heads=0,
    sparse_mode=0,
    inner_precise=0,
    block_size=0,
    antiquant_mode=0,
    softmax_lse_flag=False,
    key_antiquant_mode=0,
    value_antiquant_mode=0,
):
    """Emulated ``torch_npu.npu_fused_infer_attention_score`` (see the module docstring).

    Returns ``(attention_out, softmax_lse)``.
    """
    _reject_features(
        FIA,
        pse_shift=pse_shift,
        dequant_scale1=dequant_scale1,
        quant_scale1=quant_scale1,
        dequant_scale2=dequant_scale2,
        quant_scale2=quant_scale2,
        quant_offset2=quant_offset2,
        antiquant_scale=antiquant_scale,
        antiquant_offset=antiquant_offset,
        block_table=block_table,
        query_padding_size=query_padding_size,
        kv_padding_size=kv_padding_size,
        key_antiquant_scale=key_antiquant_scale,
        key_antiquant_offset=key_antiquant_offset,
        value_antiquant_scale=value_antiquant_scale,
        value_antiquant_offset=value_antiquant_offset,
        key_shared_prefix=key_shared_prefix,
        value_shared_prefix=value_shared_prefix,
        actual_shared_prefix_len=actual_shared_prefix_len,
        query_rope=query_rope,
        key_rope=key_rope,
        key_rope_antiquant_scale=key_rope_antiquant_scale,
    )
    _reject_modes(
        FIA,
        block_size=block_size,
        antiquant_mode=antiquant_mode,
        key_antiquant_mode=key_antiquant_mode,
        value_antiquant_mode=value_antiquant_mode,
    )
    if input_layout in ("TND", "TND_NTD", "NTD_TND"):
        raise NotImplementedError(f"{FIA}: input_layout {input_layout!r}: TND/varlen is not emulated")
    _require(
        input_layout in FIA_LAYOUTS,
        FIA,
        f"input_layout must be one of {', '.join(FIA_LAYOUTS)} (or TND), got {input_layout!r}",
    )
    _fia_validate_dtypes(query, key, value)
    q, k, v = _fia_heads(query, key, value, input_layout, num_heads, num_key_value_heads)
    _fia_validate_shapes(q, k, v, input_layout, inner_precise)
    b, sq, skv = q.shape[0], q.shape[2], k.shape[2]
    # actual_seq_lengths: "Q_S为1时该参数无效"
    q_lens = _per_batch_lengths("actual_seq_lengths", actual_seq_lengths if sq > 1 else None, b, sq)
    kv_lens = _per_batch_lengths("actual_seq_lengths_kv", actual_seq_lengths_kv, b, skv)
    keep = _fia_keep(atten_mask, sparse_mode, pre_tokens, next_tokens, q_lens, kv_lens, b, sq, skv, query.device)
    # inner_precise: "第1位(bit1)表示是否做行无效修正"
    result = _attend(q, k, v, keep, float(scale), 1.0, fix_invalid_rows=bool(inner_precise & 2))
    # rows past actual_seq_lengths are not computed, and a batch with no keys is "填充全零" like an empty key/value
    rows = torch.arange(sq, device=query.device).view(1, 1, sq, 1) < q_lens.to(query.device).view(-1, 1, 1, 1)
    rows = rows & (kv_lens.to(query.device) > 0).view(-1, 1, 1, 1)
    out = _from_bnsd(result.out.masked_fill(~rows, 0.0).to(query.dtype), input_layout)
    if not softmax_lse_flag:
        # "softmax_lse_flag为False时, 则输出shape为[1]的值为0的Tensor"
        return out, torch.zeros(1, dtype=torch.float32, device=query.device)
    lse = (result.row_max + torch.log(result.row_sum)).masked_fill(~rows, 0.0)
    return out, lse.float()


# ----------------------------------------------------------------------------------------------------------
# the fake module


def build_module() -> types.ModuleType:
    """A fresh module named ``torch_npu`` carrying the emulated ops (the two attention ops here, the fused DiT ops of
    tests/emulators/torch_npu_fused_ops.py); put it in ``sys.modules["torch_npu"]``.

    It has a real ``__spec__`` so ``importlib.util.find_spec("torch_npu")`` works on it, and the marker
    ``NPU_PORT_EMULATOR = True`` so code and reports can tell it from the real package.
    """
    module = types.ModuleType(
        "torch_npu",
        "EMULATOR of torch_npu 2.13.0 for npu-port's tests (tests/emulators/torch_npu_emulator.py): emulates the "
        "documented contracts of npu_fusion_attention and npu_fused_infer_attention_score in plain PyTorch. "
        "Not the real torch_npu; no NPU is used.",
    )
    module.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    module.__version__ = TORCH_NPU_VERSION
    module.NPU_PORT_EMULATOR = True
    module.npu_fusion_attention = npu_fusion_attention
    module.npu_fused_infer_attention_score = npu_fused_infer_attention_score
    from . import torch_npu_fused_ops  # the fused DiT ops (npu_rms_norm, npu_rotary_mul, npu_geglu); imports this

    for name in torch_npu_fused_ops.__all__:
        setattr(module, name, getattr(torch_npu_fused_ops, name))
    return module


def install(monkeypatch) -> types.ModuleType:
    """Put a fresh emulator module in ``sys.modules["torch_npu"]`` for one test (pytest ``monkeypatch`` undoes it)."""
    module = build_module()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return module
