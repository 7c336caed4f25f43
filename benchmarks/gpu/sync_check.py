"""Where does a pipeline run wait for the GPU? The tiny DiT pipeline under diffusers' own processor and under our
``sdpa`` strategy, with ``torch.cuda.set_sync_debug_mode("warn")``: every synchronising operation (``.item()``,
``bool(tensor)``, a copy to the host) warns, and each warning is booked to the innermost frame outside torch.

A synchronisation per attention call stalls a launch-bound pipeline (the CPU waits for the queue to drain before it
can enqueue the next kernel), which is what the GPU run of ``dit_strategy_overhead.py`` showed as a 15 % slowdown.

    python benchmarks/gpu/sync_check.py [--steps 4] [--out result.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import traceback
import warnings

import torch

import npu_port
from npu_port.integrations.diffusers.tiny import run_tiny_pipeline, tiny_dit_pipeline

_TORCH = os.path.dirname(torch.__file__)


def _count_syncs(pipe, steps: int) -> collections.Counter:
    seen: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" not in str(message).lower():
            return
        frames = [f for f in traceback.extract_stack()[:-1] if not f.filename.startswith(_TORCH)]
        frames = [f for f in frames if "warnings.py" not in f.filename]
        where = frames[-1] if frames else None
        seen[f"{where.filename}:{where.lineno} ({where.name})" if where else "?"] += 1

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run_tiny_pipeline(pipe, steps=steps)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return seen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        original = tiny_dit_pipeline(save_dir=os.path.join(tmp, "dit"))
        ported = tiny_dit_pipeline(save_dir=os.path.join(tmp, "dit"))
    for pipe in (original, ported):
        pipe.to(device="cuda", dtype=dtype)
        run_tiny_pipeline(pipe, steps=1)  # warm-up: lazy initialisation is not the steady state
    handle = npu_port.set_attention_strategy("sdpa", target=ported)
    try:
        run_tiny_pipeline(ported, steps=1)
        result = {"diffusers": _count_syncs(original, args.steps), "npu-port sdpa": _count_syncs(ported, args.steps)}
    finally:
        handle.restore()
    for label, seen in result.items():
        print(f"{label}: {sum(seen.values())} synchronising operations in {args.steps} steps")
        for where, count in seen.most_common(12):
            print(f"  {count:5d}  {where}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({k: dict(v) for k, v in result.items()}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
