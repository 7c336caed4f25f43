"""``npu-port diff``: record a run module by module, or compare two runs and name where they first part.

A side is a dump folder (``npu-port diff dump``, ``npu-port run --dump``; a folder of ``rank-N`` dumps is compared
rank by rank) or a spec run now: ``key=value`` pairs (device, dtype, strategy, profile, fuse_ops with ``+`` between
ops) over the command's own model options. The first word ``dump`` records instead (a dump folder named ``dump`` is
``./dump``). Exit codes: 0 no divergence beyond tolerance; 1 a divergence (the culprit is the first line); 2 bad
input, one line, found before anything runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import EXIT_ON_CTRL_C
from .infer_cmd import add_model_arguments
from .vocabulary import add_command, add_format, add_no_progress, add_output, add_verbosity, note, wants_json

#: Recording draws a bar of the tensors written (``--no-progress`` turns it off).
DRAWS_PROGRESS = True
#: -o/--output: the dump folder of npu-port diff dump.
PRIMARY_OUTPUT = "dump folder"
#: ``npu-port diff`` with nothing after it is a usage error: the help, on stderr, exit 2 (cli.main).
NEEDS_ARGUMENTS = True

#: Request options a spec side takes from a dump's meta when the command line leaves them out; their own defaults.
REQUEST_DEFAULTS = {"model": "tiny", "steps": 2, "seed": 0, "prompt": "a lighthouse at dusk, oil painting",
                    "guidance_scale": 4.0, "negative_prompt": None, "class_label": None, "height": None,
                    "width": None, "frames": None}  # fmt: skip
#: Options of the comparison only (flag, dest).
COMPARE_ONLY = (("--a", "a"), ("--b", "b"), ("--keep", "keep"), ("--format json", "format"), ("--plot", "plot"),
                ("--tolerance", "tolerance"), ("--bisect", "bisect"))  # fmt: skip
RANK_PREFIX = "rank-"


def add_parser(commands: "argparse._SubParsersAction") -> None:
    parser = add_command(
        commands,
        "diff",
        help="find where two runs part: record module by module (diff dump), compare dumps or specs run now",
        description="Record a run module by module (npu-port diff dump -o DIR), or compare two runs and name the "
        "module where they first part. A side is a dump folder (from diff dump or npu-port run --dump; a folder of "
        "rank-N dumps is compared rank by rank) or a spec run now: key=value pairs (device, dtype, strategy, profile, "
        "fuse_ops with + between ops) over the command's own model options.",
        example=[
            "npu-port diff dump --model tiny-dit --device cpu --strategy vanilla --steps 2 -o cpu.d",
            "npu-port diff cpu.d npu.d",
            "npu-port diff --model tiny --a strategy=vanilla --b strategy=sdpa,dtype=bfloat16",
            "npu-port diff cpu.d --b strategy=sdpa --format json",
        ],
    )
    parser.add_argument("sides", nargs="*", metavar="A B",
                        help="two dump folders (or one, with --a / --b); 'dump' to record one")  # fmt: skip
    _, attention, _ = add_model_arguments(parser)
    parser.set_defaults(**{name: None for name in REQUEST_DEFAULTS})  # None: given by neither user nor dump yet
    attention.add_argument("--fuse-ops", default=None, metavar="OP,OP",
                           help="fused ops to apply (rms_norm, rope, geglu_exact, geglu_tanh, adaln)")  # fmt: skip
    record = parser.add_argument_group("recording")
    add_output(record, "diff dump: the dump folder to write", metavar="DIR")
    record.add_argument("--full", default=None, metavar="PATTERNS",
                        help="module paths (shell patterns, comma-separated; 'all') kept whole")  # fmt: skip
    record.add_argument("--sample", type=int, default=None, metavar="N",
                        help="elements sampled per tensor (default 256)")  # fmt: skip
    add_no_progress(record)
    compare = parser.add_argument_group("comparing")
    compare.add_argument("--a", default=None, metavar="SPEC", help="side A run now: key=value,... over the options")
    compare.add_argument("--b", default=None, metavar="SPEC", help="side B run now (e.g. strategy=npu,dtype=float16)")
    compare.add_argument("--keep", default=None, metavar="DIR", help="keep the dumps of sides run now in DIR/a.d, b.d")
    compare.add_argument("--tolerance", type=float, default=None,
                         help="largest error (relative to the tensor's scale) accepted, for every dtype")  # fmt: skip
    compare.add_argument("--top", type=int, default=10, help="divergent calls listed after the first (default 10)")
    add_format(compare, help="the comparison as text (default) or as JSON on stdout")
    compare.add_argument("--plot", default=None, metavar="PATH", help="error per module call as .png or .html")
    compare.add_argument("--bisect", action="store_true",
                         help="with --a / --b run now: name the setting (strategy, dtype, fuse_ops) and the modules "
                              "that make B part from A")  # fmt: skip
    add_verbosity(parser)


# ---------------------------------------------------------------------------------------------- checks


def _full(text: Optional[str]) -> Any:
    from ..errors import DiffError

    if text is None:
        return ()
    if text.strip() == "all":
        return True
    patterns = [part.strip() for part in text.split(",")]
    if not all(patterns):
        raise DiffError(f"--full {text!r}: an empty pattern; give module paths (shell patterns) separated by commas, "
                        "e.g. 'transformer.transformer_blocks.1.*', or 'all'")  # fmt: skip
    return tuple(patterns)


def _check_numbers(args: argparse.Namespace) -> None:
    from ..errors import DiffError

    if args.sample is not None and args.sample < 1:
        raise DiffError(f"--sample {args.sample}: give a positive number of elements (default 256)")
    if args.top < 0:
        raise DiffError(f"--top {args.top}: give 0 or more")
    if args.tolerance is not None and not (math.isfinite(args.tolerance) and args.tolerance > 0):
        raise DiffError(f"--tolerance {args.tolerance}: give a positive finite number (e.g. 1e-3)")


def _request(args: argparse.Namespace, meta: Optional[Dict[str, Any]]):
    """The request and model: the command line's values, else the dump's, else :data:`REQUEST_DEFAULTS`."""
    from ..errors import DiffError
    from ..infer import GenerationRequest

    if meta is not None and "request" not in meta:
        raise DiffError("the dump side was recorded from a script (npu-port run --dump): nothing to run again; "
                        "compare it with another dump")  # fmt: skip
    recorded = dict((meta or {}).get("request") or {}, model=(meta or {}).get("model"))
    values = {}
    for name, default in REQUEST_DEFAULTS.items():
        given = getattr(args, name)
        values[name] = given if given is not None else recorded.get(name, default)
    if values["class_label"] is None:
        values["class_label"] = GenerationRequest.class_label
    model = values.pop("model") or "tiny"
    switches = {k: args.__dict__[k] or bool(recorded.get(k)) for k in ("vae_slicing", "vae_tiling")}
    return model, GenerationRequest(**values, **switches)


def _check_request(model: str, request: Any, args: argparse.Namespace) -> None:
    from .infer_cmd import check_class_option

    probe = argparse.Namespace(class_label=args.class_label, model=model)
    from ..diff.sides import transformers_folder

    if not transformers_folder(model):
        from ..infer.models import describe_model

        check_class_option(probe, describe_model(model).kind)


def _side(label: str, spec: Dict[str, Any], args: argparse.Namespace, meta: Optional[Dict[str, Any]]):
    from ..diff.sides import check_side, parse_fuse_ops

    model, request = _request(args, meta)
    _check_request(model, request, args)
    profile = spec.get("profile", None if "strategy" in spec else args.profile)
    strategy = spec.get("strategy", None if "profile" in spec else args.strategy)
    fuse = spec["fuse_ops"] if "fuse_ops" in spec else parse_fuse_ops(args.fuse_ops)
    return check_side(label, model, spec.get("device", args.device), spec.get("dtype", args.dtype), strategy,
                      profile, fuse, request, args.text_encoder_device)  # fmt: skip


def _refuse_flags(args: argparse.Namespace, flags, why: str) -> None:
    from ..errors import DiffError

    for flag, dest in flags:
        value = getattr(args, dest)
        if value is not None and value is not False and value != "text":
            raise DiffError(f"{flag} {why}")


# ---------------------------------------------------------------------------------------------- diff dump


def _dump(args: argparse.Namespace) -> int:
    from ..console import for_command
    from ..diff.dump import check_destination
    from ..errors import DiffError

    if len(args.sides) > 1:
        raise DiffError(f"diff dump takes no folder argument ({' '.join(args.sides[1:])!r}); give the dump with -o DIR")
    _refuse_flags(args, COMPARE_ONLY, "is for comparing; npu-port diff dump records one run into -o DIR")
    if not args.output:
        raise DiffError("diff dump needs -o DIR: the dump folder to write (it must not exist)")
    check_destination(args.output)
    _check_numbers(args)
    full = _full(args.full)
    side = _side("dump", {}, args, None)
    with for_command(args):  # the libraries' warnings and loading bars, hidden while the model loads and runs
        path = _run(side, args.output, args, full)
    from ..diff.dump import Dump

    dump = Dump(path)
    print(f"dump: {path} ({dump.index['records']} records, {dump.index['tensors']} full tensors; "
          f"{side.device}, {str(side.dtype).replace('torch.', '')}, strategy {side.strategy})")  # fmt: skip
    return 0


def _run(side: Any, out: Any, args: argparse.Namespace, full: Any) -> Path:
    from ..console import wants_progress
    from ..diff.sides import run_side
    from ..infer.paths import cache_location

    cache, warning = cache_location()
    if warning:
        note(args, f"npu-port: {warning}")
    return run_side(side, out, full=full, sample_size=args.sample, progress=wants_progress(args),
                    cache=cache, on_build=lambda message: note(args, f"npu-port: {message}"))  # fmt: skip


# ---------------------------------------------------------------------------------------------- compare


def _open(path: str):
    """A dump, or a folder of per-rank dumps: ``{rank: Dump}`` (a single dump is ``{None: Dump}``)."""
    from ..diff.dump import INDEX, Dump
    from ..errors import DiffError

    folder = Path(path)
    if folder.is_dir() and not (folder / INDEX).is_file():
        ranks = sorted(p for p in folder.iterdir() if p.name.startswith(RANK_PREFIX) and p.is_dir())
        if ranks:
            found = {}
            for rank in ranks:
                number = rank.name[len(RANK_PREFIX) :]
                if not number.isdigit():
                    raise DiffError(f"{rank} is not a rank dump (rank-N, N a number)")
                found[int(number)] = Dump(rank)
            return dict(sorted(found.items()))
    return {None: Dump(folder)}


def _plan_sides(args: argparse.Namespace):
    """(A, B): each ``("dump", {rank: Dump})`` or ``("spec", dict)``, checked."""
    from ..diff.sides import parse_spec
    from ..errors import DiffError

    if len(args.sides) > 2:
        raise DiffError(f"give two sides (dump folders or --a / --b specs), not {len(args.sides)}: "
                        f"{' '.join(args.sides)}")  # fmt: skip
    if args.output:
        raise DiffError("-o is for npu-port diff dump; to keep the dumps of sides run now give --keep DIR")
    specs = {"a": args.a, "b": args.b}
    if len(args.sides) == 2 and (args.a or args.b):
        raise DiffError("both sides are dumps already; leave out --a / --b (or give one dump and one spec)")
    if not args.sides and args.a is None and args.b is None:
        raise DiffError("nothing to compare: give two dump folders, or specs with --a / --b "
                        "(e.g. npu-port diff --model tiny --a strategy=vanilla --b strategy=sdpa)")  # fmt: skip
    dumps = list(args.sides)
    sides: List[Tuple[str, Any]] = []
    for name in ("a", "b"):
        if specs[name] is not None:
            sides.append(("spec", parse_spec(specs[name], f"--{name}")))
        elif dumps:
            sides.append(("dump", _open(dumps.pop(0))))
        else:
            sides.append(("spec", {}))
    if len(args.sides) == 1 and (args.a is not None) and (args.b is not None):
        raise DiffError("one dump and two specs: give the dump and one of --a / --b")
    return sides


def _compare(args: argparse.Namespace) -> int:
    from ..console import for_command
    from ..diff.dump import check_destination
    from ..errors import DiffError

    _check_numbers(args)
    full = _full(args.full)
    sides = _plan_sides(args)
    if args.plot:
        from ..diff.plot import check_plot_path, require_matplotlib

        try:
            check_plot_path(args.plot)
        except ValueError as exc:
            raise DiffError(f"--plot: {exc}") from None
        from ..atomic import link_problem

        problem = link_problem(args.plot)
        if not problem and os.path.exists(args.plot) and not os.path.isfile(args.plot):
            problem = "is a folder" if os.path.isdir(args.plot) else "is not a regular file"
        if problem:
            raise DiffError(f"--plot {args.plot!r} {problem}; give a new .png or .html path")
        try:
            require_matplotlib()
        except ImportError as exc:
            raise DiffError(str(exc)) from None
    if sides[0][0] == "dump" and sides[1][0] == "dump":
        if (None in sides[0][1]) != (None in sides[1][1]):
            raise DiffError("one side is a folder of per-rank dumps, the other a single dump; compare like with like")
        if set(sides[0][1]) != set(sides[1][1]):
            raise DiffError(f"the sides hold different ranks: {sorted(sides[0][1])} and {sorted(sides[1][1])}")
        return _report({r: (sides[0][1][r], sides[1][1][r]) for r in sides[0][1]}, args)
    dump_meta = None
    for kind, value in sides:
        if kind == "dump":
            if None not in value:
                raise DiffError("a folder of per-rank dumps compares with another such folder only (its ranks ran "
                                "under torchrun); give two of them")  # fmt: skip
            dump_meta = value[None].meta
    planned = [(kind, _side(label, value, args, dump_meta) if kind == "spec" else value[None])
               for label, (kind, value) in zip("AB", sides)]  # fmt: skip
    if args.bisect:
        return _bisect(planned, args, full)
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        if (keep / "index.json").exists():
            raise DiffError(f"--keep {str(keep)!r} is a dump; give a folder for the dumps of the sides run now")
        for label, (kind, _) in zip("ab", planned):
            if kind == "spec":
                check_destination(keep / f"{label}.d")
    with tempfile.TemporaryDirectory(prefix="npu-port-diff-") as scratch:
        folder = keep or Path(scratch)
        dumps = []
        from ..diff.dump import Dump

        with for_command(args):  # the libraries' warnings and loading bars, hidden while the sides run
            for label, (kind, value) in zip("ab", planned):
                if kind == "dump":
                    dumps.append(value)
                    continue
                dtype = str(value.dtype).replace("torch.", "")
                note(args, f"npu-port: running side {label.upper()}: {value.model}, {value.device}, {dtype}, "
                           f"strategy {value.strategy}")  # fmt: skip
                dumps.append(Dump(_run(value, folder / f"{label}.d", args, full)))
        return _report({None: tuple(dumps)}, args)


def _bisect_sides(planned) -> Tuple[Any, Any]:
    """Both sides of ``--bisect``, checked: run now, one model on one device, differing only in what bisect can
    change (strategy, dtype, fuse_ops) — they share one loaded pipeline."""
    from ..errors import DiffError

    if any(kind != "spec" for kind, _ in planned):
        raise DiffError("--bisect runs both sides now: give --a and --b specs, not dump folders (a dump cannot be "
                        "run again with other settings)")  # fmt: skip
    a, b = (side for _, side in planned)
    for what in ("model", "device", "text_encoder_device"):
        if getattr(a, what) != getattr(b, what):
            raise DiffError(f"--bisect: the sides differ in {what} ({getattr(a, what)} and {getattr(b, what)}); it "
                            "changes strategy, dtype and fuse_ops on one loaded model: compare the two devices "
                            "without --bisect, then bisect on one")  # fmt: skip
    if a.profile or b.profile:
        raise DiffError("--bisect takes strategies, not profiles (a profile also sets process options): give "
                        "strategy=NAME on both sides")  # fmt: skip
    return a, b


def _bisect(planned, args: argparse.Namespace, full: Any) -> int:
    """``--bisect``: load the model once and let :func:`npu_port.diff.bisect` run it with A's and B's settings."""
    from dataclasses import replace

    import torch

    from ..console import for_command
    from ..diff.bisect import bisect
    from ..diff.compare import compare_dumps
    from ..diff.runner import PipelineRunner
    from ..diff.sides import transformers_folder
    from ..errors import DiffError
    from ..infer import load_pipeline
    from ..infer.paths import cache_location
    from ..infer.run import call_arguments

    a, b = _bisect_sides(planned)
    if transformers_folder(a.model):
        raise DiffError("--bisect runs diffusers pipelines; for a transformers model compare the sides without it")
    cache, _ = cache_location()
    request = a.request

    def run_request(pipe: Any) -> Any:
        generator = torch.Generator("cpu").manual_seed(request.seed)
        with torch.no_grad():
            return pipe(**call_arguments(replace(loaded, pipe=pipe), request, generator))

    def settings(side: Any) -> Dict[str, Any]:
        return {"strategy": side.strategy, "dtype": str(side.dtype).replace("torch.", ""),
                "fuse_ops": list(side.fuse_ops)}  # fmt: skip

    # the libraries' warnings and loading bars, hidden while the model loads and runs
    with for_command(args), tempfile.TemporaryDirectory(prefix="npu-port-bisect-") as scratch:
        loaded = load_pipeline(a.model, a.device, torch.float32, text_encoder_device=a.text_encoder_device,
                               progress_bar=False, cache=cache)  # fmt: skip
        runner = PipelineRunner(loaded.pipe, run_request, args.keep or scratch, full=full, sample_size=args.sample)
        result = bisect(runner, settings(a), settings(b),
                        compare=lambda x, y: compare_dumps(x, y, tolerance=args.tolerance))  # fmt: skip
    if wants_json(args):
        print(json.dumps(result.as_dict(), indent=2, allow_nan=True, default=str))
    else:
        print(result.text())
    return 1 if result.diverged else 0


def _report(pairs: Dict[Optional[int], Tuple[Any, Any]], args: argparse.Namespace) -> int:
    from ..diff.compare import compare_dumps
    from ..diff.text import report_text
    from ..errors import DiffError

    reports = {}
    for rank, (a, b) in pairs.items():
        report = compare_dumps(a, b, tolerance=args.tolerance)
        if report.compared == 0:
            where = f"rank {rank}: " if rank is not None else ""
            raise DiffError(f"{where}{a.path} and {b.path} share no record (different models or scripts?): nothing "
                            "to compare")  # fmt: skip
        reports[rank] = report
    overall_rank = _overall(reports)
    overall = reports[overall_rank]
    if args.plot:
        from ..diff.plot import write_plot

        write_plot(overall, args.plot)
    if wants_json(args):
        if list(reports) == [None]:
            data = overall.as_dict()
        else:
            first = overall.as_dict()["first_divergence"]
            data = {"first_divergence": dict(first, rank=overall_rank) if first else None,
                    "ranks": {str(rank): report.as_dict() for rank, report in reports.items()}}  # fmt: skip
        print(json.dumps(data, indent=2, allow_nan=True, default=str))
    elif list(reports) == [None]:
        print(report_text(overall, top=args.top))
    else:
        for rank, report in reports.items():
            print(f"rank {rank}: " + report_text(report, top=args.top).replace("\n", f"\nrank {rank}: "))
        first = overall.first_divergence
        print(f"overall: first divergence on rank {overall_rank}: {first.module}, step {first.step}" if first
              else "overall: no divergence on any rank")  # fmt: skip
    if args.plot:
        note(args, f"plot: {args.plot}")
    return 1 if overall.first_divergence is not None else 0


def _overall(reports: Dict[Optional[int], Any]) -> Optional[int]:
    """The rank whose first divergence came earliest in its run (lowest rank on a tie; the first rank if none)."""
    diverged = [(r.first_divergence.order, rank if rank is not None else -1, rank) for rank, r in reports.items()
                if r.first_divergence is not None]  # fmt: skip
    return min(diverged)[2] if diverged else next(iter(reports))


def run(args: argparse.Namespace) -> int:
    try:
        if args.sides[:1] == ["dump"]:
            return _dump(args)
        return _compare(args)
    except KeyboardInterrupt:
        print("npu-port: interrupted (Ctrl-C); a dump being written keeps its records (complete: false)",
              file=sys.stderr)  # fmt: skip
        return EXIT_ON_CTRL_C
