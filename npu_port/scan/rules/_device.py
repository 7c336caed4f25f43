"""Shared helpers of the device family (NPU300-NPU399): what each ``torch.cuda.*`` call does without CUDA, and how
to recognise a CUDA device literal in a device position.

The table below was checked by calling each name on torch 2.13.0+cpu (no CUDA build): ``benign`` answers without
CUDA (``is_available()`` -> False, ``device_count()`` -> 0, the memory counters -> 0, ``manual_seed`` queues the
seed), ``warns`` warns and runs disabled (the ``torch.cuda.amp`` classes), ``raises`` raises (``synchronize`` and
``current_device`` an AssertionError "Torch not compiled with CUDA enabled", ``set_device`` and
``reset_peak_memory_stats`` an AttributeError of torch._C, ``Event`` / ``Stream`` / ``CUDAGraph`` a RuntimeError,
the nvml queries ModuleNotFoundError). ``REDIRECTED`` is what ``npu-port run``'s CUDA redirect answers
(npu_port/device/redirect/cuda_api.py: its stand-ins, plus ``torch.cuda.nvtx`` and the legacy tensor types).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Dict, Iterator, Optional, Tuple

if TYPE_CHECKING:
    from ..context import PythonFile

#: The CUDA legacy tensor types (the redirect's LEGACY_TENSOR_TYPES, copied: importing it would import torch, and the
#: scan must not). tests/scan/test_device.py checks the two lists agree.
LEGACY_TENSOR_TYPES = ("FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
                       "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor")  # fmt: skip

BENIGN = "benign"
WARNS = "warns"
RAISES = "raises"

#: ``torch.cuda`` attribute (after ``torch.cuda.``) -> what calling it does on a torch without CUDA (torch 2.13).
CUDA_API: Dict[str, str] = {
    # benign: answers, does nothing, or queues the work for a CUDA init that never comes
    "is_available": BENIGN,  # False
    "device_count": BENIGN,  # 0
    "is_initialized": BENIGN,  # False
    "is_bf16_supported": BENIGN,  # False
    "is_tf32_supported": BENIGN,  # False
    "get_arch_list": BENIGN,  # []
    "get_gencode_flags": BENIGN,  # ""
    "manual_seed": BENIGN,  # queued
    "manual_seed_all": BENIGN,
    "seed": BENIGN,
    "seed_all": BENIGN,
    "get_rng_state_all": BENIGN,  # []
    "set_rng_state": BENIGN,  # queued
    "set_rng_state_all": BENIGN,
    "empty_cache": BENIGN,
    "memory_allocated": BENIGN,  # 0
    "max_memory_allocated": BENIGN,
    "memory_reserved": BENIGN,
    "max_memory_reserved": BENIGN,
    "memory_cached": BENIGN,  # 0, with a rename warning
    "max_memory_cached": BENIGN,
    "memory_stats": BENIGN,  # {}
    "list_gpu_processes": BENIGN,  # a string saying pynvml is missing
    "set_stream": BENIGN,  # with None
    "stream": BENIGN,  # with None: a null context
    "make_graphed_callables": BENIGN,  # until the callables run
    # warns and runs disabled
    "amp.autocast": WARNS,  # deprecation, then "CUDA is not available ... Disabling autocast"
    "amp.GradScaler": WARNS,  # "GradScaler is enabled, but CUDA is not available. Disabling."
    "amp.custom_fwd": WARNS,  # deprecation warning; casts for the "cuda" autocast, which is off
    "amp.custom_bwd": WARNS,
    # raises
    "synchronize": RAISES,
    "set_device": RAISES,  # AttributeError: torch._C has no _cuda_setDevice (a negative index is ignored)
    "current_device": RAISES,
    "get_device_name": RAISES,
    "get_device_properties": RAISES,
    "get_device_capability": RAISES,
    "initial_seed": RAISES,
    "get_rng_state": RAISES,
    "reset_peak_memory_stats": RAISES,
    "reset_max_memory_allocated": RAISES,
    "reset_max_memory_cached": RAISES,
    "reset_accumulated_memory_stats": RAISES,
    "memory_summary": RAISES,  # KeyError on the empty stats
    "mem_get_info": RAISES,
    "set_per_process_memory_fraction": RAISES,
    "ipc_collect": RAISES,
    "init": RAISES,
    "Event": RAISES,
    "Stream": RAISES,
    "ExternalStream": RAISES,
    "current_stream": RAISES,
    "default_stream": RAISES,
    "device": RAISES,  # torch.cuda.device(0) on enter (a negative index is ignored)
    "device_of": RAISES,
    "CUDAGraph": RAISES,
    "graph": RAISES,
    "is_current_stream_capturing": RAISES,
    "nvtx.range_push": RAISES,
    "nvtx.range_pop": RAISES,
    "nvtx.range": RAISES,
    "nvtx.mark": RAISES,
    "utilization": RAISES,  # nvml
    "temperature": RAISES,
    "power_draw": RAISES,
    "clock_rate": RAISES,
    "memory_usage": RAISES,
    "device_memory_used": RAISES,
    "get_allocator_backend": RAISES,
    "caching_allocator_alloc": RAISES,
    "caching_allocator_delete": RAISES,
    "memory_snapshot": RAISES,
    "memory._record_memory_history": RAISES,
    "memory._dump_snapshot": RAISES,
    "set_sync_debug_mode": RAISES,
    "get_sync_debug_mode": RAISES,
    "can_device_access_peer": RAISES,
    "cudart": RAISES,
    **{name: RAISES for name in LEGACY_TENSOR_TYPES},  # TypeError: type torch.cuda.FloatTensor not available
}

#: What ``npu-port run``'s CUDA redirect answers (cuda_api.py's stand-ins, nvtx, the legacy tensor types).
REDIRECTED = frozenset(
    (
        "synchronize", "empty_cache", "ipc_collect", "init", "memory_allocated", "max_memory_allocated",
        "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "reset_max_memory_allocated",
        "reset_max_memory_cached", "reset_accumulated_memory_stats", "memory_stats", "memory_summary", "mem_get_info",
        "set_per_process_memory_fraction", "get_device_name", "get_device_properties", "get_device_capability",
        "device_count", "current_device", "set_device", "is_bf16_supported", "manual_seed", "manual_seed_all", "seed",
        "seed_all", "initial_seed", "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
        "Event", "Stream", "stream", "current_stream", "default_stream", "device",
        "nvtx.range_push", "nvtx.range_pop", "nvtx.range", "nvtx.mark",
        "amp.autocast", "amp.GradScaler",
        *LEGACY_TENSOR_TYPES,
    )
)  # fmt: skip

#: ``torch.cuda`` calls ``npu-port fix`` rewrites to an ``npu_port.device`` helper of the same behaviour on CUDA.
HELPERS = {
    "synchronize": "npu_port.device.synchronize",
    "empty_cache": "npu_port.device.empty_cache",
    "memory_allocated": "npu_port.device.memory_allocated",
    "max_memory_allocated": "npu_port.device.max_memory_allocated",
    "reset_peak_memory_stats": "npu_port.device.reset_peak_memory_stats",
    "mem_get_info": "npu_port.device.mem_get_info",
}


def cuda_api_name(qualified: Optional[str]) -> Optional[str]:
    """``"synchronize"`` for ``torch.cuda.synchronize``; None for anything not under ``torch.cuda``."""
    if qualified and qualified.startswith("torch.cuda."):
        return qualified[len("torch.cuda.") :]
    return None


def classify(name: str) -> Optional[str]:
    """What ``torch.cuda.<name>`` does without CUDA: :data:`BENIGN`, :data:`WARNS`, :data:`RAISES` or None
    (not in the table: not reported)."""
    return CUDA_API.get(name)


# ---- device literals ------------------------------------------------------------------------------------------------


def _cuda_text(text: str) -> bool:
    """``"cuda"`` or ``"cuda:N"`` (N digits or, for a template, anything)."""
    return text == "cuda" or text.startswith("cuda:")


def is_cuda_literal(node: Optional[ast.AST]) -> bool:
    """A string naming a CUDA device: ``"cuda"``, ``"cuda:0"``, ``f"cuda:{rank}"``, ``"cuda:" + str(rank)``,
    ``"cuda:{}".format(rank)``, ``"cuda:%d" % rank``, and either branch of ``"cuda" if ... else "cpu"``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _cuda_text(node.value)
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return isinstance(first, ast.Constant) and isinstance(first.value, str) and _cuda_text(first.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left = node.left
        return isinstance(left, ast.Constant) and isinstance(left.value, str) and left.value.startswith("cuda:")
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and isinstance(node.func.value, ast.Constant)
        and isinstance(node.func.value.value, str)
    ):
        return node.func.value.value.startswith("cuda:")
    if isinstance(node, ast.IfExp):
        return is_cuda_literal(node.body) or is_cuda_literal(node.orelse)
    return False


def keyword(call: ast.Call, name: str) -> Optional[ast.AST]:
    for item in call.keywords:
        if item.arg == name:
            return item.value
    return None


def argument(call: ast.Call, position: int, name: str) -> Optional[ast.AST]:
    """The argument at ``position`` (if no ``*args`` precedes it) or given as ``name=``."""
    if len(call.args) > position and not any(isinstance(a, ast.Starred) for a in call.args[: position + 1]):
        return call.args[position]
    return keyword(call, name)


# ---- call helpers ---------------------------------------------------------------------------------------------------


def cuda_calls(source: "PythonFile") -> Iterator[Tuple[ast.Call, str]]:
    """Every call of a ``torch.cuda`` function, however imported, with its name under ``torch.cuda``."""
    for call, qualified in source.calls():
        name = cuda_api_name(qualified)
        if name is not None:
            yield call, name


def call_text(name: str) -> str:
    return f"`torch.cuda.{name}()`"


AUTOCAST = frozenset(("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"))
GRAD_SCALER = frozenset(("torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.GradScaler"))
GENERATOR = frozenset(("torch.Generator", "torch._C.Generator"))


def at_import_time(source: "PythonFile", node: ast.AST) -> bool:
    """Whether ``node`` runs when the module is imported: at module or class level, in a comprehension there, or in
    a function's default arguments or decorators.

    :meth:`PythonFile.at_import_time` misses default arguments: it compares the defaults with the child it came
    from, which is the ``ast.arguments`` node, never a default. This one walks the same way and checks that node.
    """
    from ..context import _is_main_guard

    child, parent = node, source.parents.get(node)
    while parent is not None:
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_arguments = child is parent.args  # reached through a default (annotations are not evaluated here)
            in_decorators = not isinstance(parent, ast.Lambda) and child in parent.decorator_list
            if not (in_arguments or in_decorators):
                return False
        if isinstance(parent, ast.If) and _is_main_guard(parent.test):
            return False
        child, parent = parent, source.parents.get(parent)
    return True
