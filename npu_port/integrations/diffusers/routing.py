"""Which attention function is active right now, and the call that hands an attention core to it.

Processors we keep (SD3's joint attention, Flux's dispatcher calls, IP-Adapter, anything a user wrote) compute
attention themselves, so we cannot change their code; we can only change what their call to
``F.scaled_dot_product_attention`` / ``dispatch_attention_fn`` does (see :mod:`.patches`). That call carries no
hint of which model it belongs to, so the answer lives in a :class:`contextvars.ContextVar`: forward hooks on every
targeted attention module push that module's :class:`Route` while it runs and pop it afterwards. Outside a targeted
module the variable is empty and the patched functions behave exactly like the originals, so other models in the
same process are untouched. A context variable (not a global) keeps threads and asyncio tasks apart.

While a route's attention function runs, the variable is cleared, so an attention function that itself calls the
patched functions (a router that falls back to diffusers' dispatcher, say) cannot recurse into itself.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from contextvars import ContextVar
from typing import Any, Callable, Iterator, Optional, Tuple

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

AttentionFn = Callable[..., Tensor]

#: The routes of the targeted modules now running, innermost last (a tuple: immutable, so cheap to share).
_ACTIVE: ContextVar[Tuple["Route", ...]] = ContextVar("npu_port_diffusers_attention_route", default=())


class Tally:
    """How many attention calls went where, shared by every route of one application.

    ``calls`` counts by the path a call took: ``"processor"`` (our processor), ``"sdpa"`` (a kept processor's
    ``F.scaled_dot_product_attention``), ``"dispatch"`` (a kept processor's ``dispatch_attention_fn``).
    ``by_module`` counts routed calls per qualified module name. ``declined`` counts calls seen inside a targeted
    module that were left to diffusers, by reason (context parallelism, backend-specific ``attention_kwargs``).
    """

    def __init__(self) -> None:
        self.calls: Counter = Counter()
        self.by_module: Counter = Counter()
        self.declined: Counter = Counter()

    @property
    def total(self) -> int:
        return sum(self.calls.values())


class Route:
    """Where the attention cores of one targeted module go: an attention function plus the tally to count in."""

    __slots__ = ("attention_fn", "module_name", "tally")

    def __init__(self, attention_fn: AttentionFn, module_name: str = "", tally: Optional[Tally] = None) -> None:
        self.attention_fn = attention_fn
        self.module_name = module_name
        self.tally = tally if tally is not None else Tally()

    def attend(
        self,
        path: str,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Optional[Tensor] = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: Optional[float] = None,
        enable_gqa: bool = False,
    ) -> Tensor:
        """Run one attention core (SDPA semantics, ``(B, H, S, D)``) through the attention function and count it."""
        tally = self.tally
        tally.calls[path] += 1
        tally.by_module[self.module_name] += 1
        token = _ACTIVE.set(()) if _ACTIVE.get() else None  # usually nothing to hide: our processor, no hooks
        try:
            return self.attention_fn(
                query,
                key,
                value,
                attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )
        finally:
            if token is not None:
                _ACTIVE.reset(token)

    def decline(self, reason: str) -> None:
        """Count a call that is left to diffusers, with the reason (shown by ``explain``)."""
        self.tally.declined[reason] += 1

    def __repr__(self) -> str:
        return f"Route({self.module_name or '<unnamed>'} -> {self.attention_fn!r})"


def current_route() -> Optional[Route]:
    """The route of the innermost targeted module running in this thread / task, or None."""
    stack = _ACTIVE.get()
    return stack[-1] if stack else None


@contextlib.contextmanager
def active_route(route: Route) -> Iterator[Route]:
    """Make ``route`` active for the block, as a targeted module's forward does (for tests and custom code)."""
    token = _ACTIVE.set(_ACTIVE.get() + (route,))
    try:
        yield route
    finally:
        _ACTIVE.reset(token)


class _RouteHook:
    """A forward hook of a targeted module, as an object rather than a closure, so that a model carrying it can be
    copied and saved: ``copy.deepcopy(model)`` and ``torch.save(model)`` (pickle) give the copy an *inert* hook (it
    does nothing). The copy is not the model the strategy was applied to — no ``restore()`` would ever remove its
    hooks — so it must not route into this application; our processors on it still route (see :mod:`.watch`)."""

    __slots__ = ("route",)

    def __init__(self, route: Optional[Route]) -> None:
        self.route = route

    def __deepcopy__(self, memo: dict) -> "_RouteHook":
        return type(self)(None)

    def __reduce__(self):
        return (type(self), (None,))


class _Enter(_RouteHook):
    __slots__ = ()

    def __call__(self, _module: nn.Module, _args: Any) -> None:
        if self.route is not None:
            _ACTIVE.set(_ACTIVE.get() + (self.route,))


class _Leave(_RouteHook):
    __slots__ = ()

    def __call__(self, _module: nn.Module, _args: Any, _output: Any) -> None:
        stack = _ACTIVE.get()
        if self.route is not None and stack and stack[-1] is self.route:
            _ACTIVE.set(stack[:-1])


def install_route_hooks(module: nn.Module, route: Route) -> Tuple[RemovableHandle, RemovableHandle]:
    """Push ``route`` while ``module`` runs; returns the two hook handles (remove both to undo).

    The leaving hook is ``always_call`` (it runs when the forward raises, so a failed forward leaves no route behind)
    and ``prepend`` (with routes stacked by applying twice, the last pushed is popped first). It pops only its own
    route: when an earlier pre-hook raised before ours ran, there is nothing of ours to pop. Copies of the module get
    inert hooks (:class:`_RouteHook`).
    """
    entering = module.register_forward_pre_hook(_Enter(route))
    try:
        leaving = module.register_forward_hook(_Leave(route), prepend=True, always_call=True)
    except BaseException:
        entering.remove()
        raise
    return entering, leaving
