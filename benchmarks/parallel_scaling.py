"""Multi-process scaling on this machine: for 1, 2 and 4 processes and each layout (Ulysses, ring, Ulysses x ring,
CFG parallel), the time per denoising step and the bytes each rank sends per step — measured (npu-port's collective
tally, in the report of ``npu-port infer --nproc``) against the analytic figure for the layout.

    python benchmarks/parallel_scaling.py                       # tiny-flux and tiny-wan, 1/2/4 processes
    python benchmarks/parallel_scaling.py --models tiny-wan --steps 6 --out benchmarks/results/parallel_scaling_cpu.json

The analytic figure, per rank and per step, for a transformer whose context-parallel attention sees ``B`` x ``S``
tokens (the whole sequence: image and text for Flux's joint attention, the video tokens for Wan's self-attention),
``H`` heads of ``D`` and ``L`` such calls per forward, in ``e``-byte elements, over ``N = U x R`` ranks:

* Ulysses: 4 all-to-alls per call (q, k, v, out), each rank sending ``(U-1)/U`` of ``B (S/N) H D e``;
* ring: one all-gather of k and v per call, ``2 B (S/R) (H/U) D e`` sent to each of ``R-1`` peers;
* a key mask: gathered once per forward, ``B (S/N)`` bytes to each of ``N-1`` peers;
* CFG parallel: one exchange of the denoiser's output per step (``alternate``) or per call (``batch``).

diffusers' own gather of the model output at the end of the plan is not npu-port's collective and is listed apart.
On a CPU with gloo the time says little about an NPU (shared cores, memory-bound kernels); the bytes are what an NPU
user can plan with: multiply by the model's real S, H, D, L.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

LAYOUTS = {
    1: [("single", [])],
    2: [("ulysses 2", ["--ulysses", "2"]), ("ring 2", ["--ring", "2"]), ("cfg 2", ["--cfg-parallel"])],
    4: [
        ("ulysses 4", ["--ulysses", "4"]),
        ("ring 4", ["--ring", "4"]),
        ("ulysses 2 x ring 2", ["--ulysses", "2", "--ring", "2"]),
        ("cfg 2 x ulysses 2", ["--ulysses", "2", "--cfg-parallel"]),
    ],
}


def model_shapes(model: str, steps: int) -> Dict[str, Any]:
    """The context-parallel attention's global shapes, from one single-process forward of the built-in model."""
    import torch

    from npu_port.infer import GenerationRequest, generate, load_pipeline

    loaded = load_pipeline(model, torch.device("cpu"), torch.float32, progress_bar=False)
    transformer = loaded.pipe.transformer
    seen: Dict[str, Any] = {}

    def capture(module: Any, args: Any, kwargs: Dict[str, Any]) -> None:
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        seen.setdefault("hidden", tuple(hidden.shape))
        text = kwargs.get("encoder_hidden_states")
        seen.setdefault("text", tuple(text.shape) if text is not None else None)
        seen["forwards"] = seen.get("forwards", 0) + 1

    handle = transformer.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        generate(loaded, GenerationRequest(steps=steps))
    finally:
        handle.remove()
    config = dict(transformer.config)
    batch = seen["hidden"][0]
    if "num_single_layers" in config:  # Flux: joint attention over text + image tokens in every block
        tokens = seen["hidden"][1] + seen["text"][1]
        calls = config["num_layers"] + config["num_single_layers"]
        out_elems = batch * seen["hidden"][1] * config["in_channels"]
    else:  # Wan: self-attention over the video tokens (cross-attention to the text is not split)
        _, channels, frames, height, width = seen["hidden"]
        pt, ph, pw = config["patch_size"]
        tokens = frames // pt * (height // ph) * (width // pw)
        calls = config["num_layers"]
        out_elems = batch * channels * frames * height * width
    return {
        "batch": batch,
        "tokens": tokens,
        "heads": config["num_attention_heads"],
        "head_dim": config["attention_head_dim"],
        "calls_per_forward": calls,
        "forwards_per_step": seen["forwards"] / steps,
        "output_elements": out_elems,
    }


def analytic_bytes(shapes: Dict[str, Any], ulysses: int, ring: int, cfg: bool, element: int = 4) -> Dict[str, float]:
    """Bytes one rank sends per step through npu-port's collectives, by kind (see the module docstring)."""
    b, s, h, d = shapes["batch"], shapes["tokens"], shapes["heads"], shapes["head_dim"]
    n = ulysses * ring
    forwards = shapes["forwards_per_step"] / (2 if cfg else 1)  # alternate CFG: one of the two calls per rank
    calls = shapes["calls_per_forward"] * forwards
    found = {"all_to_all": 0.0, "all_gather": 0.0}
    if ulysses > 1:
        found["all_to_all"] += calls * 4 * b * (s / n) * h * d * element * (ulysses - 1) / ulysses
    if ring > 1:
        found["all_gather"] += calls * 2 * b * (s / ring) * (h / ulysses) * d * element * (ring - 1)
    if cfg:
        found["all_gather"] += shapes["output_elements"] * element
    return found


def diffusers_gather_bytes(shapes: Dict[str, Any], ulysses: int, ring: int, cfg: bool, element: int = 4) -> float:
    """What diffusers' own gather at the end of the ``_cp_plan`` (``proj_out``) sends per rank and step: each rank's
    ``1/N`` of the output to the ``N-1`` others, once per forward (not counted in npu-port's tally)."""
    n = ulysses * ring
    if n == 1:
        return 0.0
    forwards = shapes["forwards_per_step"] / (2 if cfg else 1)
    return forwards * shapes["output_elements"] / n * element * (n - 1)


def run_layout(model: str, nproc: int, flags: List[str], steps: int, workdir: str) -> Dict[str, Any]:
    report = os.path.join(workdir, f"{model}-{nproc}-{'_'.join(flags) or 'single'}.json")
    command = [sys.executable, "-m", "npu_port", "infer", "--model", model, "--steps", str(steps), "--no-progress"]
    command += ["--output", report.replace(".json", ".png"), "--report", report]
    if nproc > 1:
        command += ["--nproc", str(nproc)] + flags
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    with open(report, encoding="utf-8") as fh:
        data = json.load(fh)
    ranks = data.get("parallel", {}).get("ranks") or [
        {"median_step_s": data["time"]["median_step_s"], "bytes_sent_per_step": 0.0, "collectives": {}}
    ]
    return {"wall_s": wall, "median_step_s": max(r["median_step_s"] for r in ranks), "ranks": ranks}


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny-flux,tiny-wan")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--procs", default="1,2,4")
    parser.add_argument("--layouts", default=None, help="only these layouts, by name (e.g. 'ulysses 2,cfg 2')")
    parser.add_argument("--out", default="benchmarks/results/parallel_scaling_cpu.json")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2: the time per step is the median of the steps after the first")
    from npu_port.device import device_name

    results: Dict[str, Any] = {
        "machine": f"{device_name('cpu')}, {platform.platform()}, python {platform.python_version()}",
        "load_average_at_start": os.getloadavg()[0],
        "command": "python benchmarks/parallel_scaling.py " + " ".join(argv or sys.argv[1:]),
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="npu-port-scaling-") as workdir:
        for model in args.models.split(","):
            shapes = model_shapes(model, args.steps)
            rows = []
            for nproc in map(int, args.procs.split(",")):
                for name, flags in LAYOUTS[nproc]:
                    if args.layouts and name not in args.layouts.split(","):
                        continue
                    ulysses = int(flags[flags.index("--ulysses") + 1]) if "--ulysses" in flags else 1
                    ring = int(flags[flags.index("--ring") + 1]) if "--ring" in flags else 1
                    cfg = "--cfg-parallel" in flags
                    if nproc > 1 and ulysses == 1 and ring == 1 and not cfg:
                        ulysses = nproc // (2 if cfg else 1)
                    measured = run_layout(model, nproc, flags, args.steps, workdir)
                    expected = analytic_bytes(shapes, ulysses, ring, cfg)
                    sent = measured["ranks"][0]["bytes_sent_per_step"]
                    row = {
                        "layout": name,
                        "nproc": nproc,
                        "median_step_s": measured["median_step_s"],
                        "bytes_per_step_measured": sent,
                        "bytes_per_step_analytic": sum(expected.values()),
                        "analytic_by_kind": expected,
                        "diffusers_output_gather_per_step": diffusers_gather_bytes(shapes, ulysses, ring, cfg),
                        "ranks": measured["ranks"],
                    }
                    rows.append(row)
                    print(
                        f"{model:<10} {nproc}  {name:<20} {row['median_step_s'] * 1e3:8.1f} ms/step  "
                        f"sent {sent / 1024:9.1f} KiB/step  analytic {row['bytes_per_step_analytic'] / 1024:9.1f} KiB",
                        flush=True,
                    )
            results["models"][model] = {"shapes": shapes, "rows": rows}
    results["load_average_at_end"] = os.getloadavg()[0]
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
