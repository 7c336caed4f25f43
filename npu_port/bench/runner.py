"""Running the bench: every strategy on every shape, shape by shape, the timed calls of one shape interleaved.

For each shape the inputs and the float64 reference are made once (:mod:`.reference`); each strategy chooses its
kernel (:mod:`.cells`: unavailable, refused, or running); the running ones are warmed up (``warmup`` calls each),
then timed in ``repeats`` interleaved rounds (:class:`~npu_port.device.timing.Rounds`: one device-synchronised call
each per round, order rotated each round), so a burst of load on a shared machine slows every strategy a little
instead of one a lot; last, one more call of each gives its peak memory and its error against the reference.

The names a caller of the bench needs (``Settings``, ``select_strategies``, ``choose``, ...) are importable from here;
they are defined in :mod:`.choices`, :mod:`.reference` and :mod:`.cells`.
"""

from __future__ import annotations

import functools
import gc
from dataclasses import replace
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import torch

from ..device.timing import Rounds, timed, warm_up
from ..strategy.spec import Strategy
from . import BenchInterrupted
from .cells import RunningCell, choose, finish
from .choices import (
    BROKEN_FILE,
    DTYPES,
    Settings,
    memory_budget,
    resolve_device,
    resolve_dtype,
    select_strategies,
    unavailable_reason,
)
from .reference import Reference, make_call, reference
from .results import OK, BenchReport, Cell, machine_info
from .shapes import Shape

__all__ = [
    "BROKEN_FILE",
    "DTYPES",
    "Reference",
    "RunningCell",
    "Settings",
    "choose",
    "make_call",
    "memory_budget",
    "progress_steps",
    "reference",
    "resolve_device",
    "resolve_dtype",
    "run_bench",
    "run_shape",
    "select_strategies",
    "unavailable_reason",
]


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
    running: List[RunningCell] = []
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
    running: List[RunningCell],
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

    def alive() -> List[RunningCell]:
        return [r for r in running if r.cell.status == OK]

    def failed(run: RunningCell, exc: Exception, round_index: int) -> None:
        run.fail(exc)
        tick(settings.repeats - round_index)

    with torch.no_grad():
        for run in alive():
            try:
                warm_up(functools.partial(run.once, call), settings.device, settings.warmup)
            except Exception as exc:
                run.fail(exc)
                tick(steps - 1)
                continue
            tick(1, f"warming up {run.cell.strategy}")
        timing = alive()
        rounds = Rounds(
            timing,
            lambda run: timed(functools.partial(run.once, call), settings.device)[1],
            samples=[run.times for run in timing],
            on_error=failed,
        )
        rounds.run(
            settings.repeats,
            after_round=lambda index, started: tick(started, f"timing, round {index + 1} of {settings.repeats}"),
        )
    for run in alive():
        finish(run, shape, call, ref, settings)
        tick(1, f"memory and parity of {run.cell.strategy}")


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
