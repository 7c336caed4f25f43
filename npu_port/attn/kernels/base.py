"""What every attention kernel declares, and the checks they all share.

Capabilities are class data (devices, dtypes, head-dim limit, dropout, gradients, float masks), checked here once,
as xformers' ``AttentionOpBase`` does; a kernel module adds only what is special to it in ``call_reasons``. A kernel
can be configured (``ChunkedKernel(max_bytes=...)``): options are declared with a default, a check and a doc line,
and a wrong name or value fails with the valid choices.

Reason codes used by the built-in kernels: ``package-missing``, ``package-broken``, ``no-device``, ``device``,
``dtype``, ``head-dim``, ``heads``, ``shape``, ``mask``, ``causal``, ``dropout``, ``grad``, ``budget``, ``backend``,
``lse`` (``return_lse=True`` and the kernel cannot return the log-sum-exp for this call), ``chip`` (the Ascend chip
has no such op: 910A, 310P).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor

from ..._optional import PackageStatus, probe
from ...errors import KernelOptionError
from ...reasons import Reason
from ...settings import InvalidSetting, Setting, validate
from ..call import AttentionCall
from ..masks import dtype_name
from ..target import Target

FLOAT_DTYPES: Tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def dtype_names(dtypes) -> str:
    return ", ".join(dtype_name(d) for d in dtypes)


def check_bool(name: str) -> Callable[[Any], bool]:
    """An option check accepting only True / False."""

    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise InvalidSetting(f"option {name} must be True or False, got {value!r}")
        return value

    return check


def check_positive_int_or_none(name: str) -> Callable[[Any], Optional[int]]:
    """An option check accepting None or an int >= 1."""

    def check(value: Any) -> Optional[int]:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InvalidSetting(f"option {name} must be a positive int or None, got {value!r}")
        return value

    return check


#: A kernel option: ``Option(default, check, doc)`` — a :class:`~npu_port.settings.Setting`, checked by the one
#: settings helper; a check raises :class:`~npu_port.settings.InvalidSetting` with the whole message.
Option = Setting

#: How a kernel reports an option it does not have.
UNKNOWN_OPTION = "kernel {kernel!r} has no option {name!r}; valid options: {valid}"


def _unchanged(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class FromStrategy:
    """A kernel option that a strategy option sets: the strategy layer reads ``option`` from the strategy and, when
    its value is not None, gives the kernel ``convert(value)``. Declared on the kernel (``STRATEGY_OPTIONS``) so that
    the strategy layer needs no list of which kernel takes what (the kernel layer knows no strategy: ``option`` is
    only a name here, checked against the strategy options when a strategy is built)."""

    option: str
    convert: Callable[[Any], Any] = _unchanged


def fp32_softmax(dtype_policy: str) -> bool:
    """The ``upcast`` option of the math-style kernels from a strategy's ``dtype_policy``."""
    return dtype_policy == "fp32-softmax"


class Kernel:
    """Base class of attention kernels: declared capabilities, shared reasons, options.

    Subclasses set the class attributes and implement :meth:`run`; they may add :meth:`call_reasons` and
    :meth:`device_reasons`. ``reasons(call)`` must stay cheap and must never synchronise with the device: it runs
    for every call that selects a kernel. One exception, paid once per mask tensor and not per call: a kernel that
    converts pure float masks reads whether the mask is one (:func:`npu_port.attn.masks.float_mask_facts`, kept
    for the tensor while it is unchanged).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    #: optional module the kernel needs (probed lazily; "installed but broken" counts as missing)
    package: ClassVar[Optional[str]] = None
    #: device types the kernel serves (None = any)
    device_types: ClassVar[Optional[Tuple[str, ...]]] = None
    dtypes: ClassVar[Tuple[torch.dtype, ...]] = FLOAT_DTYPES
    max_head_dim: ClassVar[Optional[int]] = None
    supports_dropout: ClassVar[bool] = True
    supports_grad: ClassVar[bool] = True
    #: whether additive float masks (biases) can be expressed; bool masks are always taken
    supports_float_mask: ClassVar[bool] = True
    #: whether the backend, where it loses a NaN of the inputs, writes a row of zeros instead (torch's CPU SDPA
    #: does): lets the unmasked fast path screen the output for NaN rather than every input (npu_port.attn.contract)
    zeros_hide_nan: ClassVar[bool] = False
    #: whether :meth:`run_lse` can return the log-sum-exp with the output (``return_lse=True``); a kernel that can
    #: only for some calls adds its refusals in ``call_reasons``
    supports_lse: ClassVar[bool] = False
    OPTIONS: ClassVar[Mapping[str, Option]] = {}

    # ---- where the kernel stands among the others: every list of kernels is derived from these -------------------

    #: The preference order of ``auto`` (a strategy that names no candidates) and of the default selection: higher is
    #: tried first (ties: registration order). Built-ins: npu_fused_infer 70, npu_fusion 60, flash_attn 50,
    #: xformers 40, sdpa 30, chunked 20, math 10; a kernel that declares nothing comes after them.
    priority: ClassVar[int] = 0
    #: Whether ``kernel=None`` with no strategy set tries this kernel (in priority order).
    default_selection: ClassVar[bool] = False
    #: Place in listings (``npu_port.kernels()``, ``npu-port kernels``): lower first; None = after every kernel that
    #: sets one, in registration order. Built-ins: math 10, sdpa 20, chunked 30, npu_fusion 40, npu_fused_infer 50,
    #: xformers 60, flash_attn 70 (reference first, then portable, then device-specific).
    listing_order: ClassVar[Optional[int]] = None
    #: Kernel option -> the strategy option that sets it (see :class:`FromStrategy`).
    STRATEGY_OPTIONS: ClassVar[Mapping[str, FromStrategy]] = {}

    def __init__(self, **options: Any) -> None:
        self._options = validate(
            options, self.OPTIONS, error=KernelOptionError, unknown=UNKNOWN_OPTION, defaults=True, kernel=self.name
        )

    @property
    def options(self) -> Dict[str, Any]:
        return dict(self._options)

    # ---- availability on this machine -------------------------------------------------------------------------

    def package_status(self) -> Optional[PackageStatus]:
        return probe(self.package) if self.package else None

    def device_reasons(self) -> List[Reason]:
        """Reasons the machine has no device this kernel serves (only for kernels bound to one device kind)."""
        return []

    def availability(self) -> List[Reason]:
        """Why the kernel cannot run anything on this machine (missing package, missing device); empty = available."""
        status = self.package_status()
        if status is not None and not status.ok:
            return [status.reason]
        return self.device_reasons()

    def available(self) -> bool:
        return not self.availability()

    # ---- one call -----------------------------------------------------------------------------------------------

    def reasons(self, call: AttentionCall, target: Optional[Target] = None) -> List[Reason]:
        """Every reason this kernel cannot run ``call``; an empty list means it can.

        With a ``target`` the call is judged for that device instead of its own (a plan made on a CPU for an NPU):
        whether the package is installed and a device visible is not asked, the target's device type and chip are.
        """
        if target is None:
            status = self.package_status()
            if status is not None and not status.ok:
                return [status.reason]
        device_type = call.device.type if target is None else target.device_type
        found: List[Reason] = []
        if self.device_types is not None and device_type not in self.device_types:
            found.append(
                Reason(
                    "device",
                    f"tensors are on {device_type}; {self.name} runs on {'/'.join(self.device_types)} tensors only",
                )
            )
        elif target is not None:
            found.extend(self.target_reasons(target))
        if call.dtype not in self.dtypes:
            found.append(
                Reason(
                    "dtype",
                    f"dtype {dtype_names([call.dtype])} is not supported by {self.name} "
                    f"(supported: {dtype_names(self.dtypes)})",
                )
            )
        if self.max_head_dim is not None and max(call.head_dim, call.value_dim) > self.max_head_dim:
            found.append(
                Reason(
                    "head-dim",
                    f"head_dim {max(call.head_dim, call.value_dim)} > {self.max_head_dim} ({self.name} limit)",
                )
            )
        if call.dropout_p > 0 and not self.supports_dropout:
            found.append(
                Reason(
                    "dropout",
                    f"dropout_p={call.dropout_p:g} but {self.name} applies no dropout; pass dropout_p=0.0 at "
                    "inference (dropout_p=p if training else 0.0) or use a kernel that supports it",
                )
            )
        if call.needs_grad and not self.supports_grad:
            found.append(
                Reason(
                    "grad",
                    f"gradients are required but {self.name} has no backward (inference only); run under "
                    "torch.no_grad() or use a training kernel",
                )
            )
        if call.mask is not None and call.mask.bias is not None:
            found.extend(self.float_mask_reasons(call))
        if call.return_lse and not self.supports_lse:
            found.append(
                Reason(
                    "lse",
                    f"return_lse=True but {self.name} does not return the log-sum-exp of its rows; use a kernel "
                    "that does (math, chunked; sdpa on cpu; the Ascend kernels)",
                )
            )
        found.extend(self.call_reasons(call))
        return found

    def call_reasons(self, call: AttentionCall) -> List[Reason]:
        """Kernel-specific reasons beyond the declared capabilities."""
        return []

    def float_mask_reasons(self, call: AttentionCall) -> List[Reason]:
        """Why this kernel cannot take ``call``'s additive float mask: none where ``supports_float_mask``. A kernel
        that converts pure masks to its op's bool mask (the Ascend ops) overrides this to refuse only a real bias."""
        if self.supports_float_mask:
            return []
        return [
            Reason(
                "mask",
                f"additive float mask: {self.name} takes only bool masks, and a float mask may carry a bias "
                "that a bool mask cannot express; pass a bool keep-mask, or convert a pure 0/-inf mask with "
                "npu_port.masks.keep_from_additive(mask)",
            )
        ]

    def reads_mask_values(self, device_type: str) -> bool:
        """Whether, on ``device_type``, a float mask's values (is it a pure mask?) decide if this kernel takes a call
        and what it passes on: then a router must tell calls apart by that, not by shapes alone (the Ascend
        kernels; sdpa on an NPU). Asking costs one device synchronisation per mask tensor (kept: see
        :func:`npu_port.attn.masks.float_mask_facts`)."""
        return False

    def target_reasons(self, target: Target) -> List[Reason]:
        """Why the kernel cannot run on ``target`` at all (its chip lacks the op); the plan's stand-in for
        :meth:`device_reasons`, which asks the real machine."""
        return []

    def run(self, call: AttentionCall) -> Tensor:
        """Compute attention for a call whose ``reasons`` are empty; returns ``(B, Hq, Sq, Dv)``."""
        raise NotImplementedError

    def run_lse(self, call: AttentionCall) -> Tuple[Tensor, Tensor]:
        """``(output, lse)`` for a call whose ``reasons`` are empty and that asks for ``return_lse``: the output as
        :meth:`run` gives it and the float32 ``(B, Hq, Sq)`` natural log of the sum over keys of
        ``exp(scale * q.k + float mask)`` (any value in rows with no key: the contract makes them -inf)."""
        raise NotImplementedError(f"kernel {self.name!r} declares supports_lse but has no run_lse")

    def prepare(self, call: AttentionCall) -> Optional[Callable[[Tensor, Tensor, Tensor], Tensor]]:
        """A function ``(query, key, value) -> output`` that runs every later call with ``call``'s exact signature
        (shapes, dtypes, device, no mask, the same flags and scale) without building an :class:`AttentionCall`, or
        None (the default) when the kernel needs the full call. Routers cache it per signature, the way cuDNN
        caches an execution plan: on small shapes the per-call Python is as costly as the kernel itself.
        """
        return None

    def fused(self, call: AttentionCall, target: Target) -> bool:
        """Whether this kernel runs ``call`` on ``target`` as one fused attention op (no score matrix in device
        memory). Only asked of a kernel whose ``reasons(call, target)`` are empty; a plan counts the calls for which
        it is True. Portable kernels that compute scores (math, chunked) say False; a kernel that hands the call to
        a device library decides by that library's documented rules (sdpa on an NPU)."""
        return False

    def plan_bytes(self, call: AttentionCall) -> int:
        """Device bytes this kernel allocates for ``call`` beyond its inputs and output: scores, converted masks,
        workspaces. A plan reports it; the default is :meth:`score_bytes`."""
        return self.score_bytes(call)

    def score_bytes(self, call: AttentionCall) -> int:
        """Bytes of attention scores this kernel materialises for ``call`` (0 for fused, O(S) kernels).

        ``auto`` compares this with its memory budget before running a candidate, so that probing a kernel can
        never be what runs the device out of memory.
        """
        return 0

    # ---- presentation -------------------------------------------------------------------------------------------

    def __repr__(self) -> str:
        changed = {k: v for k, v in self._options.items() if v != self.OPTIONS[k].default}
        args = ", ".join(f"{k}={v!r}" for k, v in changed.items())
        return f"{type(self).__name__}({args})"


def full_score_bytes(call: AttentionCall, element_bytes: int) -> int:
    """Scores and probabilities for the whole call: ``2 * B * H * Sq * Skv`` elements."""
    return 2 * call.batch * call.heads * call.q_len * call.key_len * element_bytes


def zero_fully_masked_rows(out: Tensor, row_has_key: Optional[Tensor]) -> Tensor:
    """Rows whose keys are all masked become exact zeros (our contract), whatever the backend returned there."""
    if row_has_key is None:
        return out
    return out.masked_fill(~row_has_key, 0.0)


def unmask_empty_rows(keep: Tensor) -> Tuple[Tensor, Tensor]:
    """Return ``(safe_keep, row_has_key)``: rows with no key get all keys back so fused kernels never see an empty
    softmax (which gives NaN on several backends, also in the backward); callers zero those rows afterwards.

    This is transformers' ``_unmask_unattended`` idea done without a host sync.
    """
    row_has_key = keep.any(dim=-1, keepdim=True)
    return keep | ~row_has_key, row_has_key
