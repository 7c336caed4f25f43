"""``npu-port kernels``: every attention kernel, whether it can run on this machine, and if not, why (one line)."""

from __future__ import annotations

import argparse
import json
from typing import Any, Dict

from .vocabulary import add_command, add_format, add_verbosity, wants_json


def add_parser(commands: "argparse._SubParsersAction") -> None:
    parser = add_command(
        commands,
        "kernels",
        help="list attention kernels and why any cannot run on this machine",
        example=["npu-port kernels", "npu-port kernels --verbose", "npu-port kernels --format json"],
    )
    add_format(parser)
    add_verbosity(parser, "devices, dtypes, limits and options too")


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
    from ..attn.report import kernels_report  # imports torch: after the CLI checked that torch imports

    report = kernels_report()
    print(json.dumps(report, indent=2, default=str) if wants_json(args) else render_text(report, args.verbose))
    return 0
