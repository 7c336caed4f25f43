"""gradio's adapter: the one look inside gradio's queue (``Blocks._queue``), the only module that names its internals
(the demo, :mod:`npu_port.demo`, is their one user).

Gradio has no public API for three things the demo needs: how many requests one client has waiting or running (for
``--per-client``), whether a running request's client is still connected (to stop it at the next step and free the
slot), and a check when a request asks to join, before it waits (gradio 6 added ``validator=`` there; 5.x has
nothing). All three read or wrap the same few attributes of gradio's ``Queue`` from 5.0 to 6.31 — ``push`` (the
coroutine ``/queue/join`` awaits), ``active_jobs`` (the running events), ``event_queue_per_concurrency_id`` (the
waiting ones), each event's ``session_hash`` and ``alive`` (gradio sets it False when the client's event stream
closes, and drops that client's waiting events itself) — found by feature detection when the demo is queued. Where
one is missing, :meth:`QueueView.missing` names it, and the demo says so in one line at start and runs without the
per-client limit and the stop on disconnect (gradio's own bound on the queue and the time limit still hold).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterator, List, Optional, Protocol


class Refusal(Protocol):
    """Why a request may not join (the demo's :class:`npu_port.demo.admission.Refusal`)."""

    status: int
    message: str


class QueueView:
    """Reads (and guards the door of) the queue of one gradio ``Blocks``; the queue is looked up at each call, so
    the view may be made before ``demo.queue()``."""

    def __init__(self, demo: Any) -> None:
        self.demo = demo

    @property
    def queue(self) -> Any:
        return getattr(self.demo, "_queue", None)

    def missing(self) -> List[str]:
        """What this gradio's queue lacks of what the view uses (empty: everything is there)."""
        queue = self.queue
        if queue is None:
            return ["Blocks._queue"]
        wanted = {
            "Queue.push (a coroutine)": inspect.iscoroutinefunction(getattr(queue, "push", None)),
            "Queue.active_jobs": isinstance(getattr(queue, "active_jobs", None), list),
            "Queue.event_queue_per_concurrency_id": isinstance(
                getattr(queue, "event_queue_per_concurrency_id", None), dict
            ),
            "Blocks.fns": isinstance(getattr(self.demo, "fns", None), (dict, list)),
        }
        return [name for name, present in wanted.items() if not present]

    # ---- reading -----------------------------------------------------------------------------------------------

    def _running(self) -> Iterator[Any]:
        for job in list(self.queue.active_jobs):
            yield from list(job or ())

    def _waiting(self) -> Iterator[Any]:
        for waiting in list(self.queue.event_queue_per_concurrency_id.values()):
            yield from list(getattr(waiting, "queue", ()))

    def jobs(self, session: str) -> int:
        """Requests of ``session`` waiting or running (a running one whose client has left not counted)."""
        running = sum(1 for event in self._running() if _session(event) == session and _alive(event))
        return running + sum(1 for event in self._waiting() if _session(event) == session)

    def left(self, session: Optional[str]) -> bool:
        """Whether the client of ``session``'s running request has disconnected (False when that cannot be told)."""
        if session is None or self.queue is None:
            return False
        return any(_session(event) == session and not _alive(event) for event in self._running())

    def endpoint(self, fn_index: Any) -> Optional[str]:
        """The API name of the event ``fn_index`` names ("" for one without a name; None: no such event)."""
        fns = self.demo.fns
        try:
            fn = fns.get(fn_index) if isinstance(fns, dict) else fns[fn_index]
        except (IndexError, TypeError):
            return None
        return None if fn is None else (getattr(fn, "api_name", None) or "")

    # ---- the door ----------------------------------------------------------------------------------------------

    def hold_joins(self, check: Callable[[Optional[str], Optional[str], Any], Optional[Refusal]]) -> Callable[[], None]:
        """Run ``check(endpoint, session, values)`` on every request that asks to join the queue; a
        :class:`Refusal` answers the request with its HTTP status and message (one line, no traceback)
        and the request never enters the queue. Returns the undo.

        The check sits on this demo's own queue object (an attribute of the instance, over the class's ``push``),
        made for this demo by ``demo.queue()`` and gone with it: nothing shared is patched, and ``_patching``'s
        registry, which would hold the queue (and through it the model) for the life of the process, is not needed.
        """
        from fastapi import HTTPException  # gradio's own web framework: installed with it

        queue = self.queue
        push = queue.push

        async def checked_push(body: Any, *args: Any, **kwargs: Any) -> Any:
            fn_index = getattr(body, "fn_index", None)
            if fn_index is not None:  # without one, gradio refuses the call itself
                refusal = check(self.endpoint(fn_index), getattr(body, "session_hash", None), body.data)
                if refusal is not None:
                    raise HTTPException(status_code=refusal.status, detail=refusal.message)
            return await push(body, *args, **kwargs)

        queue.push = checked_push

        def undo() -> None:
            if vars(queue).get("push") is checked_push:
                del queue.push

        return undo


def _session(event: Any) -> Optional[str]:
    return getattr(event, "session_hash", None)


def _alive(event: Any) -> bool:
    return bool(getattr(event, "alive", True))
