"""A running request whose client has left is stopped at the next denoising step.

Gradio stops a generator event when its client disconnects, but the demo's events are plain calls into the pipeline:
without this, a closed page (or a killed ``gradio_client``) would keep the one slot for the rest of its steps while
everyone behind it waits. The request's :class:`~npu_port.infer.Deadline` is already checked after every step (inside
the scheduler's ``step``, which every diffusers pipeline calls once per step, from 0.11 on, so no pipeline callback or
private ``_interrupt`` flag is needed); :class:`WatchedDeadline` also asks there whether the client is still
connected, and raising unwinds the pipeline call, restores the strategy and frees the slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import InferenceError
from ..infer.deadline import Deadline


class ClientLeft(InferenceError):
    """The client of a running request disconnected; the request was stopped between two denoising steps."""


def _never_left() -> bool:
    return False


@dataclass
class WatchedDeadline(Deadline):
    """The request's time limit, plus ``left()``: whether its client has disconnected (checked after every step)."""

    left: Callable[[], bool] = field(default=_never_left)

    def check(self, step: int, steps: int, strategy: str) -> None:
        super().check(step, steps, strategy)
        if self.left():
            raise ClientLeft(
                f"a request was stopped because its client left (after step {step} of {steps} under strategy "
                f"{strategy!r})"
            )
