"""The device a call is judged for, when that is not the device it was recorded on.

A kernel's ``reasons(call)`` normally judge the call where it is: its tensors' device, the packages and devices of
this machine. A plan (``npu-port plan --device npu --chip 910B``) records calls on a CPU and asks what would run on
an NPU, so the same reasons must be computed for another device: :class:`Target` names it. With a target, a kernel
skips what only the real machine can tell (is the package installed, is a device visible) and judges the device
type and chip the target names; everything else (dtypes, head dims, masks, limits) is the same check, so a plan and
a real run can never disagree about a limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..device.chips import Chip, resolve_chip
from ..errors import DeviceError

__all__ = ["PLAN_DEVICE_TYPES", "Target"]

#: Device types a plan can be made for.
PLAN_DEVICE_TYPES = ("npu", "cuda", "cpu")


@dataclass(frozen=True)
class Target:
    """A device type (and, for ``npu``, a chip) that kernels judge a call for."""

    device_type: str
    chip: Optional[Chip] = None

    @classmethod
    def of(cls, device_type: str, chip: Optional[str] = None) -> "Target":
        """``Target.of("npu", "910B")``; an NPU target without a chip gets the default chip, a chip on another
        device type is an error (it would be silently meaningless)."""
        from ..device.chips import DEFAULT_CHIP

        if device_type not in PLAN_DEVICE_TYPES:
            raise DeviceError(f"unknown plan device {device_type!r}; valid devices: {', '.join(PLAN_DEVICE_TYPES)}")
        if device_type != "npu":
            if chip is not None:
                raise DeviceError(f"--chip names an Ascend chip; it applies to --device npu, not {device_type!r}")
            return cls(device_type)
        return cls(device_type, resolve_chip(chip if chip is not None else DEFAULT_CHIP))

    def describe(self) -> str:
        return f"{self.device_type} ({self.chip.name})" if self.chip is not None else self.device_type
