"""``npu-port kernels``: every attention kernel, whether it can run on this machine, and if not, why (one line)."""

from __future__ import annotations

import argparse
import json
from typing import Any, Dict, List


def add_parser(commands: "argparse._SubParsersAction") -> None:
    parser = commands.add_parser("kernels", help="list attention kernels and why any cannot run on this machine")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("-v", "--verbose", action="store_true", help="devices, dtypes, limits and options too")


def kernels_report() -> Dict[str, Any]:
    """What ``npu-port kernels --json`` prints: versions and one entry per registered kernel."""
    import torch

    import npu_port
    from npu_port.attn.kernels.base import dtype_names

    entries: List[Dict[str, Any]] = []
    for kernel in npu_port.kernels():
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
    return {"npu_port_version": npu_port.__version__, "torch_version": torch.__version__, "kernels": entries}


def render_text(report: Dict[str, Any], verbose: bool = False) -> str:
    """One line per kernel: name, status, and the summary (available) or the reason (unavailable)."""
    lines = [
        f"npu-port {report['npu_port_version']} attention kernels on this machine (torch {report['torch_version']}):"
    ]
    width = max(len(k["name"]) for k in report["kernels"])
    for entry in report["kernels"]:
        status = "available" if entry["available"] else "unavailable"
        detail = entry["summary"] if entry["available"] else "; ".join(r["message"] for r in entry["reasons"])
        lines.append(f"  {entry['name']:<{width}}  {status:<11}  {detail}")
        if verbose:
            head_dim = entry["max_head_dim"] or "any"
            supports = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in entry["supports"].items())
            lines.append(
                f"  {'':<{width}}  {'':<11}  devices: {', '.join(entry['devices'])}; "
                f"dtypes: {', '.join(entry['dtypes'])}; max head_dim: {head_dim}; {supports}"
            )
            for name, option in entry["options"].items():
                lines.append(f"  {'':<{width}}  {'':<11}  option {name}={option['default']!r}: {option['doc']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    report = kernels_report()
    print(json.dumps(report, indent=2, default=str) if args.json else render_text(report, args.verbose))
    return 0
