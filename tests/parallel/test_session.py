"""``npu_port.parallel.start`` alone (a world of one): what it sets up and that ``close`` leaves nothing behind."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from npu_port.errors import ParallelError
from npu_port.parallel import ParallelLayout, start

VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


@pytest.fixture
def no_launcher_environment(monkeypatch):
    for name in (*VARIABLES, "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    if dist.is_initialized():
        pytest.skip("a process group is already running in this process")


def test_a_world_of_one_on_a_free_port_and_close_puts_the_environment_back(no_launcher_environment):
    session = start(device="cpu")
    try:
        assert (session.rank, session.world, session.is_main, session.owns_group) == (0, 1, True, True)
        assert os.environ["MASTER_PORT"] != "29500" and os.environ["WORLD_SIZE"] == "1"
        assert session.mesh.mesh_dim_names == ("cfg", "ring", "ulysses")
    finally:
        session.close()
    assert not dist.is_initialized()
    assert not any(name in os.environ for name in VARIABLES)


def test_a_layout_for_more_processes_than_started_is_refused_and_leaves_nothing(no_launcher_environment):
    with pytest.raises(ParallelError) as info:
        start(ParallelLayout(ulysses=2), device="cpu")
    assert str(info.value) == (
        "ulysses 2 x ring 1 = 2 processes, but 1 process was started; start 2 (torchrun --nproc-per-node 2) or "
        "change the layout"
    )
    assert not dist.is_initialized()
    assert not any(name in os.environ for name in VARIABLES)
