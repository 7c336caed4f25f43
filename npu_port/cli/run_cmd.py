"""``npu-port run [options] script.py [args...]`` or ``npu-port run [options] -m module [args...]``: run a CUDA
project's entry point here, unchanged.

The entry point runs as ``__main__``, as ``python script.py`` / ``python -m module`` would run it (``sys.path[0]``
and ``sys.argv`` as Python sets them), after :func:`npu_port.activate` has installed the redirect, the drop-ins, the
fallbacks, the strategy, and the import watcher over the project's own modules — the working directory, the folder
holding the entry point's top package, and every ``--watch`` folder — which rewrites their device-type checks,
routes their legacy attention classes and applies ``--override``. Everything is checked before any of the project's
code runs. A summary of what was patched and how often it was hit goes to stderr at exit, or to ``--report`` as
JSON: one file per rank under torchrun. The exit code is the script's (1 for an uncaught exception, 130 for Ctrl-C).

``npu-port run --plan [--device npu --chip 910B --strategy npu --format json] script.py`` runs the script on this
machine's CPU instead, records every attention call it makes and prints which would run fused on the ``--device``
given (see ``npu-port plan``); the script's own output goes to stderr under ``--format json``, so stdout holds the
JSON alone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Dict, Iterator, Mapping, Optional

from .vocabulary import add_command, add_verbosity, wants_json

#: ``--report`` placeholder for the rank under torchrun.
RANK_FIELD = "{rank}"


def add_parser(commands: "argparse._SubParsersAction") -> None:
    parser = add_command(
        commands,
        "run",
        help="run a CUDA-written script or module here unchanged (redirect, drop-ins, fallbacks, strategy)",
        description="Run a CUDA project's entry point (a script, or a module with -m) on this machine, unchanged. "
        "npu-port's options come before the script; everything after it goes to the script.",
        example=[
            "npu-port run --device cpu project/main.py --out out.pt",
            "npu-port run --report run.json --strategy sdpa -m scripts.animate --seed 1",
            "npu-port run --plan --device npu --chip 910B --format json project/main.py",
        ],
    )
    parser.add_argument("--device", default=None, help="npu, cuda, xpu, mps or cpu (default: the best usable)")
    parser.add_argument("--strategy", default=None, help="attention strategy (default auto)")
    parser.add_argument("--profile", default=None, help="a profile (name or YAML): its strategy and Ascend options")
    parser.add_argument(
        "--report",
        default=None,
        help="write the summary as JSON here instead of printing it; under torchrun '{rank}' in the path is the "
        "rank (without it each rank's file gets a .rankN suffix)",
    )
    parser.add_argument(
        "--dump",
        default=None,
        metavar="DIR",
        help="record every module the script calls into the dump folder DIR (npu-port diff compares two); under "
        "torchrun each rank writes DIR/rank-N",
    )
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
    parser.add_argument(
        "--watch",
        action="append",
        default=[],
        metavar="FOLDER",
        help="another folder holding the project's modules (besides the working directory and the entry point's); "
        "repeatable",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="pkg.mod:name=my_mod:name",
        help="replace a function or class in a project module with your own, as the module is imported; repeatable",
    )
    parser.add_argument(
        "--keep-device-checks",
        action="store_true",
        help="leave the project's x.device.type == 'cuda' and x.is_cuda checks as written (default: the target "
        "device reads as cuda there)",
    )
    from .plan_cmd import PLAN_VERBOSE, add_plan_target_arguments

    plan = parser.add_argument_group("plan (npu-port plan for a script)")
    plan.add_argument(
        "--plan",
        action="store_true",
        help="run the script here (cpu), record its attention calls and say which would run fused on --device "
        "(default npu) with --strategy (default npu)",
    )
    add_plan_target_arguments(plan, None)
    add_verbosity(
        parser,
        "after the run, what the attention strategy decided per shape bucket (auto: every candidate's times, as "
        f"handle.explain() shows them); with --plan, {PLAN_VERBOSE}",
    )
    parser.add_argument("-m", dest="as_module", action="store_true", help="run a module, as python -m does")
    parser.add_argument("target", metavar="script.py | module", help="the script (or, with -m, the module) to run")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the script's own arguments")


def rank_report_path(path: str, environ: Mapping[str, str]) -> str:
    """``path`` for this process: ``{rank}`` replaced by ``RANK``; under several ranks without the placeholder, a
    ``.rankN`` suffix before the extension — so ranks never overwrite one another's report."""
    rank = environ.get("RANK")
    world = environ.get("WORLD_SIZE")
    if RANK_FIELD in path:
        return path.replace(RANK_FIELD, rank if rank is not None else "0")
    if rank is not None and world is not None and world.isdigit() and int(world) > 1:
        stem, extension = os.path.splitext(path)
        return f"{stem}.rank{rank}{extension}"
    return path


def rank_dump_path(path: str, environ: Mapping[str, str]) -> str:
    """``--dump``'s folder for this process: ``DIR/rank-N`` under several ranks (``npu-port diff`` pairs them rank by
    rank), else ``DIR``."""
    world = environ.get("WORLD_SIZE")
    if world is not None and world.isdigit() and int(world) > 1:
        return os.path.join(path, f"rank-{environ.get('RANK', '0')}")
    return path


def _dumping(path: Optional[str], args: argparse.Namespace, entry: Any) -> Any:
    """The capture of the whole process (``capture(None, ...)``) for ``--dump``, or a block that does nothing."""
    if path is None:
        return contextlib.nullcontext()
    from ..diff.capture import capture

    meta = {"script": entry.path or entry.name, "arguments": list(args.arguments), "device": args.device,
            "strategy": args.strategy, "profile": args.profile}  # fmt: skip
    return capture(None, path, meta=meta)


def _check_report_path(path: str) -> None:
    from ..atomic import folder_problem, link_problem
    from ..errors import RunError

    if os.path.isdir(path):
        raise RunError(f"--report {path!r} is a folder; give a file path such as run.json")
    problem = link_problem(path)
    if problem:
        raise RunError(f"--report {path!r} {problem}")
    problem = folder_problem(os.path.dirname(os.path.abspath(path)))
    if problem:
        raise RunError(f"--report {path!r}: cannot write there ({problem})")


def _write_report(path: str, summary: Dict[str, Any]) -> None:
    from ..atomic import write_json

    write_json(path, summary)


def _format_stop(summary: Dict[str, Any]) -> str:
    outcome = summary["outcome"]
    lines = []
    if outcome["status"] != "completed":
        error = f" ({outcome['error']})" if outcome["error"] else ""
        lines.append(f"  stopped: {outcome['status']}, exit code {outcome['exit_code']}{error}")
    if summary.get("hint"):
        lines.append(f"  hint: {summary['hint']}")
    return "\n".join(lines)


#: ``outcome.status`` of a run refused before any of the project's code ran (bad input: exit 2, one line).
REFUSED = "refused"


@contextlib.contextmanager
def _refusals_reported(report: Optional[str], args: argparse.Namespace, environ: Mapping[str, str]) -> Iterator[None]:
    """Bad input found before the project runs is still one line and exit 2 (``main`` prints it); with
    ``--report`` the report says so too, so a batch of runs never shows a missing file for a refused one."""
    from ..errors import NpuPortError
    from .main import EXIT_USAGE_OR_NPU_PORT_ERROR

    try:
        yield
    except NpuPortError as exc:
        if report:
            kind = "module" if args.as_module else "script"
            outcome = {"exit_code": EXIT_USAGE_OR_NPU_PORT_ERROR, "status": REFUSED, "error": str(exc)}
            _write_report(
                report,
                {
                    "entry_point": {"kind": kind, "name": args.target, "path": None},
                    "outcome": outcome,
                    "exit_code": outcome["exit_code"],
                    "rank": environ.get("RANK"),
                },
            )
        raise


#: Flags that mean something only with --plan.
PLAN_ONLY = (("--chip", "chip"), ("--format json", "format"), ("--require-fused", "require_fused"))


def _check_plan_flags(args: argparse.Namespace) -> None:
    from ..errors import RunError

    if not args.plan:
        for flag, name in PLAN_ONLY:
            if getattr(args, name) not in (None, False, "text"):
                raise RunError(f"{flag} applies to --plan only (npu-port run --plan {flag} ... script.py)")
        return
    if args.profile:
        raise RunError(
            "--profile sets device options for a run on the device; with --plan name the strategy to judge with "
            "--strategy"
        )


def run(args: argparse.Namespace, environ: Optional[Mapping[str, str]] = None) -> int:
    from ..device.redirect.install import UNAVAILABLE
    from ..errors import RunError
    from ..runtime import activate
    from ..runtime.launch import cuda_refusal_hint, run_entry
    from ..runtime.locate import resolve_entry, watch_roots
    from ..runtime.overrides import Overrides

    environ = os.environ if environ is None else environ
    report = rank_report_path(args.report, environ) if args.report else None
    if report:
        _check_report_path(report)
    dump = rank_dump_path(args.dump, environ) if args.dump else None
    with _refusals_reported(report, args, environ):
        _check_plan_flags(args)
        if dump is not None:
            from ..diff.dump import check_destination

            if args.plan:
                raise RunError("--dump records the run on the device; leave out --plan (it runs on the cpu)")
            check_destination(dump)
        planning = _planning(args) if args.plan else None
        entry = resolve_entry(args.target, args.as_module)
        roots = watch_roots(entry, args.watch, environ=environ)
        overrides = Overrides.parse(args.override)
        for item in overrides.items:
            item.check_locatable([entry.sys_path0, *sys.path])
        activation = activate(
            "cpu" if planning else args.device,
            RECORDING_ON if planning else args.strategy,
            args.profile,
            watch=roots,
            force_dropins=args.force_dropins,
            cuda_available=args.cuda_available,
            overrides=overrides,
            device_checks=not args.keep_device_checks,
        )
    outcome = None
    recording = None
    try:

        def run_script() -> Any:
            return run_entry(
                entry, args.arguments, transform=activation.transform, init_globals=activation.init_globals
            )

        if planning:
            recording = _record(run_script, planning, quiet_stdout=wants_json(args))
            outcome = recording.result
        else:
            with _dumping(dump, args, entry) as recorder:
                outcome = run_script()
    finally:
        summary = activation.summary()
        text = activation.format_summary()
        details = activation.strategy.explain() if args.verbose and not planning else None
        activation.deactivate()
    auto = _claim_auto_line(summary)
    hint = cuda_refusal_hint(outcome, summary["redirect"]["hits"].get(UNAVAILABLE, 0), args.cuda_available)
    summary.update(
        script=entry.path,
        entry_point={"kind": entry.kind, "name": entry.name, "path": entry.path},
        outcome=outcome.as_dict(),
        exit_code=outcome.exit_code,
        hint=hint,
        rank=environ.get("RANK"),
    )
    if dump is not None:
        summary["dump"] = {"path": str(recorder.path), "records": recorder.records, "complete": recorder.complete}
    prefix = f"[rank {environ['RANK']}] " if "RANK" in environ and report is None else ""
    stop = _format_stop(summary)
    if report:
        _write_report(report, summary)
        if hint:
            print(f"npu-port run: {hint}", file=sys.stderr)
    elif args.quiet:  # errors only: how the script stopped, when it did not complete
        if stop:
            print(prefix + "npu-port run:\n" + stop, file=sys.stderr)
    else:
        print(prefix + _with_auto_line(text, auto) + (f"\n{stop}" if stop else ""), file=sys.stderr)
    if details is not None:
        print(details, file=sys.stderr)
    if dump is not None and not args.quiet:
        print(f"npu-port run: dump {recorder.path} ({recorder.records} records)", file=sys.stderr)
    if planning:
        return _show_plan(recording, planning, args, entry.path, outcome.exit_code)
    return outcome.exit_code


def _claim_auto_line(summary: Dict[str, Any]) -> Optional[str]:
    """auto's one line (:mod:`npu_port.strategy.summary`), taken over from its logging at exit: the run summary
    shows it, and the report records its data under ``auto``."""
    from ..strategy.summary import SUMMARY

    line = SUMMARY.claim()
    summary["auto"] = SUMMARY.data()
    return line


def _with_auto_line(text: str, auto: Optional[str]) -> str:
    """The run summary with auto's line after its first line (the one naming the strategy)."""
    if auto is None:
        return text
    first, _, rest = text.partition("\n")
    return "\n".join(part for part in (first, f"  {auto}", rest) if part)


#: The strategy a planned script runs with here (npu-port plan's recording computes with sdpa, else math).
RECORDING_ON = "sdpa"


def _planning(args: argparse.Namespace) -> Any:
    """The target and strategy of ``--plan``, checked before the script is even located (bad input: one line)."""
    from ..plan.record import recording_strategy
    from .plan_cmd import plan_target

    return plan_target(args.device, args.chip), recording_strategy(args.strategy or "npu")


def _record(run_script: Any, planning: Any, quiet_stdout: bool) -> Any:
    """Run the script under the recording (process-wide); under ``--format json`` its stdout goes to stderr."""
    import contextlib

    from ..plan import record_calls

    quiet = contextlib.redirect_stdout(sys.stderr) if quiet_stdout else contextlib.nullcontext()
    with quiet:
        return record_calls(run_script, None, planning[1])


def _show_plan(recording: Any, planning: Any, args: argparse.Namespace, script: str, exit_code: int) -> int:
    """The plan of what the script did; the script's own failure (exit code) wins over --require-fused's 1."""
    from ..plan import assess
    from .plan_cmd import show_plan

    target, strategy = planning
    plan = assess(recording, target, strategy, model=script, verbose=args.verbose)
    if exit_code:
        print(
            f"npu-port run --plan: the script stopped with exit code {exit_code}; the plan covers the calls made "
            "until then",
            file=sys.stderr,
        )
    code = show_plan(plan, args)
    return exit_code or code
