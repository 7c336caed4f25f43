"""What recording a run for ``npu-port diff`` costs: time and dump size of ``capture`` on the tiny pipelines,
statistics only (the default) vs every tensor kept whole (``full=True``).

For each model one loaded pipeline runs the same request (``npu-port infer``'s :func:`generate`, strategy vanilla,
fixed seed) three ways — plain, under ``capture`` with statistics only, under ``capture(full=True)`` — in
interleaved rounds (the order rotates every round, so drift on a noisy machine hits all three alike); the ratios of
medians are the overhead. Each captured run's dump is written to a temporary folder and removed after it is timed
(writing it is part of the cost). One more run of each capture mode gives the dump's size on disk, its records and
tensors.

    python benchmarks/diff_capture.py [--models tiny,tiny-dit,tiny-flux] [--rounds 7] [--steps 4] [--threads N]
                                      [--out benchmarks/results/diff_capture_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from typing import Any, Dict

import torch

from npu_port.bench.results import machine_info
from npu_port.device.timing import Rounds, timed
from npu_port.diff import Dump, capture
from npu_port.infer.models import TINY_MODELS, load_pipeline
from npu_port.infer.run import GenerationRequest, generate

MODES = ("plain", "stats", "full")


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def measure(model: str, rounds: int, steps: int, warmup: int, scratch: str) -> Dict[str, Any]:
    loaded = load_pipeline(model, torch.device("cpu"), torch.float32, progress_bar=False)
    request = GenerationRequest(steps=steps, strategy="vanilla", seed=0)
    counter = [0]

    def one(mode: str, keep: bool = False) -> Dict[str, Any]:
        if mode == "plain":
            return {"seconds": timed(lambda: generate(loaded, request))[1]}
        counter[0] += 1
        path = os.path.join(scratch, f"{model}-{mode}-{counter[0]}.d")

        def recorded():
            with capture(loaded.pipe, path, full=(mode == "full")) as recorder:
                generate(loaded, request)
            return recorder

        recorder, seconds = timed(recorded)
        found = {"seconds": seconds}
        if keep:
            dump = Dump(recorder.path)
            found.update(bytes=folder_bytes(recorder.path), records=len(list(dump.records())))
            found.update(tensors=dump.index.get("tensors", 0), shards=len(dump.index.get("shards", [])))
        shutil.rmtree(recorder.path)
        return found

    sizes = {mode: one(mode, keep=True) for mode in MODES[1:]}  # also a warm-up of each
    table = Rounds(list(MODES), lambda mode: one(mode)["seconds"])
    table.run(rounds, untimed=warmup)
    spreads = dict(zip(MODES, table.spreads()))
    medians = {mode: spreads[mode].median for mode in MODES}
    return {
        "steps": steps,
        "median_seconds": medians,
        "quartiles_seconds": {mode: [spreads[mode].low, spreads[mode].high] for mode in MODES},
        "all_seconds": dict(zip(MODES, table.samples)),
        "ratio_stats": medians["stats"] / medians["plain"],
        "ratio_full": medians["full"] / medians["plain"],
        "dump": {mode: {k: v for k, v in found.items() if k != "seconds"} for mode, found in sizes.items()},
        "bytes_ratio_full_vs_stats": sizes["full"]["bytes"] / sizes["stats"]["bytes"],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,tiny-dit,tiny-flux", help=f"of: {', '.join(TINY_MODELS)}")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--out", default=None, help="write the result JSON here")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in TINY_MODELS]
    if unknown or not models:
        parser.error(f"unknown model {unknown[0] if unknown else '(none)'!r}; valid models: {', '.join(TINY_MODELS)}")
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0 or (args.threads is not None and args.threads < 1):
        parser.error("--rounds, --steps and --threads must be >= 1, --warmup >= 0")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    result: Dict[str, Any] = {
        "benchmark": "diff_capture",
        "machine": machine_info("cpu"),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "dtype": "float32",
        "rounds": args.rounds,
        "warmup": args.warmup,
        "threads": torch.get_num_threads(),
        "load_average_at_start": os.getloadavg()[0],
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="npu-port-diff-bench-") as scratch:
        for model in models:
            row = result["models"][model] = measure(model, args.rounds, args.steps, args.warmup, scratch)
            ms = {mode: row["median_seconds"][mode] * 1e3 for mode in MODES}
            stats, full = row["dump"]["stats"], row["dump"]["full"]
            print(
                f"{model:<10} plain {ms['plain']:8.1f} ms  stats {ms['stats']:8.1f} ms (x{row['ratio_stats']:.2f})  "
                f"full {ms['full']:8.1f} ms (x{row['ratio_full']:.2f})  dump {stats['bytes'] / 2**20:.2f} MiB "
                f"({stats['records']} records) vs {full['bytes'] / 2**20:.2f} MiB ({full['tensors']} tensors)"
            )
    result["load_average_at_end"] = os.getloadavg()[0]
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
