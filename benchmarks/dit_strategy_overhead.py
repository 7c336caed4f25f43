"""What npu-port's routing costs: the tiny DiT pipeline under our ``sdpa`` strategy vs diffusers' own
``AttnProcessor2_0``, in one process on one machine.

Both sides run the same SDPA kernel; the difference is our processor, the call validation, the bucket lookup and
the mask handling. Two copies of the pipeline are loaded from the same saved directory (one with the strategy
applied, one untouched) and run in alternating order for ``--rounds`` rounds, so drift on a noisy machine hits both
alike; the ratio of medians is the result. The images are compared too: the port must not change the output.

    python benchmarks/dit_strategy_overhead.py [--rounds 30] [--steps 10] [--out benchmarks/results/...json]
    python benchmarks/dit_strategy_overhead.py --device cuda --dtype float16   # on a GPU (benchmarks/gpu/)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone

import torch

import npu_port
from npu_port.device import device_name
from npu_port.device.timing import Rounds, timed
from npu_port.integrations.diffusers.tiny import run_tiny_pipeline, tiny_dit_pipeline

TARGET_RATIO = 1.02


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, npu, ...")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--out", default=None, help="write the result JSON here")
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)

    with tempfile.TemporaryDirectory() as tmp:
        save_dir = os.path.join(tmp, "dit")
        original = tiny_dit_pipeline(save_dir=save_dir)
        ported = tiny_dit_pipeline(save_dir=save_dir)
    original.to(device=device, dtype=dtype)
    ported.to(device=device, dtype=dtype)
    handle = npu_port.set_attention_strategy("sdpa", target=ported)
    try:
        reference = run_tiny_pipeline(original, steps=args.steps)
        ours = run_tiny_pipeline(ported, steps=args.steps)
        max_diff = float((reference.float().cpu() - ours.float().cpu()).abs().max())
        pipes = {"AttnProcessor2_0": original, "npu-port sdpa": ported}
        rounds = Rounds(list(pipes.values()), lambda pipe: timed(lambda: run_tiny_pipeline(pipe, steps=args.steps))[1])
        rounds.run(args.rounds, untimed=args.warmup)  # alternating: the order swaps every round
        calls = handle.calls
    finally:
        handle.restore()

    medians = {label: summary.median for label, summary in zip(pipes, rounds.spreads())}
    ratio = medians["npu-port sdpa"] / medians["AttnProcessor2_0"]
    result = {
        "benchmark": "dit_strategy_overhead",
        "machine": {
            "device": device_name(device),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "npu_port": npu_port.__version__,
        },
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "dtype": args.dtype,
        "rounds": args.rounds,
        "steps": args.steps,
        "median_seconds": medians,
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "passed": ratio <= TARGET_RATIO,
        "max_abs_image_diff": max_diff,
        "routed_attention_calls": calls,
    }
    for label, median in medians.items():
        print(f"{label:<18} {median * 1e3:9.2f} ms per pipeline run (median of {args.rounds})")
    print(f"ratio {ratio:.4f} (target <= {TARGET_RATIO}); max |image diff| {max_diff:.2e}; calls {calls}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
