"""``npu-port scan`` on checkouts of public CUDA-era repositories: findings per severity and per code, and the wall
time of the whole command (Python start-up included). Only counts are written; nothing of the repositories.

    python benchmarks/scan_realrepos.py /tmp/scanrepos            # every checkout in the folder
    python benchmarks/scan_realrepos.py /tmp/scanrepos --out /tmp/r.json --rounds 3

Each sub-folder must be a git checkout (``git clone``): the scan reads what git lists, as a user's checkout is read.
The findings behind the counts, read in the code, are in benchmarks/scan_realrepos.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def scan_once(repo: Path, jobs: str) -> tuple:
    command = [sys.executable, "-m", "npu_port", "scan", ".", "--format", "json", "--no-progress"]
    command += ["-j", jobs] if jobs else []
    start = time.perf_counter()
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"scan_realrepos: the scan of {repo} failed:\n{done.stderr}")
    return seconds, json.loads(done.stdout)


def one(repo: Path, rounds: int) -> dict:
    default, single, payload = [], [], None
    for _ in range(rounds):
        seconds, payload = scan_once(repo, "")
        default.append(round(seconds, 3))
        single.append(round(scan_once(repo, "1")[0], 3))
    by_code = collections.Counter(f["code"] for f in payload["findings"])
    vendored = collections.Counter(f["code"] for f in payload["vendored_findings"])
    return {
        "repository": repo.name,
        "commit": _git(repo, "rev-parse", "HEAD"),
        "commit_date": _git(repo, "log", "-1", "--format=%cs"),
        "py_files_tracked": len([p for p in _git(repo, "ls-files", "*.py").splitlines() if p]),
        "files_scanned": payload["files_scanned"],
        "seconds": {"default_jobs": default, "jobs_1": single, "median_default_jobs": sorted(default)[rounds // 2]},
        "counts": payload["counts"],
        "by_code": dict(sorted(by_code.items())),
        "vendored_by_code": dict(sorted(vendored.items())),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a folder of git checkouts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scan_realrepos.json")
    args = parser.parse_args()
    repos = sorted(p for p in args.folder.iterdir() if (p / ".git").exists())
    if not repos:
        raise SystemExit(f"scan_realrepos: no git checkout in {args.folder}")
    results = []
    for repo in repos:
        results.append(one(repo, args.rounds))
        r = results[-1]
        seconds = r["seconds"]["median_default_jobs"]
        print(f"{r['repository']:<20} {r['files_scanned']:>4} files {seconds:>6.2f} s {r['counts']}")
    payload = {
        "what": "npu-port scan on checkouts of public CUDA-era repositories (issue 15): counts only, no source",
        "command": " ".join(["python", *sys.argv]),
        "npu_port_commit": _git(ROOT, "rev-parse", "--short", "HEAD"),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} CPUs, Python {platform.python_version()}",
        "recorded": time.strftime("%Y-%m-%d"),
        "repositories": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
