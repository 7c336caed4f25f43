"""The adapter mechanism on a library of our own making: where a piece is looked for, once; what counts as missing;
the decline (its text, one warning per process, the record) and the error for an explicit request."""

from __future__ import annotations

import sys
import types
import warnings

import pytest

from npu_port.upstream import (
    Adapter,
    Decline,
    Piece,
    UpstreamDeclinedWarning,
    UpstreamMissingError,
    declines,
    forget_declines,
)


class Thing:
    pass


@pytest.fixture
def fakelib(monkeypatch):
    """``fakelib`` with ``fakelib.sub`` (holding ``Thing`` and ``nested.value``), version 1.2.3."""
    root = types.ModuleType("fakelib")
    sub = types.ModuleType("fakelib.sub")
    sub.Thing = Thing
    sub.nested = types.SimpleNamespace(value=42)
    root.sub = sub
    monkeypatch.setitem(sys.modules, "fakelib", root)
    monkeypatch.setitem(sys.modules, "fakelib.sub", sub)
    yield root
    forget_declines()


def _adapter(monkeypatch, *pieces):
    adapter = Adapter("fakelib", pieces)
    monkeypatch.setattr(adapter, "version", lambda: "1.2.3")
    return adapter


def test_the_first_place_that_has_a_piece_wins_and_it_is_looked_up_once(fakelib, monkeypatch):
    adapter = _adapter(
        monkeypatch,
        Piece("Thing", "f", where=("fakelib:Thing", "fakelib.sub:Thing")),
        Piece("value", "f", where=("fakelib.sub:nested.value",)),
    )
    assert adapter.get("Thing") is Thing and adapter.get("value") == 42
    fakelib.Thing = object  # a later change is not seen until reset: resolved once
    assert adapter.get("Thing") is Thing
    adapter.reset()
    assert adapter.get("Thing") is object


def test_a_missing_piece_is_none_with_where_it_was_looked_for(fakelib, monkeypatch):
    adapter = _adapter(monkeypatch, Piece("Gone", "f", where=("fakelib:Gone", "fakelib.nowhere:Gone")))
    assert adapter.get("Gone") is None and not adapter.has("Gone")
    assert adapter.why_missing("Gone") == "looked in fakelib:Gone, fakelib.nowhere:Gone"
    assert "fakelib.nowhere" not in sys.modules  # never imported what is not there


def test_a_check_and_a_derivation_can_refuse_a_piece_with_their_reason(fakelib, monkeypatch):
    def derive(adapter):
        raise LookupError("no such behaviour here")

    adapter = _adapter(
        monkeypatch,
        Piece("Thing", "f", where=("fakelib.sub:Thing",), check=lambda cls: "Thing has no frobnicate()"),
        Piece("behaviour", "f", derive=derive),
        Piece("derived", "f", derive=lambda a: a.get("Thing") is None),
    )
    assert adapter.why_missing("Thing") == "Thing has no frobnicate()"
    assert adapter.why_missing("behaviour") == "no such behaviour here"
    assert adapter.get("derived") is True  # derived from another piece, which is missing


def test_a_library_that_is_not_installed_has_every_piece_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "fakelib_absent", None)  # import fakelib_absent fails at once
    adapter = Adapter("fakelib_absent", [Piece("Thing", "f", where=("fakelib_absent:Thing",))])
    assert adapter.version() is None
    assert adapter.get("Thing") is None and adapter.why_missing("Thing") == "not installed"


def test_a_library_that_fails_to_import_says_so(fakelib, monkeypatch):
    adapter = _adapter(monkeypatch, Piece("Thing", "f", where=("fakelib.sub:Thing",)))

    def broken(name=""):
        raise OSError("libhccl.so: cannot open shared object file")

    monkeypatch.setattr(adapter, "module", broken)
    assert (
        adapter.why_missing("Thing") == "importing fakelib fails: OSError: libhccl.so: cannot open shared object file"
    )


def test_a_decline_names_the_library_version_and_piece_and_warns_once_per_process(fakelib, monkeypatch):
    adapter = _adapter(
        monkeypatch,
        Piece("Thing", "frob", where=("fakelib.sub:Thing",)),
        Piece("Gone", "frob", where=("fakelib:Gone",)),
    )
    assert adapter.decline("frob", "Thing") is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = adapter.decline("frob", "Thing", "Gone")
        second = adapter.decline("frob", "Thing", "Gone")
    assert first == second == Decline("fakelib", "1.2.3", "frob", ("Gone",), "Gone: looked in fakelib:Gone")
    assert str(first) == "frob: fakelib 1.2.3 has no Gone (Gone: looked in fakelib:Gone); left to fakelib"
    assert [(w.category, str(w.message)) for w in caught] == [(UpstreamDeclinedWarning, str(first))]
    assert caught[0].filename == __file__  # attributed to the caller outside npu-port
    assert declines() == [first]
    assert first.as_dict() == {
        "library": "fakelib",
        "version": "1.2.3",
        "feature": "frob",
        "missing": ["Gone"],
        "detail": "Gone: looked in fakelib:Gone",
        "message": str(first),
    }
    forget_declines()
    assert declines() == []


def test_an_explicit_request_without_its_pieces_is_an_error_before_any_work(fakelib, monkeypatch):
    adapter = _adapter(monkeypatch, Piece("Gone", "frob", where=("fakelib:Gone",)))
    with pytest.raises(UpstreamMissingError) as caught:
        adapter.require("frobbing (--frob)", "Gone")
    assert str(caught.value) == (
        "frobbing (--frob) needs Gone from fakelib, which fakelib 1.2.3 does not have (Gone: looked in fakelib:Gone); "
        "see `npu-port doctor` for the versions npu-port supports and was tested with"
    )
    assert declines() == []  # an error, not a decline


def test_capabilities_say_per_feature_what_is_there(fakelib, monkeypatch):
    adapter = _adapter(
        monkeypatch,
        Piece("Thing", "works", where=("fakelib.sub:Thing",)),
        Piece("Gone", "broken", where=("fakelib:Gone",)),
    )
    found = adapter.capabilities()
    assert list(found) == ["works", "broken"] and found["works"] is None
    assert found["broken"].missing == ("Gone",)
    assert declines() == []  # asking is not declining


def test_pieces_are_declared_with_exactly_one_way_to_find_them_and_once():
    with pytest.raises(ValueError, match="give either where= or derive=, exactly one"):
        Piece("x", "f")
    with pytest.raises(ValueError, match="give either where= or derive=, exactly one"):
        Piece("x", "f", where=("a:b",), derive=lambda a: 1)
    with pytest.raises(ValueError, match="fakelib: piece 'x' declared twice"):
        Adapter("fakelib", [Piece("x", "f", where=("a:b",)), Piece("x", "g", where=("a:c",))])
    with pytest.raises(KeyError, match="fakelib adapter has no piece 'y'; pieces: x"):
        Adapter("fakelib", [Piece("x", "f", where=("a:b",))]).get("y")
