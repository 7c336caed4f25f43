"""Ascend extensions that change what happens at import time: MindIE-SD and flash-attn-npu.

Both are probed with ``importlib.util.find_spec`` (which reads the package's location and runs none of its code)
and their versions come from metadata: importing either has side effects the doctor must not cause off an NPU.

- MindIE-SD (``mindiesd/__init__.py``) runs ``env.set_environment_variables()`` on import, which prepends
  ``mindiesd/ops/vendors/{customize_transformer,aie_ascendc,customize}`` to ``ASCEND_CUSTOM_OPP_PATH``. CANN reads
  that path once, at the first custom-op lookup in the process; a later import is too late and MindIE-SD's
  operators fail with ``EZ1001 ... does not support opType`` for the rest of the process (vllm-project/vllm-omni
  PR #6054 imports mindiesd eagerly for exactly this reason; flashserve/flash-linear-attention-npu PR #431 reports
  the same registry behaviour for another custom-op package).
- flash-attn-npu's ``__init__`` imports torch_npu and calls ``torch_npu.npu.get_device_name()`` (initialising the
  device), then raises ``RuntimeError("Unsupported Ascend device: ...")`` unless the name contains ``Ascend910``
  (``flash_attn_npu``; ``flash_attn_npu_3`` also accepts ``Ascend950``). Its ops are wrapped with
  ``torch.library.custom_op`` only ``if torch.__version__ >= "2.4.0"``, a string comparison that is False for
  torch 2.10 and later, so there they are plain functions torch.compile cannot trace
  (``flash_attn_npu/flash_attn_npu_interface.py``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import List, Optional

from .._optional import installed_version, probe
from .facts import Facts
from .finding import Finding
from .probes import release_tuple

MINDIESD_PR = "vllm-project/vllm-omni#6054"
#: The operator directories ``import mindiesd`` puts on ASCEND_CUSTOM_OPP_PATH, in its order (``mindiesd/env.py``).
MINDIESD_VENDORS = ("customize_transformer", "aie_ascendc", "customize")
FLASH_ATTN_NPU_MODULES = ("flash_attn_npu", "flash_attn_npu_3", "flash_attn_npu_4")
#: flash-attn-npu's own test for registering torch custom ops: ``torch.__version__ >= "2.4.0"``, as strings.
FLASH_ATTN_NPU_CUSTOM_OP_TEST = "2.4.0"


def locate(module: str) -> Optional[str]:
    """The directory of an installed top-level package, found without running any of its code; None if absent."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return str(list(spec.submodule_search_locations)[0])
    return os.path.dirname(spec.origin) if spec.origin else None


def mindiesd_vendor_dirs(package_dir: str) -> List[str]:
    return [os.path.join(package_dir, "ops", "vendors", vendor) for vendor in MINDIESD_VENDORS]


def check_mindiesd(facts: Facts) -> List[Finding]:
    package_dir = locate("mindiesd")
    if package_dir is None:
        return [
            Finding(
                "mindiesd",
                "MindIE-SD",
                "info",
                "MindIE-SD is not installed (optional: fused adaLN / attention operators for diffusion models)",
                None,
            )
        ]
    version = installed_version("mindiesd") or "(version unknown)"
    vendors = mindiesd_vendor_dirs(package_dir)
    configured = facts.environ.get("ASCEND_CUSTOM_OPP_PATH", "").split(os.pathsep)
    details = {"version": version, "package_dir": package_dir, "vendor_dirs": vendors}
    fix = (
        "put `import mindiesd` right after `import torch_npu`, before any tensor goes to the NPU; or, before starting "
        f"Python, export ASCEND_CUSTOM_OPP_PATH={os.pathsep.join(vendors)}{os.pathsep}$ASCEND_CUSTOM_OPP_PATH"
    )
    if all(vendor in configured for vendor in vendors):
        return [
            Finding(
                "mindiesd",
                "MindIE-SD",
                "ok",
                f"MindIE-SD {version}: its operator directories are already on ASCEND_CUSTOM_OPP_PATH, so import "
                "order does not matter",
                None,
                details,
            )
        ]
    order = list(sys.modules)
    if "mindiesd" in sys.modules:
        late = "torch_npu" in sys.modules and order.index("torch_npu") < order.index("mindiesd")
        if late and _npu_initialized():
            return [
                Finding(
                    "mindiesd",
                    "MindIE-SD",
                    "warn",
                    f"mindiesd {version} was imported in this process after torch_npu had initialised the NPU: if "
                    'any NPU operator ran before `import mindiesd`, its operators fail with EZ1001 "... does not '
                    f'support opType" for the rest of the process ({MINDIESD_PR})',
                    fix,
                    {**details, "imported": "after torch_npu initialised the NPU"},
                )
            ]
        return [
            Finding(
                "mindiesd",
                "MindIE-SD",
                "ok",
                f"mindiesd {version} was imported in this process before torch_npu initialised the NPU, as it must be",
                None,
                {**details, "imported": "before the NPU was initialised"},
            )
        ]
    return [
        Finding(
            "mindiesd",
            "MindIE-SD",
            "info",
            f"MindIE-SD {version} is installed: `import mindiesd` must run before the first NPU operator (it adds its "
            "operator directories to ASCEND_CUSTOM_OPP_PATH, which CANN reads once, at the first operator lookup); "
            f'imported later, its operators fail with EZ1001 "... does not support opType" for the whole process '
            f"({MINDIESD_PR})",
            fix,
            details,
        )
    ]


def _npu_initialized() -> bool:
    """Whether torch_npu has initialised a device in this process (unknown counts as yes: the warning is a maybe)."""
    torch = sys.modules.get("torch")
    npu = getattr(torch, "npu", None)
    try:
        return bool(npu.is_initialized()) if npu is not None else True
    except Exception:  # noqa: BLE001 - a driver that cannot answer: assume the worst, the finding says "if"
        return True


def check_flash_attn_npu(facts: Facts) -> List[Finding]:
    present = [module for module in FLASH_ATTN_NPU_MODULES if locate(module) is not None]
    if not present:
        return [
            Finding(
                "flash-attn-npu",
                "flash-attn-npu",
                "info",
                "flash-attn-npu is not installed (optional: flash-attn's API on Ascend 910B / 910C / 950)",
                None,
            )
        ]
    version = installed_version("flash-attn-npu", "flash_attn_npu") or "(version unknown)"
    return [_flash_attn_npu_import(facts, version, present), _flash_attn_npu_compile(facts, version)]


def _flash_attn_npu_import(facts: Facts, version: str, present: List[str]) -> Finding:
    details = {"version": version, "modules": present}
    side_effects = (
        "its import initialises the NPU (torch_npu.npu.get_device_name()) and raises RuntimeError('Unsupported "
        "Ascend device: ...') unless the device is an Ascend910* (flash_attn_npu_3 also accepts Ascend950)"
    )
    if not facts.npu_usable:
        return Finding(
            "flash-attn-npu",
            "flash-attn-npu",
            "info",
            f"flash-attn-npu {version} is installed ({', '.join(present)}); not imported here (no NPU): {side_effects}",
            None,
            details,
        )
    from ..device.chips import current_chip

    chip = current_chip()
    details["chip"] = chip.name if chip else None
    if chip is None:
        return Finding(
            "flash-attn-npu",
            "flash-attn-npu",
            "info",
            f"flash-attn-npu {version} is installed; NPU 0 is not a chip npu-port knows, so it was not imported: "
            f"{side_effects}",
            None,
            details,
        )
    if "flash_attn_npu" in present and not chip.flash_attn_npu_v2:
        elsewhere = " (on 950 its flash_attn_npu_3 / flash_attn_npu_4 APIs apply)" if chip.name == "950" else ""
        return Finding(
            "flash-attn-npu",
            "flash-attn-npu",
            "warn",
            f"flash-attn-npu {version}'s flash-attn 2 API (flash_attn_npu) does not support this {chip.name}: it "
            f"supports Ascend 910B / 910C, and {side_effects}{elsewhere}",
            "do not import flash_attn_npu on this chip; npu-port's flash_attn drop-in keeps its own emulation here",
            details,
            code="chip",
        )
    module = "flash_attn_npu" if "flash_attn_npu" in present else present[0]
    status = probe(module)
    if status.ok:
        return Finding(
            "flash-attn-npu",
            "flash-attn-npu",
            "ok",
            f"flash-attn-npu {version}: {module} imports on this {chip.name}",
            None,
            details,
        )
    return Finding(
        "flash-attn-npu",
        "flash-attn-npu",
        "warn",
        f"flash-attn-npu {version}: {status.reason}",
        "reinstall flash-attn-npu for this torch / torch_npu / CANN (pip install flash-attn-npu --no-build-isolation)",
        {**details, "reason": status.reason.as_dict()},
        code=status.reason.code,
    )


def _flash_attn_npu_compile(facts: Facts, version: str) -> Finding:
    torch_version = facts.torch_version or ""
    registers = torch_version >= FLASH_ATTN_NPU_CUSTOM_OP_TEST  # its own (string) comparison, on purpose
    details = {"torch": torch_version or None, "custom_ops_registered": registers}
    title = "flash-attn-npu and torch.compile"
    if registers:
        return Finding(
            "flash-attn-npu-compile",
            title,
            "ok",
            f"with torch {torch_version}, flash-attn-npu registers its ops as torch custom ops (torch.compile can "
            "trace them)",
            None,
            details,
        )
    if torch_version and release_tuple(torch_version) >= release_tuple(FLASH_ATTN_NPU_CUSTOM_OP_TEST):
        why = (
            f'it tests torch.__version__ >= "{FLASH_ATTN_NPU_CUSTOM_OP_TEST}" as strings, which is False for '
            f'"{torch_version}"'
        )
    else:
        why = f"it registers them from torch {FLASH_ATTN_NPU_CUSTOM_OP_TEST} on"
    return Finding(
        "flash-attn-npu-compile",
        title,
        "info",
        f"with torch {torch_version or '(not installed)'}, flash-attn-npu's ops are not registered as torch custom ops "
        f"({why}): torch.compile cannot trace them, expect a graph break at each call",
        "nothing to do in eager mode; under torch.compile keep those calls outside the compiled region",
        details,
    )
