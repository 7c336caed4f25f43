"""What the cuda -> cpu redirect costs: a small CUDA-written training loop run on the CPU under
``npu_port.redirect_cuda("cpu")`` vs the same loop written for the CPU.

Each run is its own process (import and patch costs are paid the way a user pays them, and no process warms the
other's caches); the two variants alternate within every round so drift on a noisy machine hits both alike. Each
process reports the time of its training loop; the result is the ratio of the medians. The final losses must agree
exactly: the redirect may not change the computation.

    python benchmarks/redirect_overhead.py [--rounds 15] [--steps 200] [--out benchmarks/results/...json]
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOOPS = {
    "cpu-written": HERE / "redirect" / "train_cpu.py",
    "cuda-written, redirected": HERE / "redirect" / "train_cuda.py",
}
TARGET_RATIO = 1.05


def _child(variant: str, steps: int) -> None:
    """One measured run, in this process: prints the loop's seconds and final loss as JSON."""
    import npu_port

    warnings.simplefilter("ignore", FutureWarning)  # torch.cuda.amp.* deprecation notices
    train = runpy.run_path(str(LOOPS[variant]))["train"]
    if variant == "cpu-written":
        result = train(steps)
    else:
        with npu_port.redirect_cuda("cpu"):
            result = train(steps)
    print(json.dumps({"seconds": result["seconds"], "final_loss": result["losses"][-1], "device": result["device"]}))


def _run(variant: str, steps: int) -> dict:
    command = [sys.executable, __file__, "--child", variant, "--steps", str(steps)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default=None, help="write the result JSON here")
    parser.add_argument("--child", choices=sorted(LOOPS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.steps)
        return 0

    from npu_port.bench.results import machine_info
    from npu_port.device.timing import Rounds

    runs = {variant: [] for variant in LOOPS}

    def one_process(variant: str) -> float:
        runs[variant].append(_run(variant, args.steps))
        return runs[variant][-1]["seconds"]  # the loop's own time, taken in the child

    rounds = Rounds(list(LOOPS), one_process)
    rounds.run(args.rounds)  # alternating: the order swaps every round
    medians = {variant: summary.median for variant, summary in zip(LOOPS, rounds.spreads())}
    ratio = medians["cuda-written, redirected"] / medians["cpu-written"]
    losses = {variant: {run["final_loss"] for run in results} for variant, results in runs.items()}
    same_outputs = len(losses["cpu-written"] | losses["cuda-written, redirected"]) == 1
    result = {
        "benchmark": "redirect_overhead",
        "machine": machine_info("cpu"),
        "rounds": args.rounds,
        "steps": args.steps,
        "median_seconds": medians,
        "all_seconds": {variant: [run["seconds"] for run in results] for variant, results in runs.items()},
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "same_final_loss": same_outputs,
        "passed": ratio <= TARGET_RATIO and same_outputs,
    }
    for variant, median in medians.items():
        print(f"{variant:<25} {median * 1e3:9.1f} ms per {args.steps}-step loop (median of {args.rounds} processes)")
    print(f"ratio {ratio:.4f} (target <= {TARGET_RATIO}); identical final loss: {same_outputs}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
