"""``npu-port infer`` (also ``scripts/inference_npu.py``): run a diffusers pipeline on this machine's device with an
attention strategy, write the image and a JSON report, or prove a port faithful with ``--compare``.

    npu-port infer                                            # the tiny text-to-image model (random weights)
    npu-port infer --model ./my-sd-pipeline --prompt "a red fox" --steps 30 --dtype float16
    npu-port infer --profile ascend-910b --text-encoder-device cpu
    npu-port infer --compare vanilla,sdpa,chunked,auto        # same seed per strategy: time, max|diff|, PSNR

Exit codes: 0 done (and, with --compare, every image within tolerance of the first); 1 a strategy's image diverged;
2 bad input (a missing model, a size out of range, an unknown strategy) — one line, no traceback.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

#: Same as npu_port.infer.models.DTYPES (kept here so that --help never imports torch).
DTYPES = ("auto", "float32", "float16", "bfloat16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument("--model", default="tiny", help="'tiny' (default), 'tiny-dit', a pipeline directory or a hub id")
    model.add_argument("--device", default=None, help="npu, cuda, xpu, mps or cpu (default: the best usable device)")
    model.add_argument("--dtype", choices=DTYPES, default="auto", help="auto: float32 on cpu, float16 elsewhere")
    model.add_argument("--text-encoder-device", default=None, metavar="DEVICE",
                       help="keep the text encoder there (e.g. cpu) and move only the prompt embeddings")  # fmt: skip
    attention = parser.add_argument_group("attention")
    attention.add_argument("--strategy", default=None, help="attention strategy (default auto; npu-port strategies)")
    attention.add_argument("--profile", default=None, help="a profile (name or YAML): its strategy and NPU options")
    attention.add_argument("--compare", default=None, metavar="S1,S2,...",
                           help="run the same seed under each strategy; compare the images with the first")  # fmt: skip
    attention.add_argument("--tolerance", type=float, default=None,
                           help="largest pixel difference (0..1) --compare accepts (default by dtype)")  # fmt: skip
    image = parser.add_argument_group("image")
    image.add_argument("--prompt", default="a lighthouse at dusk, oil painting")
    image.add_argument("--negative-prompt", default=None)
    image.add_argument("--class", dest="class_label", type=int, default=1, help="class id (class-conditional models)")
    image.add_argument("--steps", type=int, default=10)
    image.add_argument("--seed", type=int, default=0)
    image.add_argument("--height", type=int, default=None)
    image.add_argument("--width", type=int, default=None)
    image.add_argument("--guidance-scale", type=float, default=4.0)
    image.add_argument("--vae-slicing", action="store_true", help="decode images one at a time (less memory)")
    image.add_argument("--vae-tiling", action="store_true", help="decode in tiles (large images in less memory)")
    output = parser.add_argument_group("output")
    output.add_argument("--output", default="outputs/npu-port.png", help="image path (default outputs/npu-port.png)")
    output.add_argument("--report", default=None, help="JSON report path (default: the image path with .json)")
    output.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_parser(commands: "argparse._SubParsersAction") -> None:
    parser = commands.add_parser(
        "infer",
        help="generate an image with a diffusers pipeline and an attention strategy (time, memory, --compare)",
        description=__doc__.split("\n\n")[0],
    )
    add_arguments(parser)


def _versions() -> Dict[str, Optional[str]]:
    from importlib.metadata import PackageNotFoundError, version

    from .._version import __version__

    found: Dict[str, Optional[str]] = {"npu_port": __version__, "python": platform.python_version()}
    for name in ("torch", "torch-npu", "diffusers", "transformers"):
        try:
            found[name.replace("-", "_")] = version(name)
        except PackageNotFoundError:
            found[name.replace("-", "_")] = None
    return found


def _strategy_and_profile(args: argparse.Namespace):
    from ..errors import InferenceError

    if args.strategy and args.profile:
        raise InferenceError("give --strategy or --profile, not both (a profile names its own strategy)")
    return args.profile or args.strategy or "auto"


def _report_path(args: argparse.Namespace) -> Path:
    return Path(args.report) if args.report else Path(args.output).with_suffix(".json")


def _write_json(path: Path, data: Dict[str, Any]) -> None:
    from ..atomic import write_json

    write_json(path, data)  # never a half-written report, nor another run's


def _save_image(image, path: Path) -> None:
    from ..atomic import write_with
    from ..infer.run import to_pil

    write_with(path, to_pil(image).save)


def _step_line(result) -> str:
    steady = result.median_step_s
    steady_text = f"{steady * 1e3:.1f} ms per later step (median)" if steady is not None else "one step only"
    return (
        f"first step {result.first_step_s:.3f} s (with set-up), {steady_text}, total {result.total_s:.3f} s; "
        f"peak memory {result.peak_memory['bytes'] / 2**20:.0f} MiB ({result.peak_memory['what']})"
    )


def run(args: argparse.Namespace) -> int:
    from ..device import device_name, get_device
    from ..infer import GenerationRequest, compare_strategies, generate, load_pipeline
    from ..infer.models import resolve_dtype

    strategy = _strategy_and_profile(args)
    device = get_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    encoder_device = get_device(args.text_encoder_device) if args.text_encoder_device else None
    npu_options = None
    if args.profile:
        import npu_port

        npu_options = npu_port.apply_npu_options(args.profile).as_dict()
    loaded = load_pipeline(
        args.model,
        device,
        dtype,
        text_encoder_device=encoder_device,
        progress_bar=not args.no_progress,
        on_build=lambda message: print(f"npu-port: {message}", file=sys.stderr),
    )
    request = GenerationRequest(
        prompt=args.prompt,
        negative_prompt=args.negative_prompt,
        class_label=args.class_label,
        steps=args.steps,
        seed=args.seed,
        height=args.height,
        width=args.width,
        guidance_scale=args.guidance_scale,
        strategy=strategy,
        vae_slicing=args.vae_slicing,
        vae_tiling=args.vae_tiling,
    )
    report: Dict[str, Any] = {
        "device": str(device),
        "device_name": device_name(device),
        "dtype": str(dtype).replace("torch.", ""),
        "versions": _versions(),
        "model": {
            "requested": loaded.model,
            "source": loaded.source,
            "kind": loaded.kind,
            "random_weights": loaded.random_weights,
        },
        "request": {k: v for k, v in vars(request).items() if k != "strategy"},
        "text_encoder_device": str(encoder_device) if encoder_device else str(device),
        "npu_options": npu_options,
    }
    if loaded.random_weights:
        print(
            f"npu-port: model {loaded.model!r} has random weights: the image is noise-like by design", file=sys.stderr
        )
    output = Path(args.output)
    if args.compare:
        comparison = compare_strategies(loaded, request, args.compare.split(","), args.tolerance)
        images: List[str] = []
        for name, result in comparison.results.items():
            path = output.with_name(f"{output.stem}-{name}{output.suffix}")
            _save_image(result.image, path)
            images.append(str(path))
        report.update(comparison=comparison.as_dict(), images=images)
        _write_json(_report_path(args), report)
        print(comparison.format())
        print(f"images: {', '.join(images)}; report: {_report_path(args)}")
        return 1 if comparison.diverged else 0
    result = generate(loaded, request)
    _save_image(result.image, output)
    report.update(result.as_dict(), image=str(output))
    _write_json(_report_path(args), report)
    print(f"{device} ({device_name(device)}), {report['dtype']}, strategy {strategy} -> {result.strategy_resolved}")
    print(_step_line(result))
    print(f"image: {output}; report: {_report_path(args)}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``scripts/inference_npu.py``: the same as ``npu-port infer``."""
    from .main import main as cli_main

    return cli_main(["infer", *(sys.argv[1:] if argv is None else argv)])
