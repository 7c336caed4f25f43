"""``npu-port plan``: which of a model's attention calls would run fused on an NPU (or another device), from here.

The model runs once on this machine's CPU, in the dtype the target would use, with every attention call recorded;
each call signature is then judged for the target by the strategy's rule and the kernels' own reasons. Exit codes: 0
a plan was made; 1 with --require-fused when some calls would not run fused; 2 bad input (an unknown model, chip,
device or strategy) — one line, before anything is loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional

from .infer_cmd import DTYPES
from .vocabulary import add_command, add_format, add_output, add_verbosity, note, wants_json

EXIT_NOT_ALL_FUSED = 1
#: -o/--output: the plan as JSON.
PRIMARY_OUTPUT = "plan JSON"


#: What ``--verbose`` does for ``npu-port plan``.
PLAN_VERBOSE = "the plan shows every registered kernel's reasons"


def add_plan_target_arguments(parser: Any, device_help: Optional[str], verbose_help: str = PLAN_VERBOSE) -> None:
    """What ``plan`` and ``run --plan`` share: the target and how the plan is shown (``--device`` unless
    ``device_help`` is None: ``run`` has its own, which ``--plan`` reads as the target; ``run`` says what its
    ``--verbose`` does without ``--plan`` too, and adds its ``-q/-v`` where the rest of its options are)."""
    if device_help is not None:
        parser.add_argument("--device", default=None, help=device_help)
    parser.add_argument(
        "--chip", default=None, help="the Ascend chip to plan for (--device npu): 910A, 910B, 910C, 950, 310P"
    )
    add_format(parser, help="print the plan as a table (text, the default) or as JSON")
    parser.add_argument(
        "--require-fused", action="store_true", help="exit 1 unless every attention call would run fused (for CI)"
    )
    if device_help is not None:
        add_verbosity(parser, verbose_help)


def add_parser(commands: "argparse._SubParsersAction") -> None:
    parser = add_command(
        commands,
        "plan",
        help="which attention calls of a model would run fused on an NPU, and why not (recorded on this machine)",
        example=[
            "npu-port plan --device npu --model tiny-flux",
            "npu-port plan --device npu --chip 910A --model ./my-pipeline --height 1024 --width 1024 --steps 1",
            "npu-port plan --device npu --model tiny-wan --strategy auto --format json -o plan.json",
        ],
    )
    parser.add_argument(
        "--model",
        required=True,
        help="a built-in tiny pipeline (tiny, tiny-dit, tiny-flux, tiny-wan) or a local diffusers directory",
    )
    add_plan_target_arguments(
        parser,
        "the device to plan for: npu (default), cuda or cpu",
        verbose_help=f"{PLAN_VERBOSE}, and the libraries' warnings and loading bars (hidden by default)",
    )
    parser.add_argument("--strategy", default=None, help="the attention strategy to judge with (default npu)")
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="the model's dtype on the target (auto: what npu-port infer picks there: float16 on npu and cuda)",
    )
    parser.add_argument("--steps", type=int, default=2, help="denoising steps to record (each makes the same calls)")
    parser.add_argument(
        "--height", type=int, default=None, help="image height (calls follow the size; default: the model's)"
    )
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--frames", type=int, default=None, help="video frames (text-to-video models)")
    add_output(parser, "also write the plan as JSON to FILE")


def plan_target(device: Optional[str], chip: Optional[str]) -> Any:
    """The :class:`~npu_port.attn.target.Target`: ``--device`` (default npu) and ``--chip``, checked."""
    from ..attn.target import Target

    return Target.of(device if device is not None else "npu", chip)


def check_output(path: Optional[str]) -> None:
    from pathlib import Path

    from ..atomic import folder_problem, link_problem
    from ..errors import PlanError

    if path is None:
        return
    if Path(path).is_dir():
        raise PlanError(f"--output {path!r} is a folder; give a file path such as plan.json")
    problem = link_problem(path)
    if problem:
        raise PlanError(f"--output {path!r} {problem}")
    problem = folder_problem(Path(path).expanduser().resolve().parent)
    if problem:
        raise PlanError(f"--output {path!r}: cannot write there ({problem})")


def show_plan(plan: Any, args: argparse.Namespace, output: Optional[str] = None) -> int:
    """Print the plan (text or ``--format json``), write ``output``; the exit code (1: ``--require-fused`` and not
    all)."""
    from ..atomic import json_safe, write_json
    from ..plan.report import format_plan

    data = plan.to_dict()
    if output is not None:
        write_json(output, data)
    if wants_json(args):
        print(json.dumps(json_safe(data), indent=2, allow_nan=False))
    else:
        print(format_plan(plan, verbose=args.verbose))
    if args.require_fused and not plan.all_fused:
        print(
            f"npu-port plan: {plan.calls - plan.fused} of {plan.calls} attention calls would not run fused "
            "(--require-fused)",
            file=sys.stderr,
        )
        return EXIT_NOT_ALL_FUSED
    return 0


def run(args: argparse.Namespace) -> int:
    from ..infer.run import GenerationRequest
    from ..plan.models import check_diffusers, check_model, plan_dtype, record_model
    from ..plan.record import recording_strategy

    target = plan_target(args.device, args.chip)
    strategy = recording_strategy(args.strategy or "npu")
    dtype = plan_dtype(args.dtype, target)
    request = GenerationRequest(steps=args.steps, height=args.height, width=args.width, frames=args.frames)
    check_model(args.model, request)
    check_output(args.output)
    check_diffusers()  # last: importing diffusers takes seconds

    def building(message: str) -> None:
        note(args, f"npu-port: {message}")

    from ..console import for_command
    from ..plan import assess

    with for_command(args):  # the libraries' warnings and loading bars, hidden while the model loads and runs
        recording = record_model(args.model, dtype, request, strategy, on_build=building)
    plan = assess(
        recording,
        target,
        strategy,
        model=args.model,
        dtype=str(dtype).replace("torch.", ""),
        verbose=args.verbose,
    )
    return show_plan(plan, args, args.output)
