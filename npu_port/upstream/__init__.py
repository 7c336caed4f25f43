"""Adapters to the libraries whose internals npu-port uses: one module per library, the only place that names them.

Each adapter (:mod:`.transformers`, :mod:`.diffusers`) declares the pieces npu-port takes from its library and
resolves them by feature detection, once (:mod:`.adapter`). Integrations ask an adapter instead of importing the
library's internals; when a piece is missing, the integration declines — the model runs on the library's own path,
one :class:`~.adapter.UpstreamDeclinedWarning` says which library, version and piece, and ``explain()`` /
``report()`` / ``npu-port plan`` / ``run --report`` list it — and nothing raises inside a user's forward. A test
(``tests/project/test_upstream_boundary.py``) keeps every other module from naming those internals, and the removal
tests take each declared piece away to prove the decline.

Importing this package imports no optional library.
"""

from __future__ import annotations

from .adapter import (
    Adapter,
    Decline,
    Piece,
    UpstreamDeclinedWarning,
    UpstreamMissingError,
    declines,
    forget_declines,
    record_decline,
)

__all__ = [
    "Adapter",
    "Decline",
    "Piece",
    "UpstreamDeclinedWarning",
    "UpstreamMissingError",
    "adapters",
    "declines",
    "forget_declines",
    "record_decline",
]


def adapters() -> "list[Adapter]":
    """Every library adapter (for doctor, the removal tests and the boundary test)."""
    from . import diffusers, transformers

    return [transformers.ADAPTER, diffusers.ADAPTER]
