"""Running something without it counting as a draw: the random state of the CPU and of one device, put back after.

What npu-port runs on a user's tensors beside the call they asked for (auto timing candidates on the real inputs,
with their dropout) must leave their random numbers as it found them. Otherwise the first call of a shape, which
measures, draws different dropout masks from every later one; and under gradient checkpointing, which restores the
random state before it recomputes a forward, the recompute (which measures nothing) would drop other elements than the
forward did — gradients of another function, and no error to say so.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Tuple

import torch


def _device_state(device: torch.device) -> Optional[Tuple[Any, Any]]:
    """(the backend module, ``device``'s generator state), or None where there is no such generator to keep (cpu,
    which the caller keeps anyway; a backend without ``get_rng_state``; one that cannot answer now)."""
    if device.type in ("cpu", "meta"):
        return None
    backend = getattr(torch, device.type, None)  # torch.cuda, torch.npu (after torch_npu), torch.xpu, torch.mps
    get_state = getattr(backend, "get_rng_state", None)
    if get_state is None or not callable(getattr(backend, "set_rng_state", None)):
        return None
    try:
        return backend, get_state(device) if device.index is not None else get_state()
    except Exception:  # no driver, a generator in a graph capture: nothing that can be put back
        return None


@contextlib.contextmanager
def preserved_rng(device: torch.device) -> Iterator[None]:
    """Put the CPU's random state, and ``device``'s, back as they were when the block ends (however it ends)."""
    cpu_state = torch.get_rng_state()
    device_state = _device_state(device)
    try:
        yield
    finally:
        torch.set_rng_state(cpu_state)
        if device_state is not None:
            backend, state = device_state
            if device.index is not None:
                backend.set_rng_state(state, device)
            else:
                backend.set_rng_state(state)
