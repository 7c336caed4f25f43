"""Layouts and their checks, in one process: every impossible layout gets one line naming the valid choices, and a
layout that is returned always fills the processes asked for."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from npu_port.errors import ParallelError
from npu_port.parallel import ParallelLayout
from npu_port.parallel.layout import check_heads, check_plan, check_sequence, models_with_plans


def _error(call, *args) -> str:
    with pytest.raises(ParallelError) as info:
        call(*args)
    return str(info.value)


@pytest.mark.parametrize(
    "args, text",
    [
        ((0, None, None, False), "--nproc must be a whole number >= 1, got 0"),
        ((True, None, None, False), "--nproc must be a whole number >= 1, got True"),
        (("2", None, None, False), "--nproc must be a whole number >= 1, got '2'"),
        ((3, None, None, True), "--cfg-parallel needs an even --nproc (one half of guidance per rank), got 3"),
        (
            (4, 3, None, False),
            "--ulysses 3 x --ring ? does not fill 4 processes: the sequence is split over 4 ranks; valid layouts: "
            "--ulysses 1 --ring 4, --ulysses 2 --ring 2, --ulysses 4 --ring 1",
        ),
        (
            (6, None, 4, False),
            "--ulysses ? x --ring 4 does not fill 6 processes: the sequence is split over 6 ranks; valid layouts: "
            "--ulysses 1 --ring 6, --ulysses 2 --ring 3, --ulysses 3 --ring 2, --ulysses 6 --ring 1",
        ),
        (
            (4, 2, 1, False),
            "--ulysses 2 x --ring 1 does not fill 4 processes: the sequence is split over 4 ranks; valid layouts: "
            "--ulysses 1 --ring 4, --ulysses 2 --ring 2, --ulysses 4 --ring 1",
        ),
        (
            (4, 4, None, True),
            "--ulysses 4 x --ring ? does not fill 4 processes with --cfg-parallel (2 guidance halves): the sequence is "
            "split over 2 ranks; valid layouts: --ulysses 1 --ring 2, --ulysses 2 --ring 1",
        ),
        (
            (2, 2, None, True),
            "--ulysses 2 x --ring ? does not fill 2 processes with --cfg-parallel (2 guidance halves): the sequence is "
            "split over 1 rank; valid layouts: --ulysses 1 --ring 1",
        ),
        ((2, 0, None, False), "--ulysses must be a whole number >= 1, got 0"),
        ((2, None, 0, False), "--ring must be a whole number >= 1, got 0"),
        ((2, -1, None, False), "--ulysses must be a whole number >= 1, got -1"),
        ((2, 2.0, None, False), "--ulysses must be a whole number >= 1, got 2.0"),
    ],
)
def test_for_processes_errors(args, text):
    assert _error(ParallelLayout.for_processes, *args) == text


def test_degrees_are_checked_on_the_layout_itself():
    assert _error(ParallelLayout, 0, 1) == "--ulysses must be a whole number >= 1, got 0"
    assert _error(ParallelLayout, 1, True) == "--ring must be a whole number >= 1, got True"


def test_describe():
    assert ParallelLayout(2, 1, True).describe() == "ulysses 2 x ring 1 x cfg-parallel 2 = 4 processes"
    assert ParallelLayout().describe() == "ulysses 1 x ring 1 = 1 process"
    assert ParallelLayout.for_processes(8, None, 2, True) == ParallelLayout(2, 2, True)


degree = st.one_of(st.none(), st.integers(1, 12))


@given(nproc=st.integers(1, 16), ulysses=degree, ring=degree, cfg=st.booleans())
def test_a_returned_layout_fills_the_processes_and_a_refused_one_names_choices_that_work(nproc, ulysses, ring, cfg):
    halves = 2 if cfg else 1
    sequence = nproc // halves
    fitting = [
        (u, sequence // u)
        for u in range(1, sequence + 1)
        if sequence % u == 0 and (ulysses is None or u == ulysses) and (ring is None or sequence // u == ring)
    ]
    try:
        layout = ParallelLayout.for_processes(nproc, ulysses, ring, cfg)
    except ParallelError as error:
        assert nproc % halves or not fitting, f"refused a layout that fits: {error}"
        choices = [(int(u), int(r)) for u, r in re.findall(r"--ulysses (\d+) --ring (\d+)", str(error))]
        for u, r in choices:
            assert ParallelLayout.for_processes(nproc, u, r, cfg).world == nproc
        return
    assert layout.world == nproc and layout.cfg == cfg
    assert (layout.ulysses, layout.ring) == (
        fitting[-1] if ulysses is None and ring is None else fitting[0]
    )  # Ulysses first


def test_check_heads():
    check_heads(4, ParallelLayout(2, 2))
    check_heads(3, ParallelLayout(1, 4))  # ring splits no heads
    check_heads(6, ParallelLayout(4, 1), anything=True)
    assert _error(check_heads, 6, ParallelLayout(4, 1)) == (
        "the model has 6 attention heads, which do not split over --ulysses 4; valid Ulysses degrees: 1, 2, 3, 6 "
        "(or --ulysses-anything, which pads the heads)"
    )


def test_check_sequence():
    check_sequence("input 'hidden_states' of blocks.0", 8, ParallelLayout(2, 2))
    check_sequence("anything", 3, ParallelLayout())  # one rank: nothing to split
    assert _error(check_sequence, "input 'hidden_states' of blocks.0", 3, ParallelLayout(2, 2)) == (
        "input 'hidden_states' of blocks.0: 3 tokens, fewer than the 4 context-parallel ranks (ulysses 2 x ring 2); "
        "valid ulysses x ring products for it: 1, 3"
    )
    assert _error(check_sequence, "input 'mask' of <model>", 1, ParallelLayout(2, 1)) == (
        "input 'mask' of <model>: 1 token, fewer than the 2 context-parallel ranks (ulysses 2 x ring 1); valid ulysses "
        "x ring products for it: 1"
    )
    assert _error(check_sequence, "input 'x' of <model>", 130, ParallelLayout(1, 4)) == (
        "input 'x' of <model>: 130 tokens, which do not split evenly over the 4 context-parallel ranks (ulysses 1 x "
        "ring 4); valid ulysses x ring products for it: 1, 2, 5, 10, 13, 26"
    )


def test_models_with_plans_from_candidates():
    from diffusers import FluxTransformer2DModel, UNet2DConditionModel

    candidates = [UNet2DConditionModel, FluxTransformer2DModel, "FluxTransformer2DModel", torch.nn.Linear]
    assert models_with_plans(candidates) == ["FluxTransformer2DModel"]


@pytest.mark.slow  # imports every diffusers model class (about 5 s)
def test_check_plan_names_the_models_that_have_one():
    from diffusers import FluxTransformer2DModel

    check_plan(FluxTransformer2DModel.__new__(FluxTransformer2DModel))
    found = models_with_plans()
    assert {"FluxTransformer2DModel", "WanTransformer3DModel"} <= set(found) and found == sorted(found)
    assert _error(check_plan, torch.nn.Linear(2, 2)) == (
        f"Linear has no context-parallel plan (_cp_plan), so its sequence cannot be split; models with one: "
        f"{', '.join(found)}. Use --cfg-parallel alone, or pass a cp_plan"
    )
