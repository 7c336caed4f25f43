"""``npu-port fix PATH...``: the scan's safe fixes as a unified diff (a dry run), or applied with ``--write``.

Exit codes as ruff's: a dry run (the diff) and ``--check`` (the names of the files that would change, nothing else)
exit 1 when something is left to fix, 0 when nothing is; ``--write`` exits 0 once every change is written.
``--format json`` prints the planned (or, with ``--write``, made) edits as one JSON document instead of the diff."""

from __future__ import annotations

import argparse
import json
import sys

from .scan_cmd import add_rule_selection, codes
from .vocabulary import add_command, add_format, add_verbosity, wants_json

#: npu_port.scan.targets.TARGETS, written out: building the parser must not import the scan package (a test checks).
TARGETS = ("torch", "npu-port")

NEEDS_TORCH = False  # rewriting code needs no torch


def add_parser(commands) -> None:
    parser = add_command(
        commands,
        "fix",
        help="apply the scan's safe fixes (a unified diff by default; --write to change the files)",
        example=[
            "npu-port fix project/",
            "npu-port fix --check project/",
            "npu-port fix --write project/main.py",
            "npu-port fix --format json --select NPU1 project/",
        ],
        description="Rewrite what npu-port scan finds and knows how to fix, keeping comments and formatting. By "
        "default nothing is written: the unified diff goes to stdout. --write replaces each file atomically, keeping "
        "its permissions; a second run changes nothing. Findings without an automatic fix are listed with what to do.",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or folders (default: .)")
    parser.add_argument("--write", action="store_true", help="change the files (default: print the diff only)")
    parser.add_argument("--unsafe-fixes", action="store_true", help="also apply fixes that may change behaviour")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing, print the files that would change; exit 1 when there are any",
    )
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="torch",
        help="what the fixes call: torch's device-agnostic API (default; torch >= 2.6, else npu_port's helpers) or "
        "npu_port's helpers",
    )
    add_rule_selection(parser, "fix")
    add_format(parser, help="what to print: text (the unified diff) or json (the edits, file by file; default text)")
    add_verbosity(parser)


def run(args: argparse.Namespace) -> int:
    from ..scan.fix import fix
    from ..scan.targets import resolve

    if args.check and args.write:
        sys.stderr.write("npu-port fix: --check writes nothing; drop --write or --check\n")
        return 2
    target, note = resolve(args.target)
    try:
        fixes = fix(
            args.paths or ["."],
            select=codes(args.select),
            ignore=codes(args.ignore),
            unsafe=args.unsafe_fixes,
            write=args.write,
            target=target,
        )
    except KeyboardInterrupt:  # each file is replaced in one step: it is either fixed or as it was
        done = "files already fixed stay fixed, the others are unchanged" if args.write else "nothing written"
        sys.stderr.write(f"npu-port fix: interrupted; {done}\n")
        return 130
    changed = [f for f in fixes if f.new is not None]
    if wants_json(args) and not args.check:
        sys.stdout.write(json.dumps(edits(fixes, args.write, note), indent=2) + "\n")
    elif args.check:
        for one in changed:
            sys.stdout.write(f"would fix {one.path}\n")
    elif not args.write:
        if note and changed:  # one line before the diff (git apply skips it)
            sys.stdout.write(f"# {note}\n")
        sys.stdout.flush()
        for one in changed:  # in each file's own encoding: the diff applies to its bytes
            sys.stdout.buffer.write(one.diff_bytes())
        sys.stdout.buffer.flush()
    count = sum(len(f.fixed) for f in changed)
    verb = "fixed" if args.write else "would fix"
    lines = [note] if note and (args.write or args.check) and changed else []
    lines.append(f"npu-port fix: {verb} {count} findings in {len(changed)} files")
    for one in fixes:
        if one.problem:
            lines.append(f"{one.path}: {one.problem}")
    left = [finding for one in fixes for finding in one.left]
    manual = [f for f in left if f.fix == "manual" and f.severity in ("import", "runtime", "perf", "deprecated")]
    handled = [f for f in left if f.fix == "manual" and f.severity == "handled"]
    unsafe = [f for f in left if f.fix == "unsafe" and f.severity != "info"]
    if unsafe:  # a rewrite exists, and may change behaviour: only when asked
        lines.append(f"{len(unsafe)} have a fix that may change behaviour (--unsafe-fixes applies it):")
        lines += [f"  {m.path}:{m.line}:{m.column} {m.code} {m.message}" for m in unsafe]
    if manual:
        lines.append(f"{len(manual)} need a manual change:")
        lines += [f"  {m.path}:{m.line}:{m.column} {m.code} {m.message}" for m in manual]
    if handled:  # nothing to do under npu-port run; without it, the message says what to change
        lines.append(f"{len(handled)} with no automatic fix are handled by npu-port as they are:")
        lines += [f"  {m.path}:{m.line}:{m.column} {m.code} {m.message} [{m.handled_by}]" for m in handled]
    if not args.write and changed:
        lines.append("dry run: nothing written (--write applies the fixes)")
    if args.quiet:  # errors only: the files that could not be fixed
        lines = [f"{one.path}: {one.problem}" for one in fixes if one.problem]
    if lines:
        sys.stderr.write("\n".join(lines) + "\n")
    if args.write:
        return 1 if any(one.unwritten for one in fixes) else 0  # asked to write, and a file could not be
    return 1 if changed else 0  # a dry run or --check with changes pending


def _finding(finding) -> dict:
    return {"path": finding.path, "line": finding.line, "column": finding.column, "code": finding.code,
            "severity": finding.severity, "fix": finding.fix, "message": finding.message}  # fmt: skip


def edits(fixes, written: bool, note) -> dict:
    """``--format json``: per file the findings fixed, the unified diff and what was left; ``written`` says whether
    the files were changed (``--write``) or the edits are only planned."""
    files = []
    for one in fixes:
        if one.new is None and not one.problem and not one.left:
            continue
        files.append(
            {
                "path": one.path,
                "changed": one.new is not None,
                "fixed": [_finding(f) for f in one.fixed] if one.new is not None else [],
                "diff": one.diff() if one.new is not None else "",
                "left": [_finding(f) for f in one.left],
                "problem": one.problem,
                "unwritten": one.unwritten,
            }
        )
    return {"written": written, "note": note, "files": files}
