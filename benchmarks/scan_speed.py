"""How fast ``npu-port scan`` reads a big tree: the installed ``torch`` and ``transformers`` packages (about 5,100
real Python files, CUDA-heavy code among them), scanned in a fresh process as a user runs it.

Target (issue 15): a 5,000-file tree in under 10 s on CI's 2-core machine.

    python benchmarks/scan_speed.py                           # results to benchmarks/results/scan_speed_cpu.json
    python benchmarks/scan_speed.py --packages torch --out /tmp/r
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_SECONDS = 10.0


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"scan_speed: package {name!r} is not installed here")
    return Path(list(spec.submodule_search_locations)[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", default="torch,transformers", help="installed packages to scan (comma list)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh-process scans; the median is reported")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()

    folders = [package_dir(name.strip()) for name in args.packages.split(",") if name.strip()]
    files = sum(1 for folder in folders for _ in folder.rglob("*.py"))
    seconds = []
    payload = None
    for _ in range(args.rounds):
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "npu_port", "scan", "--format", "json", "--no-progress", *map(str, folders)],
            capture_output=True,
            text=True,
            check=False,
        )
        seconds.append(time.perf_counter() - start)
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            return done.returncode
        payload = json.loads(done.stdout)
    seconds.sort()
    median = seconds[len(seconds) // 2]
    import torch

    from npu_port.bench.results import machine_info

    result = {
        "benchmark": "scan_speed",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "packages": args.packages,
        "python_files": files,
        "files_scanned": payload["files_scanned"],
        "seconds": seconds,
        "median_seconds": round(median, 3),
        "target_seconds": TARGET_SECONDS,
        "passed": median < TARGET_SECONDS,
        "counts": payload["counts"],
        "vendored_counts": {
            severity: sum(1 for f in payload["vendored_findings"] if f["severity"] == severity)
            for severity in payload["counts"]
        },
        "cpu_count": os.cpu_count(),
        "machine": machine_info(torch.device("cpu")),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "scan_speed_cpu.json"
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(
        f"{files} Python files ({payload['files_scanned']} scanned): median {median:.2f} s of {args.rounds} "
        f"(target < {TARGET_SECONDS:.0f} s): {'PASS' if result['passed'] else 'FAIL'}; findings {payload['counts']}"
    )
    print(f"wrote {path}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
