"""Taking a piece of a library away, as a release that moved or renamed it would, for the removal tests.

:func:`remove` deletes every place an adapter looks for a piece (``Piece.where``) from the library's modules with
``monkeypatch`` (put back at the test's end) and makes the adapter look again. A derived piece (a behaviour, not a
name) is made to fail through :func:`break_derived`. :func:`one_decline` checks the warning a decline must give:
exactly one, naming the library, its version and the piece.

Each ``test_removal_*.py`` module sets ``FEATURES``: the adapter features whose pieces it removes, one scenario per
feature; ``test_removal_coverage.py`` checks that every feature of every adapter has one.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any, List

import pytest

from npu_port.upstream import Adapter, UpstreamDeclinedWarning


def with_every_piece(adapter: Adapter, features: Any) -> Any:
    """The version marker of a removal module: its tests take pieces away from a release that has them all, so they
    run from the newest ``since`` among the pieces of ``features`` on and are deselected under older releases (there
    the pieces are missing already: the declines are tested by the integration's own tests)."""
    from packaging.version import Version

    since = max((p.since for p in adapter.pieces() if p.feature in features and p.since), key=Version)
    return getattr(pytest.mark, f"{adapter.library}_min")(since)


def in_era(name: str) -> Any:
    """``name`` as a parameter carrying the version markers of its era in diffusers (``attention.ERAS``): a release
    outside it is meant not to have the piece, so the test is deselected there (conftest), not skipped."""
    from npu_port.upstream.diffusers.attention import ERAS

    since, until = ERAS[name]
    marks = [pytest.mark.diffusers_min(since)]
    if until is not None:
        marks.append(pytest.mark.diffusers_below(until))
    return pytest.param(name, marks=marks, id=name)


def remove(monkeypatch: Any, adapter: Adapter, name: str) -> None:
    """Delete the piece ``name`` from every place the adapter looks for it; the adapter forgets what it found."""
    piece = adapter.piece(name)
    if piece.derive is not None:
        break_derived(monkeypatch, adapter, name)
        return
    for module_name, attr in adapter.locations(name):
        if not attr:  # a whole module: unimportable, and gone from its package's namespace
            monkeypatch.setitem(sys.modules, module_name, None)
            package, _, leaf = module_name.rpartition(".")
            if package and sys.modules.get(package) is not None and leaf in vars(sys.modules[package]):
                monkeypatch.delattr(sys.modules[package], leaf)
            continue
        module = sys.modules.get(module_name)
        if module is None:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
        *path, last = attr.split(".")
        owner = module
        for part in path:
            owner = getattr(owner, part, None)
            if owner is None:
                break
        # a lazy package (transformers' top level) that has not loaded the name yet finds it in the submodule it
        # comes from, which is among the places removed too
        if owner is not None and last in vars(owner):
            monkeypatch.delattr(owner, last)
    adapter.reset()


def break_derived(monkeypatch: Any, adapter: Adapter, name: str) -> None:
    """Make the derived piece ``name`` fail as a changed behaviour would (its derive raises LookupError)."""
    piece = adapter.piece(name)

    def broken(_adapter: Adapter) -> Any:
        raise LookupError(f"{name} behaves differently in this version (removed by the test)")

    monkeypatch.setitem(adapter._pieces, name, type(piece)(**{**piece.__dict__, "derive": broken}))
    adapter.reset()


def one_decline(caught: List[warnings.WarningMessage], adapter: Adapter, name: str) -> str:
    """The one decline warning in ``caught`` (asserted), naming the library, its version and ``name``."""
    messages = [str(w.message) for w in caught if issubclass(w.category, UpstreamDeclinedWarning)]
    assert len(messages) == 1, messages
    message = messages[0]
    assert f"{adapter.library} {adapter.version()} has no " in message and name in message, message
    return message
