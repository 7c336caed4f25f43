"""``npu-port bench``: time every attention strategy on the shapes that matter, on this machine.

The exit code is 0 when every cell that ran gave finite output within the dtype's tolerance, 1 when a strategy
accepted a shape and then failed or disagreed with the float64 reference (refusals are results, not failures), 2 for
a bad option, 130 when stopped with Ctrl-C: what was measured until then is printed and written, marked PARTIAL.
The work is in :mod:`npu_port.bench`; this module only parses and prints, and imports torch only inside :func:`run`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import EXIT_ON_CTRL_C as EXIT_INTERRUPTED  # 128 + SIGINT, as a shell reports Ctrl-C
from .vocabulary import add_command, add_format, add_no_progress, add_output, add_verbosity, note, wants_json

DRAWS_PROGRESS = True
#: -o/--output: the folder for bench.csv, bench.json and bench.png.
PRIMARY_OUTPUT = "results folder"


def _at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    return parse


def add_parser(commands: "argparse._SubParsersAction") -> None:
    parser = add_command(
        commands,
        "bench",
        help="benchmark attention strategies over shapes (time, memory, TFLOP/s, parity)",
        example=[
            "npu-port bench",
            "npu-port bench --strategies vanilla,sdpa,auto --shapes seq1024,sd-64x64 --dtype float16 -o bench-results",
            "npu-port bench --device npu --shapes all -o results/",
            "npu-port bench --shapes custom:2,8,4096,40 --format json",
        ],
        description="Time each attention strategy on named shapes: median time, peak memory, TFLOP/s, error against "
        "a float64 reference, the kernel that ran (what auto picked), or why it cannot run.",
    )
    parser.add_argument(
        "--strategies",
        metavar="LIST",
        help="comma-separated strategy names (e.g. vanilla,sdpa,auto), or 'all' to include unavailable ones; "
        "default: every strategy that can run on this machine",
    )
    parser.add_argument(
        "--shapes",
        metavar="LIST",
        help="comma-separated: seq256, seq512, seq1024, sd-64x64, video-15x4096, 'default', 'all', or "
        "custom:B,H,S,D; default: all but video-15x4096 on cpu, all elsewhere",
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--device", help="cpu, cuda, npu, ... (default: npu or cuda when available, else cpu)")
    parser.add_argument(
        "--warmup", type=_at_least(0), default=2, metavar="N", help="untimed calls per cell (default 2)"
    )
    parser.add_argument(
        "--repeats", type=_at_least(1), default=10, metavar="N", help="timed calls per cell; median (default 10)"
    )
    parser.add_argument(
        "--memory-budget",
        metavar="SIZE",
        help="largest score tensor a kernel may materialise, e.g. 4GiB; larger is refused without running "
        "(default: auto's budget, a quarter of the device's free memory)",
    )
    add_output(parser, "write bench.csv, bench.json and bench.png in this folder", metavar="DIR", old=["--out"])
    parser.add_argument("--no-plot", action="store_true", help="with --output: skip bench.png (no matplotlib needed)")
    add_format(parser, help="what to print: text (the table) or json (the whole report; default text)")
    add_verbosity(parser)
    add_no_progress(parser)


def _progress(total: int, wanted: bool = True):
    """A tqdm bar on stderr (hidden when stderr is not a terminal); None if tqdm is missing or the bar is not
    wanted — progress is cosmetic."""
    if not wanted:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="step", file=sys.stderr, disable=None, leave=False, dynamic_ncols=True)


def check_out(out: str, plot: bool) -> None:
    """Refuse an ``--output`` the results cannot be written to, before measuring (which takes minutes): a file, a
    folder that cannot be written, or a result file in it that is a folder or a link onto something else."""
    from ..atomic import folder_problem, link_problem
    from ..bench import BenchError

    folder = Path(out).expanduser()
    if folder.exists() and not folder.is_dir():
        raise BenchError(f"--output {out!r} is not a folder; give a folder for bench.csv, bench.json and bench.png")
    problem = folder_problem(folder)
    if problem:
        raise BenchError(f"--output {out!r}: cannot write there ({problem})")
    for name in ("bench.csv", "bench.json") + (("bench.png",) if plot else ()):
        path = folder / name
        problem = "is a folder; move it away" if path.is_dir() and not path.is_symlink() else link_problem(path)
        if problem:
            raise BenchError(f"--output {out!r}: {name} in it {problem}")


def run(args: argparse.Namespace) -> int:
    """Parse, measure, print, write; Ctrl-C at any point exits 130 without a traceback, keeping what was measured."""
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("npu-port: bench interrupted (Ctrl-C) before anything was measured; nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    from ..bench import BenchError, BenchInterrupted, plot, report
    from ..bench.results import FAILED, OK
    from ..bench.runner import (
        BROKEN_FILE,
        Settings,
        progress_steps,
        resolve_device,
        resolve_dtype,
        run_bench,
        select_strategies,
    )
    from ..bench.shapes import parse_shapes
    from ..console import for_command, wants_progress
    from ..strategy.spec import parse_size

    device = resolve_device(args.device)
    budget = None
    if args.memory_budget is not None:
        try:
            budget = parse_size(args.memory_budget, "--memory-budget")
        except ValueError as exc:
            raise BenchError(str(exc)) from None
    shapes, skipped_shapes = parse_shapes(args.shapes, device.type)
    strategies, skipped_strategies = select_strategies(args.strategies)
    for name, why in skipped_strategies:
        if why.startswith(BROKEN_FILE):
            print(f"npu-port: warning: strategy {name!r} skipped: {why[len(BROKEN_FILE) :]}", file=sys.stderr)
    if not strategies:
        why = "; ".join(f"{name}: {reason}" for name, reason in skipped_strategies)
        raise BenchError(f"no strategy can run on this machine: {why}")
    out_dir = Path(args.output).expanduser() if args.output else None
    if out_dir is not None:
        check_out(args.output, plot=not args.no_plot)
        if not args.no_plot:
            plot.require_matplotlib()

    settings = Settings(
        device=device, dtype=resolve_dtype(args.dtype), warmup=args.warmup, repeats=args.repeats, memory_budget=budget
    )
    bar = _progress(progress_steps(strategies, shapes, settings)) if wants_progress(args) else None
    try:
        with for_command(args, libraries=()):  # bench loads no pipeline: only other packages' Python warnings
            result = run_bench(
                strategies,
                shapes,
                settings,
                skipped_shapes=skipped_shapes,
                skipped_strategies=skipped_strategies,
                progress=bar,
            )
    except BenchInterrupted as stopped:
        result = stopped.report
    finally:
        if bar is not None:
            bar.close()
    result.settings["requested"] = {"strategies": args.strategies, "shapes": args.shapes}
    try:
        if wants_json(args):
            from ..atomic import json_safe

            print(json.dumps(json_safe(result.as_dict()), indent=2, default=str, allow_nan=False))
        else:
            print(report.render_table(result))
        if out_dir is not None:
            _write(result, out_dir, plot=not args.no_plot, args=args)
    except KeyboardInterrupt:  # a second Ctrl-C while writing: each file is whole or untouched (atomic writes)
        print(
            "npu-port: interrupted again while writing the results; files not yet written were left as they were",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if result.partial:
        return EXIT_INTERRUPTED
    broken = [c for c in result.cells if c.status == FAILED or (c.status == OK and c.parity_ok is False)]
    return 1 if broken else 0


def _write(result, out_dir: Path, plot: bool, args: argparse.Namespace) -> None:
    """bench.csv, bench.json and (unless --no-plot) bench.png, each written atomically. For a partial run a plot
    that cannot be drawn is said, not raised: the CSV and JSON are what matter then."""
    from ..bench import plot as plotting
    from ..bench import report

    out_dir.mkdir(parents=True, exist_ok=True)
    report.write_csv(result, out_dir / "bench.csv")
    report.write_json(result, out_dir / "bench.json")
    written = ["bench.csv", "bench.json"]
    if plot:
        try:
            plotting.write_png(result, out_dir / "bench.png")
            written.append("bench.png")
        except Exception as exc:
            if not result.partial:
                raise
            print(
                f"npu-port: bench.png not drawn for the partial results: {type(exc).__name__}: {exc}", file=sys.stderr
            )
    label = "wrote partial results: " if result.partial else "wrote "
    line = label + ", ".join(str(out_dir / name) for name in written)
    if wants_json(args):  # stdout holds the JSON alone
        note(args, f"npu-port: {line}")
    elif not args.quiet:
        print(line)
