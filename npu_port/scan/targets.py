"""What ``npu-port fix`` writes in place of CUDA-only code: one table of replacement expressions per target.

``torch`` (the default): torch's own device-agnostic API, so the fixed project needs nothing but torch — it runs on
CUDA as before, on an NPU with torch_npu alone (torch_npu registers the NPU behind ``torch.accelerator`` and
``torch.get_device_module()``), and on a CPU. Every expression here exists from torch 2.6 (``torch.accelerator``'s
``is_available``, ``current_accelerator``, ``synchronize``; ``torch.get_device_module``; ``torch.amp.GradScaler``
with a device); the memory functions under ``torch.accelerator`` came in 2.9, so they are reached through
``torch.get_device_module()`` instead. ``current_accelerator()`` raises without an accelerator on torch 2.6 and
answers the compile-time accelerator on newer torch even where no device is visible, so the device type is asked
only when ``is_available()``: otherwise ``"cpu"``.

``npu-port``: the ``npu_port`` helpers (``npu_port.get_device().type``, ``npu_port.device.*``), the fixes made
before torch had that API; chosen with ``--target npu-port``, and for ``torch`` where the installed torch is older
than 2.6 (said before the diff). Rules look their replacement up here by name (:func:`expression`), so each rewrite
is written once for both targets.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

TARGETS = ("torch", "npu-port")
#: The oldest torch the ``torch`` target's expressions run on.
TORCH_TARGET_NEEDS = "2.6"

#: The current accelerator's device type (``"cuda"`` on CUDA, ``"npu"`` on Ascend), ``"cpu"`` without one.
_DEVICE_TYPE = (
    '(torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")).type'
)

#: name -> target -> expression text. ``{device}`` in a text stands for the device type's expression.
_TABLE: Dict[str, Dict[str, str]] = {
    "device_type": {"torch": _DEVICE_TYPE, "npu-port": "npu_port.get_device().type"},
    "grad_scaler": {"torch": "torch.amp.GradScaler", "npu-port": "npu_port.device.grad_scaler"},
    "autocast": {"torch": "torch.autocast", "npu-port": "npu_port.device.autocast"},
    "backend": {
        "torch": f"torch.distributed.Backend.default_device_backend_map[{_DEVICE_TYPE}]",
        "npu-port": "npu_port.distributed.default_backend()",
    },
    "synchronize": {"torch": "torch.accelerator.synchronize", "npu-port": "npu_port.device.synchronize"},
}
for _name in ("empty_cache", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats", "mem_get_info"):
    _TABLE[_name] = {"torch": f"torch.get_device_module().{_name}", "npu-port": f"npu_port.device.{_name}"}

#: What a guarded call gives on a CPU under the ``torch`` target (the original on CUDA: nothing to wait for, no
#: cache, no memory in use). ``mem_get_info`` has no honest CPU answer: it is left unguarded, raising as it did.
CPU_ANSWER = {
    "synchronize": "None",
    "empty_cache": "None",
    "reset_peak_memory_stats": "None",
    "memory_allocated": "0",
    "max_memory_allocated": "0",
}
#: The test that guards those calls under the ``torch`` target.
AVAILABLE = "torch.accelerator.is_available()"

#: The module each target's expressions need imported.
_IMPORT = {"torch": "torch", "npu-port": "npu_port"}


def expression(name: str, target: str) -> str:
    """The text that replaces ``name`` (a key of the table) under ``target``."""
    return _TABLE[name][target]


def imports(needed: Iterable[str], target: str) -> List[str]:
    """A rule's ``fix_imports`` (written for the ``npu-port`` target) as ``target`` needs them."""
    return [_IMPORT[target] if module == "npu_port" else module for module in needed]


def resolve(requested: str) -> Tuple[str, Optional[str]]:
    """The target to use for ``requested``, and a one-line note when it is not the one asked for: the ``torch``
    target needs torch >= 2.6 where ``fix`` runs (the project's environment); read from the package metadata."""
    if requested != "torch":
        return requested, None
    from importlib.metadata import PackageNotFoundError, version

    from .fix import _release

    try:
        installed = version("torch")
    except PackageNotFoundError:
        installed = None
    if installed is None or _release(installed) < _release(TORCH_TARGET_NEEDS):
        have = f"torch {installed}" if installed else "no torch"
        return "npu-port", (
            f"npu-port fix: {have} here, and torch's device-agnostic API needs {TORCH_TARGET_NEEDS}: "
            "the fixes use npu_port's helpers"
        )
    return "torch", None


def call_for(name: str, target: str, args: List[object]) -> List[object]:
    """``args`` (libcst arguments, less any device) as the call to ``name``'s replacement takes them: under the
    ``torch`` target torch's class or function for a device (``torch.amp.GradScaler``, ``torch.autocast``) takes the
    device type first; the ``npu-port`` helpers find the device themselves."""
    if target != "torch":
        return args
    import libcst as cst

    device = cst.Arg(cst.parse_expression(expression("device_type", target)))
    if args:
        device = device.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return [device, *args]
