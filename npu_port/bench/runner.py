"""Running the bench: which strategies and device, then each (strategy, shape) cell — chosen, timed, checked.

A cell goes through a strategy's own router, exactly as a model's attention would: a fixed strategy runs its kernel,
``auto`` measures its candidates on the first call (that probe is timed separately, as ``select_s``) and runs its
pick afterwards. Every outcome is recorded rather than raised:

- the strategy cannot run on this machine (package or device missing): *unavailable*, with each candidate's reason;
- its kernel cannot run this shape, or would materialise more scores than the memory budget: *refused*. The budget
  is checked with ``kernel.score_bytes`` *before* anything runs: a 483 GiB score tensor is refused, never tried;
- it ran: median of ``repeats`` device-synchronised calls after ``warmup`` calls, peak memory of one more call, and
  the largest difference of that call's output from a float64 reference on a slice (batch 0, up to 2 heads, the
  first ``parity_rows`` query rows over every key — the slice ``auto`` checks, computed on the CPU in float64);
  the timed calls of one shape are *interleaved* across strategies (round-robin, order rotated each round), so a
  burst of load on a shared machine slows every strategy a little instead of one a lot;
- it accepted the shape and then failed (an error, NaN or inf): *failed*, with the error.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ..attn.call import AttentionCall
from ..attn.kernels.base import Kernel
from ..attn.registry import get_kernel
from ..device import free_memory_bytes, get_device, synchronize
from ..errors import DeviceError, KernelUnavailableError, NoKernelError, NpuPortError, StrategyError
from ..strategy.decision import bucket_key
from ..strategy.measure import TOLERANCE, parity_slice
from ..strategy.registry import get_strategy, survey
from ..strategy.router import FREE_MEMORY_SHARE, StrategyRouter
from ..strategy.spec import Strategy
from . import BenchError, BenchInterrupted
from .memory import peak_bytes
from .results import FAILED, INTERRUPTED, OK, REFUSED, UNAVAILABLE, BenchReport, Cell, machine_info
from .shapes import Shape

DTYPES = ("float32", "float16", "bfloat16")
GiB = 1 << 30


@dataclass(frozen=True)
class Settings:
    device: torch.device
    dtype: torch.dtype
    warmup: int = 2
    repeats: int = 10
    memory_budget: Optional[int] = None  # bytes of scores a kernel may materialise; None: auto's rule
    parity_rows: int = 64

    def as_dict(self) -> Dict[str, Any]:
        return {
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "warmup": self.warmup,
            "repeats": self.repeats,
            "memory_budget_bytes": self.memory_budget,
            "parity_rows": self.parity_rows,
        }


# ---- what to run ------------------------------------------------------------------------------------------------


def resolve_device(text: Optional[str]) -> torch.device:
    """``--device``: None is :func:`npu_port.get_device` (``$NPU_PORT_DEVICE`` or the best usable device); a device
    this machine cannot use is an error with the reason and the usable devices."""
    try:
        return get_device(text)
    except DeviceError as exc:
        raise BenchError(str(exc)) from None


def resolve_dtype(text: str) -> torch.dtype:
    if text not in DTYPES:
        raise BenchError(f"unknown dtype {text!r}; valid dtypes: {', '.join(DTYPES)}")
    return getattr(torch, text)


def unavailable_reason(router: StrategyRouter) -> Optional[str]:
    """None if some candidate can run here; else every candidate's reasons, one line (shared reasons merged)."""
    found = router.availability()
    if not all(found.values()):
        return None
    grouped: Dict[str, List[str]] = {}
    for name, reasons in found.items():
        grouped.setdefault("; ".join(reasons), []).append(name)
    return "; ".join(f"{', '.join(names)}: {reasons}" for reasons, names in grouped.items())


def _router(strategy: Strategy) -> StrategyRouter:
    """A router that measures afresh (``cache=False``): the bench reports this run, not an old decision."""
    return StrategyRouter(strategy.with_overrides(cache=False) if strategy.select == "measure" else strategy)


#: How a skipped strategy whose file cannot be loaded is labelled (the CLI also warns about those on stderr).
BROKEN_FILE = "broken strategy file: "


def select_strategies(text: Optional[str]) -> Tuple[List[Strategy], List[Tuple[str, str]]]:
    """The strategies a ``--strategies`` value names, and the (name, reason) of default ones left out.

    None: every strategy (profiles excluded) that can run on this machine; ``all``: every strategy, unavailable ones
    included (they show their reasons). Unknown names raise :class:`~npu_port.UnknownStrategyError`, which lists
    the valid ones. A strategy file that cannot be loaded is skipped with its error when listing; named explicitly,
    it raises that error.
    """
    if text is not None and not text.strip():
        raise BenchError("--strategies names no strategy; valid strategies: " + ", ".join(survey()[0]))
    if text is not None and text.strip() != "all":
        names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
        if not names:
            raise BenchError("--strategies names no strategy; valid strategies: " + ", ".join(survey()[0]))
        return [get_strategy(n) for n in names], []  # a broken file asked for by name raises its own error
    chosen: List[Strategy] = []
    names, broken = survey(kind="strategy")
    skipped: List[Tuple[str, str]] = [(entry.name, f"{BROKEN_FILE}{entry.error}") for entry in broken]
    for name in names:
        strategy = get_strategy(name)
        if not strategy.candidates:
            skipped.append((name, "routes no attention kernel (it installs a diffusers processor class)"))
            continue
        reason = unavailable_reason(_router(strategy)) if text is None else None
        if reason:
            skipped.append((name, f"cannot run on this machine: {reason}"))
        else:
            chosen.append(strategy)
    return chosen, skipped


# ---- one shape ----------------------------------------------------------------------------------------------------


def make_call(shape: Shape, settings: Settings, seed: int = 0) -> AttentionCall:
    """Seeded random inputs for ``shape`` (drawn on the CPU in float32, so every device and dtype sees the same)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(shape.batch, shape.heads, shape.seq, shape.head_dim, generator=gen)
    k = torch.randn(shape.batch, shape.heads, shape.key_len, shape.head_dim, generator=gen)
    v = torch.randn(shape.batch, shape.heads, shape.key_len, shape.head_dim, generator=gen)
    q, k, v = (t.to(device=settings.device, dtype=settings.dtype) for t in (q, k, v))
    return AttentionCall.from_arguments(q, k, v, None, 0.0, shape.causal, None, False)


@dataclass(frozen=True)
class Reference:
    """The float64 answer on the parity slice, and how to cut the same slice out of a strategy's output."""

    heads: int
    rows: int
    output: torch.Tensor  # (1, heads, rows, Dv) float64 on the CPU

    def error(self, out: torch.Tensor) -> Tuple[float, float]:
        """(max abs error, the same relative to max(1, max|reference|)) of ``out`` on the slice."""
        got = out[:1, : self.heads, : self.rows].detach().to("cpu", torch.float64)
        error = float((got - self.output).abs().max()) if got.numel() else 0.0
        scale = max(1.0, float(self.output.abs().max())) if self.output.numel() else 1.0
        return error, error / scale


def reference(call: AttentionCall, rows: int) -> Reference:
    """The math kernel in float64 on the CPU, on ``parity_slice(call, rows)`` of the (dtype-rounded) inputs."""
    sliced = parity_slice(call, rows)
    on_cpu = replace(
        sliced,
        query=sliced.query.to("cpu", torch.float64),
        key=sliced.key.to("cpu", torch.float64),
        value=sliced.value.to("cpu", torch.float64),
    )
    with torch.no_grad():
        output = get_kernel("math").run(on_cpu)
    return Reference(sliced.heads, sliced.q_len, output)


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
    decision = router.decisions.get(bucket_key(call))
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
class _Running:
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
            cell.median_s, cell.min_s, cell.runs = statistics.median(self.times), min(self.times), len(self.times)
        what = f"interrupted after {len(self.times)} of {repeats} timed calls; no memory or parity figures"
        cell.note = f"{what}; {cell.note}" if cell.note else what


def choose(
    strategy: Strategy, shape: Shape, call: AttentionCall, settings: Settings
) -> Tuple[Cell, Optional[_Running]]:
    """The cell, finished if the strategy is unavailable or refuses the shape; else also what is needed to run it.

    Choosing runs auto's probe (timed as ``select_s``); the memory budget is checked on the chosen kernel before it
    ever runs.
    """
    cell = _new_cell(strategy, shape)
    try:
        router = _router(strategy)
    except StrategyError as exc:
        cell.status, cell.note = UNAVAILABLE, str(exc).strip().splitlines()[0]
        return cell, None
    problem = unavailable_reason(router)
    if problem:
        cell.status, cell.note = UNAVAILABLE, problem
        return cell, None
    try:
        with torch.no_grad():
            synchronize(settings.device)
            start = time.perf_counter()
            kernel = router.select(call)
            synchronize(settings.device)
        cell.select_s = time.perf_counter() - start
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
    return cell, _Running(cell, router, kernel, [])


def _finish(run: _Running, shape: Shape, call: AttentionCall, ref: Reference, settings: Settings) -> None:
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
    cell.median_s, cell.min_s, cell.runs = statistics.median(run.times), min(run.times), len(run.times)
    cell.tflops = shape.flops / cell.median_s / 1e12 if cell.median_s > 0 else None
    cell.parity_max_abs_error, relative = ref.error(out)
    cell.parity_tolerance = TOLERANCE.get(settings.dtype, 3e-4)
    cell.parity_ok = relative <= cell.parity_tolerance


def run_shape(
    strategies: Sequence[Strategy],
    shape: Shape,
    settings: Settings,
    progress: Any = None,
    into: Optional[List[Cell]] = None,
) -> List[Cell]:
    """Every strategy on one shape; timed calls interleaved across strategies (see the module docstring).

    Cells are appended to ``into`` (a new list by default) as soon as their strategy has chosen, so that on Ctrl-C
    the caller keeps them: the cells still being timed are marked interrupted, with their times so far, and the
    KeyboardInterrupt goes on. ``progress`` (tqdm-like) advances ``repeats + 3`` steps per strategy: choose, warm
    up, each round, finish.
    """
    cells: List[Cell] = [] if into is None else into
    running: List[_Running] = []
    try:
        _run_shape(strategies, shape, settings, progress, cells, running)
    except KeyboardInterrupt:
        for run in running:
            if run.cell.status == OK and run.cell.median_s is None:  # not failed, not finished
                run.interrupt(settings.repeats)
        raise
    finally:
        running.clear()
        gc.collect()
    return cells


def _run_shape(
    strategies: Sequence[Strategy],
    shape: Shape,
    settings: Settings,
    progress: Any,
    cells: List[Cell],
    running: List["_Running"],
) -> None:
    steps = settings.repeats + 3

    def tick(n: int, what: str = "") -> None:
        if progress is not None:
            if what:
                progress.set_description(f"{shape.name}: {what}")
            progress.update(n)

    call = make_call(shape, settings)
    ref = reference(call, settings.parity_rows)
    for strategy in strategies:
        if progress is not None:
            progress.set_description(f"{shape.name}: choosing for {strategy.name}")
        cell, run = choose(strategy, shape, call, settings)
        cells.append(cell)
        if run is None:
            tick(steps)
        else:
            running.append(run)
            tick(1)

    def alive() -> List[_Running]:
        return [r for r in running if r.cell.status == OK]

    with torch.no_grad():
        for run in alive():
            try:
                for _ in range(settings.warmup):
                    run.once(call)
                synchronize(settings.device)
            except Exception as exc:
                run.fail(exc)
                tick(steps - 1)
                continue
            tick(1, f"warming up {run.cell.strategy}")
        for round_index in range(settings.repeats):
            order = alive()
            shift = round_index % len(order) if order else 0
            for run in order[shift:] + order[:shift]:
                try:
                    synchronize(settings.device)
                    start = time.perf_counter()
                    run.once(call)
                    synchronize(settings.device)
                    run.times.append(time.perf_counter() - start)
                except Exception as exc:
                    run.fail(exc)
                    tick(settings.repeats - round_index)
            tick(len(order), f"timing, round {round_index + 1} of {settings.repeats}")
    for run in alive():
        _finish(run, shape, call, ref, settings)
        tick(1, f"memory and parity of {run.cell.strategy}")


# ---- the whole run ------------------------------------------------------------------------------------------------


def memory_budget(settings: Settings) -> Optional[int]:
    """The bench's score budget: as given, else auto's own rule (a share of the device's free memory)."""
    if settings.memory_budget is not None:
        return settings.memory_budget
    free = free_memory_bytes(settings.device)
    return int(free * FREE_MEMORY_SHARE) if free else None


def progress_steps(strategies: Sequence[Strategy], shapes: Sequence[Shape], settings: Settings) -> int:
    return len(strategies) * len(shapes) * (settings.repeats + 3)


def run_bench(
    strategies: Sequence[Strategy],
    shapes: Iterable[Shape],
    settings: Settings,
    *,
    skipped_shapes: Sequence[Tuple[str, str]] = (),
    skipped_strategies: Sequence[Tuple[str, str]] = (),
    progress: Any = None,
) -> BenchReport:
    """Every strategy on every shape, shape by shape (inputs and reference made once per shape).

    ``progress`` is anything with tqdm's ``set_description(str)`` and ``update(n)``; the run takes
    :func:`progress_steps` steps. Ctrl-C raises :class:`~npu_port.bench.BenchInterrupted` carrying the report so
    far (``partial``, what was measured of what was planned, and why it stopped).
    """
    shapes = list(shapes)
    settings = replace(settings, memory_budget=memory_budget(settings))
    report = BenchReport(
        machine=machine_info(settings.device),
        settings=settings.as_dict(),
        shapes=[
            {
                "name": s.name,
                "batch": s.batch,
                "heads": s.heads,
                "seq_q": s.seq,
                "seq_kv": s.key_len,
                "head_dim": s.head_dim,
                "causal": s.causal,
                "flops": s.flops,
                "about": s.about,
            }
            for s in shapes
        ],
        skipped_shapes=list(skipped_shapes),
        skipped_strategies=list(skipped_strategies),
    )
    report.planned_cells = len(strategies) * len(shapes)
    for shape in shapes:
        try:
            run_shape(strategies, shape, settings, progress, into=report.cells)
        except KeyboardInterrupt:
            report.stopped_because = f"interrupted (Ctrl-C) while measuring shape {shape.name}"
            raise BenchInterrupted(report) from None
    return report
