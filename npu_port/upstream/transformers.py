"""The transformers adapter: everything npu-port takes from transformers, found by feature detection.

npu-port routes the attention of transformers models (the CLIP / T5 / UMT5 text encoders of diffusers pipelines)
through transformers' documented ``AttentionInterface``: it registers a stand-in for the ``"sdpa"`` entry with
``AttentionInterface.register`` (the public way to add or override an attention function) and calls the entry that
was there. Nothing else of transformers is needed: no private module, no copy of transformers' own SDPA glue, which
changes from release to release (5.24 moved a class that 5.23's glue used). Versions without the interface (before
4.50: the diffusers 0.11-0.14 era pins 4.25-4.30) decline, and their text encoders run transformers' own attention.

Only this module names transformers' modules and attributes (a test enforces it).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from .adapter import Adapter, Piece

LIBRARY = "transformers"
#: The integration that routes transformers models' attention (the name declines and explain lines use).
TEXT_ENCODERS = "text encoders routed (transformers AttentionInterface)"
#: The integration that keeps transformers' console output quiet in npu-port's own commands.
LOGGING = "transformers logging"
#: The attention implementation npu-port routes: its SDPA call goes to the strategy.
ROUTED_IMPLEMENTATION = "sdpa"


def _usable_interface(interface: Any) -> Optional[str]:
    """The interface can be registered with, and has a callable ``"sdpa"`` entry to stand in for."""
    if not callable(getattr(interface, "register", None)):
        return "AttentionInterface has no register()"
    try:
        entry = interface()[ROUTED_IMPLEMENTATION]
    except Exception as exc:  # KeyError, or an interface that cannot be instantiated or read like a mapping
        return f"AttentionInterface has no readable {ROUTED_IMPLEMENTATION!r} entry ({type(exc).__name__})"
    return None if callable(entry) else f"AttentionInterface's {ROUTED_IMPLEMENTATION!r} entry is not callable"


PIECES = (
    Piece(
        "PreTrainedModel",
        TEXT_ENCODERS,
        where=("transformers:PreTrainedModel", "transformers.modeling_utils:PreTrainedModel"),
        public=True,
        since="2.0",
    ),
    Piece(
        "AttentionInterface",
        TEXT_ENCODERS,
        where=("transformers:AttentionInterface", "transformers.modeling_utils:AttentionInterface"),
        check=_usable_interface,
        public=True,
        since="4.50",
    ),
    Piece(
        "logging",
        LOGGING,
        where=("transformers:logging", "transformers.utils.logging"),
        check=lambda log: None if callable(getattr(log, "disable_progress_bar", None)) else "no progress switch",
        public=True,
        since="4.20",
    ),
)

ADAPTER = Adapter(LIBRARY, PIECES)


def is_model(obj: Any) -> bool:
    """A transformers ``PreTrainedModel``: told without importing transformers (a model exists only once it was
    imported), so asking costs nothing."""
    if LIBRARY not in sys.modules:
        return False
    cls = ADAPTER.get("PreTrainedModel")
    return cls is not None and isinstance(obj, cls)


def looks_like_model(obj: Any) -> bool:
    """A model whose class comes from transformers, even when ``PreTrainedModel`` cannot be found (a release that
    moved it): told from the classes' modules, so such a model is declined with the reason, not mistaken for
    something else."""
    if is_model(obj):
        return True
    try:
        mro = type(obj).__mro__
    except AttributeError:  # pragma: no cover - every type has an MRO
        return False
    return any(str(getattr(cls, "__module__", "")).split(".")[0] == LIBRARY for cls in mro) and hasattr(obj, "config")


def attention_implementation(model: Any) -> Optional[str]:
    """The attention implementation a model's config names now (``"sdpa"``, ``"eager"``, ...), or None for a
    transformers version that has no such setting."""
    config = getattr(model, "config", None)
    try:
        value = getattr(config, "_attn_implementation", None)
    except Exception:  # a property that raises on an odd config
        return None
    return value if isinstance(value, str) else None


def uses_attention_interface(cls: type) -> bool:
    """Whether the module that defines a model class computes attention through the global ``AttentionInterface``
    (it imported ``ALL_ATTENTION_FUNCTIONS``, an instance of the interface): only such models can be routed. Models
    that compute attention in their own code (T5 before transformers moved it onto the interface) cannot."""
    interface = ADAPTER.get("AttentionInterface")
    module = sys.modules.get(getattr(cls, "__module__", ""))
    functions = getattr(module, "ALL_ATTENTION_FUNCTIONS", None)
    return interface is not None and isinstance(functions, interface)


def sdpa_entry() -> Callable[..., Any]:
    """The attention function under ``"sdpa"`` now, read through the interface's mapping API (read fresh: it may be
    npu-port's own stand-in). Only called once the ``AttentionInterface`` piece was found."""
    return ADAPTER.get("AttentionInterface")()[ROUTED_IMPLEMENTATION]


def set_sdpa_entry(function: Callable[..., Any]) -> None:
    """Put ``function`` under ``"sdpa"`` with ``AttentionInterface.register`` (transformers' public API)."""
    ADAPTER.get("AttentionInterface").register(ROUTED_IMPLEMENTATION, function)


def logging_module() -> Any:
    """transformers' logging module (``transformers.logging``), or None (declined, warned once)."""
    if ADAPTER.decline(LOGGING, "logging") is not None:
        return None
    return ADAPTER.get("logging")
