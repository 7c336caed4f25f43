"""``npu-port infer`` (also ``scripts/inference_npu.py``): run a diffusers pipeline on this machine's device with an
attention strategy, write the image (or video) and a JSON report, or prove a port faithful with ``--compare``.

Exit codes: 0 done (and, with --compare, every image within tolerance of the first); 1 a strategy's image diverged;
2 bad input (a missing model, a size out of range, an unknown strategy) — one line, no traceback.
"""

from __future__ import annotations

import argparse
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import EXIT_ON_CTRL_C as EXIT_INTERRUPTED  # 128 + SIGINT, as a shell reports Ctrl-C
from .vocabulary import add_command, add_format, add_no_progress, add_output, add_verbosity, note, wants_json

#: The diffusers pipeline draws a bar per denoising loop (``--no-progress`` turns it off).
DRAWS_PROGRESS = True
#: -o/--output: the image (or video).
PRIMARY_OUTPUT = "image"

#: Same as npu_port.infer.models.DTYPES (kept here so that --help never imports torch).
DTYPES = ("auto", "float32", "float16", "bfloat16")


def add_model_arguments(parser: argparse.ArgumentParser, steps: int = 10) -> Tuple[Any, Any, Any]:
    """The model, attention and image options (what runs and what it makes), shared with ``npu-port diff``; returns
    the three argument groups so that a command can add its own options to them."""
    model = parser.add_argument_group("model")
    model.add_argument("--model", default="tiny",
                       help="'tiny' (default), 'tiny-dit', 'tiny-flux', 'tiny-wan' (video), a pipeline directory or a "
                            "hub id")  # fmt: skip
    model.add_argument("--device", default=None, help="npu, cuda, xpu, mps or cpu (default: the best usable device)")
    model.add_argument("--dtype", choices=DTYPES, default="auto", help="auto: float32 on cpu, float16 elsewhere")
    model.add_argument("--text-encoder-device", default=None, metavar="DEVICE",
                       help="keep the text encoder there (e.g. cpu) and move only the prompt embeddings")  # fmt: skip
    attention = parser.add_argument_group("attention")
    attention.add_argument("--strategy", default=None, help="attention strategy (default auto; npu-port strategies)")
    attention.add_argument("--profile", default=None, help="a profile (name or YAML): its strategy and NPU options")
    image = parser.add_argument_group("image")
    image.add_argument("--prompt", default="a lighthouse at dusk, oil painting")
    image.add_argument("--negative-prompt", default=None)
    image.add_argument("--class", dest="class_label", type=int, default=None,
                       help="class id of a class-conditional model such as tiny-dit (default 1)")  # fmt: skip
    image.add_argument("--steps", type=int, default=steps)
    image.add_argument("--seed", type=int, default=0)
    image.add_argument("--height", type=int, default=None)
    image.add_argument("--width", type=int, default=None)
    image.add_argument("--guidance-scale", type=float, default=4.0)
    image.add_argument("--vae-slicing", action="store_true", help="decode images one at a time (less memory)")
    image.add_argument("--vae-tiling", action="store_true", help="decode in tiles (large images in less memory)")
    image.add_argument("--frames", type=int, default=None,
                       help="frames of a video model (4k+1 for Wan; default: the model's)")  # fmt: skip
    return model, attention, image


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _, attention, _ = add_model_arguments(parser)
    attention.add_argument("--compare", default=None, metavar="S1,S2,...",
                           help="run the same seed under each strategy; compare the images with the first")  # fmt: skip
    attention.add_argument("--tolerance", type=float, default=None,
                           help="largest pixel difference (0..1) --compare accepts (default by dtype)")  # fmt: skip
    parallel = parser.add_argument_group("several devices (torch.distributed; docs/how-to/several-npus.md)")
    parallel.add_argument("--nproc", type=int, default=1,
                          help="processes, one device each (started through torchrun's launcher)")  # fmt: skip
    parallel.add_argument("--ulysses", type=int, default=None,
                          help="Ulysses degree: heads exchanged for sequence (default: the ranks left)")  # fmt: skip
    parallel.add_argument("--ring", type=int, default=None, help="ring degree: keys passed round (default 1)")
    parallel.add_argument("--ulysses-anything", action="store_true",
                          help="let --ulysses split heads it does not divide (pads them; ring 1)")  # fmt: skip
    parallel.add_argument("--cfg-parallel", action="store_true",
                          help="conditional and unconditional halves of guidance on two ranks")  # fmt: skip
    output = parser.add_argument_group("output")
    add_output(output, "image path (default outputs/npu-port.png); a video: NAME.mp4 (the 'video' extra), or an "
               "image path for one image per frame (NAME-000.png, ...)", "PATH", "outputs/npu-port.png")  # fmt: skip
    output.add_argument("--report", default=None, help="JSON report path (default: the image path with .json)")
    add_format(output, help="what to print: text (a summary) or json (the report, as written to --report)")
    add_verbosity(output)
    add_no_progress(output)


def add_parser(commands: "argparse._SubParsersAction") -> None:
    parser = add_command(
        commands,
        "infer",
        help="generate an image with a diffusers pipeline and an attention strategy (time, memory, --compare)",
        description="Run a diffusers pipeline on this machine's device with an attention strategy; write the image "
        "(or video) and a JSON report, or compare strategies on the same seed with --compare.",
        example=[
            "npu-port infer --model tiny --steps 2",
            'npu-port infer --model ./my-sd-pipeline --prompt "a red fox" --steps 30 --dtype float16',
            "npu-port infer --model tiny-wan --frames 9 -o clip.mp4",
            "npu-port infer --profile ascend-910b --text-encoder-device cpu",
            "npu-port infer --model tiny --steps 2 --compare vanilla,sdpa,chunked,auto --format json",
        ],
    )
    add_arguments(parser)


def _versions() -> Dict[str, Optional[str]]:
    from .._optional import installed_version
    from .._version import __version__

    found: Dict[str, Optional[str]] = {"npu_port": __version__, "python": platform.python_version()}
    for name in ("torch", "torch-npu", "diffusers", "transformers"):
        found[name.replace("-", "_")] = installed_version(name)
    return found


def _strategy_and_profile(args: argparse.Namespace):
    from ..errors import InferenceError

    if args.strategy and args.profile:
        raise InferenceError("give --strategy or --profile, not both (a profile names its own strategy)")
    return args.profile or args.strategy or "auto"


def _step_line(result) -> str:
    steady = result.median_step_s
    steady_text = f"{steady * 1e3:.1f} ms per later step (median)" if steady is not None else "one step only"
    return (
        f"first step {result.first_step_s:.3f} s (with set-up), {steady_text}, total {result.total_s:.3f} s; "
        f"peak memory {result.peak_memory['bytes'] / 2**20:.0f} MiB ({result.peak_memory['what']})"
    )


@dataclass
class _Plan:
    """Everything a run needs, checked before any model is loaded."""

    strategy: str
    compare: Optional[List[str]]
    device: Any
    dtype: Any
    encoder_device: Any
    request: Any  # GenerationRequest
    outputs: Any  # npu_port.infer.paths.OutputPlan
    cache: Any  # npu_port.infer.paths.CacheLocation
    layout: Any = None  # npu_port.parallel.ParallelLayout for --nproc > 1, else None


def _preflight(args: argparse.Namespace) -> _Plan:
    """Every argument, path and strategy name checked, cheapest first; the first problem is one line (exit 2)."""
    from ..device import get_device
    from ..errors import InferenceError
    from ..infer.limits import TEXT_TO_VIDEO, UNKNOWN_MODEL, check_tolerance
    from ..infer.models import describe_model, resolve_dtype
    from ..infer.paths import cache_location, plan_outputs
    from ..infer.strategies import check_strategies, check_strategy

    strategy = _strategy_and_profile(args)
    if args.tolerance is not None:
        if not args.compare:
            raise InferenceError("--tolerance applies to --compare only")
        check_tolerance(args.tolerance, "--tolerance")
    request = build_request(args, strategy)
    model = describe_model(args.model)
    check_class_option(args, model.kind)
    (model.limits or UNKNOWN_MODEL).check(request)  # a hub id's own limits are checked again once it is loaded
    device = get_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    encoder_device = get_device(args.text_encoder_device) if args.text_encoder_device else None
    if encoder_device is not None and model.limits is not None:
        model.limits.check_text_encoder_device(args.model)
    compare = check_strategies(args.compare.split(",")) if args.compare else None
    resolved_strategy = check_strategy(strategy)
    layout = _layout(args)
    if layout is not None and layout.context_parallel and getattr(resolved_strategy, "is_custom_processor", False):
        raise InferenceError(
            f"strategy {strategy!r} replaces the attention processors, and context parallelism needs npu-port's "
            "backend on every one (each rank would attend to its own part of the sequence only); use a kernel "
            "strategy (auto, sdpa, npu, ...) with --ulysses / --ring, or --cfg-parallel alone"
        )
    outputs = plan_outputs(args.output, args.report, compare, video=model.kind == TEXT_TO_VIDEO if model.kind else None)
    cache, warning = cache_location()
    if warning:
        note(args, f"npu-port: {warning}")
    return _Plan(strategy, compare, device, dtype, encoder_device, request, outputs, cache, layout)


def build_request(args: argparse.Namespace, strategy: str) -> Any:
    """The :class:`~npu_port.infer.GenerationRequest` the image options (:func:`add_model_arguments`) ask for."""
    from ..infer import GenerationRequest

    return GenerationRequest(
        prompt=args.prompt,
        negative_prompt=args.negative_prompt,
        class_label=GenerationRequest.class_label if args.class_label is None else args.class_label,
        steps=args.steps,
        seed=args.seed,
        height=args.height,
        width=args.width,
        guidance_scale=args.guidance_scale,
        strategy=strategy,
        vae_slicing=args.vae_slicing,
        vae_tiling=args.vae_tiling,
        frames=args.frames,
    )


def check_class_option(args: argparse.Namespace, kind: Optional[str]) -> None:
    """Refuse ``--class`` for a model that takes a prompt (``kind`` None: a hub id, checked again once loaded)."""
    from ..errors import InferenceError
    from ..infer.limits import CLASS_CONDITIONAL

    if args.class_label is not None and kind is not None and kind != CLASS_CONDITIONAL:
        raise InferenceError(
            f"--class is for class-conditional models such as tiny-dit; {args.model!r} is {kind}: describe what to "
            "make with --prompt"
        )


def _layout(args: argparse.Namespace):
    """The multi-device layout for --nproc > 1 (None for one process), with what cannot be combined with it."""
    from ..errors import InferenceError

    parallel = args.ulysses is not None or args.ring is not None or args.cfg_parallel or args.ulysses_anything
    if args.nproc == 1 and not parallel:
        return None
    if args.nproc == 1:
        raise InferenceError("--ulysses / --ring / --cfg-parallel need --nproc N (the processes to split over)")
    if args.ulysses_anything and (args.ring or 1) > 1:
        raise InferenceError("--ulysses-anything works with --ring 1 only (diffusers' rule)")
    for flag, value in (("--compare", args.compare), ("--text-encoder-device", args.text_encoder_device)):
        if value:
            raise InferenceError(f"{flag} runs in one process; leave it out with --nproc {args.nproc}")
    from ..parallel import ParallelLayout
    from ..parallel.layout import require

    layout = ParallelLayout.for_processes(args.nproc, args.ulysses, args.ring, args.cfg_parallel)
    require(layout, args.ulysses_anything)  # the installed diffusers can split this way: said before any work
    return layout


def _image_files(
    results: Dict[Optional[str], Any], plan: _Plan
) -> Tuple[Dict[Path, bytes], Dict[Any, Dict], List[Path]]:
    """The encoded files to write (finite results only: an image, an mp4, or a video's frames), per result what the
    report says about its files (``image``: the first one, ``files``: each with its sha256), and the paths to clear:
    a non-finite result's (an earlier run's picture there would sit beside this report) and an earlier video's
    frames that this run does not write over."""
    from ..infer.paths import earlier_frames
    from ..infer.saving import encode_output, sha256

    files: Dict[Path, bytes] = {}
    entries: Dict[Any, Dict[str, Any]] = {}
    stale: List[Path] = []
    for name, result in results.items():
        path = plan.outputs.images[name]
        earlier = earlier_frames(path) if result.image.ndim == 4 else []
        if not result.finite:  # fail closed: a NaN image would be saved as a black picture that looks like a result
            entries[name] = {"image": None, "image_sha256": None, "files": []}
            stale += [path, *earlier]
            continue
        encoded = encode_output(result.image, path)
        files.update(encoded)
        stale += [frame for frame in earlier if frame not in encoded]
        first = next(iter(encoded))
        entries[name] = {
            "image": str(first),
            "image_sha256": sha256(encoded[first]),
            "files": [{"path": str(written), "sha256": sha256(data)} for written, data in encoded.items()],
        }
    return files, entries, stale


def _what(result) -> str:
    """ "image", or "video (N frames)"."""
    if result.image.ndim == 3:
        return "image"
    frames = result.image.shape[0]
    return f"video ({frames} frame{'s' if frames != 1 else ''})"


def _files_text(files: Dict[Path, bytes]) -> str:
    paths = list(files)
    if len(paths) > 2:
        return f"{paths[0]} .. {paths[-1]} ({len(paths)} files)"
    return ", ".join(str(path) for path in paths) or "none"


def _execute(args: argparse.Namespace, plan: _Plan, written: List[Path]) -> int:
    from ..console import wants_progress
    from ..device import device_name
    from ..errors import InferenceError
    from ..infer import compare_strategies, generate, load_pipeline
    from ..infer.limits import TEXT_TO_VIDEO
    from ..infer.paths import VIDEO_FORMATS
    from ..infer.saving import write_set

    if plan.layout is not None:
        return _execute_parallel(args, plan, written)

    npu_options = None
    if args.profile:
        from ..npu_setup import apply_npu_options

        npu_options = apply_npu_options(args.profile).as_dict()
    loaded = load_pipeline(
        args.model,
        plan.device,
        plan.dtype,
        text_encoder_device=plan.encoder_device,
        progress_bar=wants_progress(args),
        on_build=lambda message: note(args, f"npu-port: {message}"),
        cache=plan.cache,
    )
    request = plan.request
    check_class_option(args, loaded.kind)  # a hub id's kind is known now
    if loaded.kind != TEXT_TO_VIDEO and plan.outputs.image.suffix.lower() in VIDEO_FORMATS:  # a hub id, now known
        raise InferenceError(f"--output {str(plan.outputs.image)!r}: {args.model!r} makes images, not a video")
    report: Dict[str, Any] = {
        "device": str(plan.device),
        "device_name": device_name(plan.device),
        "dtype": str(plan.dtype).replace("torch.", ""),
        "versions": _versions(),
        "model": {
            "requested": loaded.model,
            "source": loaded.source,
            "kind": loaded.kind,
            "random_weights": loaded.random_weights,
        },
        "request": {k: v for k, v in vars(request).items() if k != "strategy"},
        "text_encoder_device": str(plan.encoder_device) if plan.encoder_device else str(plan.device),
        "npu_options": npu_options,
        "disk_cache": loaded.disk_cache,
    }
    if loaded.random_weights:
        what = "video" if loaded.kind == TEXT_TO_VIDEO else "image"
        note(args, f"npu-port: model {loaded.model!r} has random weights: the {what} is noise-like by design")
    report_path = plan.outputs.report
    if plan.compare:
        comparison = compare_strategies(loaded, request, plan.compare, args.tolerance)
        files, entries, stale = _image_files(comparison.results, plan)
        details = comparison.as_dict()
        for name, entry in entries.items():
            details["strategies"][name].update(entry)
        report.update(comparison=details, images=[str(path) for path in files])
        write_set(files, report_path, report, plan.outputs.lock, written, stale)
        if wants_json(args):
            _print_json(report)
        else:
            if not args.quiet:
                print(comparison.format())
            print(f"images: {_files_text(files)}; report: {report_path}")
        return 1 if comparison.diverged else 0
    result = generate(loaded, request)
    files, entries, stale = _image_files({None: result}, plan)
    report.update(result.as_dict(), **entries[None])
    write_set(files, report_path, report, plan.outputs.lock, written, stale)
    device_text = f"{plan.device} ({device_name(plan.device)}), {report['dtype']}"
    if wants_json(args):
        _print_json(report)
    elif not args.quiet:
        print(f"{device_text}, strategy {plan.strategy} -> {result.strategy_resolved}")
        print(_step_line(result))
    if not result.finite:
        print(
            f"npu-port: the image under strategy {plan.strategy} (resolved {result.strategy_resolved}) is not finite "
            f"({result.non_finite} of {result.image.size} values are NaN or inf): no image written; report: "
            f"{report_path}",
            file=sys.stderr,
        )
        return 1
    if not wants_json(args):
        print(f"{_what(result)}: {_files_text(files)}; report: {report_path}")
    return 0


def _print_json(report: Dict[str, Any]) -> None:
    """``--format json``: the report as written to ``--report`` (non-finite numbers as null), on stdout."""
    import json

    from ..atomic import json_safe

    print(json.dumps(json_safe(report), indent=2, default=str, allow_nan=False))


def _execute_parallel(args: argparse.Namespace, plan: _Plan, written: List[Path]) -> int:
    """--nproc N: the ranks generate, this process writes rank 0's image and the report (with every rank's timing)."""
    from ..console import wants_progress
    from ..device import device_name
    from ..errors import InferenceError
    from ..infer.models import describe_model
    from ..infer.multi import rank_lines, run_parallel
    from ..infer.paths import VIDEO_FORMATS
    from ..infer.saving import write_set

    dtype = str(plan.dtype).replace("torch.", "")
    if describe_model(args.model).builtin:
        note(args, f"npu-port: model {args.model!r} has random weights: the image is noise-like by design")
    result, ranks = run_parallel(
        args.model,
        plan.device.type,
        dtype,
        plan.request,
        plan.layout,
        plan.cache,
        wants_progress(args),
        anything=args.ulysses_anything,
        profile=args.profile,
        on_build=lambda message: note(args, f"npu-port: {message}"),
    )
    report: Dict[str, Any] = {
        "device": plan.device.type,
        "device_name": device_name(plan.device),
        "dtype": dtype,
        "versions": _versions(),
        "model": {"requested": args.model, "random_weights": describe_model(args.model).builtin},
        "npu_options": result.details.pop("npu_options", None),
        "request": {k: v for k, v in vars(plan.request).items() if k != "strategy"},
        "parallel": {
            "nproc": plan.layout.world,
            "ulysses": plan.layout.ulysses,
            "ring": plan.layout.ring,
            "cfg_parallel": plan.layout.cfg,
            "ranks": ranks,
        },
    }
    if result.image.ndim == 3 and plan.outputs.image.suffix.lower() in VIDEO_FORMATS:  # a hub id, known only now
        raise InferenceError(f"--output {str(plan.outputs.image)!r}: {args.model!r} makes images, not a video")
    files, entries, stale = _image_files({None: result}, plan)
    report.update(result.as_dict(), **entries[None])
    write_set(files, plan.outputs.report, report, plan.outputs.lock, written, stale)
    if wants_json(args):
        _print_json(report)
    elif not args.quiet:
        print(f"{plan.device.type} x {plan.layout.world} ({plan.layout.describe()}), {dtype}, strategy "
              f"{plan.strategy} -> {result.strategy_resolved}")  # fmt: skip
        print(_step_line(result) + " (rank 0)")
        print("\n".join(rank_lines(ranks)))
    if not result.finite:
        print(f"npu-port: the image is not finite ({result.non_finite} values are NaN or inf): no image written; "
              f"report: {plan.outputs.report}", file=sys.stderr)  # fmt: skip
        return 1
    if not wants_json(args):
        print(f"{_what(result)}: {_files_text(files)}; report: {plan.outputs.report}")
    return 0


def run(args: argparse.Namespace) -> int:
    written: List[Path] = []
    from ..console import for_command
    from ..errors import RankFailedError

    try:
        plan = _preflight(args)  # bad input is said before the console takes over (and before any import it costs)
        with for_command(args):  # the libraries' warnings and loading bars, hidden while the model loads and runs
            return _execute(args, plan, written)
    except RankFailedError as exc:  # not bad input: the run failed (its traceback is above)
        print(f"npu-port: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        what = "the image(s) and report had been written whole" if written else "nothing was written"
        print(f"npu-port: interrupted (Ctrl-C); {what}", file=sys.stderr)
        return EXIT_INTERRUPTED


def main(argv: Optional[List[str]] = None) -> int:
    """``scripts/inference_npu.py``: the same as ``npu-port infer``."""
    from .main import main as cli_main

    return cli_main(["infer", *(sys.argv[1:] if argv is None else argv)])
