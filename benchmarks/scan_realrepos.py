"""Recall and precision of ``npu-port scan`` per category, on a hand-made inventory of CUDA-only code in public
repositories (benchmarks/scan_inventory/<repo>.yaml, made by reading the code, not by running the scan).

    python benchmarks/scan_realrepos.py /tmp/scanrepos                 # a folder of `git clone`s, one per inventory
    python benchmarks/scan_realrepos.py /tmp/scanrepos --out /tmp/r.json --rounds 3
    python benchmarks/scan_realrepos.py /tmp/heldout --inventory benchmarks/scan_inventory_heldout   # held-out set

Each clone must sit at its inventory's commit (checked). A finding is mapped to a category by its rule code (CATEGORY
below) and matched to an inventory item by (path, line) within that category; a code with several candidate
categories takes the one an item at that line has. Findings of codes outside the categories (requirement pins, info,
RoPE precision) are listed apart and not scored. Also timed: all clones in one `npu-port scan` command.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
INVENTORY = ROOT / "benchmarks" / "scan_inventory"
CATEGORIES = ("cuda-tensor", "cuda-api", "amp", "distributed", "flash-attn", "xformers", "extension", "attention")

# rule code -> candidate categories, the first being where an unmatched finding counts.
CATEGORY: dict[str, tuple[str, ...]] = {
    "NPU101": ("flash-attn",),
    "NPU110": ("flash-attn",),
    "NPU111": ("flash-attn",),
    "NPU114": ("flash-attn",),
    "NPU130": ("flash-attn",),
    "NPU652": ("flash-attn",),
    "NPU102": ("xformers",),
    "NPU112": ("xformers",),
    "NPU113": ("xformers",),
    "NPU120": ("xformers",),
    "NPU651": ("xformers", "flash-attn"),
    "NPU653": ("xformers", "flash-attn"),
    "NPU103": ("extension",),
    "NPU104": ("extension", "flash-attn", "xformers"),
    "NPU105": ("extension", "flash-attn", "xformers"),
    "NPU106": ("extension", "flash-attn", "xformers"),
    "NPU301": ("cuda-tensor",),
    "NPU310": ("cuda-tensor",),
    "NPU390": ("cuda-tensor",),
    "NPU391": ("cuda-tensor",),
    "NPU302": ("cuda-api",),
    "NPU303": ("cuda-api",),
    "NPU304": ("cuda-api",),
    "NPU305": ("cuda-api",),
    "NPU306": ("cuda-api",),
    "NPU309": ("cuda-api", "cuda-tensor"),
    "NPU313": ("cuda-api",),
    "NPU314": ("cuda-api",),
    "NPU315": ("cuda-api",),
    "NPU316": ("cuda-api",),
    "NPU318": ("cuda-api",),
    "NPU320": ("cuda-api", "cuda-tensor"),
    "NPU307": ("amp",),
    "NPU308": ("amp",),
    "NPU317": ("amp",),
    "NPU319": ("amp",),
    "NPU311": ("distributed",),
    "NPU312": ("distributed",),
    "NPU401": ("attention",),
}
for code in ("NPU501", "NPU502", "NPU503", "NPU504", "NPU505", "NPU506"):
    CATEGORY[code] = ("extension",)


def amp_codes(rules_text: str) -> None:
    """Rules added after this table (the amp / deprecated rule) map by name: any rule named *amp* counts as amp."""
    for line in rules_text.splitlines():
        parts = line.split()
        if len(parts) > 1 and parts[0].startswith("NPU") and parts[0] not in CATEGORY and "amp" in parts[1]:
            CATEGORY[parts[0]] = ("amp",)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def scan(paths: list[Path], cwd: Path) -> tuple[float, dict]:
    command = [sys.executable, "-m", "npu_port", "scan", *map(str, paths), "--format", "json", "--no-progress"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    try:
        return seconds, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"scan_realrepos: the scan in {cwd} failed ({done.returncode}):\n{done.stderr}") from None


def scanner(cwd: Path) -> str:
    """Where the npu_port that `python -m npu_port` imports outside this checkout lives, and its commit."""
    found = subprocess.run(
        [sys.executable, "-c", "import npu_port; print(npu_port.__file__)"], cwd=cwd, capture_output=True, text=True
    )
    package = Path(found.stdout.strip()).parent
    try:
        return f"{package} at {_git(package, 'rev-parse', '--short', 'HEAD')}"
    except (subprocess.CalledProcessError, FileNotFoundError):
        return str(package)


CUDA_SOURCES = (".cu", ".cuh")


def where(path: str, line: int) -> tuple[str, int]:
    """A CUDA source file is one item wherever in it the finding sits."""
    return (path, 0) if path.endswith(CUDA_SOURCES) else (path, line)


def categorise(finding: dict, items: dict, excluded: tuple[str, ...]) -> str | None:
    candidates = CATEGORY.get(finding["code"])
    # the inventory is of Python code (and CUDA sources) outside the folders it leaves out (vendored code):
    # configs, requirement files and excluded folders are not scored
    path = finding["path"]
    if not candidates or not path.endswith((".py", *CUDA_SOURCES)) or path.startswith(excluded):
        return None
    for category in candidates:
        if (*where(finding["path"], finding["line"]), category) in items:
            return category
    return candidates[0]


def score(repo: str, payload: dict, inventory: dict) -> dict:
    items = {(*where(i["path"], i["line"]), i["category"]): i for i in inventory["items"]}
    matched, false_positives, apart = set(), [], []
    per = {c: collections.Counter() for c in CATEGORIES}
    for item in items.values():
        per[item["category"]]["items"] += 1
        per[item["category"]]["guarded_items"] += item["guarded"]
    for finding in payload["findings"] + payload.get("vendored_findings", []):
        category = categorise(finding, items, tuple(inventory.get("excluded") or ()))
        brief = {
            "repo": repo,
            "at": f"{finding['path']}:{finding['line']}",
            "code": finding["code"],
            "severity": finding.get("severity"),
            "message": finding["message"],
        }
        if category is None:
            apart.append(brief)
            continue
        per[category]["findings"] += 1
        key = (*where(finding["path"], finding["line"]), category)
        if key in items:
            per[category]["true"] += 1
            matched.add(key)
        else:
            false_positives.append({**brief, "category": category})
    missed = []
    for key, item in sorted(items.items()):
        if key in matched:
            per[key[2]]["found"] += 1
            per[key[2]]["guarded_found"] += item["guarded"]
        else:
            missed.append(
                {
                    "repo": repo,
                    "at": f"{key[0]}:{key[1]}",
                    "category": key[2],
                    "guarded": item["guarded"],
                    "note": item["note"],
                }
            )
    return {
        "per_category": {c: dict(v) for c, v in per.items()},
        "unmatched": false_positives,
        "missed": missed,
        "apart": apart,
    }


def ratio(a: int, b: int) -> float | None:
    return round(a / b, 3) if b else None


def table(per: dict) -> dict:
    rows = {}
    for category in (*CATEGORIES, "overall"):
        c = collections.Counter(per[category])
        rows[category] = {
            "items": c["items"],
            "found": c["found"],
            "recall": ratio(c["found"], c["items"]),
            "findings": c["findings"],
            "true": c["true"],
            "precision": ratio(c["true"], c["findings"]),
            "guarded_items": c["guarded_items"],
            "guarded_found": c["guarded_found"],
        }
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a folder of git clones named as the inventories")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scan_realrepos.json")
    parser.add_argument(
        "--inventory",
        type=Path,
        default=INVENTORY,
        help="folder of <repo>.yaml inventories (held-out: scan_inventory_heldout)",
    )
    args = parser.parse_args()
    amp_codes(
        subprocess.run([sys.executable, "-m", "npu_port", "scan", "--rules"], capture_output=True, text=True).stdout
    )
    inventories = {p.stem: yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted(args.inventory.glob("*.yaml"))}
    clones = sorted(p for p in args.folder.iterdir() if (p / ".git").exists())
    total = {c: collections.Counter() for c in (*CATEGORIES, "overall")}
    repos, unmatched, missed, apart = [], [], [], []
    for clone in clones:
        commit = _git(clone, "rev-parse", "HEAD")
        inventory = inventories.get(clone.name)
        if inventory and inventory["commit"] != commit:
            raise SystemExit(f"scan_realrepos: {clone} is at {commit}, its inventory at {inventory['commit']}")
        runs = [scan([Path(".")], clone) for _ in range(args.rounds)]
        seconds = [round(s, 3) for s, _ in runs]
        payload = runs[-1][1]
        entry = {
            "repository": clone.name,
            "commit": commit,
            "files_scanned": payload["files_scanned"],
            "seconds": seconds,
            "median_seconds": statistics.median(seconds),
            "inventory": bool(inventory),
        }
        if inventory:
            result = score(clone.name, payload, inventory)
            entry["per_category"] = table(
                {
                    **result["per_category"],
                    "overall": sum(
                        (collections.Counter(v) for v in result["per_category"].values()), collections.Counter()
                    ),
                }
            )
            for category, counts in result["per_category"].items():
                total[category].update(counts)
                total["overall"].update(counts)
            unmatched += result["unmatched"]
            missed += result["missed"]
            apart += result["apart"]
        repos.append(entry)
        print(
            f"{clone.name:<18} {payload['files_scanned']:>4} files {entry['median_seconds']:>6.2f} s"
            + (
                f"  recall {entry['per_category']['overall']['recall']}  precision "
                f"{entry['per_category']['overall']['precision']}"
                if inventory
                else "  (no inventory)"
            )
        )
    together = [round(scan(clones, args.folder)[0], 3) for _ in range(args.rounds)]
    rows = table(total)
    print(
        f"\n{'category':<12} {'items':>5} {'found':>5} {'recall':>6} {'findings':>8} {'true':>5} {'precision':>9}"
        " guarded found/items"
    )
    for category, r in rows.items():
        print(
            f"{category:<12} {r['items']:>5} {r['found']:>5} {r['recall'] if r['recall'] is not None else '-':>6} "
            f"{r['findings']:>8} {r['true']:>5} {r['precision'] if r['precision'] is not None else '-':>9} "
            f"{r['guarded_found']:>11}/{r['guarded_items']}"
        )
    print(f"\nall {len(clones)} clones in one scan: {together} s (median {statistics.median(together)} s)")
    print(f"\nunmatched findings ({len(unmatched)}):")
    for f in unmatched:
        print(f"  {f['repo']}/{f['at']}  {f['code']} [{f['category']}]  {f['message'][:100]}")
    print(f"\nmissed items ({len(missed)}):")
    for m in missed:
        print(f"  {m['repo']}/{m['at']}  [{m['category']}{', guarded' if m['guarded'] else ''}]  {m['note']}")
    print(
        f"\nnot scored ({len(apart)}): "
        + ", ".join(f"{c} {n}" for c, n in sorted(collections.Counter(a["code"] for a in apart).items()))
    )
    payload = {
        "what": "npu-port scan against a hand-made inventory of CUDA-only code (issue 28), by category",
        "command": " ".join(["python", *sys.argv]),
        "inventory": str(args.inventory),
        "npu_port_commit": _git(ROOT, "rev-parse", "--short", "HEAD"),
        # the scan runs from each clone, so it uses the installed npu_port, which need not be this checkout's
        "scanner": scanner(args.folder),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()} (shared, noisy)",
        "recorded": time.strftime("%Y-%m-%d"),
        "all_clones_one_scan_seconds": together,
        "all_clones_one_scan_median": statistics.median(together),
        "totals": rows,
        "repositories": repos,
        "unmatched_findings": unmatched,
        "missed_items": missed,
        "not_scored": apart,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
