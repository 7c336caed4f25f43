"""A time limit for one request: checked after every denoising step, so a request that runs too long stops at the
next step boundary instead of holding the device (and the demo's single queue slot) for hours.

The check runs inside the scheduler's ``step`` (which every diffusers pipeline calls once per step); raising there
unwinds the pipeline call, and :func:`~npu_port.infer.run.generate` restores the attention strategy on the way out.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ..errors import InferenceError


class RequestTimeout(InferenceError):
    """A request ran past its time limit and was stopped between two denoising steps."""


def check_timeout(seconds: float, label: str = "request timeout") -> float:
    """A time limit in seconds: finite and > 0."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise InferenceError(f"{label} must be a finite number of seconds > 0, got {seconds:g}")
    return seconds


@dataclass
class Deadline:
    """``seconds`` from when it was made (make it when the request starts running, not while it waits in a queue)."""

    seconds: float
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        check_timeout(self.seconds)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def check(self, step: int, steps: int, strategy: str) -> None:
        """Raise :class:`RequestTimeout` if the limit has passed (after ``step`` of ``steps`` under ``strategy``)."""
        elapsed = self.elapsed
        if elapsed > self.seconds:
            raise RequestTimeout(
                f"the request ran past its time limit of {self.seconds:g} s and was stopped (after {elapsed:.1f} s, at "
                f"step {step} of {steps} under strategy {strategy!r}); ask for fewer steps or a smaller image"
            )
