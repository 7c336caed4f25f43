"""``npu-port doctor``: diagnose this machine (Python, torch, torch_npu, CANN, devices, attention, diffusers, settings).

The doctor runs where things are broken, so it opts out of the CLI's ``import torch`` pre-check (``NEEDS_TORCH``):
a torch that cannot be imported is one of its findings, not a reason to stop. Whatever happens, it prints a report
or one line and exits 0 (fine), 1 (warnings) or 2 (errors) -- never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

#: Read by cli.main: run this command even when ``import torch`` fails.
NEEDS_TORCH = False
EXIT_INTERNAL_ERROR = 2


def add_parser(commands: "argparse._SubParsersAction") -> None:
    parser = commands.add_parser(
        "doctor", help="diagnose torch, torch_npu, CANN, devices, attention kernels and settings; say how to fix"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    try:
        from ..doctor import run_doctor
        from ..doctor.report import as_json, render_text

        if hasattr(sys.stdout, "reconfigure"):  # quoted paths and errors must not fail on a narrow terminal encoding
            sys.stdout.reconfigure(errors="replace")
        result = run_doctor()
        print(json.dumps(as_json(result), indent=2, default=str) if args.json else render_text(result))
        return result.exit_code
    except Exception as exc:  # noqa: BLE001 - the doctor must not end in a traceback
        detail = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        print(f"npu-port doctor: internal error ({detail}); please report this", file=sys.stderr)
        return EXIT_INTERNAL_ERROR
