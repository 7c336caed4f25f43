"""What the fused ops run on: torch_npu and MindIE-SD (``mindiesd``), and which tensors they take.

torch_npu is probed the project's way (:func:`npu_port._optional.probe`: installed-but-broken counts as absent, with
the reason). ``mindiesd`` has one more rule: it registers its custom ops (``torch.ops.mindiesd.adaln``) with CANN,
and CANN only sees ops registered before it reads its custom-op registry; a later registration fails on use with
``EZ1001 ... does not support opType`` for the rest of the process (vllm-omni PR #6054). We cannot tell when CANN
reads that registry, so any ``torch_npu`` import before ``mindiesd`` counts as too late: ``fuse_ops`` imports
``mindiesd`` before anything else it does (before it probes torch_npu, which imports it), and refuses ``adaln`` with
reason ``import-order`` when torch_npu came first — it does not import mindiesd then, since that import is what
would go wrong.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Optional, Tuple

import torch

from .._optional import probe
from ..reasons import Reason

#: Device types whose tensors the fused ops take. Tests add "cpu": the torch_npu emulator computes on CPU tensors.
DEVICE_TYPES: Tuple[str, ...] = ("npu",)

#: The dtypes all three torch_npu ops document ("float16, bfloat16, float32").
OP_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: Why adaln is refused when torch_npu was imported before mindiesd.
IMPORT_ORDER = (
    "mindiesd was not imported before torch_npu: MindIE-SD registers its custom ops (torch.ops.mindiesd.adaln) with "
    "CANN, and ops registered after CANN reads its custom-op registry fail with EZ1001 '... does not support opType' "
    "for the rest of the process (vllm-omni PR #6054); put `import mindiesd` first in your script, before torch_npu "
    "and diffusers, then call fuse_ops"
)


def torch_npu_module() -> Tuple[Optional[ModuleType], Optional[Reason]]:
    """``(torch_npu, None)``, or ``(None, reason)`` when it is missing or cannot be imported."""
    status = probe("torch_npu")
    return status.module, status.reason


def import_mindiesd_first() -> Tuple[Optional[ModuleType], Optional[Reason]]:
    """``(mindiesd, None)``: imported now if torch_npu is not imported yet; else ``(None, reason)`` — not installed,
    broken, or (code ``import-order``) torch_npu came first. Called before ``fuse_ops`` touches torch_npu."""
    module = sys.modules.get("mindiesd")
    if module is not None:
        return module, None
    try:
        spec = importlib.util.find_spec("mindiesd")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None, Reason(
            "package-missing",
            "mindiesd (MindIE-SD) is not installed; adaln needs it: install MindIE-SD on an Ascend machine with CANN "
            "(pip install mindiesd), matching your CANN and torch_npu",
        )
    if "torch_npu" in sys.modules:
        return None, Reason("import-order", IMPORT_ORDER)
    try:
        return importlib.import_module("mindiesd"), None
    except Exception as exc:  # a broken native package is "absent", never a crash
        detail = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        return None, Reason(
            "package-broken",
            f"mindiesd is installed but cannot be imported ({detail}); source CANN's environment first and check "
            "that MindIE-SD matches your CANN and torch_npu",
        )


def device_reason(tensor: torch.Tensor) -> Optional[str]:
    """None when ``tensor`` is on a device the fused ops take, else why not (the original runs)."""
    if tensor.device.type in DEVICE_TYPES:
        return None
    return f"tensor on {tensor.device.type}: the fused op takes {'/'.join(DEVICE_TYPES)} tensors"


def dtype_reason(tensor: torch.Tensor, what: str = "input") -> Optional[str]:
    """None for float16 / bfloat16 / float32, else why not."""
    if tensor.dtype in OP_DTYPES:
        return None
    return f"{what} dtype {str(tensor.dtype).replace('torch.', '')}: the op takes float16, bfloat16 or float32"
