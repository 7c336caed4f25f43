"""Every backend the device layer knows, what it sees, and which device npu-port will run on.

This reuses :mod:`npu_port.device.detect` rather than asking ``torch.cuda.is_available()``, so the doctor reports
what npu-port itself will do (including the reason a backend is unusable and an invalid ``$NPU_PORT_DEVICE``).
"""

from __future__ import annotations

from typing import List

from .facts import Facts, needs_torch
from .finding import Finding

#: Devices listed by name in a summary line; the rest are in ``details``.
_SHOWN_DEVICES = 4


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


@needs_torch
def check_devices(facts: Facts) -> List[Finding]:
    from ..device.detect import backends

    findings = [_backend_finding(status) for status in backends()]
    findings.append(_selected_device(facts))
    return findings


def _describe(device) -> dict:
    from ..device.helpers import mem_get_info
    from ..device.sync import device_name

    entry = {"device": str(device), "name": device_name(device)}
    try:
        free, total = mem_get_info(device)
    except Exception as exc:  # noqa: BLE001 - a device that cannot report memory is still listed
        entry["memory_error"] = f"{type(exc).__name__}: {exc}"
    else:
        entry.update(free_bytes=free, total_bytes=total)
    return entry


def _entry_text(entry: dict) -> str:
    memory = (
        f"{_gib(entry['free_bytes'])} free of {_gib(entry['total_bytes'])}"
        if "total_bytes" in entry
        else "memory unknown"
    )
    return f"{entry['name']}, {memory}"


def _backend_finding(status) -> Finding:
    import torch

    kind = status.type
    details = {"available": status.available, "count": status.count}
    if not status.available:
        details["reason"] = status.reason.as_dict() if status.reason is not None else None
        summary = f"{kind}: not usable: {status.reason}"
        code = status.reason.code if status.reason is not None else None
        return Finding(f"device-{kind}", f"{kind} devices", "info", summary, None, details, code=code)
    devices = [torch.device("cpu")] if kind == "cpu" else [torch.device(kind, i) for i in range(status.count)]
    entries = [_describe(device) for device in devices]
    details["devices"] = entries
    if kind == "cpu":
        return Finding("device-cpu", "cpu", "info", f"{_entry_text(entries[0])} (host RAM)", None, details)
    shown = "; ".join(f"{e['device']}: {_entry_text(e)}" for e in entries[:_SHOWN_DEVICES])
    more = f"; and {len(entries) - _SHOWN_DEVICES} more" if len(entries) > _SHOWN_DEVICES else ""
    return Finding(
        f"device-{kind}", f"{kind} devices", "ok", f"{status.count} {kind} device(s): {shown}{more}", None, details
    )


def _selected_device(facts: Facts) -> Finding:
    from ..device.detect import ENV_VARIABLE, available_device_types, get_device
    from ..errors import DeviceError

    requested = facts.environ.get(ENV_VARIABLE, "").strip()
    origin = f"${ENV_VARIABLE}={requested}" if requested else "detected"
    details = {ENV_VARIABLE: requested or None}
    try:
        device = get_device()
    except DeviceError as exc:
        usable = ", ".join(available_device_types())
        return Finding(
            "device-selected",
            "npu-port's device",
            "error",
            str(exc).splitlines()[0],
            f"unset {ENV_VARIABLE} or set it to auto or one of: {usable}",
            details,
        )
    details["device"] = str(device)
    if device.type == "cpu":
        return Finding(
            "device-selected",
            "npu-port's device",
            "info",
            f"npu-port runs on cpu ({origin if requested else 'no accelerator is usable here'})",
            None,
            details,
        )
    return Finding("device-selected", "npu-port's device", "ok", f"npu-port runs on {device} ({origin})", None, details)
