"""``npu-port doctor``: diagnose this machine (Python, torch, torch_npu, CANN, devices, attention, diffusers, settings).

The doctor runs where things are broken, so it opts out of the CLI's ``import torch`` pre-check (``NEEDS_TORCH``):
a torch that cannot be imported is one of its findings, not a reason to stop. Whatever happens, it prints a report
or one line and exits 0 (fine), 1 (warnings) or 2 (errors) -- never a traceback.

``npu-port doctor --explain CODE`` explains CANN / ACL / aclnn / torch_npu error codes instead (exit 0, or 2 with
one line when nothing in CODE is a code it knows); CODE may be a whole pasted log line, and ``list`` lists them all.
It needs neither torch nor an NPU.
"""

from __future__ import annotations

import argparse
import json
import sys

from .vocabulary import add_command, add_format, add_verbosity, wants_json

#: Read by cli.main: run this command even when ``import torch`` fails.
NEEDS_TORCH = False
EXIT_INTERNAL_ERROR = 2
#: ``--explain`` with nothing it knows: the usage-error code the CLI uses everywhere.
EXIT_UNKNOWN_CODE = 2


def add_parser(commands: "argparse._SubParsersAction") -> None:
    parser = add_command(
        commands,
        "doctor",
        help="diagnose torch, torch_npu, CANN, devices, attention kernels and settings; say how to fix",
        example=[
            "npu-port doctor",
            "npu-port doctor --format json",
            "npu-port doctor --explain 507015",
            "npu-port doctor --explain list",
        ],
    )
    add_format(parser)
    add_verbosity(parser)
    parser.add_argument(
        "--explain",
        nargs="+",
        metavar="CODE",
        help="explain a CANN / ACL / torch_npu error code (507015, EZ1001, ERR99999, ...) or every code in a pasted "
        "log line; 'list' lists the codes it knows",
    )


def run(args: argparse.Namespace) -> int:
    if args.explain:
        return explain(" ".join(args.explain), as_json=wants_json(args))
    try:
        from ..doctor import run_doctor
        from ..doctor.report import as_json, render_text

        if hasattr(sys.stdout, "reconfigure"):  # quoted paths and errors must not fail on a narrow terminal encoding
            sys.stdout.reconfigure(errors="replace")
        result = run_doctor()
        print(json.dumps(as_json(result), indent=2, default=str) if wants_json(args) else render_text(result))
        return result.exit_code
    except BrokenPipeError:  # a reader that stopped early (| head): npu-port's entry point ends quietly
        raise
    except Exception as exc:  # noqa: BLE001 - the doctor must not end in a traceback
        detail = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        print(f"npu-port doctor: internal error ({detail}); please report this", file=sys.stderr)
        return EXIT_INTERNAL_ERROR


def explain(query: str, as_json: bool = False) -> int:
    """Print what the codes in ``query`` mean (exit 0), or one line saying none is known (exit 2)."""
    from ..doctor import error_codes

    if query.strip().lower() == error_codes.LIST_WORD:
        if as_json:
            print(json.dumps({"codes": [entry.as_dict() for entry in error_codes.ERROR_CODES]}, indent=2))
        else:
            print(error_codes.render_list())
        return 0
    entries = error_codes.find(query)
    if not entries:
        message = error_codes.unknown_message(query)
        if as_json:
            print(json.dumps({"query": query, "codes": [], "error": message}, indent=2))
        else:
            print(message, file=sys.stderr)
        return EXIT_UNKNOWN_CODE
    if as_json:
        print(json.dumps({"query": query, "codes": [entry.as_dict() for entry in entries]}, indent=2))
    else:
        print(error_codes.render(entries))
    return 0
