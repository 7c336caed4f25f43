"""``set_attention_strategy`` / ``attention_strategy`` and the handle they return.

``target=None`` applies a strategy process-wide: environment variables (and diffusers' runtime equivalent), and the
kernel ``npu_port.attention(kernel=None)`` uses. ``target=model_or_pipeline`` applies it to every attention module in
it, through the target applier an integration registered for it (:mod:`.appliers`; diffusers models and pipelines:
:mod:`npu_port.integrations.diffusers`), and changes nothing else — unless the strategy sets ``fuse_ops:``, whose
fused ops are then installed on the same target (:mod:`npu_port.fuse`, reached through its key applier). Either way
the handle can say what it did (``explain()``) and undo it exactly (``restore()``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional

from ..errors import StrategyError
from ..weak import weak
from .appliers import applier_for, key_applier
from .process import STATE
from .registry import import_attr, is_processor_class, resolve
from .router import StrategyRouter
from .spec import Strategy
from .tally import TALLY


class StrategyHandle:
    """An applied strategy: ``.name`` (what it resolved to), ``.explain()``, ``.restore()``; a context manager."""

    def __init__(self, strategy: Strategy, router: Optional[StrategyRouter], target: Any = None) -> None:
        self.strategy = strategy
        self.router = router
        self.process_wide = target is None
        self._target = weak(target)  # a handle never keeps the model alive (npu_port.weak)
        self.applied: Any = None  # the target applier's record, when target is given (see .appliers)
        self.fused: Any = None  # the fuse_ops record (npu_port.fuse), when the strategy sets fuse_ops and has a target
        self.notes: List[str] = []
        self.declines: List[Any] = []  # process-wide: what diffusers' dispatcher could not take (npu_port.upstream)
        self.restored = False

    @property
    def target(self) -> Any:
        """The model or pipeline the strategy was applied to; None when applied process-wide, or once it was freed."""
        return self._target()

    @property
    def name(self) -> str:
        """The kernel(s) the strategy resolved to so far (``auto`` measures per shape), or the strategy's name."""
        if self.router is None:
            processor = self.strategy.processor
            label = processor.__qualname__ if isinstance(processor, type) else str(processor)
            return f"custom-processor:{label}"
        if self.strategy.select == "fixed":
            return self.strategy.name
        resolved = self.router.resolved()
        if not resolved:
            return self.strategy.name
        return resolved[0] if len(resolved) == 1 else "+".join(resolved)

    @property
    def calls(self) -> Dict[str, int]:
        """Attention calls routed so far, per kernel."""
        return dict(self.router.calls) if self.router is not None else {}

    def explain(self) -> str:
        """What was applied where, and per shape bucket each candidate's time, parity error or refusal."""
        lines: List[str] = []
        if self.router is not None:
            lines += self.router.explain_lines()
        else:
            lines.append(f"strategy custom-processor ({self.name})")
        if self.process_wide:
            lines.append("  applied process-wide: npu_port.attention(kernel=None) and environment variables")
            for key, value in self.strategy.env.items():
                lines.append(f"    {key}={value}")
        elif self.applied is not None:
            counts = self.applied.counts()
            done = ", ".join(f"{n} {action}" for action, n in counts.items() if n) or "no"
            target = self.target
            label = type(target).__name__ if target is not None else "a model that was freed since"
            lines.append(f"  applied to {label}: {done} attention modules")
            lines.append("  attention modules now:")
            lines += [f"  {line}" for line in self.applied.describe().splitlines()[1:]]
        if self.fused is not None:
            lines += [f"  {line}" for line in self.fused.describe().splitlines()]
        lines += [f"  note: {note}" for note in self.notes]
        if self.restored:
            lines.append("  restored")
        return "\n".join(lines)

    def report(self) -> Dict[str, Any]:
        """The same as ``explain()``, as JSON-ready data."""
        data: Dict[str, Any] = {
            "strategy": self.strategy.name,
            "resolved": self.name,
            "select": self.strategy.select,
            "candidates": list(self.strategy.candidates),
            "calls": self.calls,
            "notes": list(self.notes),
            "restored": self.restored,
        }
        if self.router is not None:
            data["decisions"] = [d.to_dict() for d in self.router.decisions.values()]
        if self.applied is not None:
            data["modules"] = self.applied.counts()
            data["modules_now"] = [state._asdict() for state in self.applied.states()]
            text_states = getattr(self.applied, "text_states", None)
            data["text_models"] = [state._asdict() for state in text_states()] if text_states is not None else []
            declines = getattr(self.applied, "upstream_declines", None)
            data["declines"] = [decline.as_dict() for decline in declines()] if declines is not None else []
        if self.process_wide:
            data["declines"] = [decline.as_dict() for decline in self.declines]
        if self.fused is not None:
            data["fuse_ops"] = self.fused.report()
        return data

    def restore(self) -> None:
        """Undo everything this handle did (idempotent). Processors come back as the very same objects."""
        if self.restored:
            return
        if self.fused is not None:  # installed last, undone first
            self.fused.restore()
        if self.process_wide:
            STATE.deactivate(self)
        elif self.applied is not None:
            self.applied.restore()
        if self.router is not None:
            TALLY.fold(self.router)
        self.restored = True

    def __enter__(self) -> "StrategyHandle":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.restore()

    def __repr__(self) -> str:
        target = self.target
        where = "process" if self.process_wide else type(target).__name__ if target is not None else "(freed)"
        state = ", restored" if self.restored else ""
        return f"<StrategyHandle {self.strategy.name} -> {self.name} on {where}{state}>"


def _processor_class(strategy: Strategy) -> type:
    processor = strategy.processor
    if processor is None:
        raise StrategyError(
            "custom-processor needs the processor class: set_attention_strategy('custom-processor', target=model, "
            "processor='package.module:Class'), or a strategy file that extends custom-processor and sets processor"
        )
    if isinstance(processor, str):
        processor = import_attr(processor, origin=strategy.processor_origin)
    if not is_processor_class(processor):
        raise StrategyError(f"processor must be a class with __call__, got {processor!r}")
    return processor


def set_attention_strategy(strategy: Any = "auto", target: Any = None, **options: Any) -> StrategyHandle:
    """Apply an attention strategy process-wide (``target=None``) or to a diffusers model / pipeline.

    ``strategy``: a built-in or registered name (``npu_port.list_strategies()``), a YAML file path, a processor
    class, ``"package.module:attr"``, or a :class:`~npu_port.strategy.spec.Strategy`. ``options`` override the
    strategy's ``options:`` (``memory_budget``, ``sdpa_backends``, ``compute_dtype``, ``repeats``, ...) and may set
    ``candidates``, ``processor`` or ``kernel_options``. Returns a :class:`StrategyHandle`.
    """
    spec = resolve(strategy)
    if options:
        spec = spec.with_overrides(**options)
    if spec.is_custom_processor:
        if target is None:
            raise StrategyError(
                "custom-processor installs a processor on diffusers Attention modules; pass target=model or pipeline"
            )
        processor = _processor_class(spec)
        handle = StrategyHandle(spec, None, target)
        handle.applied = applier_for(target).apply(target, None, processor_factory=processor)
        _apply_fuse_ops(handle, target)
        return handle
    router = StrategyRouter(spec)
    router.check_available()
    return apply_router(router, target)


def apply_router(router: StrategyRouter, target: Any = None) -> StrategyHandle:
    """Apply an already built router (its strategy is ``router.strategy``) as :func:`set_attention_strategy` applies
    the one it builds: process-wide for ``target=None``, else through the target's applier. For routers that do
    more than route (``npu-port plan`` records every call it is given); the caller checks availability."""
    handle = StrategyHandle(router.strategy, router, target)
    if target is None:
        handle.notes = STATE.activate(handle)
        if handle.strategy.fuse_ops:
            handle.notes.append(
                f"fuse_ops ({', '.join(handle.strategy.fuse_ops)}) change a model: apply the strategy with "
                "target=model or pipeline (nothing was fused process-wide)"
            )
    else:
        handle.applied = applier_for(target).apply(target, router)
        _apply_fuse_ops(handle, target)
    TALLY.record(router, router.strategy.name, target)  # npu-port run counts every routed call (see .tally)
    return handle


def _apply_fuse_ops(handle: StrategyHandle, target: Any) -> None:
    """The strategy's ``fuse_ops`` on the target, after its attention; if that fails, the attention is undone too."""
    if not handle.strategy.fuse_ops:
        return
    try:
        handle.fused = key_applier("fuse_ops")(target, handle.strategy.fuse_ops)
    except BaseException:
        handle.applied.restore()
        raise


@contextlib.contextmanager
def attention_strategy(strategy: Any = "auto", target: Any = None, **options: Any) -> Iterator[StrategyHandle]:
    """``set_attention_strategy`` for a ``with`` block: restored on exit, even on error."""
    handle = set_attention_strategy(strategy, target, **options)
    try:
        yield handle
    finally:
        handle.restore()
