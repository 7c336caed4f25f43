"""Starting N ranks on this machine through torchrun's own launcher API (``torch.distributed.launcher.api``), with
the environment each device needs.

torchrun is the launcher people know, and its API gives the same agent, rendezvous and failure handling from
Python: ``elastic_launch(config, entrypoint)(*args)`` starts the ranks (spawned), sets RANK / LOCAL_RANK /
WORLD_SIZE / MASTER_ADDR / MASTER_PORT for each, and returns every rank's return value. What we add is the device
side:

* one device per rank — the ranks must fit in the visible devices (``ASCEND_RT_VISIBLE_DEVICES`` /
  ``CUDA_VISIBLE_DEVICES`` when set), checked before anything starts;
* Ascend: generous HCCL timeouts (``HCCL_CONNECT_TIMEOUT``, ``HCCL_EXEC_TIMEOUT``): the first step compiles graphs
  for minutes, and ranks that wait on a slower one must not give up (kept when the user set them);
* a CPU: the cores shared out (``OMP_NUM_THREADS``), where torchrun would give each rank one thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import uuid
from typing import Any, Callable, Dict, Iterator, Optional

from .. import errors
from ..errors import ParallelError, RankFailedError

#: Seconds (as strings: environment values) for HCCL's connection set-up and for one collective.
HCCL_TIMEOUTS = {"HCCL_CONNECT_TIMEOUT": "1800", "HCCL_EXEC_TIMEOUT": "1800"}

#: The variable listing the devices a process may see, per device type.
VISIBLE_DEVICES = {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}


def rank_environment(device_type: str, nproc: int, visible_count: Optional[int]) -> Dict[str, str]:
    """The variables to set for the ranks (existing values win), after checking ``nproc`` devices can be had.

    ``visible_count``: how many devices of that type this process sees (None for a cpu)."""
    env: Dict[str, str] = {}
    if device_type in VISIBLE_DEVICES:
        variable = VISIBLE_DEVICES[device_type]
        listed = os.environ.get(variable)
        count = len([d for d in listed.split(",") if d.strip()]) if listed else visible_count
        if count is not None and count < nproc:
            where = f"{variable}={listed!r} lists {count}" if listed else f"{count} {device_type} device(s) visible"
            raise ParallelError(
                f"--nproc {nproc} needs one {device_type} device per process but {where}; give --nproc {count} or "
                f"fewer, or list more devices in {variable}"
            )
    if device_type == "npu":
        env.update({k: v for k, v in HCCL_TIMEOUTS.items() if k not in os.environ})
    if device_type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        env["OMP_NUM_THREADS"] = str(max(1, cores // nproc))  # the cores this process may use, shared out
    return env


#: The launcher's loggers: they print a failed rank's traceback as log lines; :func:`launch` says it once instead.
_QUIET = ("torch.distributed.elastic", "torch.multiprocessing.spawn", "torch.distributed.launcher")


#: The signals the launcher's agent takes over (its ``signals_to_handle``) and does not give back.
_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


@contextlib.contextmanager
def _quiet_launcher() -> Iterator[None]:
    """The launcher's loggers quiet and, afterwards, this process's signal handlers as they were: the agent installs
    its own (Ctrl-C raising its SignalException) and leaves them in place after the run."""
    import signal
    import threading

    saved = [(logging.getLogger(name), logging.getLogger(name).level) for name in _QUIET]
    for logger, _ in saved:
        logger.setLevel(logging.CRITICAL)
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.getsignal(sig) for sig in (getattr(signal, n, None) for n in _SIGNALS) if sig}
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)
        for sig, handler in handlers.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _recorded(failure: Any) -> str:
    """The exception a rank recorded ("Name: message"), or "" when it left none (an exit code, a kill)."""
    message = failure.message
    text = message.get("message", "") if isinstance(message, dict) else ""
    return text.strip()


def failure_error(exc: Any) -> errors.NpuPortError:
    """One line for the failure that explains the run (torchelastic records each rank's exception).

    An npu-port error of any rank comes first, with its own message (bad input, the same on every rank):
    :class:`ParallelError`. Otherwise a recorded exception beats a rank that just exited or was killed — a rank that
    dies takes its peers' collectives down with "connection closed" errors, and the clock that orders the failures
    ticks in whole seconds: :class:`RankFailedError` after printing that rank's traceback."""
    failures = sorted(exc.failures.items())
    for _rank, failure in failures:
        name, _, rest = _recorded(failure).partition(": ")
        kind = getattr(errors, name, None)
        if isinstance(kind, type) and issubclass(kind, errors.NpuPortError) and rest:
            return ParallelError(rest)
    recorded = [(rank, f) for rank, f in failures if _recorded(f)]
    peer_lost = ("Connection closed", "Connection reset", "Broken pipe", "peer")
    recorded.sort(key=lambda item: any(word in _recorded(item[1]) for word in peer_lost))
    if recorded:
        rank, failure = recorded[0]
        stack = failure.message.get("extraInfo", {}).get("py_callstack")
        if stack:
            print(stack.rstrip(), file=sys.stderr)
        return RankFailedError(f"rank {rank} failed: {_recorded(failure).splitlines()[0]}")
    rank, failure = failures[0]
    return RankFailedError(
        f"rank {rank} exited with code {failure.exitcode} (no Python exception; see its output above)"
    )


def set_environment(values: Dict[str, str]) -> Dict[str, Optional[str]]:
    """Set ``values`` in ``os.environ``; returns what was there, for :func:`put_back_environment`."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    return saved


def put_back_environment(saved: Dict[str, Optional[str]]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def launch(entrypoint: Callable[..., Any], args: tuple, nproc: int, env: Dict[str, str]) -> Dict[int, Any]:
    """Run ``entrypoint(*args)`` in ``nproc`` ranks on this machine (torchrun's ``--standalone``); returns
    ``{rank: return value}``. ``env`` is set for the ranks (and restored here afterwards).

    When a rank raises, the agent stops the others (no rank waits for ever in a collective) and the first failure
    becomes one :class:`ParallelError` (:func:`failure_error`); Ctrl-C becomes ``KeyboardInterrupt``."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"npu-port-{uuid.uuid4().hex[:8]}",
        role="npu-port",
        rdzv_endpoint="localhost:0",
        rdzv_backend="c10d",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    saved = set_environment(env)
    try:
        with _quiet_launcher():
            return elastic_launch(config, entrypoint)(*args)
    except ChildFailedError as exc:
        raise failure_error(exc) from None
    except SignalException:
        raise KeyboardInterrupt from None
    finally:
        put_back_environment(saved)
