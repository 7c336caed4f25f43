"""Free memory on a device, asked the cheapest honest way each backend offers.

The chunked attention kernel sizes its blocks from this. Every branch is guarded: a backend that cannot answer
returns None and the caller falls back to a fixed budget, rather than failing an attention call over a statistic.
"""

from __future__ import annotations

import os
from typing import Optional, Union

import torch


def _host_available_bytes() -> Optional[int]:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def host_memory_bytes() -> "tuple[int, int]":
    """``(available, total)`` bytes of host RAM (0 for a number the system will not give)."""
    total = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        try:
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            total = 0
    return _host_available_bytes() or 0, total


def free_memory_bytes(device: Union[torch.device, str, None] = None) -> Optional[int]:
    """Bytes free on ``device`` (host RAM for cpu), or None when the backend cannot say."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cpu":
        return _host_available_bytes()
    module = getattr(torch, device.type, None)  # torch.cuda, torch.npu (once torch_npu is imported), torch.xpu
    mem_get_info = getattr(module, "mem_get_info", None)
    if mem_get_info is not None:
        try:
            free, _total = mem_get_info(device)
            return int(free)
        except Exception:  # a backend without a driver, a device index out of range: no statistic, no crash
            return None
    if device.type == "mps":
        try:
            return int(torch.mps.recommended_max_memory() - torch.mps.current_allocated_memory())
        except Exception:
            return None
    return None
