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
from ..errors import ParallelError

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
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
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


def failure_error(exc: Any) -> ParallelError:
    """One line for the rank that failed first (torchelastic records each rank's exception): an npu-port error's own
    message as it is (bad input, the same on every rank), anything else as "rank N failed: ..." after printing that
    rank's traceback to stderr."""
    rank, failure = exc.get_first_failure()
    message = failure.message
    text = message.get("message", "") if isinstance(message, dict) else str(message or "")
    name, _, rest = text.partition(": ")
    kind = getattr(errors, name, None)
    if isinstance(kind, type) and issubclass(kind, errors.NpuPortError) and rest:
        return ParallelError(rest)
    stack = message.get("extraInfo", {}).get("py_callstack") if isinstance(message, dict) else None
    if stack:
        print(stack.rstrip(), file=sys.stderr)
    first = text.strip().splitlines()[0] if text.strip() else f"exit code {failure.exitcode}"
    return ParallelError(f"rank {rank} failed: {first}")


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
