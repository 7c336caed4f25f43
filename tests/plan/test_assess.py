"""Judging a recording for a target: the strategy's rule, the kernels' reasons for that device and chip, memory,
and a summary line that never says 100% unless every call is fused."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import npu_port
from npu_port.attn import get_kernel
from npu_port.attn.registry import kernel_names
from npu_port.attn.target import Target
from npu_port.plan import assess, record_calls
from npu_port.strategy.registry import resolve

NPU = Target.of("npu", "910B")


def _record(*calls, grad=False):
    """Record ``npu_port.attention`` (routed) or SDPA (``("sdpa", ...)``, unrouted) calls on fresh inputs."""

    def run():
        for call in calls:
            direct = call[0] == "sdpa"
            shape, dtype, kwargs = call[1:] if direct else call
            q = torch.zeros(shape, dtype=dtype, requires_grad=grad)
            (F.scaled_dot_product_attention if direct else npu_port.attention)(q, q, q, **kwargs)

    return record_calls(run)


HALF = ((1, 2, 32, 64), torch.float16, {})


def test_half_precision_calls_run_fused_on_a_910b_with_the_inference_op_first():
    plan = assess(_record(HALF, HALF, HALF), NPU)
    assert (plan.calls, plan.fused, len(plan.signatures)) == (3, 3, 1)
    only = plan.signatures[0]
    assert (only.kernel, only.fused, only.runnable) == ("npu_fused_infer", True, ["npu_fused_infer", "npu_fusion"])
    assert only.reasons == {"npu_fused_infer": [], "npu_fusion": []}
    assert plan.summary() == "fused: 3/3 attention calls (100%) on npu (910B) with strategy npu"


@pytest.mark.parametrize("chip", ["910A", "310P"])
def test_chips_without_flash_attention_score_fuse_nothing_and_say_why(chip):
    plan = assess(_record(HALF, HALF), Target.of("npu", chip))
    assert (plan.calls, plan.fused, plan.unrunnable) == (2, 0, 2)
    only = plan.signatures[0]
    assert only.kernel is None and not only.fused
    assert {name: [r.code for r in found] for name, found in only.reasons.items()} == {
        "npu_fused_infer": ["chip"],
        "npu_fusion": ["chip"],
    }
    assert plan.summary() == f"fused: 0/2 attention calls (0%) on npu ({chip}) with strategy npu"


def test_float32_goes_to_the_training_op_or_to_the_inference_op_with_compute_dtype():
    single = ((1, 2, 32, 64), torch.float32, {})
    plan = assess(_record(single), NPU)
    only = plan.signatures[0]
    assert (only.kernel, only.fused) == ("npu_fusion", True)
    assert [r.code for r in only.reasons["npu_fused_infer"]] == ["dtype"]
    cast = assess(_record(single), NPU, resolve("npu").with_overrides(compute_dtype="float16"))
    only = cast.signatures[0]
    assert (only.kernel, only.fused) == ("npu_fused_infer@float16", True)
    q = 2 * 32 * 64 * 4  # float32 bytes of query (key, value and output alike)
    assert only.bytes == {"inputs": 3 * q, "output": q, "kernel": 0, "total": 4 * q}


def test_gradients_leave_the_inference_op_for_the_training_op():
    only = assess(_record(HALF, grad=True), NPU).signatures[0]
    assert only.signature.grad and only.kernel == "npu_fusion"
    assert [r.code for r in only.reasons["npu_fused_infer"]] == ["grad"]


def test_a_call_no_candidate_can_run_is_reported_not_raised():
    huge_head = ((1, 2, 8, 1024), torch.float16, {})
    plan = assess(_record(huge_head, HALF), NPU)
    stuck = plan.signatures[0]
    assert stuck.kernel is None and stuck.runnable == [] and plan.unrunnable == 1
    assert [r.code for r in stuck.reasons["npu_fusion"]] == ["head-dim"]
    assert plan.summary() == "fused: 1/2 attention calls (50%) on npu (910B) with strategy npu"


@pytest.mark.parametrize("fused", [True, False])
def test_unrouted_calls_are_judged_as_the_devices_own_sdpa(monkeypatch, fused):
    asked = []

    def sdpa_fused(self, call, target):
        asked.append((tuple(call.query.shape), target))
        return fused

    monkeypatch.setattr(type(get_kernel("sdpa")), "fused", sdpa_fused)
    plan = assess(_record(("sdpa", *HALF), ("sdpa", *HALF)), NPU)
    only = plan.signatures[0]
    assert not only.signature.routed and only.kernel == "sdpa" and only.reasons == {"sdpa": []}
    assert only.fused is fused and plan.fused == (2 if fused else 0)
    assert asked == [((1, 2, 32, 64), NPU)]  # once per signature, for the target


def test_auto_lists_what_it_would_measure_and_counts_the_first_in_its_order():
    plan = assess(_record(HALF), NPU, "auto")
    only = plan.signatures[0]
    assert only.measured and only.kernel == "npu_fused_infer" and only.fused
    assert only.runnable[:2] == ["npu_fused_infer", "npu_fusion"] and "sdpa" in only.runnable
    assert [r.code for r in only.reasons["flash_attn"]] == ["device"]


def test_the_summary_rounds_down_and_says_when_nothing_was_recorded():
    plan = assess(_record(HALF, HALF, ((1, 2, 8, 1024), torch.float16, {})), NPU)
    assert plan.summary() == "fused: 2/3 attention calls (66%) on npu (910B) with strategy npu"
    empty = assess(record_calls(lambda: None), Target.of("cuda"), "sdpa")
    assert empty.summary() == "fused: 0/0 attention calls (no attention call was recorded) on cuda with strategy sdpa"


def test_the_plan_as_json_data():
    mask = {"attn_mask": torch.ones(32, 32, dtype=torch.bool)}
    plan = assess(_record(HALF, ((1, 2, 32, 64), torch.float16, mask)), NPU, model="m", dtype="float16", verbose=True)
    data = json.loads(json.dumps(plan.to_dict()))
    assert {k: data[k] for k in ("model", "device", "chip", "strategy", "dtype", "calls", "fused")} == {
        "model": "m",
        "device": "npu",
        "chip": "910B",
        "strategy": "npu",
        "dtype": "float16",
        "calls": 2,
        "fused": 2,
    }
    first, second = data["signatures"]
    assert first["shapes"] == {"query": [1, 2, 32, 64], "key": [1, 2, 32, 64], "value": [1, 2, 32, 64]}
    assert first["mask"] is None and first["routed"] and first["kernel"] == "npu_fused_infer" and first["count"] == 1
    assert second["mask"] == {"kind": "bool", "shape": [1, 1, 32, 32], "layout": "full", "pure": None, "values": None}
    assert second["bytes"]["inputs"] == 3 * 2 * 32 * 64 * 2 + 32 * 32
    assert list(second["every_kernel"]) == kernel_names()
    assert [r["code"] for r in second["every_kernel"]["flash_attn"]] == ["device", "mask"]


def test_the_text_report_says_what_runs_where_and_why_not(monkeypatch):
    from npu_port.plan.report import format_plan

    monkeypatch.setattr(type(get_kernel("sdpa")), "fused", lambda self, call, target: False)
    recording = _record(HALF, HALF, ((1, 2, 8, 1024), torch.float16, {}), ("sdpa", *HALF))
    text = format_plan(assess(recording, NPU, model="m", dtype="float16"))
    lines = text.splitlines()
    assert lines[:2] == [
        "plan: m on npu (910B), strategy npu (first: npu_fused_infer, npu_fusion), float16",
        "recorded on this machine: 4 attention calls in 3 signatures",
    ]
    rows = [line.split() for line in lines[4:7]]
    assert [row[:3] for row in rows] == [["1", "2", "1x2x32x64"], ["2", "1", "1x2x8x1024"], ["3", "1", "1x2x32x64"]]
    assert rows[0][-5:] == ["yes", "npu_fused_infer", "yes", "32.0", "KiB"]  # query, key, value, output: 8 KiB each
    assert rows[1][-8:-2] == ["yes", "none", "can", "run", "it", "no"]
    assert rows[2][-5:-2] == ["no", "sdpa", "no"]
    why = lines[lines.index("why:") + 1 :]
    assert why[:2] == ["  #1 npu_fused_infer, fused", "      npu_fusion: could run it (comes after npu_fused_infer)"]
    assert why[2] == "  #2 no candidate of strategy npu can run it on npu (910B)"
    assert why[3].startswith("      npu_fused_infer [head-dim] head_dim 1024 > 512")
    assert why[4].startswith("      npu_fusion [head-dim] head_dim 1024 > 768")
    assert why[5].startswith(f"  #3 sdpa, not fused; not routed: a direct F.scaled_dot_product_attention ({__file__}:")
    assert why[5].endswith(
        "that no npu-port integration routes, so on npu the device's own SDPA runs it (judged as the sdpa kernel); "
        "torch_npu sends SDPA to FlashAttentionScore only with a bool mask or none, heads <= 2048, head dim <= 512, "
        "query heads a multiple of key heads, on 910B or newer; otherwise it computes the whole score matrix"
    )
    assert "1 call(s) would fail on npu (910B) with strategy npu: no candidate can run them (see why above)" in lines
    assert lines[-1] == "fused: 2/4 attention calls (50%) on npu (910B) with strategy npu"
