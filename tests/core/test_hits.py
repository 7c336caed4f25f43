"""npu_port.hits: what a mechanism of ``npu-port run`` handled, counted, with the first few places in the user's code —
past npu-port's, torch's and the standard library's frames, and past installed packages' unless nothing else is on
the stack."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from npu_port.hits import PLACES, HitLog, caller_place


def _here() -> int:
    """The line of the caller (where a hit made on that line is placed)."""
    return sys._getframe(1).f_lineno


def _installed_module(tmp_path):
    """A module under a ``site-packages`` folder: an installed library that calls back."""
    folder = tmp_path / "venv" / "lib" / "site-packages"
    folder.mkdir(parents=True)
    path = folder / "somelib.py"
    path.write_text("def call(function, *args):\n    return function(*args)\n")
    spec = importlib.util.spec_from_file_location("somelib", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, str(path)


def test_a_hit_is_counted_and_placed_at_the_line_that_made_it():
    log = HitLog()
    line = _here() + 2
    for _ in range(3):
        log.hit("Tensor.cuda")
    assert log.counts == {"Tensor.cuda": 3}
    assert [place for _, place in log.places["Tensor.cuda"]] == [(__file__, line)]
    assert log.snapshot() == {"Tensor.cuda": {"count": 3, "where": log.places["Tensor.cuda"]}}


def test_standard_library_frames_are_looked_past():
    log = HitLog()
    with contextlib.ExitStack() as stack:  # contextlib's __exit__ makes the call
        stack.callback(log.hit, "k")
        line = _here()
    assert [place for _, place in log.places["k"]] == [(__file__, line - 2)]  # the `with` line


def test_an_installed_library_is_looked_past_to_the_users_line(tmp_path):
    library, _ = _installed_module(tmp_path)
    log = HitLog()
    line = _here() + 1
    library.call(log.hit, "k")
    assert [place for _, place in log.places["k"]] == [(__file__, line)]


def test_with_no_user_frame_the_library_is_the_place(tmp_path):
    library, path = _installed_module(tmp_path)
    log = HitLog()
    thread = threading.Thread(target=library.call, args=(log.hit, "k"))  # threading.py, then the library only
    thread.start()
    thread.join()
    assert [place for _, place in log.places["k"]] == [(path, 2)]


def test_caller_place_starts_above_its_caller():
    def wrapper():  # a mechanism's wrapper asks where it was called from
        return caller_place()

    assert wrapper() == (__file__, _here())


def test_counted_calls_count_returns_not_raises_and_not_npu_ports_own_calls():
    log = HitLog()

    @log.counts_calls
    def flash_attn_func(fail=False):
        if fail:
            raise ValueError("refused")
        return 1

    assert flash_attn_func() == 1
    line = _here() - 1
    try:
        flash_attn_func(fail=True)
    except ValueError:
        pass
    namespace = {"__name__": "npu_port.dropins.somewhere", "f": flash_attn_func}
    exec("def packed():\n    return f()\n", namespace)
    assert namespace["packed"]() == 1  # one drop-in function calling another: the project made no call
    assert log.kinds == {"flash_attn_func"} and log.counts == {"flash_attn_func": 1}
    assert [place for _, place in log.places["flash_attn_func"]] == [(__file__, line)]
    assert flash_attn_func.__name__ == "flash_attn_func" and flash_attn_func.__wrapped__ is not None


def test_clear_forgets_hits_but_not_kinds():
    log = HitLog()
    log.counter("a")()
    log.clear()
    assert (log.counts, log.places, log.kinds) == ({}, {}, {"a"})
    log.hit("a")
    assert log.counts == {"a": 1} and len(log.places["a"]) == 1


#: One function per line of a pretend user file, each hitting the kind it is given.
_USER_FILE = "/home/someone/project/train.py"
_LINES = range(1, 9)
_CALLERS = {}
for _line in _LINES:
    _namespace = {"__name__": "train"}
    exec(compile("\n" * (_line - 1) + "def call(log, kind): log.hit(kind)\n", _USER_FILE, "exec"), _namespace)
    _CALLERS[_line] = _namespace["call"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from(list(_LINES))), max_size=40))
def test_counts_are_exact_and_places_are_the_first_few_distinct_in_order(hits):
    log = HitLog()
    for kind, line in hits:
        _CALLERS[line](log, kind)
    for kind in "ab":
        lines = [line for k, line in hits if k == kind]
        assert log.counts.get(kind, 0) == len(lines)
        first = list(dict.fromkeys(lines))[:PLACES]
        assert [place for _, place in log.places.get(kind, [])] == [(_USER_FILE, line) for line in first]
    # the order numbers follow the order the places were first met, across kinds
    met = list(dict.fromkeys((kind, line) for kind, line in hits))
    numbered = sorted((order, kind, place[1]) for kind in log.places for order, place in log.places[kind])
    assert [(kind, line) for _, kind, line in numbered] == [item for item in met if _kept(item, met)]


def _kept(item, met):
    """Whether ``item`` (kind, line) is among the first PLACES distinct places of its kind."""
    same_kind = [other for other in met if other[0] == item[0]]
    return same_kind.index(item) < PLACES
