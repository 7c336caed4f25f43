"""A target applier for tests of what routes attention: its targets (:class:`Model`) keep the strategy's router as a
processor would (``model.attend``), with no diffusers model behind it. Register it with :func:`holding_applier`."""

from __future__ import annotations

import contextlib
from typing import Iterator

from npu_port.strategy.appliers import register_target_applier


class Model:
    """A target: ``attend`` is the attention function applied to it (None when none is)."""

    attend = None


class Record:
    """What the applier returns: the handle explains and restores through it."""

    def __init__(self, target: Model) -> None:
        self.target = target

    def restore(self) -> None:
        self.target.attend = None

    def counts(self):
        return {"replaced": 1}

    def describe(self) -> str:
        return "Model\n  attend"

    def states(self):
        return []


def _apply(target, attention_fn, *, processor_factory=None):
    target.attend = attention_fn
    return Record(target)


@contextlib.contextmanager
def holding_applier() -> Iterator[None]:
    """The applier, registered for :class:`Model` targets while the block runs."""
    with register_target_applier("holding-test", _apply, accepts=lambda target: isinstance(target, Model)):
        yield
