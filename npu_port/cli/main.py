"""``npu-port``: argument parsing and dispatch only; each subcommand lives in its own module.

Bad input is one line on stderr and exit code 2, from one of two places: argparse (a malformed option: ``npu-port
bench: error: ...``, without the usage block, which would hide the line that matters) or an error npu-port raises
on purpose (``npu-port: ...``). A broken ``import torch`` — the classic torch_npu-without-CANN failure — is
diagnosed instead of dumping a traceback (exit code 3). A reader that closes stdout early (``npu-port kernels |
head -1``) ends the command quietly with 141, as a process stopped by SIGPIPE ends in a shell.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from typing import List, Optional

from .._version import __version__

EXIT_OK = 0
EXIT_USAGE_OR_NPU_PORT_ERROR = 2
EXIT_BROKEN_TORCH = 3
#: stdout closed by its reader: 128 + SIGPIPE, what a shell reports for ``yes | head -1``'s ``yes``.
EXIT_BROKEN_PIPE = 141


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
    "diff": "diff_cmd",
    "scan": "scan_cmd",
    "fix": "fix_cmd",
}


def _command_module(command: str):
    return importlib.import_module(f"{__package__}.{COMMANDS[command]}")


class Parser(argparse.ArgumentParser):
    """argparse with two changes, inherited by every subcommand's parser (``add_subparsers`` makes them of this
    class):

    - an error is one line (``npu-port bench: error: argument --repeats: must be ...``) and exit code 2;
    - a value that starts with a minus sign and a digit is a value, not an option (``--memory-budget -1GiB``,
      ``--seed -1e3``), so that its own check explains it; plain argparse takes only ``-1`` and ``-1.5`` that way
      and says ``expected one argument`` for the rest. No npu-port option looks like a number.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE_OR_NPU_PORT_ERROR, f"{self.prog}: error: {' '.join(message.splitlines())}\n")


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # here, not at exit: a closed pipe (also under --help) is then caught below
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE


def _quiet_stdout() -> None:
    """Point stdout at the null device, so that Python's own flush at exit does not fail again (the recipe in
    Python's ``signal`` documentation); where stdout has no file descriptor (captured in tests) there is nothing
    left to flush."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, descriptor)
    os.close(null)


def subparsers(parser: argparse.ArgumentParser) -> dict:
    """Command name -> its parser (what ``add_subparsers`` made)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _main(argv: Optional[List[str]]) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:  # a usage error: the help goes to stderr, as argparse's errors do
        parser.print_help(sys.stderr)
        return EXIT_USAGE_OR_NPU_PORT_ERROR
    command = _command_module(args.command)
    if getattr(command, "NEEDS_ARGUMENTS", False) and argv[-1:] == [args.command]:  # nothing after the command
        subparsers(parser)[args.command].print_help(sys.stderr)
        return EXIT_USAGE_OR_NPU_PORT_ERROR
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
