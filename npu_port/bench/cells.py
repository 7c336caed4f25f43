"""One (strategy, shape) cell of the bench: the kernel chosen, why it cannot run, or what it measured.

A cell goes through a strategy's own router, exactly as a model's attention would: a fixed strategy runs its kernel,
``auto`` measures its candidates on the first call (that probe is timed separately, as ``select_s``) and runs its
pick afterwards. Every outcome is recorded rather than raised:

- the strategy cannot run on this machine (package or device missing): *unavailable*, with each candidate's reason;
- its kernel cannot run this shape, or would materialise more scores than the memory budget: *refused*. The budget
  is checked with ``kernel.score_bytes`` *before* anything runs: a 483 GiB score tensor is refused, never tried;
- it ran: the median of its timed calls (:mod:`.runner` times them), peak memory of one more call, and the largest
  difference of that call's output from the float64 reference (:mod:`.reference`);
- it accepted the shape and then failed (an error, NaN or inf): *failed*, with the error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..attn.call import AttentionCall
from ..attn.kernels.base import Kernel
from ..device.timing import spread, timed
from ..errors import KernelUnavailableError, NoKernelError, NpuPortError, StrategyError
from ..strategy.measure import TOLERANCE
from ..strategy.router import StrategyRouter
from ..strategy.spec import Strategy
from .choices import Settings, fresh_router, unavailable_reason
from .memory import peak_bytes
from .reference import Reference
from .results import FAILED, INTERRUPTED, OK, REFUSED, UNAVAILABLE, Cell
from .shapes import Shape

GiB = 1 << 30


def _size(nbytes: int) -> str:
    return f"{nbytes / GiB:.1f} GiB" if nbytes >= GiB else f"{nbytes / (1 << 20):.0f} MiB"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _refusal(exc: NpuPortError) -> str:
    """A router's refusal as one line: a fixed kernel's reasons, or every candidate's."""
    reasons = getattr(exc, "reasons", None)
    if isinstance(exc, KernelUnavailableError):
        return f"{exc.kernel}: " + "; ".join(str(r) for r in exc.reasons)
    if isinstance(reasons, dict):
        return "; ".join(f"{name}: {', '.join(str(r) for r in rs)}" for name, rs in reasons.items())
    return str(exc).strip().splitlines()[0]


def _auto_note(router: StrategyRouter, call: AttentionCall) -> Tuple[str, List[Dict[str, Any]]]:
    decision = router.decisions.get(router.bucket(call))
    if decision is None:
        return "", []
    parts = []
    for c in decision.candidates:
        if c.median_s is not None:
            parts.append(f"{c.kernel} {c.median_s * 1e3:.3g} ms" + (" (picked)" if c.kernel == decision.kernel else ""))
        elif c.status != "refused":
            parts.append(f"{c.kernel} {c.status}")
    return "probe: " + ", ".join(parts), [c.__dict__.copy() for c in decision.candidates]


def _new_cell(strategy: Strategy, shape: Shape) -> Cell:
    return Cell(
        shape=shape.name,
        strategy=strategy.name,
        status=OK,
        batch=shape.batch,
        heads=shape.heads,
        seq_q=shape.seq,
        seq_kv=shape.key_len,
        head_dim=shape.head_dim,
        causal=shape.causal,
    )


@dataclass
class RunningCell:
    """A cell whose strategy accepted the shape: its router, chosen kernel and the times taken so far."""

    cell: Cell
    router: StrategyRouter
    kernel: Kernel
    times: List[float]

    def once(self, call: AttentionCall) -> torch.Tensor:
        return self.router(call.query, call.key, call.value, is_causal=call.is_causal)

    def fail(self, exc: BaseException) -> None:
        self.cell.status, self.cell.note = FAILED, f"{self.kernel.name} failed: {_first_line(exc)}"

    def interrupt(self, repeats: int) -> None:
        """Ctrl-C before this cell was finished: keep the timed calls so far, say how many, claim nothing more."""
        cell = self.cell
        cell.status = INTERRUPTED
        if self.times:
            cell.median_s, cell.min_s, cell.runs = spread(self.times).median, min(self.times), len(self.times)
        what = f"interrupted after {len(self.times)} of {repeats} timed calls; no memory or parity figures"
        cell.note = f"{what}; {cell.note}" if cell.note else what


def choose(
    strategy: Strategy, shape: Shape, call: AttentionCall, settings: Settings
) -> Tuple[Cell, Optional[RunningCell]]:
    """The cell, finished if the strategy is unavailable or refuses the shape; else also what is needed to run it.

    Choosing runs auto's probe (timed as ``select_s``); the memory budget is checked on the chosen kernel before it
    ever runs.
    """
    cell = _new_cell(strategy, shape)
    try:
        router = fresh_router(strategy)
    except StrategyError as exc:
        cell.status, cell.note = UNAVAILABLE, str(exc).strip().splitlines()[0]
        return cell, None
    problem = unavailable_reason(router)
    if problem:
        cell.status, cell.note = UNAVAILABLE, problem
        return cell, None
    try:
        with torch.no_grad():
            kernel, cell.select_s = timed(lambda: router.select(call), settings.device)
    except (KernelUnavailableError, NoKernelError, StrategyError) as exc:
        cell.status, cell.note = REFUSED, _refusal(exc)
        return cell, None
    except Exception as exc:  # auto's probe failing outright (every candidate broken) is a result too
        cell.status, cell.note = FAILED, f"choosing a kernel failed: {_first_line(exc)}"
        return cell, None
    cell.kernel = kernel.name
    if strategy.select == "measure":
        cell.note, cell.decision = _auto_note(router, call)
    budget = settings.memory_budget
    needed = kernel.score_bytes(call)
    if budget is not None and needed > budget:
        cell.status = REFUSED
        cell.note = (
            f"{kernel.name} would materialise {_size(needed)} of scores, over the {_size(budget)} memory budget "
            "(--memory-budget)"
        )
        return cell, None
    return cell, RunningCell(cell, router, kernel, [])


def finish(run: RunningCell, shape: Shape, call: AttentionCall, ref: Reference, settings: Settings) -> None:
    """Peak memory and parity from one more call, then the statistics of the timed calls."""
    cell = run.cell
    try:
        with torch.no_grad():
            out, cell.peak_bytes = peak_bytes(lambda: run.once(call), settings.device)
        finite = bool(torch.isfinite(out).all())
    except Exception as exc:
        run.fail(exc)
        return
    if not finite:
        cell.status, cell.note = FAILED, f"{run.kernel.name} returned NaN or inf"
        return
    cell.median_s, cell.min_s, cell.runs = spread(run.times).median, min(run.times), len(run.times)
    cell.tflops = shape.flops / cell.median_s / 1e12 if cell.median_s > 0 else None
    cell.parity_max_abs_error, relative = ref.error(out)
    cell.parity_tolerance = TOLERANCE.get(settings.dtype, 3e-4)
    cell.parity_ok = relative <= cell.parity_tolerance
