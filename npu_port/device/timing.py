"""Timing work on any device: the one place where npu-port reads a clock around device work.

An accelerator (cuda, npu, xpu, mps) runs asynchronously: a clock read right after a call measures the launch, not
the kernel. Every measurement here synchronises the device before it reads the clock (:func:`stamp`), so a time is
the work's on every backend (on a CPU synchronising is a no-op). On a shared machine load comes and goes over
seconds; timing candidates one after another lets a burst land on one of them only, so several candidates are timed
in *interleaved rounds* (:class:`Rounds`): one run each per round, the order rotated every round, so that drift hits
every candidate alike. A candidate is then summarised by the median of its runs and their middle half
(:func:`spread`), which one outlier, however large, shifts only as far as a neighbouring run.

auto (:mod:`npu_port.strategy.measure`), ``npu-port bench`` and the scripts in ``benchmarks/`` all time through here,
so their figures are taken the same way. The clock can be injected (``clock=``) so that tests script it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Generic, List, Optional, Sequence, Tuple, TypeVar, Union

import torch

from .sync import synchronize

T = TypeVar("T")
K = TypeVar("K")
Clock = Callable[[], float]
DeviceLike = Union[torch.device, str, None]


def stamp(device: DeviceLike = None, clock: Clock = time.perf_counter) -> float:
    """The clock, read once the work queued on ``device`` is done."""
    synchronize(device)
    return clock()


def timed(fn: Callable[[], T], device: DeviceLike = None, *, clock: Clock = time.perf_counter) -> Tuple[T, float]:
    """``fn()``'s result and its seconds, the device synchronised before and after (a single measurement)."""
    start = stamp(device, clock)
    out = fn()
    return out, stamp(device, clock) - start


def warm_up(fn: Callable[[], object], device: DeviceLike = None, times: int = 1) -> None:
    """Run ``fn`` ``times`` times untimed (lazy initialisation, caches, autotuning), then wait for the device."""
    for _ in range(times):
        fn()
    synchronize(device)


def repeat(
    fn: Callable[[], object],
    device: DeviceLike = None,
    repeats: int = 5,
    *,
    warmup: int = 1,
    clock: Clock = time.perf_counter,
) -> List[float]:
    """The seconds of ``repeats`` synchronised runs of ``fn`` after ``warmup`` untimed ones (one candidate)."""
    warm_up(fn, device, warmup)
    return [timed(fn, device, clock=clock)[1] for _ in range(repeats)]


@dataclass(frozen=True)
class Spread:
    """A candidate's timed runs summarised: the median and the middle half (first and third quartiles)."""

    median: float
    low: float
    high: float
    runs: int


def spread(samples: Sequence[float]) -> Spread:
    """Median and quartiles of ``samples`` (inclusive method: for 5 runs the 2nd and 4th fastest); a single run is
    its own median and quartiles."""
    if not samples:
        raise ValueError("no timed runs to summarise")
    median = statistics.median(samples)
    if len(samples) > 1:
        low, _, high = statistics.quantiles(samples, n=4, method="inclusive")
    else:
        low = high = samples[0]
    return Spread(median, low, high, len(samples))


def rotated(items: Sequence[K], round_index: int) -> List[K]:
    """``items`` in the order of round ``round_index``: each round starts one candidate later than the last."""
    shift = round_index % len(items) if items else 0
    return list(items[shift:]) + list(items[:shift])


class Rounds(Generic[K]):
    """Interleaved timing rounds over ``candidates``: each round runs every candidate still taking part once, in an
    order rotated each round. ``time_one(candidate)`` runs one and returns its seconds (usually through
    :func:`timed`; a caller can keep its own function there, as auto does, so that tests script the times).

    The seconds of candidate ``i`` are appended to ``samples[i]`` as each run finishes, so a Ctrl-C keeps what was
    timed (pass your own lists as ``samples`` to hold them). A candidate whose run raises is handed with the
    exception and the round's index to ``on_error`` and takes no further part; without ``on_error`` the exception
    propagates. Successive :meth:`run` calls continue the rotation and the samples.
    """

    def __init__(
        self,
        candidates: Sequence[K],
        time_one: Callable[[K], float],
        *,
        samples: Optional[Sequence[List[float]]] = None,
        on_error: Optional[Callable[[K, Exception, int], None]] = None,
        clock: Clock = time.perf_counter,
    ) -> None:
        self.candidates = list(candidates)
        if samples is not None and len(samples) != len(self.candidates):
            raise ValueError(f"{len(samples)} sample lists for {len(self.candidates)} candidates")
        self.samples: List[List[float]] = list(samples) if samples is not None else [[] for _ in self.candidates]
        self.time_one = time_one
        self.on_error = on_error
        self.clock = clock
        self.alive: List[int] = list(range(len(self.candidates)))
        self.index = 0  # rounds started so far: drives the rotation
        self.last_round_s: Optional[float] = None

    def run(
        self,
        rounds: int,
        *,
        untimed: int = 0,
        deadline: Optional[float] = None,
        first_round_s: float = 0.0,
        after_round: Optional[Callable[[int, int], None]] = None,
    ) -> int:
        """Up to ``untimed + rounds`` rounds, the first ``untimed`` of them warm-up (run, not recorded); how many
        rounds ran.

        With a ``deadline`` (a time on ``clock``) a round starts only if it is expected to end before it: expected to
        take as long as the round before it took, or ``first_round_s`` when none has run yet. ``after_round(index,
        started)`` is called after each round with the number of candidates that started it.
        """
        ran = 0
        for local in range(untimed + rounds):
            if not self.alive:
                break
            round_start = self.clock()
            expected = self.last_round_s if self.last_round_s is not None else first_round_s
            if deadline is not None and round_start + expected > deadline:
                break
            index, self.index = self.index, self.index + 1
            order = rotated(self.alive, index)
            for i in order:
                try:
                    seconds = self.time_one(self.candidates[i])
                except Exception as exc:
                    if self.on_error is None:
                        raise
                    self.alive.remove(i)
                    self.on_error(self.candidates[i], exc, index)
                    continue
                if local >= untimed:
                    self.samples[i].append(seconds)
            self.last_round_s = self.clock() - round_start
            ran += 1
            if after_round is not None:
                after_round(index, len(order))
        return ran

    def spreads(self) -> List[Optional[Spread]]:
        """Each candidate's :func:`spread`, None for one without a timed run."""
        return [spread(times) if times else None for times in self.samples]
