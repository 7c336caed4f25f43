"""Apply + restore, a hundred times, leaves nothing behind.

A notebook or a server applies a strategy per request and restores it afterwards; anything a cycle leaves (a
``weakref.finalize``, a hook, a config layer, a tally) grows without bound there. Each case below applies one of
npu-port's reversible changes to a tiny pipeline, runs the pipeline, restores, :data:`CYCLES` times, and compares a
census of every object the garbage collector tracks (by type), plus ``weakref.finalize``'s registry, before and after.
Warm-up cycles come first: the first calls fill caches that are meant to stay (torch's dispatch caches, the auto
cache's in-memory decisions, lazily imported modules). The cycles run in two halves and residue is what grew in
both: something a cycle leaves grows in every half, while a one-off (pytest resetting the warnings registry, which a
later warning refills) shows in one at most. Warnings are ignored while cycling, so that registry stays put anyway.
"""

from __future__ import annotations

import collections
import gc
import warnings
import weakref
from typing import Callable, Dict

import pytest
import torch

import npu_port
from npu_port.fallbacks.safe_math import force_safe_math
from npu_port.integrations.diffusers import tiny
from npu_port.integrations.legacy_attention import hook_enable_xformers, patch_legacy_attention

from ..fixtures.legacy_attention import LegacyTransformer

pytestmark = [pytest.mark.slow, pytest.mark.diffusers_min("0.27")]

CYCLES = 100
WARM_UP = 3


def census(*ignore: object) -> Dict[str, int]:
    """Objects the garbage collector tracks, per type name (``ignore``: the census's own earlier results)."""
    gc.collect()
    skip = {id(obj) for obj in ignore} | {id(ignore)}
    counts = collections.Counter(type(obj).__qualname__ for obj in gc.get_objects() if id(obj) not in skip)
    counts["weakref.finalize registry"] = len(weakref.finalize._registry)  # type: ignore[attr-defined]
    return dict(counts)


def grown(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    return {kind: after[kind] - before.get(kind, 0) for kind in after if after[kind] > before.get(kind, 0)}


def residue(cycle: Callable[[], None]) -> Dict[str, int]:
    """What :data:`CYCLES` cycles (after :data:`WARM_UP`) left behind: the kinds that grew in both halves, with
    their total growth."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(WARM_UP):
            cycle()
        census()  # the first census itself leaves a few lasting objects behind
        start = census()
        for _ in range(CYCLES // 2):
            cycle()
        middle = census(start)
        for _ in range(CYCLES - CYCLES // 2):
            cycle()
        end = census(start, middle)
    first, second = grown(start, middle), grown(middle, end)
    return {kind: first[kind] + second[kind] for kind in first if kind in second}


class _Context:
    """A context manager held open between apply and restore (``redirect_cuda`` is one, not a handle)."""

    def __init__(self, manager) -> None:
        self.manager = manager
        manager.__enter__()

    def restore(self) -> None:
        self.manager.__exit__(None, None, None)


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    pipe = tiny.tiny_dit_pipeline(save_dir=str(tmp_path_factory.mktemp("dit")))
    pipe.set_progress_bar_config(disable=True)
    return pipe


CASES: Dict[str, Callable] = {
    "set_attention_strategy(sdpa, pipeline)": lambda pipe: npu_port.set_attention_strategy("sdpa", target=pipe),
    "set_attention_strategy(chunked, pipeline)": lambda pipe: npu_port.set_attention_strategy("chunked", target=pipe),
    "set_attention_strategy(auto, pipeline)": lambda pipe: npu_port.set_attention_strategy("auto", target=pipe),
    "set_attention_strategy(sdpa, transformer)": lambda pipe: npu_port.set_attention_strategy(
        "sdpa", target=pipe.transformer
    ),
    "attention_strategy(...) as a context": lambda pipe: _Context(npu_port.attention_strategy("sdpa", target=pipe)),
    "set_attention_strategy(chunked), process-wide": lambda pipe: npu_port.set_attention_strategy("chunked"),
    "hook_enable_xformers()": lambda pipe: hook_enable_xformers(),
    "fuse_ops(pipeline)": lambda pipe: npu_port.fuse_ops(pipe, ops=["rms_norm", "rope", "geglu_exact"]),
    "redirect_cuda(cpu)": lambda pipe: _Context(npu_port.redirect_cuda("cpu")),
    "force_safe_math()": lambda pipe: force_safe_math(),
    "apply_npu_options(ascend-910b)": lambda pipe: npu_port.apply_npu_options("ascend-910b"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_apply_and_restore_cycles_leave_no_residue(pipe, case):
    make = CASES[case]

    def cycle() -> None:
        handle = make(pipe)
        tiny.run_tiny_pipeline(pipe, steps=1)
        handle.restore()

    assert residue(cycle) == {}


def test_legacy_attention_patch_cycles_leave_no_residue():
    model = LegacyTransformer(layers=1)
    hidden, text = torch.randn(1, 6, 32), torch.randn(1, 3, 16)

    def cycle() -> None:
        handle = patch_legacy_attention(model)
        with torch.no_grad():
            model(hidden, text)
        handle.restore()

    assert residue(cycle) == {}


class _Leftover:
    """What the check's own test leaves behind once per cycle: a type of its own, so its count is exact (a census of
    tuples also counts those other threads make and free meanwhile, such as pytest-xdist's channel)."""

    def __init__(self, finalizer: weakref.finalize) -> None:
        self.finalizer = finalizer


def test_the_census_finds_what_a_cycle_leaves():
    """The check itself: a cycle that leaves a finalizer and an object behind each time is caught, with the count."""
    kept = []

    class Target:
        pass

    targets = [Target() for _ in range(WARM_UP + CYCLES)]

    def cycle() -> None:
        kept.append(_Leftover(weakref.finalize(targets[len(kept)], print)))

    found = residue(cycle)
    assert found["weakref.finalize registry"] == CYCLES
    assert found["_Leftover"] == CYCLES
    assert residue(lambda: None) == {}
