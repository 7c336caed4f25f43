"""Who may join the demo's queue, decided when a request asks to join, before it waits.

Gradio's queue bounds its length (``max_size``) but not what one client holds: one client could queue twenty
maximum-cost Compares ahead of everyone. So each client (a page load, a ``gradio_client.Client`` — gradio's session)
may have at most ``--per-client`` requests waiting or running; one more is refused with one line naming the limit,
and other clients are not affected. A call of the wrong shape (the wrong number of values, an endpoint that does not
exist) is refused at the same door: gradio would otherwise take it into the queue and fail on it with a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

from ..errors import InferenceError
from .payload import Field, MalformedCall, check_count

#: Requests that may wait in the queue (the one running not counted): gradio's ``max_size``.
DEFAULT_MAX_QUEUE = 10
#: Requests one client may have waiting or running: a page can send one Generate and one Compare.
DEFAULT_PER_CLIENT = 2

#: HTTP statuses of a refusal at the door: too many requests from this client; a call of the wrong shape.
TOO_MANY_REQUESTS = 429
BAD_REQUEST = 400


@dataclass(frozen=True)
class QueueLimits:
    """How many requests may wait (``max_queue``) and how many one client may have waiting or running
    (``per_client``); whole numbers >= 1, and a client may not hold more than the whole queue."""

    max_queue: int = DEFAULT_MAX_QUEUE
    per_client: int = DEFAULT_PER_CLIENT

    def __post_init__(self) -> None:
        for flag, value in (("--max-queue", self.max_queue), ("--per-client", self.per_client)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InferenceError(f"{flag} must be a whole number >= 1, got {value!r}")
        if self.per_client > self.max_queue:
            raise InferenceError(
                f"--per-client {self.per_client} is more than --max-queue {self.max_queue}: one client could fill the "
                "queue; lower --per-client or raise --max-queue"
            )


@dataclass(frozen=True)
class Refusal:
    """Why a request may not join: the HTTP status and the one line the caller sees."""

    status: int
    message: str


class Admission:
    """The check gradio's queue runs on each request that asks to join (``QueueView.hold_joins`` of
    :mod:`npu_port.upstream.gradio`).

    ``endpoints``: the demo's API names and their fields, in the order the page sends them; ``jobs(session)``: how
    many requests that client has waiting or running now.
    """

    def __init__(self, limits: QueueLimits, endpoints: Dict[str, Sequence[Field]], jobs: Callable[[str], int]) -> None:
        self.limits = limits
        self.endpoints = dict(endpoints)
        self.jobs = jobs

    def check(self, endpoint: Optional[str], session: Optional[str], values: Any) -> Optional[Refusal]:
        """None to let the request in, else the :class:`Refusal`. ``endpoint``: the API name of the event called
        (None: no event has the index the call names, where gradio would fail with a traceback); an event that is not
        one of ``endpoints`` is left to gradio's own rules."""
        if endpoint is None:
            return Refusal(BAD_REQUEST, f"no such endpoint; the demo's endpoints: {', '.join(self.endpoints)}")
        fields = self.endpoints.get(endpoint)
        if fields is None:
            return None
        try:
            check_count(endpoint, fields, values)
        except MalformedCall as exc:
            return Refusal(BAD_REQUEST, str(exc))
        if session is None:  # gradio gives such a call a session of its own: nothing of it can be waiting
            return None
        held = self.jobs(session)
        if held >= self.limits.per_client:
            return Refusal(
                TOO_MANY_REQUESTS,
                f"this client already has {held} requests waiting or running, the most one client may have "
                f"(--per-client {self.limits.per_client}); wait for one to finish",
            )
        return None
