"""``npu-port run [--device D] [--strategy S | --profile P] [--report FILE] script.py [args...]``: run a CUDA
project's script here, unchanged.

The script runs as ``__main__`` (as ``python script.py`` would run it: its directory first on ``sys.path``,
``sys.argv`` = the script and its arguments) after :func:`npu_port.activate` has installed the redirect, the
drop-ins, the fallbacks, the strategy and the legacy-attention routing. A summary of what was patched and how often
it was hit goes to stderr at exit, or to ``--report`` as JSON. The exit code is the script's.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from typing import Any, Optional


def add_parser(commands: "argparse._SubParsersAction") -> None:
    parser = commands.add_parser(
        "run",
        help="run a CUDA-written script here unchanged (redirect, drop-ins, fallbacks, strategy)",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--device", default=None, help="npu, cuda, xpu, mps or cpu (default: the best usable)")
    parser.add_argument("--strategy", default=None, help="attention strategy (default auto)")
    parser.add_argument("--profile", default=None, help="a profile (name or YAML): its strategy and Ascend options")
    parser.add_argument("--report", default=None, help="write the summary as JSON here instead of printing it")
    parser.add_argument(
        "--force-dropins",
        action="store_true",
        help="use npu-port's flash_attn / xformers even if the real packages are installed",
    )
    parser.add_argument(
        "--cuda-available",
        action="store_true",
        help="make torch.cuda.is_available() return True (for scripts that refuse to run otherwise)",
    )
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the script's own arguments")


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _write_report(path: str, summary: Any) -> None:
    from ..atomic import write_json

    write_json(path, summary)


def run(args: argparse.Namespace, script_globals: Optional[dict] = None) -> int:
    from ..errors import NpuPortError
    from ..runtime import activate

    script = os.path.abspath(args.script)
    if not os.path.isfile(script):
        raise NpuPortError(f"no such script: {args.script!r}")
    directory = os.path.dirname(script)
    activation = activate(
        args.device,
        args.strategy,
        args.profile,
        watch=[directory],
        force_dropins=args.force_dropins,
        cuda_available=args.cuda_available,
    )
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    sys.argv = [script, *args.arguments]
    sys.path.insert(0, directory)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    finally:
        summary = activation.summary()
        text = activation.format_summary()
        sys.argv, sys.path[:] = saved_argv, saved_path
        activation.deactivate()
        if args.report:
            _write_report(args.report, {**summary, "script": script, "exit_code": code})
        else:
            print(text, file=sys.stderr)
    return code
