"""Each piece of diffusers' attention dispatcher taken away, as a release that moved it would.

* A process-wide strategy declines its run-time choice in diffusers' dispatcher: one warning naming diffusers, its
  version and the piece, the decline in ``explain()`` / ``report()["declines"]``, diffusers' active backend left as it
  was, ``npu_port.attention`` still on the strategy, and the tiny pipeline makes the image diffusers makes on its
  own. Nothing raises.
* Context parallelism (npu-port's backend in the dispatcher) is an explicit request: it is refused before any work —
  no process group joined, no environment changed — with a message naming the piece.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

import npu_port
from npu_port.upstream import UpstreamDeclinedWarning, UpstreamMissingError
from npu_port.upstream.diffusers import ADAPTER, dispatch
from tests.versions import at_least

from .diffusers_scenarios import load_tiny, run_plain
from .removal import one_decline, remove, with_every_piece

pytest.importorskip("diffusers")

FEATURES = (dispatch.DISPATCHER, dispatch.BACKEND)
pytestmark = with_every_piece(ADAPTER, FEATURES)
if at_least("diffusers", pytestmark.args[0]):  # the module must import under older releases to be deselected
    from diffusers.models import attention_dispatch
DISPATCHER_PIECES = [p.name for p in ADAPTER.pieces() if p.feature == dispatch.DISPATCHER]
BACKEND_PIECES = list(dispatch.BACKEND_PIECES)
#: The registry, kept before a test takes its name away (diffusers' own code needs it to run a dispatcher model).
REGISTRY = attention_dispatch._AttentionBackendRegistry if at_least("diffusers", pytestmark.args[0]) else None
#: Which tiny pipeline shows the image: Flux's processors call the dispatcher, which needs its registry — a release
#: without that name has its registry elsewhere, but here taking the name away breaks diffusers' own Flux too, so
#: that piece is shown on the UNet pipeline (whose processors call torch's SDPA).
PIPELINE = {"_AttentionBackendRegistry": "tiny"}


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    """tiny-flux and tiny, each with its image on diffusers' own path; and, every piece in place, a process-wide
    strategy reaching the dispatcher (the thing that declines below)."""
    loaded = {name: load_tiny(name, tmp_path_factory) for name in ("tiny-flux", "tiny")}
    expected = {name: run_plain(pipe) for name, pipe in loaded.items()}
    before = REGISTRY._active_backend
    with npu_port.attention_strategy("vanilla") as handle:
        assert REGISTRY._active_backend == attention_dispatch.AttentionBackendName._NATIVE_MATH
        assert handle.report()["declines"] == []
    assert REGISTRY._active_backend is before
    return loaded, expected


def _qkv():
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, 8, 16, generator=generator) for _ in range(3)]


@pytest.mark.parametrize("name", DISPATCHER_PIECES)
def test_a_process_wide_strategy_declines_and_the_pipeline_makes_diffusers_own_image(pipelines, monkeypatch, name):
    loaded, expected = pipelines
    model = PIPELINE.get(name, "tiny-flux")
    before = REGISTRY._active_backend
    remove(monkeypatch, ADAPTER, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with npu_port.attention_strategy("vanilla") as handle:
            assert REGISTRY._active_backend is before  # diffusers keeps its backend
            image = run_plain(loaded[model])
            npu_port.attention(*_qkv())
            report, explained = handle.report(), handle.explain()
    message = one_decline(caught, ADAPTER, name)
    assert message.startswith(f"{dispatch.DISPATCHER}: diffusers {ADAPTER.version()} has no {name} (")
    assert [d["message"] for d in report["declines"]] == [message] and report["declines"][0]["missing"] == [name]
    assert f"note: not applied in this process: {message}" in explained
    assert handle.calls == {"math": 1}  # the strategy itself still applies: npu_port.attention follows it
    assert os.environ.get("DIFFUSERS_ATTN_BACKEND") != "_native_math"  # restored
    assert REGISTRY._active_backend is before
    assert np.array_equal(image, expected[model])


def test_the_decline_is_warned_once_per_process_and_listed_on_every_handle(pipelines, monkeypatch):
    remove(monkeypatch, ADAPTER, "_AttentionBackendRegistry")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with npu_port.attention_strategy("sdpa") as handle:
                assert len(handle.report()["declines"]) == 1
    assert len([w for w in caught if issubclass(w.category, UpstreamDeclinedWarning)]) == 1


@pytest.mark.parametrize("name", BACKEND_PIECES)
def test_context_parallelism_is_refused_before_any_work(monkeypatch, name):
    import torch.distributed as dist

    from npu_port.parallel import start

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    environment = dict(os.environ)
    remove(monkeypatch, ADAPTER, name)
    with pytest.raises(UpstreamMissingError) as raised:
        start(ulysses=2)
    message = str(raised.value)
    assert " needs " in message and name in message.split(" from diffusers")[0], message
    assert f"diffusers {ADAPTER.version()} does not have" in message
    assert not dist.is_initialized() and dict(os.environ) == environment


def test_without_the_backend_tables_cfg_parallelism_alone_is_still_possible(monkeypatch):
    """CFG parallelism does not use the dispatcher: only a sequence split needs npu-port's backend."""
    from npu_port.parallel import ParallelLayout
    from npu_port.parallel.layout import require

    remove(monkeypatch, ADAPTER, "backend tables")
    require(ParallelLayout(cfg=True))
    with pytest.raises(UpstreamMissingError, match="backend tables"):
        require(ParallelLayout(ulysses=2))
