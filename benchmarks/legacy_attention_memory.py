"""Legacy ``_attention`` (ControlVideo-style ``baddbmm`` + softmax + ``bmm``) at a size it cannot run, routed by
``patch_legacy_attention`` through the ``chunked`` and ``auto`` strategies in bounded memory.

The module is the test suite's diffusers <= 0.14-style fixture (``tests/fixtures/legacy_attention.py``); only its
``_attention`` is called, on ``(batch*heads, seq, head_dim)`` tensors as its ``forward`` would pass them. The default
size — batch 2 (classifier-free guidance) x 8 heads, 16384 tokens (4 frames of 64x64 latents attending to each other,
as ControlVideo's ``FullyFrameAttention`` does), head dim 40 (SD 1.5's first blocks) — gives a 16 GiB float32 score
tensor; the legacy code holds two of them at once (``baddbmm``'s input and output, then scores and probabilities),
~32 GiB, which is computed, not run.

Method (as ``chunked_memory.py``): each run is its own Python process. Inputs are created, a 64-token warm-up call
loads the kernels, then the process's peak resident set size (``ru_maxrss``) is read before and after the one
measured call: the difference is the call's extra peak memory (its output included). ``auto`` measures its
candidates inside that call (a fresh decision cache), so its number includes the probing; its second call is timed
too. Correctness: query rows are independent, so the original, un-patched ``_attention`` is run on the first
``--check-rows`` query rows against every key (float32, and float64 as the reference) and compared with the same
rows of the routed result. ``--legacy-seq`` runs the original itself at a size that fits, to check the memory
formula against a measurement.

    python benchmarks/legacy_attention_memory.py                        # results to benchmarks/results/
    python benchmarks/legacy_attention_memory.py --seq 256 --legacy-seq 128 --out /tmp/r
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MiB = 1 << 20
GiB = 1 << 30
ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "legacy_attention.py"
WARMUP_TOKENS = 64


def legacy_peak_bytes(batch_heads: int, seq: int, itemsize: int) -> dict:
    """What the legacy formulation allocates beyond its inputs: two score-sized tensors live at once (``baddbmm``'s
    ``torch.empty`` input and its result; then the scores and the softmax's probabilities), plus the output."""
    scores = batch_heads * seq * seq * itemsize
    return {"score_tensor_bytes": scores, "peak_bytes": 2 * scores}


def _load_fixture():
    spec = importlib.util.spec_from_file_location("legacy_attention_fixture", FIXTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def child(spec: dict) -> dict:
    """One measured run (in its own process): ``spec["strategy"]`` is a strategy name, or ``legacy`` (unpatched)."""
    import resource

    import torch

    import npu_port
    from npu_port.device.timing import timed
    from npu_port.integrations.legacy_attention import patch_legacy_attention

    cls = _load_fixture().LegacyCrossAttention
    original = cls._attention
    batch, heads, seq, dim = spec["batch"], spec["heads"], spec["seq"], spec["dim"]
    dtype = getattr(torch, spec["dtype"])
    module = cls(query_dim=heads * dim, heads=heads, dim_head=dim).eval()
    gen = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(batch * heads, seq, dim, generator=gen).to(dtype) for _ in range(3))
    handle = patch = None
    if spec["strategy"] != "legacy":
        handle = npu_port.set_attention_strategy(spec["strategy"])
        patch = patch_legacy_attention(cls)

    def maxrss() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    row = {"strategy": spec["strategy"], "seq": seq}
    with torch.no_grad():
        module._attention(*(t[:, :WARMUP_TOKENS] for t in (query, key, value)))  # load kernels outside the measurement
        before = maxrss()
        out, row["seconds"] = timed(lambda: module._attention(query, key, value), "cpu")
        row["extra_peak_bytes"] = maxrss() - before
        if spec["strategy"] == "auto":
            _, row["seconds_second_call"] = timed(lambda: module._attention(query, key, value), "cpu")
        if handle is not None:
            row["resolved"] = handle.name
            row["calls"] = handle.calls
        rows = min(spec["check_rows"], seq)
        part = slice(0, rows)
        expected = original(module, query[:, part], key, value)
        expected64 = original(module, query[:, part].double(), key.double(), value.double())
        row["check_rows"] = rows
        row["max_abs_diff_vs_original"] = (out[:, part] - expected).abs().max().item()
        row["max_abs_diff_vs_float64"] = (out[:, part].double() - expected64).abs().max().item()
        row["output_shape"] = list(out.shape)
        row["output_dtype"] = str(out.dtype).replace("torch.", "")
    if patch is not None:
        patch.restore()
        handle.restore()
    return row


def run_child(spec: dict, cache_dir: str) -> dict:
    env = {**os.environ, "NPU_PORT_CACHE_DIR": cache_dir}  # auto decides afresh: its probing is part of the run
    result = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or [f"exit code {result.returncode}"]
        return {"strategy": spec["strategy"], "seq": spec["seq"], "error": lines[-1]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=16384)
    parser.add_argument("--dim", type=int, default=40)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--strategies", default="chunked,auto", help="comma list of strategy names")
    parser.add_argument("--check-rows", type=int, default=256, help="query rows compared with the original")
    parser.add_argument("--legacy-seq", type=int, default=2048, help="run the original at this size (0: skip)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0

    from npu_port.bench.results import machine_info

    itemsize = {"float32": 4}.get(args.dtype, 2)
    batch_heads = args.batch * args.heads
    base = {k: getattr(args, k) for k in ("batch", "heads", "dim", "dtype")} | {"check_rows": args.check_rows}
    runs = [dict(base, strategy=name, seq=args.seq) for name in args.strategies.split(",") if name]
    if args.legacy_seq:
        runs.append(dict(base, strategy="legacy", seq=args.legacy_seq))
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        for spec in runs:
            row = run_child(spec, cache_dir)
            row["legacy_formulation"] = legacy_peak_bytes(batch_heads, spec["seq"], itemsize)
            rows.append(row)
            label = f"{row['strategy']} @ {spec['seq']}"
            if "error" in row:
                print(f"{label:>18}: failed: {row['error']}")
                continue
            legacy = row["legacy_formulation"]["peak_bytes"]
            print(
                f"{label:>18}: extra peak {row['extra_peak_bytes'] / MiB:9.1f} MiB, {row['seconds']:7.2f} s"
                + (f" ({row['resolved']})" if row.get("resolved") else "")
                + f", max|diff| vs original {row['max_abs_diff_vs_original']:.1e} on {row['check_rows']} rows"
                + f"; legacy formulation: {legacy / GiB:.2f} GiB"
            )
    result = {
        "benchmark": "legacy_attention_memory",
        "command": "python " + " ".join([os.path.relpath(__file__, ROOT)] + sys.argv[1:]),
        "config": dict(base, seq=args.seq, batch_heads=batch_heads),
        "legacy_formulation": legacy_peak_bytes(batch_heads, args.seq, itemsize),
        "method": "extra peak = ru_maxrss after - before the one measured call, in a fresh process per run",
        "machine": machine_info("cpu"),
        "rows": rows,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "legacy_attention_memory_cpu.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0 if all("error" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
