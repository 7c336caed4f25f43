"""Judging a recording for a target device: per signature, the kernel a strategy would pick there, whether it runs
fused, the memory it needs, and every other candidate's reasons.

Nothing here runs attention or needs the target's hardware: a kernel's ``reasons(call, target)`` are static checks
(the chip, the dtype, the head dim, the mask, the op's limits), ``fused(call, target)`` says whether it is one fused
op there, ``plan_bytes(call)`` what it allocates beyond inputs and output. The strategy's rule is the router's own
(:meth:`~npu_port.strategy.router.StrategyRouter.candidate_forms`, ``compute_dtype`` forms included): ``fixed``
and ``first`` take the first candidate that can run the call; ``measure`` (auto) times the runnable candidates at
run time, so the plan lists them and counts the most preferred (the strategy's order) as the pick.
A call npu-port does not route runs on the device's own SDPA, judged with the ``sdpa`` kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

from ..attn.call import AttentionCall
from ..attn.kernels.base import Kernel
from ..attn.registry import get_kernel, kernels
from ..attn.target import Target
from ..reasons import Reason
from ..strategy.router import StrategyRouter
from .record import Recorded, Recording, recording_strategy
from .signature import Signature

#: The kernel a call that npu-port does not route is judged with: the device's own SDPA.
UNROUTED_KERNEL = "sdpa"


def _tensor_bytes(shape: Any, dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def io_bytes(call: AttentionCall) -> Dict[str, int]:
    """Bytes of the call's inputs (query, key, value and its mask as given, broadcast dimensions not counted) and of
    its output, in the call's dtype."""
    inputs = sum(_tensor_bytes(t.shape, t.dtype) for t in (call.query, call.key, call.value))
    if call.mask is not None:
        mask = call.mask.bias if call.mask.bias is not None else call.mask.keep
        inputs += _tensor_bytes(mask.shape, mask.dtype)
    return {"inputs": inputs, "output": _tensor_bytes(call.output_shape, call.dtype)}


@dataclass
class SignaturePlan:
    """One signature's answer: ``kernel`` (None: no candidate can run it on the target), ``fused``, ``bytes``
    (``kernel``: what it allocates beyond ``inputs`` and ``output``; ``total``), ``reasons`` for every candidate
    (an empty list: it could run the call too), ``runnable`` (candidates with no reason, in the strategy's order),
    ``measured`` (auto chooses among several at run time), ``every_kernel`` (every registered kernel's reasons,
    when asked for)."""

    signature: Signature
    count: int
    kernel: Optional[str]
    fused: bool
    bytes: Dict[str, int]
    reasons: Dict[str, List[Reason]]
    runnable: List[str]
    measured: bool = False
    sites: List[str] = field(default_factory=list)
    components: List[str] = field(default_factory=list)
    every_kernel: Optional[Dict[str, List[Reason]]] = None

    def to_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {"count": self.count, **self.signature.to_dict()}
        data.update(
            kernel=self.kernel,
            fused=self.fused,
            runnable=list(self.runnable),
            measured=self.measured,
            bytes=dict(self.bytes),
            reasons={name: [r.as_dict() for r in found] for name, found in self.reasons.items()},
        )
        data["components"] = list(self.components)
        if self.sites:
            data["sites"] = list(self.sites)
        if self.every_kernel is not None:
            data["every_kernel"] = {name: [r.as_dict() for r in found] for name, found in self.every_kernel.items()}
        return data


@dataclass
class Plan:
    """A recording judged for a target with a strategy. ``calls`` and ``fused`` count calls (not signatures)."""

    target: Target
    strategy: str
    select: str
    candidates: List[str]
    signatures: List[SignaturePlan]
    model: Optional[str] = None
    dtype: Optional[str] = None
    unreadable: Dict[str, int] = field(default_factory=dict)
    declines: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return sum(s.count for s in self.signatures)

    @property
    def fused(self) -> int:
        return sum(s.count for s in self.signatures if s.fused)

    @property
    def unrunnable(self) -> int:
        """Calls no candidate can run on the target (the run would fail there)."""
        return sum(s.count for s in self.signatures if s.kernel is None)

    @property
    def all_fused(self) -> bool:
        return self.fused == self.calls

    def summary(self) -> str:
        """``fused: 12/12 attention calls (100%) on npu (910B) with strategy npu``. The percentage is rounded down,
        so 100% means every call."""
        where = f"on {self.target.describe()} with strategy {self.strategy}"
        if not self.calls:
            return f"fused: 0/0 attention calls (no attention call was recorded) {where}"
        percent = 100 * self.fused // self.calls
        return f"fused: {self.fused}/{self.calls} attention calls ({percent}%) {where}"

    def to_dict(self) -> Dict[str, Any]:
        chip = self.target.chip
        return {
            "model": self.model,
            "device": self.target.device_type,
            "chip": chip.name if chip is not None else None,
            "strategy": self.strategy,
            "select": self.select,
            "candidates": list(self.candidates),
            "dtype": self.dtype,
            "calls": self.calls,
            "fused": self.fused,
            "unrunnable": self.unrunnable,
            "summary": self.summary(),
            "signatures": [s.to_dict() for s in self.signatures],
            "unreadable": dict(self.unreadable),
            "declines": [dict(d) for d in self.declines],
        }


def _bytes(kernel: Optional[Kernel], call: AttentionCall) -> Dict[str, int]:
    found = io_bytes(call)
    found["kernel"] = kernel.plan_bytes(call) if kernel is not None else 0
    found["total"] = found["inputs"] + found["output"] + found["kernel"]
    return found


def _judge(entry: Recorded, router: StrategyRouter, target: Target, verbose: bool) -> SignaturePlan:
    call = entry.call
    if entry.signature.routed:
        forms = router.candidate_forms(call, target)
    else:
        sdpa = get_kernel(UNROUTED_KERNEL)
        forms = [(sdpa, sdpa.reasons(call, target))]
    reasons = {kernel.name: list(found) for kernel, found in forms}
    runnable = [kernel for kernel, found in forms if not found]
    chosen = runnable[0] if runnable else None
    every = None
    if verbose:
        every = {kernel.name: list(kernel.reasons(call, target)) for kernel in kernels()}
    return SignaturePlan(
        signature=entry.signature,
        count=entry.count,
        kernel=chosen.name if chosen is not None else None,
        fused=bool(chosen is not None and chosen.fused(call, target)),
        bytes=_bytes(chosen, call),
        reasons=reasons,
        runnable=[kernel.name for kernel in runnable],
        measured=entry.signature.routed and router.strategy.select == "measure" and len(runnable) > 1,
        sites=list(entry.sites),
        components=list(entry.components),
        every_kernel=every,
    )


def assess(
    recording: Recording,
    target: Target,
    strategy: Any = None,
    *,
    model: Optional[str] = None,
    dtype: Optional[str] = None,
    verbose: bool = False,
) -> Plan:
    """Judge ``recording`` for ``target`` (``Target.of("npu", "910B")``) with ``strategy`` (default: the one the
    recording was made for, ``"npu"`` unless told). ``verbose``: every registered kernel's reasons as well.
    ``model`` and ``dtype`` are labels for the report."""
    spec = recording_strategy(recording.strategy if strategy is None else strategy)
    router = StrategyRouter(spec)  # never asked whether it can run here: the plan is for the target
    with torch.enable_grad():  # a signature's grad flag is the stand-in tensors' (see record.py), whatever the caller
        signatures = [_judge(entry, router, target, verbose) for entry in recording.entries]
    return Plan(
        target=target,
        strategy=spec.name,
        select=spec.select,
        candidates=[k.name for k in router.kernels],
        signatures=signatures,
        model=model,
        dtype=dtype,
        unreadable=dict(recording.unreadable),
        declines=list(recording.declines),
    )
