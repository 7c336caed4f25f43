"""``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``, guarded against its NaN cases.

SDPA picks a fused backend per call (flash, memory-efficient, cuDNN, math); several of them have returned NaN for a
query row whose keys are all masked (pytorch#103749, #109517; unsloth PR #9848 on B200 with torch 2.13). So before
calling it, rows with no key get all keys back and afterwards those rows are set to zero: the same answer on every
backend, finite gradients, no host synchronisation. Backends can be pinned with the ``backends`` option, through
``torch.nn.attention.sdpa_kernel`` — never the deprecated ``torch.backends.cuda.sdp_kernel``.

On an Ascend NPU, torch_npu's SDPA runs FlashAttentionScore only for a bool mask or none; a float mask sends the call
to its math path, which builds the whole score matrix. So there a float mask that is a pure mask (0 and masked
values) is handed over as the bool mask it is, converted once per mask tensor and call signature
(:func:`npu_port.attn.masks.memoized`); :meth:`SdpaKernel.fused` says which calls then reach the fused op.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ...errors import KernelRuntimeError
from ...reasons import Reason
from ...settings import InvalidSetting, check_masked_value
from ..call import AttentionCall
from ..masks import causal_keep, float_mask_facts, mask_keep, memoized
from ..registry import register_kernel
from ..target import Target
from .base import FromStrategy, Kernel, Option, full_score_bytes, unmask_empty_rows, zero_fully_masked_rows

#: Our backend names -> ``torch.nn.attention.SDPBackend`` member names.
BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
    "overrideable": "OVERRIDEABLE",
}


def _torch_version() -> Tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _check_backends(value: Any) -> Optional[Tuple[str, ...]]:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    try:
        names = tuple(value)
    except TypeError:
        raise InvalidSetting(f"option backends must be a list of names, got {value!r}") from None
    bad = [n for n in names if n not in BACKENDS]
    if bad or not names:
        raise InvalidSetting(
            f"unknown SDPA backend {bad[0] if bad else '(empty list)'!r}; valid backends: {', '.join(BACKENDS)}"
        )
    return tuple(dict.fromkeys(names))


def _sdpa_context(backends: Optional[Tuple[str, ...]]):
    if backends is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, BACKENDS[b]) for b in backends])


#: Parsed once: these run on every call.
TORCH_VERSION = _torch_version()
SUPPORTS_ENABLE_GQA = TORCH_VERSION >= (2, 5)


#: Device types whose SDPA takes its fused path only with a bool mask (torch_npu: a float mask goes to the math
#: path, op-plugin's ScaledDotProductAttentionKernelNpuOpApi.cpp): there a pure float mask is passed as bool.
CONVERT_ON: Tuple[str, ...] = ("npu",)

#: torch_npu's limits for SDPA's fused path (FlashAttentionScore), op-plugin's ScaledDotProductAttentionKernelNpuOpApi
#: ``N_LIMIT`` and ``D_LIMIT``.
NPU_MAX_HEADS = 2048
NPU_MAX_HEAD_DIM = 512


def sdpa_mask(
    call: AttentionCall, masked_value: Optional[float] = None, convert: bool = False
) -> Tuple[Optional[Tensor], Optional[Tensor], bool]:
    """The mask to hand to SDPA, the rows to zero afterwards, and whether to pass ``is_causal``.

    Without a mask, causality stays SDPA's ``is_causal`` (so fused kernels can use it). With a mask, causality is
    folded into it and empty rows are unmasked; entries equal to ``masked_value`` count as masked. A bool mask
    (or, with ``convert``, a pure float mask that needs no gradient) goes as a bool keep-mask, built once per mask
    tensor and call signature; a float mask otherwise keeps its bias, with ``-inf`` where masked.
    """
    mask = call.mask
    if mask is None:
        return None, None, call.is_causal
    as_bool = mask.bias is None
    if not as_bool and convert and not (call.needs_grad and mask.bias.requires_grad):
        as_bool = float_mask_facts(mask, masked_value).pure
    if as_bool:
        signature = ("sdpa", masked_value, call.is_causal, call.q_len, call.key_len)
        safe_keep, row_has_key = memoized(mask, signature, lambda: unmask_empty_rows(_keep(call, masked_value)))
        return safe_keep, row_has_key, False
    keep = _keep(call, masked_value)
    _, row_has_key = unmask_empty_rows(keep)
    bias = mask.bias.to(call.dtype)
    bias = bias.masked_fill(~keep, float("-inf")).masked_fill(~row_has_key, 0.0)
    return bias, row_has_key, False


def _keep(call: AttentionCall, masked_value: Optional[float]) -> Tensor:
    keep = mask_keep(call.mask, masked_value)
    if call.is_causal:
        keep = keep & causal_keep(call.q_len, call.key_len, call.device)[None, None]
    return keep


@register_kernel
class SdpaKernel(Kernel):
    """torch's scaled_dot_product_attention with fully-masked rows made safe; optional backend pinning."""

    name = "sdpa"
    summary = "torch.nn.functional.scaled_dot_product_attention (fused backends picked by torch), NaN-safe"
    priority = 30
    default_selection = True
    listing_order = 20
    supports_lse = True  # on cpu only, without dropout or gradients: see lse_reasons
    STRATEGY_OPTIONS = {"backends": FromStrategy("sdpa_backends"), "masked_value": FromStrategy("masked_value")}
    #: torch's CPU flash kernel treats a row whose scores are all NaN as empty and writes zeros (a NaN query row, a
    #: head whose keys are all NaN); every other NaN it reads it passes on. (Under is_causal with fewer queries than
    #: keys it never reads the keys past the last query: the router does not rely on this flag there.)
    #: tests/attn/test_nan_propagation.py pins both.
    zeros_hide_nan = True
    OPTIONS = {
        "backends": Option(
            None,
            _check_backends,
            "pin SDPA to these backends via torch.nn.attention.sdpa_kernel: " + ", ".join(BACKENDS),
            tuple(BACKENDS),
        ),
        "masked_value": Option(
            None,
            check_masked_value,
            "an additive mask value that counts as masked, exactly (e.g. diffusers' -10000.0); on an NPU, float masks "
            "holding only 0 and masked values go to SDPA as bool masks (its fused path)",
        ),
    }

    def call_reasons(self, call: AttentionCall) -> List[Reason]:
        found = self.lse_reasons(call) if call.return_lse else []
        backends = self._options["backends"]
        if backends is None:
            return found
        if found:
            return found
        if TORCH_VERSION < (2, 3):
            return [
                Reason(
                    "backend",
                    f"pinning SDPA backends needs torch >= 2.3 (torch.nn.attention); found {torch.__version__}",
                )
            ]
        return self._pinned_backend_reasons(call, backends)

    def lse_reasons(self, call: AttentionCall) -> List[Reason]:
        """torch exposes the log-sum-exp of SDPA only through its private per-backend ops; the one used here is the
        CPU flash kernel (``aten._scaled_dot_product_flash_attention_for_cpu``, which takes a mask and a scale). Its
        logsumexp carries no gradient and it applies no dropout, so those calls are refused rather than answered
        with a detached or undropped value."""
        problems = []
        if call.device.type != "cpu":
            problems.append(f"on {call.device.type} torch exposes no SDPA log-sum-exp that npu-port uses")
        if call.dropout_p > 0:
            problems.append("the cpu flash kernel that returns it applies no dropout")
        if call.needs_grad:
            problems.append("its log-sum-exp carries no gradient")
        backends = self._options["backends"]
        if backends is not None and "flash" not in backends:
            problems.append(f"it comes from the flash backend, and the pinned backends are {', '.join(backends)}")
        if not problems:
            return []
        return [
            Reason(
                "lse",
                f"return_lse=True: sdpa cannot return the log-sum-exp here ({'; '.join(problems)}); "
                "use math or chunked",
            )
        ]

    def _pinned_backend_reasons(self, call: AttentionCall, backends: Tuple[str, ...]) -> List[Reason]:
        """Predict whether any pinned backend accepts the call, using torch's own checks where torch exposes them."""
        if "math" in backends or "overrideable" in backends:
            return []
        problems: List[str] = []
        for backend in backends:
            problem = self._backend_problem(call, backend)
            if problem is None:
                return []
            problems.append(f"{backend}: {problem}")
        return [Reason("backend", f"none of the pinned SDPA backends can run this call ({'; '.join(problems)})")]

    @staticmethod
    def _backend_problem(call: AttentionCall, backend: str) -> Optional[str]:
        if call.device.type == "cpu":
            if backend != "flash":
                return "not available on cpu"
            if call.dropout_p > 0:
                return "the cpu flash kernel does not support dropout"
            return None
        if call.device.type != "cuda":
            return None  # other devices (npu, xpu, mps) decide at run time; failures are reported then
        checks = {
            "flash": "can_use_flash_attention",
            "efficient": "can_use_efficient_attention",
            "cudnn": "can_use_cudnn_attention",
        }
        check = getattr(torch.backends.cuda, checks[backend], None)
        params_cls = getattr(torch.backends.cuda, "SDPAParams", None)
        if check is None or params_cls is None:
            return None
        # what run() will pass, without materialising it: the (broadcast) mask, and is_causal only when unmasked
        mask = call.mask.keep if call.mask is not None else None
        is_causal = call.is_causal and call.mask is None
        try:
            params = params_cls(call.query, call.key, call.value, mask, call.dropout_p, is_causal, call.enable_gqa)
            return None if check(params, False) else "torch's support check refuses these inputs"
        except (TypeError, RuntimeError):
            return None

    def score_bytes(self, call: AttentionCall) -> int:
        """SDPA materialises the scores when it has to use its math backend: dropout on cpu, or math pinned."""
        backends = self._options["backends"]
        math_only = backends is not None and set(backends) <= {"math"}
        if math_only or (call.device.type == "cpu" and call.dropout_p > 0):
            return full_score_bytes(call, 4)
        return 0

    def prepare(self, call: AttentionCall) -> Optional[Callable[[Tensor, Tensor, Tensor], Tensor]]:
        """Unmasked, unpinned calls are SDPA itself with the call's flags bound (no fully-masked rows to fix)."""
        if call.mask is not None or self._options["backends"] is not None:
            return None
        kwargs = {}
        if call.group > 1:
            if not SUPPORTS_ENABLE_GQA:
                return None
            kwargs["enable_gqa"] = True
        return functools.partial(
            F.scaled_dot_product_attention,
            dropout_p=call.dropout_p,
            is_causal=call.is_causal,
            scale=call.scale,
            **kwargs,
        )

    def reads_mask_values(self, device_type: str) -> bool:
        return device_type in CONVERT_ON

    def fused(self, call: AttentionCall, target: Target) -> bool:
        """Whether torch_npu's SDPA runs ``call`` as FlashAttentionScore (``npu_fusion_attention``) rather than its
        math path, by op-plugin's rules (``ScaledDotProductAttentionKernelNpuOpApi.cpp``; research notes
        ascend_2026-11.md section 2.3), each checked here:

        - the target is an NPU whose chip has the op (``GetSocVersion() >= Ascend910B1``; 910A and 310P fall
          through to math);
        - the mask is bool or absent once this kernel has converted it (a pure float mask becomes bool here; a
          bias stays float: ``attn_mask->dtype() == at::kBool || !attn_mask.has_value()``);
        - query, key and value are 4-D BNSD (``dim == BNSD_DIM``): this kernel always passes the call's 4-D
          ``(B, H, S, D)`` tensors;
        - query and key heads <= 2048 (``N_LIMIT``), query head dim <= 512 (``D_LIMIT``), query heads a multiple of
          key heads (``query.size(1) % key.size(1) == 0``: grouped-query attention needs no ``enable_gqa`` there);
        - dtype float16, bfloat16 or float32, and float32 only with every head dim a multiple of 4 (otherwise
          ``_scaled_dot_product_attention_math``).

        Not visible to a plan: ``torch_npu.npu.use_compatible_impl(True)`` (off by default) also sends head dims
        over 256, and a math-only ``sdpa_kernel`` pin, to the math path."""
        if target.device_type != "npu" or target.chip is None or not target.chip.fused_attention:
            return False
        if call.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return False
        if call.dtype == torch.float32 and (call.head_dim % 4 or call.value_dim % 4):
            return False
        if max(call.heads, call.kv_heads) > NPU_MAX_HEADS or call.head_dim > NPU_MAX_HEAD_DIM:
            return False
        if call.heads % call.kv_heads:
            return False
        mask = call.mask
        if mask is not None and mask.bias is not None:
            if call.needs_grad and mask.bias.requires_grad:
                return False
            return float_mask_facts(mask, self._options["masked_value"]).pure
        return True

    def _mask(self, call: AttentionCall) -> Tuple[Optional[Tensor], Optional[Tensor], bool]:
        return sdpa_mask(call, self._options["masked_value"], convert=call.device.type in CONVERT_ON)

    def run(self, call: AttentionCall) -> Tensor:
        mask, row_has_key, is_causal = self._mask(call)
        key, value, gqa = call.key, call.value, call.group > 1
        kwargs = {}
        if gqa and SUPPORTS_ENABLE_GQA:
            kwargs["enable_gqa"] = True
        elif gqa:  # torch < 2.5: share heads by expanding key/value
            key = key.repeat_interleave(call.group, dim=1)
            value = value.repeat_interleave(call.group, dim=1)
        try:
            with _sdpa_context(self._options["backends"]):
                out = F.scaled_dot_product_attention(
                    call.query,
                    key,
                    value,
                    attn_mask=mask,
                    dropout_p=call.dropout_p,
                    is_causal=is_causal,
                    scale=call.scale,
                    **kwargs,
                )
        except RuntimeError as exc:
            if self._options["backends"] is None:
                raise
            raise KernelRuntimeError(
                f"SDPA pinned to {', '.join(self._options['backends'])} could not run this call "
                f"({call.describe()}): {str(exc).strip().splitlines()[0]}; allow more backends (e.g. add 'math') "
                "or use the chunked kernel"
            ) from exc
        return zero_fully_masked_rows(out, row_has_key)

    def run_lse(self, call: AttentionCall) -> Tuple[Tensor, Tensor]:
        """The CPU flash kernel's ``(output, logsumexp)``: key/value heads expanded for grouped-query attention (the
        op has no ``enable_gqa``), masks as for :meth:`run`. Rows given their keys back are -inf in the contract."""
        mask, row_has_key, is_causal = self._mask(call)
        if mask is not None and mask.dtype == torch.bool:  # the op takes additive masks in the query's dtype only
            mask = torch.zeros(mask.shape, dtype=call.dtype, device=call.device).masked_fill_(~mask, float("-inf"))
        key, value = call.key, call.value
        if call.group > 1:
            key = key.repeat_interleave(call.group, dim=1)
            value = value.repeat_interleave(call.group, dim=1)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            call.query, key, value, 0.0, is_causal, attn_mask=mask, scale=call.scale
        )
        if row_has_key is not None:  # rows with no key (a declared masked_value too) are -inf, as the contract says
            lse = lse.masked_fill(~row_has_key[..., 0], float("-inf"))
        return zero_fully_masked_rows(out, row_has_key), lse
