"""``npu-port scan PATH...``: what will break, where, and what npu-port already handles (see npu_port.scan)."""

from __future__ import annotations

import argparse
import sys

from .vocabulary import add_command, add_format, add_no_progress, add_output, add_verbosity

#: npu_port.scan.rule.SEVERITIES, most serious first, and "never" (written out: building the CLI's parsers must not
#: import the scan package, which `npu-port run` does not need; tests/scan/test_guarded.py checks the two agree).
SEVERITIES = ("import", "runtime", "handled", "perf", "deprecated", "guarded", "info")
SEVERITY_CHOICES = (*SEVERITIES, "never")
NEEDS_TORCH = False  # reading code needs no torch: a scan works where torch is broken
DRAWS_PROGRESS = True  # on a large tree (see npu_port.scan.engine)
#: -o/--output: the report.
PRIMARY_OUTPUT = "report"


def add_parser(commands) -> None:
    parser = add_command(
        commands,
        "scan",
        help="find what will break on an NPU / CPU / GPU without CUDA-only builds, and what npu-port handles",
        description="Scan Python files (and requirements, YAML configs, CUDA sources) for CUDA-only code: a report "
        "grouped by file and severity with a summary of what breaks at import, what npu-port run handles and what "
        "needs a manual change. Suppress one finding with '# npu-port: ignore[NPU301]' on its line.",
        example=[
            "npu-port scan project/",
            "npu-port scan --format sarif -o scan.sarif project/",
            "npu-port scan --fail-on import --select NPU1 project/",
            "npu-port scan --rules --markdown",
        ],
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or folders (default: .)")
    parser.add_argument("--rules", action="store_true", help="list every rule and exit")
    parser.add_argument(
        "--markdown", action="store_true", help="with --rules: the Markdown table (the documentation's rule reference)"
    )
    add_format(parser, choices=("text", "json", "csv", "sarif"))
    add_output(parser, "write the report here (atomically) instead of stdout")
    add_rule_selection(parser, "run")
    parser.add_argument(
        "--fail-on",
        choices=SEVERITY_CHOICES,
        default="never",
        help="exit 1 when a finding of this severity or a more serious one is found (" + " > ".join(SEVERITIES) + "; "
        "default: never)",
    )
    parser.add_argument("--jobs", "-j", type=int, default=None, help="processes (default: one per core)")
    add_verbosity(parser)
    add_no_progress(parser)


def add_rule_selection(parser, verb: str) -> None:
    """``--select`` / ``--ignore``, as scan and fix both take them (codes or prefixes, ruff's convention)."""
    parser.add_argument(
        "--select",
        default="",
        help=f"comma list of codes or prefixes to {verb}, or severities to keep (default: all)",
    )
    parser.add_argument(
        "--ignore", default="", help=f"comma list of codes or prefixes not to {verb}, or severities to drop (guarded)"
    )


def codes(value: str):
    """``"npu3, NPU101, guarded"`` -> ``["npu3", "NPU101", "guarded"]``: the scan reads severity names as such and
    upper-cases the codes."""
    return [part.strip() for part in value.split(",") if part.strip()]


def check_output(path: str) -> None:
    """Refuse an ``--output`` the report cannot be written to before scanning (a large tree takes minutes)."""
    import os

    from ..atomic import folder_problem, link_problem
    from ..scan.engine import ScanError

    if os.path.isdir(path):
        raise ScanError(f"cannot write the report to {path}: it is a folder; give a file path such as report.json")
    problem = link_problem(path)
    if problem:
        raise ScanError(f"--output {path!r} {problem}")
    problem = folder_problem(os.path.dirname(os.path.abspath(path)))
    if problem:
        raise ScanError(f"cannot write the report to {path}: {problem}")


def run(args: argparse.Namespace) -> int:
    from ..scan import report
    from ..scan.engine import scan
    from ..scan.rule import SEVERITIES

    if args.rules:
        sys.stdout.write(report.rules_table(markdown=args.markdown))
        return 0
    if args.jobs is not None and args.jobs < 1:
        from ..scan.engine import ScanError

        raise ScanError(f"--jobs must be at least 1, got {args.jobs}")
    if args.output:
        check_output(args.output)
    try:
        result = scan(
            args.paths or ["."],
            select=codes(args.select),
            ignore=codes(args.ignore),
            jobs=args.jobs,
            progress=not (args.no_progress or args.quiet) and sys.stderr.isatty(),
        )
    except KeyboardInterrupt:
        sys.stderr.write("npu-port scan: interrupted; no report written\n")
        return 130
    text = report.render(result, args.format)
    if args.output:
        from ..atomic import write_text
        from ..scan.engine import ScanError

        try:
            write_text(args.output, text.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
        except OSError as exc:
            raise ScanError(f"cannot write the report to {args.output}: {exc.strerror or exc}") from None
        if not args.quiet:
            sys.stderr.write("\n".join(report.summary_lines(result)) + f"\nwrote {args.output}\n")
    else:
        sys.stdout.write(text)
    if args.fail_on != "never":
        worst = SEVERITIES.index(args.fail_on)
        if any(SEVERITIES.index(f.severity) <= worst for f in result.findings):
            return 1
    return 0
