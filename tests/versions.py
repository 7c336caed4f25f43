"""The installed versions of the libraries the version markers name (``diffusers_min``, ``transformers_min``, ...),
read from metadata without importing them: conftest deselects by them, and a module whose imports exist only from
some version on guards them with :func:`at_least` so that it still imports (and is deselected) under older ones."""

from __future__ import annotations

import importlib.metadata
from typing import Optional

from packaging.version import Version

#: The libraries with version markers: ``<name>_min(version)`` and ``<name>_below(version)`` for each.
VERSIONED = ("diffusers", "transformers")


def installed_version(distribution: str) -> Optional[Version]:
    """The installed ``distribution``'s version, from its metadata (no import); None when it is not installed."""
    try:
        return Version(importlib.metadata.version(distribution))
    except importlib.metadata.PackageNotFoundError:
        return None


def at_least(distribution: str, version: str) -> bool:
    """Whether ``distribution`` is installed at ``version`` or newer."""
    installed = installed_version(distribution)
    return installed is not None and installed >= Version(version)
