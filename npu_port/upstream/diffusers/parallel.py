"""diffusers pieces: model hooks and context parallelism (``npu-port infer --nproc``, :mod:`npu_port.parallel`).

npu-port splits one generation over several processes with diffusers' own machinery: its documented hooks
(``ModelHook`` / ``HookRegistry``, 0.33 onwards) run one guidance half per rank and check each split input, and its
documented context parallelism (``ContextParallelConfig`` and ``ModelMixin.enable_parallelism``, 0.36 onwards; a
config that takes a ``mesh``, 0.38 onwards) splits the sequence along the model's ``_cp_plan``. Undoing that and
reading the groups it built uses private names (``remove_context_parallel``, ``_get_submodule_by_name``,
``ContextParallelInput``, the config's meshes). Every use is an explicit request (``--ulysses`` / ``--ring`` /
``--cfg-parallel``, ``npu_port.parallel.start``), so a missing piece is an error raised before any work —
:func:`require` — never a half-split model. One thing declines instead: telling a pipeline's conditional and
unconditional calls apart by diffusers' cache context (0.35 onwards: ``StateManager``); without it CFG parallelism
tells them apart by their order, as it does for pipelines that name no context.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..adapter import Adapter, Decline, Piece
from . import dispatch

#: Hooks on the denoiser: CFG parallelism's split and the checks before a context-parallel split.
HOOKS = "diffusers model hooks (CFG parallelism, context-parallel checks)"
#: The sequence split over ranks (Ulysses, ring).
CONTEXT_PARALLEL = "context parallelism (--ulysses / --ring)"
#: Ulysses with a head count the degree does not divide (``--ulysses-anything``).
ULYSSES_ANYTHING = "context parallelism with any head count (--ulysses-anything)"
#: CFG parallelism telling the two calls of a step apart by diffusers' cache-context names ("cond" / "uncond").
CACHE_CONTEXT = "CFG parallelism: calls told apart by diffusers' cache context"
#: The models with a context-parallel plan, named in the error for a model without one.
PLANNED_MODELS = "models with a context-parallel plan (named in errors)"

HOOK_PIECES = ("ModelHook", "HookRegistry")
CONTEXT_PARALLEL_PIECES = (
    "ContextParallelConfig",
    "context-parallel meshes",
    "enable_parallelism",
    "remove_context_parallel",
    "_get_submodule_by_name",
    "ContextParallelInput",
    "_cp_plan",
)
CACHE_CONTEXT_PIECES = ("BaseState", "StateManager", "cache context")
_HOOKS = "diffusers.hooks"
_CONTEXT_PARALLEL = "diffusers.hooks.context_parallel"
_PARALLEL_CONFIGS = "diffusers.models._modeling_parallel"
#: What ContextParallelConfig.setup records: the meshes and this rank's place in them (read by npu-port's backend).
_MESHES = ("_flattened_mesh", "_ring_mesh", "_ulysses_mesh", "_ring_local_rank", "_ulysses_local_rank")


def _model_hook(cls: Any) -> Optional[str]:
    missing = [
        m
        for m in ("initialize_hook", "pre_forward", "post_forward", "reset_state")
        if not callable(getattr(cls, m, None))
    ]
    if missing:
        return f"ModelHook has no {', '.join(missing)}"
    try:
        hook = cls()
    except Exception as exc:  # a constructor that now wants arguments
        return f"ModelHook() fails: {type(exc).__name__}: {exc}"
    return None if hasattr(hook, "fn_ref") else "a ModelHook has no fn_ref (the forward it wraps)"


def _hook_registry(cls: Any) -> Optional[str]:
    needed = ("check_if_exists_or_initialize", "register_hook", "remove_hook")
    missing = [m for m in needed if not callable(getattr(cls, m, None))]
    return f"HookRegistry has no {', '.join(missing)}" if missing else None


def _fields(cls: Any) -> List[str]:
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []


def _config(cls: Any) -> Optional[str]:
    missing = [f for f in ("ulysses_degree", "ring_degree", "mesh") if f not in _fields(cls)]
    if missing:  # mesh: 0.38 onwards; npu-port's mesh also has the CFG dimension, so diffusers must take it
        return f"ContextParallelConfig takes no {', '.join(missing)}"
    return None


def _config_field(adapter: Adapter, names: tuple) -> tuple:
    cls = adapter.get("ContextParallelConfig")
    if cls is None:
        raise LookupError(f"needs ContextParallelConfig ({adapter.why_missing('ContextParallelConfig')})")
    missing = [name for name in names if name not in _fields(cls)]
    if missing:
        raise LookupError(f"ContextParallelConfig has no {', '.join(missing)}")
    return names


def _cache_context(adapter: Adapter) -> Callable[[Any], Any]:
    """How a ``StateManager`` holds the context diffusers set on it: ``_context`` (a ``CacheContext`` with a name,
    0.41 onwards) or ``_current_context`` (the name, 0.35-0.40). Read from a fresh one, not assumed."""
    base, manager = adapter.get("BaseState"), adapter.get("StateManager")
    if base is None or manager is None:
        raise LookupError("needs BaseState and StateManager")
    fresh = manager(base)
    for attr in ("_context", "_current_context"):
        if attr in vars(fresh):
            return lambda states, attr=attr: getattr(states, attr, None)
    raise LookupError(f"a StateManager keeps its context in none of _context, _current_context ({sorted(vars(fresh))})")


PIECES = (
    Piece(
        "ModelHook",
        HOOKS,
        where=(f"{_HOOKS}:ModelHook", f"{_HOOKS}.hooks:ModelHook"),
        check=_model_hook,
        public=True,
        since="0.33",
    ),
    Piece(
        "HookRegistry",
        HOOKS,
        where=("diffusers:HookRegistry", f"{_HOOKS}:HookRegistry", f"{_HOOKS}.hooks:HookRegistry"),
        check=_hook_registry,
        public=True,
        since="0.33",
    ),
    Piece("BaseState", CACHE_CONTEXT, where=(f"{_HOOKS}.hooks:BaseState",), since="0.35"),
    Piece("StateManager", CACHE_CONTEXT, where=(f"{_HOOKS}.hooks:StateManager",), since="0.35"),
    Piece("cache context", CACHE_CONTEXT, derive=_cache_context, since="0.35"),
    Piece(
        "ContextParallelConfig",
        CONTEXT_PARALLEL,
        where=(
            "diffusers:ContextParallelConfig",
            "diffusers.models:ContextParallelConfig",
            f"{_PARALLEL_CONFIGS}:ContextParallelConfig",
        ),
        check=_config,
        public=True,
        since="0.38",
    ),
    Piece(
        "context-parallel meshes",
        CONTEXT_PARALLEL,
        derive=lambda adapter: _config_field(adapter, _MESHES),
        since="0.36",
    ),
    Piece(
        "enable_parallelism",
        CONTEXT_PARALLEL,
        where=("diffusers:ModelMixin.enable_parallelism",),
        check=lambda f: None if callable(f) else "not callable",
        public=True,
        since="0.36",
    ),
    Piece(
        "remove_context_parallel",
        CONTEXT_PARALLEL,
        where=(f"{_CONTEXT_PARALLEL}:remove_context_parallel",),
        since="0.36",
    ),
    Piece(
        "_get_submodule_by_name", CONTEXT_PARALLEL, where=(f"{_CONTEXT_PARALLEL}:_get_submodule_by_name",), since="0.36"
    ),
    Piece(
        "ContextParallelInput",
        CONTEXT_PARALLEL,
        where=(f"{_PARALLEL_CONFIGS}:ContextParallelInput", f"{_CONTEXT_PARALLEL}:ContextParallelInput"),
        since="0.36",
    ),
    Piece("_cp_plan", CONTEXT_PARALLEL, where=("diffusers:ModelMixin._cp_plan",), since="0.36"),
    Piece(
        "ulysses_anything",
        ULYSSES_ANYTHING,
        derive=lambda adapter: _config_field(adapter, ("ulysses_anything",)),
        since="0.37",
    ),
    Piece(
        "_import_structure",
        PLANNED_MODELS,
        where=("diffusers:_import_structure",),
        check=lambda s: None if isinstance(s, dict) and isinstance(s.get("models"), list) else "no list of models",
    ),
)


def _adapter() -> Adapter:
    from . import ADAPTER

    return ADAPTER


# ---- explicit requests ----------------------------------------------------------------------------------------


def require(*, context_parallel: bool = False, cfg: bool = False, anything: bool = False) -> None:
    """Raise :class:`~npu_port.upstream.UpstreamMissingError` when the installed diffusers lacks a piece the layout
    needs — before any process starts or any weight is loaded. CFG parallelism without the cache-context pieces is
    declined instead (warned about once): it tells the calls apart by their order."""
    if not (context_parallel or cfg):
        return
    adapter = _adapter()
    adapter.require(HOOKS, *HOOK_PIECES)
    if context_parallel:
        adapter.require(CONTEXT_PARALLEL, *CONTEXT_PARALLEL_PIECES)
        adapter.require(dispatch.BACKEND, *dispatch.BACKEND_PIECES)
        if anything:
            adapter.require(ULYSSES_ANYTHING, "ulysses_anything")
    if cfg:
        adapter.decline(CACHE_CONTEXT, *CACHE_CONTEXT_PIECES)


# ---- hooks ------------------------------------------------------------------------------------------------------


def model_hook() -> type:
    """diffusers' ``ModelHook`` (a hook subclasses it)."""
    return _adapter().get("ModelHook")


def hook_registry(module: Any) -> Any:
    """The module's ``HookRegistry``, made if it has none."""
    return _adapter().get("HookRegistry").check_if_exists_or_initialize(module)


def hook_registry_attribute() -> str:
    """The attribute a module keeps its registry under (made by :func:`hook_registry`)."""
    return "_diffusers_hook"


def context_states() -> Tuple[Any, Any, Optional[Decline]]:
    """``(StateManager, reader, None)``: a ``StateManager`` for a stateful hook (diffusers sets the cache context of
    each call on it) and the function that reads that context; ``(None, None, decline)`` when diffusers lacks a piece
    (declined, warned about once: the calls are then told apart by their order)."""
    adapter = _adapter()
    decline = adapter.decline(CACHE_CONTEXT, *CACHE_CONTEXT_PIECES)
    if decline is not None:
        return None, None, decline
    base = adapter.get("BaseState")

    class _Nothing(base):
        def reset(self, *args: Any, **kwargs: Any) -> None:
            pass

    return adapter.get("StateManager")(_Nothing), adapter.get("cache context"), None


# ---- context parallelism ----------------------------------------------------------------------------------------


def context_parallel_config(**options: Any) -> Any:
    """A ``ContextParallelConfig(**options)``; ``ulysses_anything`` is only passed when set."""
    if not options.get("ulysses_anything"):
        options.pop("ulysses_anything", None)
    return _adapter().get("ContextParallelConfig")(**options)


def remove_context_parallel(model: Any, plan: Dict[str, Any]) -> None:
    _adapter().get("remove_context_parallel")(model, plan)


def plan_modules(model: Any, where: str) -> List[Any]:
    """The modules a ``_cp_plan`` key names (``"blocks.*"`` is each block), as diffusers finds them."""
    found = _adapter().get("_get_submodule_by_name")(model, where)
    return found if isinstance(found, list) else [found]


def split_input_type() -> type:
    """``ContextParallelInput``: a plan entry that splits an input."""
    return _adapter().get("ContextParallelInput")


def cp_plan(model_or_class: Any) -> Any:
    """The context-parallel plan of a model or model class (None when it has none, or this diffusers has no plans:
    :func:`require` says so for an explicit request)."""
    if not _adapter().imported() or not _adapter().has("_cp_plan"):
        return None
    return getattr(model_or_class, "_cp_plan", None)


def config_meshes(config: Any) -> Dict[str, Any]:
    """What ``ContextParallelConfig.setup`` recorded: ``ulysses_mesh``, ``ring_mesh``, ``flattened_mesh`` (every rank
    of the split), ``ulysses_rank``, ``ring_rank``."""
    return {
        "ulysses_mesh": config._ulysses_mesh,
        "ring_mesh": config._ring_mesh,
        "flattened_mesh": config._flattened_mesh,
        "ulysses_rank": config._ulysses_local_rank,
        "ring_rank": config._ring_local_rank,
    }


def planned_model_names() -> Optional[List[str]]:
    """The names of diffusers' model classes (to find those with a plan), or None (declined, warned about once)."""
    adapter = _adapter()
    if adapter.decline(PLANNED_MODELS, "_import_structure") is not None:
        return None
    return [name for name in adapter.get("_import_structure")["models"] if name[:1].isupper()]
