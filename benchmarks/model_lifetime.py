"""Swapping models under a strategy, without ``restore()``: how many dropped models stay alive, and how much memory.

What a server, a notebook or a test suite does: build a model, apply a strategy to it, run it, set another processor
on it (``set_default_attn_processor``: what diffusers' own tests and many scripts do), and drop it — never calling
``handle.restore()``. Before issue 13 npu-port's watcher table kept every such model alive (one model's memory per
swap; on an NPU, device memory). Each swap here uses a UNet of about ``--channels``-wide blocks; after each swap the
script collects garbage and records how many of the dropped models are still alive (weak references) and the
process's resident memory.

Only the public API is used (``set_attention_strategy(..., target=model)``), so the same script measures an older
checkout: run it with that checkout first on ``PYTHONPATH`` to get the "before" numbers.

    python benchmarks/model_lifetime.py                                  # results to benchmarks/results/
    python benchmarks/model_lifetime.py --swaps 4 --channels 64 --out /tmp/r --label before
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def resident_bytes() -> int:
    """The process's resident set size now (Linux ``/proc/self/statm``), not the peak."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_unet(channels: int):
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(channels, 2 * channels),
        layers_per_block=1,
        norm_num_groups=8,
        cross_attention_dim=64,
        attention_head_dim=8,
    ).eval()


def run(model, torch) -> None:
    with torch.no_grad():
        model(torch.randn(1, 4, 16, 16), 1, encoder_hidden_states=torch.randn(1, 5, 64))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swaps", type=int, default=8, help="models built, used and dropped (default 8)")
    parser.add_argument("--channels", type=int, default=256, help="width of the UNet's first block (default 256)")
    parser.add_argument("--strategy", default="sdpa")
    parser.add_argument("--label", default="current", help="name of this run in the results (e.g. before / after)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()

    import torch

    import npu_port

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    gone = []
    rows = []
    start = resident_bytes()
    model_bytes = None
    for swap in range(args.swaps):
        model = build_unet(args.channels)
        if model_bytes is None:
            model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        npu_port.set_attention_strategy(args.strategy, target=model)  # the handle is dropped: never restored
        run(model, torch)
        model.set_default_attn_processor()
        run(model, torch)
        gone.append(weakref.ref(model))
        del model
        gc.collect()
        alive = sum(ref() is not None for ref in gone)
        rows.append({"swap": swap + 1, "alive_models": alive, "resident_mib": round(resident_bytes() / MiB, 1)})
        print(f"swap {swap + 1}: {alive} dropped models alive, resident {rows[-1]['resident_mib']} MiB", flush=True)

    from npu_port.bench.results import machine_info

    checkout = Path(npu_port.__file__).resolve().parents[1]  # the checkout measured, not necessarily this one
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True)
    result = {
        "benchmark": "model_lifetime",
        "label": args.label,
        "npu_port_imported_from": str(Path(npu_port.__file__).resolve().parent),
        "commit": commit.stdout.strip() or None,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "strategy": args.strategy,
        "model_parameters_mib": round(model_bytes / MiB, 1),
        "resident_at_start_mib": round(start / MiB, 1),
        "swaps": rows,
        "machine": machine_info(torch.device("cpu")),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"model_lifetime_cpu_{args.label}.json"
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
