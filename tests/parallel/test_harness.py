"""The multi-process harness itself: results come back per rank, a failing rank's traceback reaches the test, and a
hung rank is killed at the timeout instead of hanging the run."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from .conftest import run_ranks


def gather_ranks(offset: int) -> dict:
    """Every rank's ``rank + offset``, all-gathered: the group is joined and collectives work."""
    mine = torch.tensor([dist.get_rank() + offset])
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "every": torch.cat(every).tolist()}


def fail_on_rank_one() -> None:
    if dist.get_rank() == 1:
        raise ValueError("rank one says no")
    dist.barrier()  # left waiting for rank 1: the harness ends it once rank 1 has failed


def hang_on_rank_one() -> None:
    if dist.get_rank() == 1:
        time.sleep(3600)
    dist.barrier()


@pytest.mark.e2e
def test_each_rank_returns_its_result_and_a_failing_rank_shows_its_traceback(tmp_path):
    assert run_ranks(2, gather_ranks, 10, out_dir=tmp_path / "ok") == [
        {"rank": 0, "world": 2, "every": [10, 11]},
        {"rank": 1, "world": 2, "every": [10, 11]},
    ]
    with pytest.raises(pytest.fail.Exception) as info:
        run_ranks(2, fail_on_rank_one, out_dir=tmp_path / "fails")
    text = str(info.value)
    assert text.startswith(
        "fail_on_rank_one failed on 2 ranks\n--- rank 1 raised ---\nTraceback (most recent call last):\n"
    )
    assert 'raise ValueError("rank one says no")' in text and "ValueError: rank one says no" in text


@pytest.mark.e2e
def test_a_hung_rank_is_killed_at_the_timeout_and_shows_where_it_hung(tmp_path):
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as info:
        run_ranks(2, hang_on_rank_one, out_dir=tmp_path, timeout=2)
    text = str(info.value)
    assert text.startswith(
        "2 ranks of hang_on_rank_one still running 2 s after joining the group (killed)\n--- rank 0 stderr"
    )
    rank_one = text[text.index("--- rank 1 stderr") :]
    assert " in hang_on_rank_one\n" in rank_one  # faulthandler's stack of the sleeping rank
    assert time.monotonic() - started < 60
