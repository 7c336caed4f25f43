"""What ``torch.cuda.*`` means while CUDA-written code runs on another device.

On an npu or xpu target a name is forwarded to ``torch.npu`` / ``torch.xpu`` (device arguments mapped) when that
module has it. Everything else — and everything on a cpu target — is answered by the faithful stand-ins below, built
on :mod:`npu_port.device.helpers`: synchronising waits for the target, memory statistics are the target's (0 on cpu,
which has no device allocator), seeding seeds the generator the target's ops draw from, and CUDA events time with
the host clock after a synchronise. ``is_available`` is *not* here: it stays honest unless asked otherwise.
"""

from __future__ import annotations

import contextlib
import os
import time
from types import SimpleNamespace
from typing import Any, Callable, Dict, Optional

import torch

from .. import helpers
from ..sync import device_name
from .mapping import DeviceMapper

#: torch.cuda names whose first argument (or ``device=``) is a device.
DEVICE_ARGUMENT_FUNCTIONS = (
    "synchronize",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_accumulated_memory_stats",
    "memory_stats",
    "memory_summary",
    "mem_get_info",
    "get_device_name",
    "get_device_properties",
    "get_device_capability",
    "set_device",
    "current_stream",
    "default_stream",
    "get_rng_state",
    "set_per_process_memory_fraction",
)

#: The CUDA legacy tensor types, mapped to the target's (e.g. torch.cuda.FloatTensor -> torch.FloatTensor on cpu).
LEGACY_TENSOR_TYPES = (
    "FloatTensor",
    "DoubleTensor",
    "HalfTensor",
    "BFloat16Tensor",
    "LongTensor",
    "IntTensor",
    "ShortTensor",
    "CharTensor",
    "ByteTensor",
    "BoolTensor",
)


class TimingEvent:
    """``torch.cuda.Event`` for a device without events: records the host clock after synchronising the target."""

    def __init__(
        self, target: torch.device, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ):
        self._target = target
        self.enable_timing = enable_timing
        self._time: Optional[float] = None

    def record(self, stream: Any = None) -> None:
        helpers.synchronize(self._target)
        self._time = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        helpers.synchronize(self._target)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        helpers.synchronize(self._target)

    def elapsed_time(self, end_event: "TimingEvent") -> float:
        """Milliseconds between this event and ``end_event``, like CUDA's."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("both events must be created with enable_timing=True to measure elapsed time")
        if self._time is None or end_event._time is None:
            raise RuntimeError("both events must be recorded before measuring elapsed time")
        return (end_event._time - self._time) * 1000.0


class DeviceContext(contextlib.nullcontext):
    """``torch.cuda.device(i)``: selecting among the target's devices (there is only one cpu)."""

    def __init__(self, device: Any = None):
        super().__init__()
        self.idx = device if isinstance(device, int) else 0


def _properties(target: torch.device) -> SimpleNamespace:
    _free, total = helpers.mem_get_info(target)
    return SimpleNamespace(
        name=device_name(target),
        total_memory=total,
        major=0,
        minor=0,
        multi_processor_count=os.cpu_count() or 1,
        is_integrated=True,
        is_multi_gpu_board=False,
    )


def _stand_ins(target: torch.device, mapper: DeviceMapper) -> Dict[str, Callable[..., Any]]:
    """Every replacement written in terms of the device-generic helpers (what a cpu or mps target uses)."""

    def synchronize(device: Any = None) -> None:
        helpers.synchronize(target)

    def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
        return (
            f"{target.type}: allocated {helpers.memory_allocated(target)} bytes, "
            f"peak {helpers.max_memory_allocated(target)} bytes (npu-port stand-in for torch.cuda.memory_summary)"
        )

    def seed_generator(seed: int) -> None:
        if target.type == "cpu":  # only the generator the target's ops draw from, as torch.cuda.manual_seed does
            torch.random.default_generator.manual_seed(int(seed))
        else:
            helpers.manual_seed(seed)

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.random.get_rng_state()

    def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
        torch.random.set_rng_state(new_state)

    cpu_streams = torch.cpu
    return {
        "synchronize": synchronize,
        "empty_cache": lambda: helpers.empty_cache(target),
        "ipc_collect": nothing,
        "init": nothing,
        "memory_allocated": lambda device=None: helpers.memory_allocated(target),
        "max_memory_allocated": lambda device=None: helpers.max_memory_allocated(target),
        "memory_reserved": lambda device=None: helpers.memory_allocated(target),
        "max_memory_reserved": lambda device=None: helpers.max_memory_allocated(target),
        "reset_peak_memory_stats": lambda device=None: helpers.reset_peak_memory_stats(target),
        "reset_max_memory_allocated": lambda device=None: helpers.reset_peak_memory_stats(target),
        "reset_max_memory_cached": lambda device=None: helpers.reset_peak_memory_stats(target),
        "reset_accumulated_memory_stats": nothing,
        "memory_stats": lambda device=None: {
            "allocated_bytes.all.current": helpers.memory_allocated(target),
            "allocated_bytes.all.peak": helpers.max_memory_allocated(target),
        },
        "memory_summary": memory_summary,
        "mem_get_info": lambda device=None: helpers.mem_get_info(target),
        "set_per_process_memory_fraction": nothing,
        "get_device_name": lambda device=None: device_name(target),
        "get_device_properties": lambda device=None: _properties(target),
        "get_device_capability": lambda device=None: (0, 0),
        "device_count": lambda: 0 if mapper.counts_no_cuda_devices() else helpers.device_count(target.type),
        "current_device": lambda: 0,
        "set_device": nothing,
        "is_bf16_supported": lambda including_emulation=True: True,
        "manual_seed": seed_generator,
        "manual_seed_all": seed_generator,
        "seed": lambda: torch.random.seed(),
        "seed_all": lambda: torch.random.seed(),
        "initial_seed": lambda: torch.random.initial_seed(),
        "get_rng_state": get_rng_state,
        "set_rng_state": set_rng_state,
        "get_rng_state_all": lambda: [torch.random.get_rng_state()],
        "set_rng_state_all": lambda new_states: torch.random.set_rng_state(new_states[0]),
        "Event": lambda enable_timing=False, blocking=False, interprocess=False: TimingEvent(
            target, enable_timing, blocking, interprocess
        ),
        "Stream": cpu_streams.Stream,
        "stream": cpu_streams.stream,
        "current_stream": lambda device=None: cpu_streams.current_stream(),
        "default_stream": lambda device=None: cpu_streams.current_stream(),
        "device": DeviceContext,
    }


def _forwarding(module: Any, name: str, mapper: DeviceMapper) -> Optional[Callable[..., Any]]:
    function = getattr(module, name, None)
    if function is None:
        return None
    if name not in DEVICE_ARGUMENT_FUNCTIONS:
        return function

    def forward(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (mapper.device(args[0]),) + args[1:]
        if "device" in kwargs:
            kwargs["device"] = mapper.device(kwargs["device"])
        return function(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"torch.cuda.{name} redirected to torch.{mapper.target}.{name} (device arguments mapped)."
    return forward


def cuda_api(target: torch.device, mapper: DeviceMapper) -> Dict[str, Any]:
    """``{name: replacement}`` for ``torch.cuda``: the target module's own function where it has one."""
    api = _stand_ins(target, mapper)
    module = getattr(torch, target.type, None) if target.type in ("npu", "xpu") else None
    if module is not None:
        for name in list(api):
            forwarded = _forwarding(module, name, mapper)
            if forwarded is not None:
                api[name] = forwarded
    legacy_owner = module if module is not None else torch
    for name in LEGACY_TENSOR_TYPES:
        legacy = getattr(legacy_owner, name, None)
        if legacy is not None:
            api[name] = legacy
    return api


def nvtx_api() -> Dict[str, Callable[..., Any]]:
    """``torch.cuda.nvtx`` without CUDA: ranges become profiler record_function scopes, marks do nothing."""

    stack = []

    def range_push(msg: str) -> int:
        scope = torch.autograd.profiler.record_function(msg)
        scope.__enter__()
        stack.append(scope)
        return len(stack) - 1

    def range_pop() -> int:
        if stack:
            stack.pop().__exit__(None, None, None)
        return len(stack)

    @contextlib.contextmanager
    def range(msg: str, *args: Any, **kwargs: Any):  # noqa: A001 - torch.cuda.nvtx's own name
        with torch.autograd.profiler.record_function(msg.format(*args, **kwargs)):
            yield

    return {"range_push": range_push, "range_pop": range_pop, "range": range, "mark": lambda msg: None}
