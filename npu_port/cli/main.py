"""``npu-port``: argument parsing and dispatch only; each subcommand lives in its own module.

Errors npu-port raises on purpose print as one message (exit code 2); a broken ``import torch`` — the classic
torch_npu-without-CANN failure — is diagnosed instead of dumping a traceback (exit code 3).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from .._version import __version__

EXIT_OK = 0
EXIT_USAGE_OR_NPU_PORT_ERROR = 2
EXIT_BROKEN_TORCH = 3


#: Subcommand -> module in npu_port.cli with ``add_parser(commands)`` and ``run(args) -> int``. Modules import
#: torch (and anything heavy) only inside ``run``, so ``--help`` and broken-torch diagnosis always work. A module
#: with ``NEEDS_TORCH = False`` (the doctor) runs even when ``import torch`` fails, and diagnoses that itself.
COMMANDS = {
    "kernels": "kernels_cmd",
    "strategies": "strategies_cmd",
    "bench": "bench_cmd",
    "doctor": "doctor_cmd",
    "infer": "infer_cmd",
    "run": "run_cmd",
    "plan": "plan_cmd",
    "scan": "scan_cmd",
    "fix": "fix_cmd",
}


def _command_module(command: str):
    return importlib.import_module(f"{__package__}.{COMMANDS[command]}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu-port",
        description="Move CUDA-era PyTorch / diffusers code onto Ascend NPUs, new GPUs and CPUs.",
    )
    parser.add_argument("--version", action="version", version=f"npu-port {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        _command_module(command).add_parser(commands)
    return parser


def _torch_import_problem() -> Optional[str]:
    try:
        import torch  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure here is what we diagnose
        detail = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        hint = ""
        if "torch_npu" in detail or "libhccl" in detail or "backend extension" in detail:
            hint = (
                "\nThis is torch_npu failing to load while torch imports (usually CANN's environment is missing): "
                "source /usr/local/Ascend/ascend-toolkit/set_env.sh, or set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to "
                "import torch without it."
            )
        return f"npu-port: cannot import torch ({detail}){hint}"
    return None


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return EXIT_OK
    command = _command_module(args.command)
    problem = _torch_import_problem() if getattr(command, "NEEDS_TORCH", True) else None
    if problem:
        print(problem, file=sys.stderr)
        return EXIT_BROKEN_TORCH
    from ..errors import NpuPortError

    try:
        return command.run(args)
    except NpuPortError as exc:
        print(f"npu-port: {exc}", file=sys.stderr)
        return EXIT_USAGE_OR_NPU_PORT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
