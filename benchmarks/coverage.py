"""Coverage: on a tiny model of every family npu-port claims, how many attention calls would run fused on an Ascend
910B under the ``npu`` strategy, and why the rest would not.

Each family's tiny model (:mod:`npu_port.plan.families`: the real head dims and the mask forms its pipeline passes,
bfloat16) runs one forward on this machine's CPU under a recording of the ``npu`` strategy applied to the model
(``npu_port.plan.record_calls``: the routing ``set_attention_strategy("npu", target=model)`` installs, plus every
direct SDPA call no integration routes); ``npu_port.plan.assess`` then judges each recorded call signature for
``Target.of("npu", "910B")`` with the kernels' static ``reasons()`` — no NPU needed, and the same checks a real run
makes. Three assessments per family (``families.ASSESSMENTS``): the ``npu`` strategy as it ships; the same with
diffusers' ``-10000`` declared as masked (``masked_value=-10000.0``, what a user of a pipeline that passes text masks
sets); and a 910A, which has no fused attention op at all.

    python benchmarks/coverage.py     # writes benchmarks/results/coverage_npu_910b.json and benchmarks/coverage.md
    python benchmarks/coverage.py --families sd15,ltx --json /tmp/c.json --markdown /tmp/c.md

``tests/plan/test_coverage.py`` pins the JSON: a change in routing or in a kernel's limits that changes a count or a
reason fails it until this script is run again and the change is looked at.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
JSON_PATH = ROOT / "benchmarks" / "results" / "coverage_npu_910b.json"
MARKDOWN_PATH = ROOT / "benchmarks" / "coverage.md"
DECLARED = "910B masked_value=-10000"


def measure(families: List[str]) -> Dict[str, Any]:
    """The report: the machine and versions it was recorded with, and one :func:`~npu_port.plan.families.coverage`
    row per family."""
    import diffusers

    from npu_port.bench.results import machine_info
    from npu_port.plan import families as tiny

    return {
        "benchmark": "coverage",
        "target": {"device": "npu", "chip": "910B", "strategy": "npu"},
        "assessments": {label: {"chip": chip, "options": opts} for label, (chip, opts) in tiny.ASSESSMENTS.items()},
        "dtype": "bfloat16",
        "machine": {**machine_info("cpu"), "diffusers": diffusers.__version__},
        "families": [tiny.coverage(name) for name in families],
    }


def _reasons(unfused: List[Dict[str, Any]]) -> str:
    """``3 x float per-head 2x2x1x77 -0/-9984 [mask, head-dim]`` per signature not fused: its calls, its mask, and
    the reason codes of its candidates (the messages are in the JSON)."""
    parts = []
    for item in unfused:
        codes = dict.fromkeys(r["code"] for found in item["reasons"].values() for r in found)
        parts.append(f"{item['count']} x {item['mask'] or 'no mask'} [{', '.join(codes)}]")
    return "; ".join(parts) or "-"


def _fraction(fused: int, calls: int) -> str:
    return f"{fused / calls:.2f}" if calls else "-"


def markdown(report: Dict[str, Any]) -> str:
    """The table (one row per family) and what it was recorded with."""
    machine = report["machine"]
    lines = [
        "| family | model | head dims | masks (as its pipeline passes them) | calls | fused (`npu`) | fused/all | "
        "not fused (`npu`): calls x mask [reason codes] | fused, `masked_value=-10000` | fused/all | 910A |",
        "|---|---|---|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for row in report["families"]:
        plain, declared, old = (row["assessments"][label] for label in ("910B", DECLARED, "910A"))
        reasons = [found for item in old["unfused"] for found in item["reasons"].values()]
        chip = all(any(r["code"] == "chip" for r in found) for found in reasons)
        lines.append(
            f"| {row['family']} | `{row['model']}` | {', '.join(map(str, row['head_dims']))} | "
            f"{'; '.join(row['masks']) or 'none'} | {row['calls']} | "
            f"{plain['fused']} | "
            f"{_fraction(plain['fused'], row['calls'])} | {_reasons(plain['unfused'])} | {declared['fused']} | "
            f"{_fraction(declared['fused'], row['calls'])} | {old['fused']}{' (chip)' if chip else ''} |"
        )
    calls = sum(row["calls"] for row in report["families"])
    fused = {
        label: sum(row["assessments"][label]["fused"] for row in report["families"]) for label in ("910B", DECLARED)
    }
    lines += [
        "",
        f"All families: {fused['910B']}/{calls} calls fused with `npu` as it ships, {fused[DECLARED]}/{calls} with "
        "`masked_value=-10000.0` declared; 0 on 910A.",
        "",
        f"Recorded with torch {machine['torch']}, diffusers {machine['diffusers']}, npu-port {machine['npu_port']}, "
        f"Python {machine['python']} on {machine['platform']} ({machine['date'][:10]}); bfloat16 models and inputs; "
        "`python benchmarks/coverage.py`.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: List[str] | None = None) -> int:
    from npu_port.plan.families import FAMILIES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, of: {', '.join(FAMILIES)}")
    parser.add_argument("--json", type=Path, default=JSON_PATH, help="where the JSON report goes")
    parser.add_argument("--markdown", type=Path, default=MARKDOWN_PATH, help="where the markdown table goes")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.families.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in FAMILIES]
    if unknown or not chosen:
        parser.error(f"unknown families {unknown or '(none given)'}; valid families: {', '.join(FAMILIES)}")
    report = measure(chosen)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    table = markdown(report)
    args.markdown.write_text(
        "# Coverage: attention calls that run fused on an Ascend 910B, per model family\n\n"
        "What the table is and how it is made: `benchmarks/coverage.py`'s docstring; "
        'docs/how-to/plan-before-the-hardware.md, "Coverage by model family". '
        "Raw results: [`results/coverage_npu_910b.json`](results/coverage_npu_910b.json).\n\n" + table
    )
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
