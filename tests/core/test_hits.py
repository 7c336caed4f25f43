"""npu_port.hits: what a mechanism of ``npu-port run`` handled, counted per kind and per owner — the project when a
frame of its own code made the call, else the library (torch, an installed package) whose frame did — with the first
few places of each; npu-port's frames, the standard library's and forwarding shims are passed over."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading
import warnings

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_port.hits
from npu_port.device.redirect import redirect_cuda
from npu_port.hits import NO_CALLER, PASS, PLACES, PROJECT, HitLog, caller, owner_of


def _here() -> int:
    """The line of the caller (where a hit made on that line is placed)."""
    return sys._getframe(1).f_lineno


def _installed_module(tmp_path, name="somelib", filename=None):
    """A module under a ``site-packages`` folder: an installed library that calls what it is given."""
    folder = tmp_path / "venv" / "lib" / "site-packages"
    path = folder / (filename or f"{name}.py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("def call(function, *args):\n    return function(*args)\n")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, str(path)


def _where(log, kind, owner=PROJECT):
    return [place for _, place in log.places.get((kind, owner), [])]


def test_a_hit_is_counted_and_placed_at_the_project_line_that_made_it():
    log = HitLog()
    line = _here() + 2
    for _ in range(3):
        log.hit("Tensor.cuda")
    assert log.counts == {"Tensor.cuda": 3} and log.owned == {("Tensor.cuda", PROJECT): 3}
    assert _where(log, "Tensor.cuda") == [(__file__, line)]
    assert log.snapshot() == {
        "Tensor.cuda": {"count": 3, "project": 3, "where": log.places[("Tensor.cuda", PROJECT)], "libraries": {}}
    }


def test_standard_library_frames_are_passed_over():
    log = HitLog()
    with contextlib.ExitStack() as stack:  # contextlib's __exit__ makes the call
        stack.callback(log.hit, "k")
        line = _here()
    assert _where(log, "k") == [(__file__, line - 2)]  # the `with` line


def test_a_call_an_installed_library_made_is_the_librarys_not_the_project_line_that_called_it(tmp_path):
    library, path = _installed_module(tmp_path)
    log = HitLog()
    library.call(log.hit, "k")
    log.hit("k")
    line = _here() - 1
    assert log.owned == {("k", "somelib"): 1, ("k", PROJECT): 1}
    assert _where(log, "k", "somelib") == [(path, 2)] and _where(log, "k") == [(__file__, line)]
    snapshot = log.snapshot()["k"]
    assert (snapshot["count"], snapshot["project"]) == (2, 1)
    assert snapshot["libraries"] == {"somelib": {"count": 1, "where": log.places[("k", "somelib")]}}


def test_forwarding_shims_are_passed_over(tmp_path):
    """typing_extensions' deprecation wrappers only pass a call on: the project that called through them made it."""
    shim, _ = _installed_module(tmp_path, "typing_extensions")
    log = HitLog()
    shim.call(log.hit, "k")
    assert log.owned == {("k", PROJECT): 1} and _where(log, "k") == [(__file__, _here() - 1)]


def test_with_no_owner_on_the_stack_the_hit_is_no_callers_and_has_no_place():
    log = HitLog()
    thread = threading.Thread(target=log.hit, args=("k",))  # threading.py only, above the hit
    thread.start()
    thread.join()
    assert log.owned == {("k", NO_CALLER): 1} and log.places == {}
    assert log.snapshot()["k"] == {
        "count": 1,
        "project": 0,
        "where": [],
        "libraries": {NO_CALLER: {"count": 1, "where": []}},
    }


def test_owner_of_a_file():
    site = os.path.join(os.sep, "venv", "lib", "python3.11", "site-packages", "")
    dist = os.path.join(os.sep, "usr", "lib", "python3", "dist-packages", "")
    assert owner_of(npu_port.hits.__file__) == PASS
    assert owner_of(contextlib.__file__) == owner_of("<frozen importlib._bootstrap>") == PASS
    assert owner_of(site + os.path.join("diffusers", "pipelines", "pipeline_utils.py")) == "diffusers"
    assert owner_of(dist + "six.py") == "six"
    assert owner_of(site + "typing_extensions.py") == PASS
    assert owner_of(site + os.path.join("torch", "cuda", "amp", "grad_scaler.py")) == PASS  # torch.cuda: the CUDA API
    assert owner_of(site + os.path.join("torch", "amp", "autocast_mode.py")) == "torch"
    assert owner_of(torch.random.__file__) == "torch" and owner_of(torch.cuda.__file__) == PASS
    assert owner_of(__file__) == owner_of(os.path.join(os.sep, "home", "me", "project", "train.py")) == PROJECT
    assert owner_of("<stdin>") == PROJECT


def test_caller_starts_above_its_caller(tmp_path):
    def wrapper():  # a mechanism's wrapper asks who made the call it answers
        return caller()

    assert wrapper() == (PROJECT, (__file__, _here()))
    library, path = _installed_module(tmp_path)
    assert library.call(wrapper) == ("somelib", (path, 2))


def test_torch_own_calls_are_torchs_and_the_projects_cuda_calls_the_projects():
    """Under the real redirect: ``torch.manual_seed`` seeds CUDA itself (torch's hit); the project's own
    ``torch.cuda.manual_seed_all``, ``.cuda()``, and ``torch.cuda.amp``'s classes (forwarding to torch.amp) stay
    the project's."""
    with redirect_cuda("cpu") as redirect, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.cuda.amp is deprecated
        torch.manual_seed(0)
        torch.cuda.manual_seed_all(0)
        seeded = _here() - 1
        torch.ones(1).cuda()
        moved = _here() - 1
        with torch.cuda.amp.autocast():
            autocast = _here() - 1
        torch.cuda.amp.GradScaler()
        scaler = _here() - 1
        log = redirect.hit_log()
        snapshot = log.snapshot()
    seeding = snapshot["torch.cuda.manual_seed_all"]
    assert (seeding["count"], seeding["project"], list(seeding["libraries"])) == (2, 1, ["torch"])
    assert _where(log, "torch.cuda.manual_seed_all") == [(__file__, seeded)]
    (torch_place,) = _where(log, "torch.cuda.manual_seed_all", "torch")
    assert torch_place[0] == torch.random.__file__
    assert _where(log, "Tensor.cuda") == [(__file__, moved)]
    assert _where(log, "autocast") == [(__file__, autocast)] and snapshot["autocast"]["libraries"] == {}
    assert _where(log, "GradScaler") == [(__file__, scaler)] and snapshot["GradScaler"]["libraries"] == {}


def test_counted_calls_count_returns_not_raises_and_not_npu_ports_own_calls(tmp_path):
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
    library, path = _installed_module(tmp_path)
    assert library.call(flash_attn_func) == 1  # a library's call (diffusers' flash backend): the library's
    assert log.kinds == {"flash_attn_func"} and log.counts == {"flash_attn_func": 2}
    assert log.owned == {("flash_attn_func", PROJECT): 1, ("flash_attn_func", "somelib"): 1}
    assert _where(log, "flash_attn_func") == [(__file__, line)]
    assert _where(log, "flash_attn_func", "somelib") == [(path, 2)]
    assert flash_attn_func.__name__ == "flash_attn_func" and flash_attn_func.__wrapped__ is not None


def test_clear_forgets_hits_but_not_kinds():
    log = HitLog()
    log.counter("a")()
    log.clear()
    assert (log.counts, log.owned, log.places, log.kinds) == ({}, {}, {}, {"a"})
    log.hit("a")
    assert log.counts == {"a": 1} and len(log.places[("a", PROJECT)]) == 1


#: One function per line of a pretend project file and of a pretend installed library, each hitting the kind given.
_FILES = {
    PROJECT: os.path.join(os.sep, "home", "someone", "project", "train.py"),
    "somelib": os.path.join(os.sep, "venv", "lib", "python3.11", "site-packages", "somelib", "core.py"),
}
_LINES = range(1, 9)
_CALLERS = {}
for _owner, _file in _FILES.items():
    for _line in _LINES:
        _namespace = {"__name__": "train"}
        exec(compile("\n" * (_line - 1) + "def call(log, kind): log.hit(kind)\n", _file, "exec"), _namespace)
        _CALLERS[_owner, _line] = _namespace["call"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("ab"), st.sampled_from(list(_FILES)), st.sampled_from(list(_LINES))), max_size=40
    )
)
def test_counts_are_exact_per_owner_and_places_are_the_first_few_distinct_in_order(hits):
    log = HitLog()
    for kind, owner, line in hits:
        _CALLERS[owner, line](log, kind)
    snapshot = log.snapshot()
    for kind in "ab":
        assert log.counts.get(kind, 0) == len([k for k, _, _ in hits if k == kind])
        for owner, filename in _FILES.items():
            lines = [line for k, o, line in hits if (k, o) == (kind, owner)]
            assert log.owned.get((kind, owner), 0) == len(lines)
            first = list(dict.fromkeys(lines))[:PLACES]
            assert _where(log, kind, owner) == [(filename, line) for line in first]
        if kind in snapshot:
            entry = snapshot[kind]
            libraries = sum(item["count"] for item in entry["libraries"].values())
            assert entry["project"] + libraries == entry["count"] == log.counts[kind]
    # the order numbers follow the order the places were first met, across kinds and owners
    met = list(dict.fromkeys(hits))
    numbered = sorted((order, key, place[1]) for key, places in log.places.items() for order, place in places)
    assert [(kind, owner, line) for _, (kind, owner), line in numbered] == [item for item in met if _kept(item, met)]


def _kept(item, met):
    """Whether ``item`` (kind, owner, line) is among the first PLACES distinct places of its kind and owner."""
    same = [other for other in met if other[:2] == item[:2]]
    return same.index(item) < PLACES
