"""The coverage table pinned: per model family, the attention calls npu-port routes and the number that would run fused
on an Ascend 910B under the ``npu`` strategy equal what ``benchmarks/coverage.py`` recorded in
``benchmarks/results/coverage_npu_910b.json`` — a change in routing or in a kernel's limits that moves a count or a
reason fails here until the benchmark is run again and its new table looked at.

And the table says what issue 17 asks of it: every call reaches npu-port; with diffusers' -10000 declared as masked,
every call of every family is fused; with ``npu`` as it ships, a call that is not fused is refused only for a float
mask that is not a pure mask (diffusers' -10000 bias, undeclared), never for a pure mask or the device; on 910A no call
is fused, each for the chip.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch

import npu_port
from npu_port.integrations.diffusers import classes
from npu_port.integrations.legacy_attention import find_legacy_attention
from npu_port.plan import families

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "coverage_npu_910b.json"
BENCHMARK = ROOT / "benchmarks" / "coverage.py"
DECLARED = "910B masked_value=-10000"
#: Reason codes the kernels document (npu_port/attn/kernels/base.py's docstring) that the op limits give.
OP_LIMITS = {"dtype", "head-dim", "heads", "shape", "mask", "causal", "dropout", "grad", "lse", "chip"}
#: Cheap families, one per routing path that matters, for the fast tier: a -10000 text mask through diffusers'
#: dispatcher (ltx), a head dim that is not 16-aligned (dit), legacy attention beside diffusers attention.
FAST = ("ltx", "dit", "legacy_controlvideo")


@pytest.fixture(scope="module")
def recorded() -> Dict[str, Dict[str, Any]]:
    report = json.loads(RESULTS.read_text())
    return {row["family"]: row for row in report["families"]}


def pinned(row: Dict[str, Any]) -> Dict[str, Any]:
    """What the test compares: counts, and per signature not fused its shapes, mask and each kernel's reason codes
    (the messages may be reworded without a new table)."""

    def unfused(items: List[Dict[str, Any]]) -> List[Tuple[Any, ...]]:
        return [
            (
                item["count"],
                tuple(item["query"]),
                tuple(item["key"]),
                item["mask"],
                item["routed"],
                item["kernel"],
                tuple((kernel, tuple(r["code"] for r in found)) for kernel, found in item["reasons"].items()),
            )
            for item in items
        ]

    return {
        "model": row["model"],
        "calls": row["calls"],
        "routed": row["routed"],
        "dtypes": row["dtypes"],
        "head_dims": row["head_dims"],
        "masks": row["masks"],
        "assessments": {
            label: (found["fused"], unfused(found["unfused"])) for label, found in row["assessments"].items()
        },
    }


#: The head dims each family's builder claims (the real model's, where the op limits depend on them).
HEAD_DIMS = {
    "sd15": [40, 80],
    "sdxl": [64],
    "sd3": [64],
    "flux": [128],
    "pixart": [72],
    "dit": [72],
    "wan": [128],
    "hunyuan_video": [128],
    "cogvideox": [64],
    "ltx": [64],
    "vae": [512],
    "legacy_controlvideo": [40, 80],
}


def check_promises(row: Dict[str, Any]) -> None:
    """What issue 17 asks of one family's row, and what its builder claims."""
    assert row["dtypes"] == ["bfloat16"] and row["head_dims"] == HEAD_DIMS[row["family"]], row["family"]
    calls = row["calls"]
    assert calls > 0 and row["routed"] == calls, row["family"]  # every call reaches npu-port's router
    assert row["assessments"][DECLARED]["fused"] == calls, row["family"]
    plain = row["assessments"]["910B"]
    for item in plain["unfused"]:
        codes = {r["code"] for found in item["reasons"].values() for r in found}
        assert codes <= OP_LIMITS and "mask" in codes, (row["family"], codes)
        # refused for its mask only where the mask is a float bias (diffusers' -10000, undeclared), never a pure one
        assert item["mask"].startswith("float") and "(pure)" not in item["mask"], (row["family"], item["mask"])
    assert plain["fused"] + sum(item["count"] for item in plain["unfused"]) == calls
    old = row["assessments"]["910A"]
    assert old["fused"] == 0 and sum(item["count"] for item in old["unfused"]) == calls
    for item in old["unfused"]:
        assert all(any(r["code"] == "chip" for r in found) for found in item["reasons"].values()), row["family"]


def test_the_table_covers_every_family_and_keeps_the_promises(recorded):
    assert list(recorded) == list(families.FAMILIES)
    for row in recorded.values():
        check_promises(row)


def test_the_cheap_families_measure_as_recorded(recorded):
    for name in FAST:
        assert pinned(families.coverage(name)) == pinned(recorded[name]), name


def count_routing(name: str) -> Tuple[int, int, List[str], int]:
    """``name``'s forward under the ``vanilla`` strategy (the math kernel, which calls no SDPA) applied to its model:
    how many times an attention module ran (diffusers' and legacy ones; each computes one attention call), how many
    calls reached the strategy's router, the modules not routed (``kept``), and how many calls went to torch's SDPA
    all the same — counted by patching it for the run, independently of npu-port's own bookkeeping."""
    model = families.build(name)
    kinds = classes.load().attention_module_classes
    legacy = {id(module) for _, module in find_legacy_attention(model)}
    ran: List[str] = []
    hooks = [
        module.register_forward_hook(lambda *_, n=module_name: ran.append(n))
        for module_name, module in model.named_modules()
        if isinstance(module, kinds) or id(module) in legacy
    ]
    real = torch.nn.functional.scaled_dot_product_attention
    direct: List[tuple] = []

    def counting(*args, **kwargs):
        direct.append(tuple(args[0].shape))
        return real(*args, **kwargs)

    with npu_port.attention_strategy("vanilla", target=model) as handle:
        torch.nn.functional.scaled_dot_product_attention = counting
        try:
            families.run(name, model)
        finally:
            torch.nn.functional.scaled_dot_product_attention = real
        kept = [state.name for state in handle.applied.states() if state.state not in ("replaced", "routed")]
    for hook in hooks:
        hook.remove()
    return len(ran), sum(handle.calls.values()), kept, len(direct)


@pytest.mark.parametrize(
    "name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in families.FAMILIES]
)
def test_every_attention_call_reaches_the_router(name, recorded):
    ran, routed, kept, direct = count_routing(name)
    assert (ran, routed, kept, direct) == (recorded[name]["calls"], recorded[name]["calls"], [], 0)


@pytest.mark.slow
def test_every_family_measures_as_recorded(recorded):
    for name in families.FAMILIES:
        if name not in FAST:
            assert pinned(families.coverage(name)) == pinned(recorded[name]), name


def _benchmark():
    spec = importlib.util.spec_from_file_location("coverage_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table(text: str) -> List[str]:
    return [line for line in text.splitlines() if line.startswith("| ")]


def test_the_markdown_table_and_the_site_show_the_recorded_json():
    from ..docs import site

    table = _table(_benchmark().markdown(json.loads(RESULTS.read_text())))
    assert len(table) == 1 + len(families.FAMILIES)  # the header, then one row per family
    assert _table((ROOT / "benchmarks" / "coverage.md").read_text()) == table
    assert site.pages_with("coverage"), "a docs page shows the table: <!-- generated: coverage -->"
    assert _table(site.hook().render("coverage")) == table


@pytest.mark.e2e
def test_the_benchmark_writes_the_rows_it_measures(tmp_path, recorded):
    out, table = tmp_path / "c.json", tmp_path / "c.md"
    command = [sys.executable, str(BENCHMARK), "--families", "dit,ltx", "--json", str(out), "--markdown", str(table)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert [pinned(row) for row in report["families"]] == [pinned(recorded[name]) for name in ("dit", "ltx")]
    assert {"torch", "diffusers", "npu_port", "python", "platform", "date"} <= set(report["machine"])
    assert _table(table.read_text()) == _table(done.stdout) and len(_table(done.stdout)) == 3

    bad = subprocess.run(
        [sys.executable, str(BENCHMARK), "--families", "dit,sd2"], capture_output=True, text=True, timeout=300
    )
    assert bad.returncode == 2
    assert bad.stderr.splitlines()[-1].endswith(
        f"error: unknown families ['sd2']; valid families: {', '.join(families.FAMILIES)}"
    )
