"""npu_port.strategy.tally: while open (npu-port run), every router applied — process-wide, to a target by the project,
or for it by a hook that names itself — is counted once, under what applied it; a restored handle keeps its count and
leaves nothing held; nothing is recorded while closed."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch

import npu_port
from npu_port.strategy import tally
from npu_port.strategy.tally import PROCESS_WIDE, TALLY

from ..holding_applier import Model, holding_applier


@pytest.fixture
def applier():
    with holding_applier():
        yield


@pytest.fixture
def opened():
    TALLY.open()
    try:
        yield TALLY
    finally:
        TALLY.close()


def _attend(fn, times):
    q = torch.randn(1, 2, 4, 8)
    for _ in range(times):
        fn(q, q, q)


def test_nothing_is_recorded_while_closed(applier):
    handle = npu_port.set_attention_strategy("sdpa")
    model = Model()
    applied = npu_port.set_attention_strategy("sdpa", target=model)
    try:
        _attend(npu_port.attention, 2)
        _attend(model.attend, 1)
        assert TALLY.routes() == [] and TALLY.calls() == {}
    finally:
        applied.restore()
        handle.restore()


def test_every_route_counts_once_under_what_applied_it(applier, opened):
    handle = npu_port.set_attention_strategy("sdpa")
    project, hooked = Model(), Model()
    applied = npu_port.set_attention_strategy("chunked", target=project)
    with TALLY.via("Pipe.enable_xformers_memory_efficient_attention()"):
        routed = npu_port.set_attention_strategy("sdpa", target=hooked)
    try:
        _attend(npu_port.attention, 2)  # the drop-ins and patched legacy attention call this
        _attend(project.attend, 3)
        _attend(hooked.attend, 4)
        assert TALLY.routes() == [
            {"via": PROCESS_WIDE, "strategy": "sdpa", "calls": {"sdpa": 2}},
            {"via": "set_attention_strategy('chunked', target=Model)", "strategy": "chunked", "calls": {"chunked": 3}},
            {"via": "Pipe.enable_xformers_memory_efficient_attention()", "strategy": "sdpa", "calls": {"sdpa": 4}},
        ]
        assert TALLY.calls() == {"sdpa": 6, "chunked": 3}
        # each router counts its own calls: the tally is their sum, no call counted twice
        assert sum(h.router.calls.total() for h in (handle, applied, routed)) == 9
    finally:
        routed.restore()
        applied.restore()
        handle.restore()
    assert TALLY.calls() == {"sdpa": 6, "chunked": 3}  # restored handles keep their counts


def test_a_restored_handle_leaves_nothing_held_cycle_after_cycle(applier, opened):
    model = Model()
    routers = []
    for _ in range(20):
        handle = npu_port.set_attention_strategy("sdpa", target=model)
        _attend(model.attend, 1)
        routers.append(weakref.ref(handle.router))
        handle.restore()
        del handle
    gc.collect()
    assert [ref() for ref in routers] == [None] * 20
    assert TALLY.routes() == [
        {"via": "set_attention_strategy('sdpa', target=Model)", "strategy": "sdpa", "calls": {"sdpa": 20}}
    ]


def test_routers_never_restored_are_held_up_to_live_then_folded(applier, opened, monkeypatch):
    """A script's pipeline is gone by exit and its handle with it: the tally keeps its router (its count); a process
    that applies many and restores none keeps at most LIVE, folding the oldest."""
    monkeypatch.setattr(tally, "LIVE", 2)
    routers = []
    for _ in range(3):
        model = Model()
        handle = npu_port.set_attention_strategy("sdpa", target=model)
        _attend(model.attend, 2)
        routers.append(weakref.ref(handle.router))
        del handle, model  # the model and its handle are gone: only the tally holds the router
    gc.collect()
    assert [ref() is None for ref in routers] == [True, False, False]  # the oldest folded
    assert TALLY.calls() == {"sdpa": 6}


def test_close_forgets_and_nested_opens_share_one_record(applier):
    model = Model()
    TALLY.open()
    TALLY.open()
    handle = npu_port.set_attention_strategy("sdpa", target=model)
    _attend(model.attend, 1)
    TALLY.close()
    assert TALLY.calls() == {"sdpa": 1}  # the outer one is still open
    TALLY.close()
    assert TALLY.routes() == []
    handle.restore()
    TALLY.close()  # one close too many changes nothing
    assert TALLY.routes() == []


def test_via_names_this_threads_applications_only_and_ends_with_its_block(applier, opened):
    seen = []

    def elsewhere():
        other = Model()
        seen.append(npu_port.set_attention_strategy("sdpa", target=other))

    with TALLY.via("Pipe.enable_xformers_memory_efficient_attention()"):
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
    after = npu_port.set_attention_strategy("sdpa", target=Model())
    _attend(seen[0].target.attend, 1)
    _attend(after.target.attend, 1)
    assert [route["via"] for route in TALLY.routes()] == ["set_attention_strategy('sdpa', target=Model)"]
    assert TALLY.calls() == {"sdpa": 2}
    for handle in (seen[0], after):
        handle.restore()
