"""The multi-process harness of the parallel tests: N gloo ranks on this CPU for a worker function, started the way
torchrun starts them — torch.distributed.elastic's ``start_processes`` (spawned processes, per-rank environment,
error files) — connecting to a TCP store this process hosts on a free port, as torchrun's agent does.

Why this and not ``subprocess`` + torchrun: the ranks import the worker by reference (no script to write), one spawn
runs several cases, and torchrun's own machinery records a failing rank's traceback. Each rank joins the process
group before the worker runs and writes what the worker returns to ``out_dir`` with ``torch.save``; the test reads
it back. A rank that fails makes the test fail with its traceback (the first rank to raise first) and the last lines
of every rank's stderr; ranks still running ``timeout`` seconds after all joined the group (a hung collective) are killed,
each printing where it was, and the test fails instead of hanging CI.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch

#: How long the ranks may run once all have joined the process group before they are taken as hung (the default
#: suite's workers take seconds).
TIMEOUT = 120.0
#: How long starting them may take (spawn, imports, joining): kept apart from TIMEOUT so that a loaded machine's slow
#: start-up does not eat a short TIMEOUT.
START_TIMEOUT = 120.0
#: The key of the TCP store each rank adds 1 to once it has joined the group.
JOINED = "ptests/joined"
#: How long a collective may wait inside a rank: less than TIMEOUT, so a rank left waiting on a peer fails with its
#: own traceback (where it waited) before the harness kills it.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=90)


def _rank_main(worker: Callable[..., Any], out_dir: str, args: tuple) -> None:
    """One rank: join the gloo group, run ``worker(*args)``, save its result as ``rank<r>.pt``."""
    import torch.distributed as dist

    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)  # killed at the timeout: say where it hung
    torch.set_num_threads(1)  # N ranks share a few cores: one thread each keeps them from oversubscribing
    dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
    dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False).add(JOINED, 1)
    result = worker(*args)  # an exception leaves the group as it is: the rank records its error before peers see it
    torch.save(result, os.path.join(out_dir, f"rank{dist.get_rank()}.pt"))
    dist.destroy_process_group()


def _tail(path: Optional[str], lines: int = 30) -> str:
    if not path or not os.path.exists(path):
        return "(no output)"
    text = Path(path).read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:]) or "(empty)"


def _raised(error_files: Dict[int, str]) -> List[Tuple[int, str]]:
    """``(rank, traceback)`` for every rank that raised (torchrun's error files), the first to raise first: when one
    rank fails, its peers fail next in the collective they were waiting in, and the first is the cause."""
    found = []
    for rank, path in error_files.items():
        if not os.path.exists(path):
            continue
        message = json.loads(Path(path).read_text()).get("message", {})
        text = message.get("extraInfo", {}).get("py_callstack") if isinstance(message, dict) else None
        found.append((os.stat(path).st_mtime_ns, rank, text or str(message)))
    return [(rank, text) for _, rank, text in sorted(found)]


def run_ranks(nproc: int, worker: Callable[..., Any], *args: Any, out_dir: Path, timeout: float = TIMEOUT) -> List[Any]:
    """Run ``worker(*args)`` on ``nproc`` ranks (a function of an importable module); each rank's return value, in
    rank order. ``out_dir``: a fresh folder (the test's ``tmp_path``) for the results and the ranks' logs."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std, start_processes

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # port 0: a free one, held by us
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # the ranks connect to our store, as torchrun's workers do
        "TORCHELASTIC_RESTART_COUNT": "0",
    }
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    context = start_processes(
        name="ptests",
        entrypoint=_rank_main,
        args={rank: (worker, str(out_dir), args) for rank in range(nproc)},
        envs={rank: dict(env, RANK=str(rank), LOCAL_RANK=str(rank)) for rank in range(nproc)},
        logs_specs=DefaultLogsSpecs(log_dir=str(out_dir / "logs"), redirects=Std.ALL),
        start_method="spawn",
    )
    started, joined = time.monotonic(), None
    try:
        while True:
            result = context.wait(timeout=0)  # a poll: the result once every rank is done or one has failed
            now = time.monotonic()
            if joined is None and store.add(JOINED, 0) == nproc:
                joined = now
            if result is not None or now > (started + START_TIMEOUT if joined is None else joined + timeout):
                break
            time.sleep(0.05)
    finally:
        context.close()  # kills ranks still running (a hang); a no-op when they are done
        for sig, handler in handlers.items():  # start_processes takes these over and leaves them to this worker
            signal.signal(sig, handler)
    logs = "\n".join(
        f"--- rank {rank} stderr (last lines) ---\n{_tail(path)}" for rank, path in context.stderrs.items()
    )
    if result is None and joined is None:
        pytest.fail(f"{nproc} ranks of {worker.__qualname__} not started after {START_TIMEOUT:.0f} s (killed)\n{logs}")
    if result is None:
        pytest.fail(
            f"{nproc} ranks of {worker.__qualname__} still running {timeout:.0f} s after joining the group (killed)\n"
            f"{logs}"
        )
    if result.is_failed():
        raised = _raised(context.error_files)
        failed = "\n".join(f"--- rank {rank} raised ---\n{text}" for rank, text in raised)
        if not raised:  # killed or crashed without a Python exception
            failed = "\n".join(
                f"--- rank {r} failed with exit code {f.exitcode} and no traceback file (see the captured stderr) ---"
                for r, f in sorted(result.failures.items())
            )
        pytest.fail(f"{worker.__qualname__} failed on {nproc} ranks\n{failed}\n{logs}", pytrace=False)
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=False) for rank in range(nproc)]


def shared_ranks(tmp_path_factory: pytest.TempPathFactory, name: str, nproc: int, worker: Callable[..., Any], *args):
    """:func:`run_ranks` once per test session, under pytest-xdist too: the first xdist worker to ask runs the ranks
    and saves their results in the session's shared temporary folder; the others wait for it and read them. (A
    module fixture alone would spawn the ranks again in every xdist worker that gets one of the module's tests.)"""
    from filelock import FileLock  # a dependency of torch

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the folder every xdist worker of this session shares
    out_dir = root / f"ranks-{name}"
    with FileLock(str(out_dir) + ".lock"):
        saved = out_dir / "results.pt"
        if saved.exists():
            return torch.load(saved, weights_only=False)
        results = run_ranks(nproc, worker, *args, out_dir=out_dir)
        torch.save(results, saved)
        return results
