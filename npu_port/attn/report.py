"""The registered kernels and what each can do on this machine, as plain data: what ``npu-port kernels --json``
prints and the doctor's attention check reads (one definition for both, in the layer that owns the kernels)."""

from __future__ import annotations

from typing import Any, Dict, List


def kernels_report() -> Dict[str, Any]:
    """What ``npu-port kernels --json`` prints: versions and one entry per registered kernel."""
    import torch

    from .._version import __version__
    from .kernels.base import dtype_names
    from .registry import kernels

    entries: List[Dict[str, Any]] = []
    for kernel in kernels():
        reasons = kernel.availability()
        entries.append(
            {
                "name": kernel.name,
                "available": not reasons,
                "summary": kernel.summary,
                "reasons": [reason.as_dict() for reason in reasons],
                "devices": list(kernel.device_types) if kernel.device_types else ["any"],
                "dtypes": dtype_names(kernel.dtypes).split(", "),
                "max_head_dim": kernel.max_head_dim,
                "supports": {
                    "dropout": kernel.supports_dropout,
                    "grad": kernel.supports_grad,
                    "float_mask": kernel.supports_float_mask,
                },
                "options": {
                    name: {"default": option.default, "doc": option.doc} for name, option in kernel.OPTIONS.items()
                },
            }
        )
    return {"npu_port_version": __version__, "torch_version": torch.__version__, "kernels": entries}
