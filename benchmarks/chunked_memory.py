"""Peak memory and time of attention kernels on one large self-attention call, each in a fresh process.

The target (foundation issue): ``chunked`` computes B=1, H=8, S=16384, D=64 float32 self-attention with extra peak
memory under 256 MiB, where the materialising formulation needs ~16 GiB, and matches SDPA.

Method: every (kernel, S) runs in its own Python process. Inputs are created and a tiny warm-up call loads the
kernels; then the process's peak resident set size (``ru_maxrss``) is read before and after the one measured call:
the difference is the call's extra peak memory (its output included). On an accelerator (cuda, npu, xpu) the same
is done with the device module's ``max_memory_allocated``. Outputs are saved and compared with SDPA's in the parent
process.

    python benchmarks/chunked_memory.py                      # the issue's configuration, results to benchmarks/results/
    python benchmarks/chunked_memory.py --seq 4096 --kernels math,sdpa,chunked --out /tmp/r
    python benchmarks/chunked_memory.py --device npu --dtype float16 --kernels sdpa,npu_fusion,npu_fused_infer,chunked

Ratios are what to compare across machines; the recorded results name the machine they came from.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

MiB = 1 << 20

CHILD = r"""
import json, resource, sys
import torch
import npu_port
from npu_port.attn import AttentionCall, get_kernel
from npu_port.device.timing import timed

spec = json.loads(sys.argv[1])
torch.manual_seed(0)
device = torch.device(spec["device"])
if device.type == "npu":
    import torch_npu  # noqa: F401  (registers the device)
accel = getattr(torch, device.type) if device.type != "cpu" else None  # torch.cuda, torch.npu, torch.xpu
shape = (spec["batch"], spec["heads"], spec["seq"], spec["dim"])
dtype = getattr(torch, spec["dtype"])
query, key, value = (torch.randn(shape).to(device=device, dtype=dtype) for _ in range(3))
options = spec["options"]
kernel = get_kernel(spec["kernel"], **options) if spec["kernel"] != "legacy" else None

def legacy(q, k, v):
    # the hand-written formulation ported projects use: scores and probabilities both materialised
    b, h, s, d = q.shape
    q3, k3, v3 = q.reshape(b * h, s, d), k.reshape(b * h, s, d), v.reshape(b * h, s, d)
    empty = torch.empty(b * h, s, s, device=q.device, dtype=q.dtype)
    scores = torch.baddbmm(empty, q3, k3.transpose(1, 2), beta=0, alpha=d ** -0.5)
    probs = scores.softmax(dim=-1)
    return torch.bmm(probs, v3).reshape(b, h, s, d)

def run(q, k, v):
    if kernel is None:
        return legacy(q, k, v)
    return npu_port.attention(q, k, v, kernel=kernel)

with torch.no_grad():
    small = tuple(t[:, :, :64] for t in (query, key, value))
    run(*small)  # load kernels and libraries outside the measurement
    if accel is not None:
        accel.synchronize(); accel.reset_peak_memory_stats(); before = accel.memory_allocated()
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out, seconds = timed(lambda: run(query, key, value), device)  # device-synchronised before and after
    if accel is not None:
        peak = accel.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
plan = None
if spec["kernel"] == "chunked":
    plan = kernel.plan(AttentionCall.from_arguments(query, key, value)).describe()
torch.save(out.float().cpu(), spec["output"])
print(json.dumps({"extra_peak_bytes": peak, "seconds": seconds, "plan": plan}))
"""


def machine() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30), 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def measure(kernel: str, seq: int, args, workdir: Path, options: dict) -> dict:
    output = workdir / f"{kernel}-{seq}-{len(options)}.pt"
    spec = {
        "kernel": kernel,
        "options": options,
        "batch": args.batch,
        "heads": args.heads,
        "seq": seq,
        "dim": args.dim,
        "device": args.device,
        "dtype": args.dtype,
        "output": str(output),
    }
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True)
    if result.returncode != 0:
        return {"kernel": kernel, "seq": seq, "options": options, "error": result.stderr.strip().splitlines()[-1]}
    row = json.loads(result.stdout.strip().splitlines()[-1])
    row.update(kernel=kernel, seq=seq, options=options, output=str(output))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=16384)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, npu, xpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument(
        "--kernels",
        default="sdpa,chunked,chunked@64MiB,math",
        help="comma list; name@NMiB sets max_bytes; 'legacy' = baddbmm+softmax+bmm",
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()

    full_scores = args.batch * args.heads * args.seq * args.seq * {"float32": 4}.get(args.dtype, 2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for entry in args.kernels.split(","):
            name, _, budget = entry.partition("@")
            options = {"max_bytes": int(budget.rstrip("MiB")) * MiB} if budget else {}
            row = measure(name, args.seq, args, Path(tmp), options)
            rows.append(row)
            label = entry
            if "error" in row:
                print(f"{label:>16}: failed: {row['error']}")
                continue
            print(
                f"{label:>16}: extra peak {row['extra_peak_bytes'] / MiB:9.1f} MiB, {row['seconds']:7.2f} s"
                + (f"  ({row['plan']})" if row.get("plan") else "")
            )
        import torch

        reference = next((r for r in rows if r["kernel"] == "sdpa" and "error" not in r), None)
        if reference is not None:
            expected = torch.load(reference["output"])
            for row in rows:
                if "error" not in row:
                    row["max_abs_diff_vs_sdpa"] = (torch.load(row["output"]) - expected).abs().max().item()
        for row in rows:
            row.pop("output", None)

    result = {
        "benchmark": "chunked_memory",
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:]),
        "config": {k: getattr(args, k) for k in ("batch", "heads", "seq", "dim", "device", "dtype")},
        "full_score_tensor_mib": full_scores / MiB,
        "machine": machine(),
        "rows": rows,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"chunked_memory_{args.device}_{args.dtype}_S{args.seq}"
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out_dir / (stem + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
