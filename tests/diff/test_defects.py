"""Defects injected into tiny models: the comparison must name the defective module first, as the origin, at the
step where the defect starts — and must name nothing when two runs differ only by equivalent kernels.

Side A is the clean model, side B the same weights with one defect (``tests/diff/defect_models.py``); both are
captured with :func:`npu_port.diff.capture` and compared with :func:`npu_port.diff.compare_dumps`.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from npu_port.diff import Dump, capture, compare_dumps
from npu_port.diff.compare import TOLERANCE

from . import defect_models as dm

ROOT = Path(__file__).resolve().parents[2]


def _first(tmp_path, name, defect, from_call=None, calls=1):
    dm.write_dump(name, str(tmp_path / "a.d"), calls=calls)
    dm.write_dump(name, str(tmp_path / "b.d"), defect, from_call, calls)
    report = compare_dumps(Dump(tmp_path / "a.d"), Dump(tmp_path / "b.d"))
    return report, report.as_dict()["first_divergence"]


def _names(first):
    return first["module"], first["origin"], first["step"], first["call"]


# ---------------------------------------------------------------------------------------------------------------
# the defects


def test_a_flipped_mask_in_one_attention_module_is_named_first_as_origin(tmp_path):
    report, first = _first(tmp_path, "encoder", "blocks.1.attn")
    assert _names(first) == ("blocks.1.attn", True, 0, 0)
    assert first["class"] == "MaskedAttention" and first["metric"] == "error"
    assert first["input_error"] == 0.0 and first["error"] > 100 * first["tolerance"]
    # the modules around it hold it too (their inputs match), so they are origins as well, named after it; what
    # comes after it only carries it
    origins = {c.module: c.origin for c in report.divergent}
    assert [m for m, origin in origins.items() if origin] == ["blocks.1.attn", "blocks.1", "(model)"]
    assert origins["blocks.2.attn"] is False and origins["blocks.2"] is False
    assert not [m for m in origins if m.startswith("blocks.0")]


def test_is_causal_dropped_in_one_call_is_named_first_as_origin(tmp_path):
    _, first = _first(tmp_path, "decoder", "blocks.2.attn")
    assert _names(first) == ("blocks.2.attn", True, 0, 0)
    assert first["input_error"] == 0.0 and first["error"] > 100 * first["tolerance"]


@pytest.mark.slow
def test_a_defect_that_starts_at_the_second_step_is_reported_at_that_step(tmp_path):
    report, first = _first(tmp_path, "encoder", "blocks.0.attn", from_call=1, calls=3)
    assert _names(first) == ("blocks.0.attn", True, 1, 0)
    assert not [c for c in report.divergent if c.step == 0]
    assert {c.step for c in report.divergent if c.module == "blocks.0.attn"} == {1, 2}


def test_a_float16_overflow_in_one_norm_is_named_first_with_the_nan_it_makes(tmp_path):
    report, first = _first(tmp_path, "big", "norms.1")
    assert _names(first) == ("norms.1", True, 0, 0)
    assert first["class"] == "HalfNorm" and first["metric"] == "nan"
    assert first["outputs"][0]["nan"][0] == 0 and first["outputs"][0]["nan"][1] > 0
    assert first["inputs"][0]["metric"] == "match"  # the values over 65504 come in identical: float32 on both sides
    assert first["inputs"][0]["divergent"] is False
    # the NaN is carried, not made, by the next stage
    assert {c.module: c.origin for c in report.divergent}["norms.2"] is False


def _geglu_tanh(gate: torch.Tensor) -> torch.Tensor:
    return F.gelu(gate, approximate="tanh")


@pytest.mark.slow
def test_geglu_tanh_instead_of_erf_in_one_feed_forward_is_named_first(tmp_path):
    from npu_port.integrations.diffusers.tiny import run_tiny, tiny_unet

    model = tiny_unet()
    with torch.no_grad():  # gates near -2.5, where tanh's form is furthest from erf's relative to gelu itself
        for module in model.modules():
            if type(module).__name__ == "GEGLU":
                half = module.proj.bias.shape[0] // 2
                module.proj.bias[half:] = -2.5
                module.proj.weight[half:] *= 0.1
    defective = copy.deepcopy(model)
    path = "up_blocks.1.attentions.0.transformer_blocks.0.ff.net.0"
    defective.get_submodule(path).gelu = _geglu_tanh
    for target, where in ((model, "a.d"), (defective, "b.d")):
        with capture(target, tmp_path / where):
            run_tiny(target)
    first = compare_dumps(Dump(tmp_path / "a.d"), Dump(tmp_path / "b.d")).as_dict()["first_divergence"]
    assert _names(first) == (path, True, 0, 0)
    assert first["class"] == "GEGLU" and first["input_error"] == 0.0
    assert first["error"] > 100 * TOLERANCE["float32"]  # 1.6e-2 here: not a marginal call


@pytest.fixture
def emulated_npu(monkeypatch):
    """torch_npu = the emulator (its fused ops included), and the fused ops take CPU tensors."""
    from npu_port.fuse import backend

    from ..emulators import torch_npu_emulator

    module = torch_npu_emulator.install(monkeypatch)
    monkeypatch.setattr(backend, "DEVICE_TYPES", ("npu", "cpu"))
    return module


def test_a_fused_op_that_changes_its_scale_after_its_check_is_named_first(tmp_path, emulated_npu, monkeypatch):
    """fuse_ops checks each site once, on its first call; an op that passes that check and then misbehaves (here:
    one RMSNorm's output scaled by 1.01 from its second call on) is what the diff has to find."""
    import npu_port

    model = dm.build("rms")
    fused = copy.deepcopy(model)
    bad_gamma = fused.norms[1].weight
    exact = emulated_npu.npu_rms_norm
    seen = []

    def drifting(x, gamma, epsilon=1e-6):
        y, rstd = exact(x, gamma, epsilon)
        if gamma is bad_gamma:
            seen.append(1)
            if len(seen) > 1:  # the first call is fuse_ops' check
                y = y * 1.01
        return y, rstd

    monkeypatch.setattr(emulated_npu, "npu_rms_norm", drifting)
    with capture(model, tmp_path / "a.d"):
        dm.run(model, "rms", calls=3)
    with npu_port.fuse_ops(fused, ops=["rms_norm"]) as handle:
        with capture(fused, tmp_path / "b.d"):
            dm.run(fused, "rms", calls=3)
        assert [site.state for site in handle.sites] == ["checked"] * 3  # it passed its check
        assert all(site.fused_calls == 3 for site in handle.sites)
    first = compare_dumps(Dump(tmp_path / "a.d"), Dump(tmp_path / "b.d")).as_dict()["first_divergence"]
    assert _names(first) == ("norms.1", True, 1, 0)
    assert first["class"] == "RMSNorm" and first["input_error"] < TOLERANCE["float32"] / 10
    assert first["error"] == pytest.approx(0.01, rel=0.05)


# ---------------------------------------------------------------------------------------------------------------
# NaN


def test_a_nan_in_both_runs_is_no_divergence_and_in_one_run_it_is(tmp_path):
    model = dm.build("nan")
    with capture(model, tmp_path / "a.d"):
        dm.run(model, "nan")
    with capture(model, tmp_path / "same.d"):
        dm.run(model, "nan")
    clean = copy.deepcopy(model)
    clean[1].on = False
    with capture(clean, tmp_path / "clean.d"):
        dm.run(clean, "nan")
    same = compare_dumps(Dump(tmp_path / "a.d"), Dump(tmp_path / "same.d"))
    assert same.as_dict()["first_divergence"] is None and same.compared > 0
    assert any(p.a["nan"] == 1 for c in same.calls for p in c.outputs)  # the NaN was there, in both
    first = compare_dumps(Dump(tmp_path / "clean.d"), Dump(tmp_path / "a.d")).as_dict()["first_divergence"]
    assert _names(first) == ("1", True, 0, 0) and first["metric"] == "nan"


# ---------------------------------------------------------------------------------------------------------------
# across processes


@pytest.mark.e2e
@pytest.mark.slow
def test_a_dump_written_by_another_process_is_compared_here(tmp_path):
    dm.write_dump("encoder", str(tmp_path / "a.d"), calls=2)
    command = [sys.executable, "-m", "tests.diff.defect_models", "encoder", str(tmp_path / "b.d"), "blocks.2.attn"]
    done = subprocess.run(command + ["1", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    b = Dump(tmp_path / "b.d")
    assert b.complete and b.meta["defect"] == "blocks.2.attn"
    first = compare_dumps(Dump(tmp_path / "a.d"), b).as_dict()["first_divergence"]
    assert _names(first) == ("blocks.2.attn", True, 1, 0)


# ---------------------------------------------------------------------------------------------------------------
# equivalent kernels


def _strategy_dumps(pipe, run, tmp_path):
    from npu_port.strategy.api import set_attention_strategy

    for strategy in ("vanilla", "sdpa"):
        handle = set_attention_strategy(strategy, target=pipe)
        try:
            with capture(pipe, tmp_path / f"{strategy}.d"):
                run(pipe)
        finally:
            handle.restore()
    return compare_dumps(Dump(tmp_path / "vanilla.d"), Dump(tmp_path / "sdpa.d"))


@pytest.mark.slow
def test_sdpa_and_vanilla_attention_on_the_tiny_dit_pipeline_do_not_diverge(tmp_path):
    from npu_port.integrations.diffusers.tiny import run_tiny_pipeline, tiny_dit_pipeline

    report = _strategy_dumps(tiny_dit_pipeline(), run_tiny_pipeline, tmp_path)
    assert report.as_dict()["first_divergence"] is None
    assert report.only_a == report.only_b == 0 and len(report.calls) > 100
    assert {0, 1} <= {c.step for c in report.calls}
    assert any(c.kind == "attention" for c in report.calls)  # the routed calls were compared too


@pytest.mark.slow
def test_sdpa_and_vanilla_attention_on_the_tiny_unet_pipeline_do_not_diverge(tmp_path, text2image_dir):
    from .pipelines import run_text2image, text2image_pipeline

    report = _strategy_dumps(text2image_pipeline(text2image_dir), lambda pipe: run_text2image(pipe, steps=1), tmp_path)
    assert report.as_dict()["first_divergence"] is None
    assert report.only_a == report.only_b == 0 and len(report.calls) > 100
    assert any(c.kind == "attention" for c in report.calls)


@pytest.mark.slow
def test_a_defect_from_the_second_denoiser_call_of_a_pipeline_is_reported_at_step_1(tmp_path):
    """A LayerNorm whose epsilon goes wrong (1e-5 -> 0.1, an "epsilon ignored" port) from the second call of the
    DiT transformer on: the diff names that norm, at step 1, and nothing at step 0."""
    from npu_port.integrations.diffusers.tiny import run_tiny_pipeline, tiny_dit_pipeline

    pipe = tiny_dit_pipeline()
    path = "transformer_blocks.1.norm3"
    norm = pipe.transformer.get_submodule(path)
    eps = norm.eps
    with capture(pipe, tmp_path / "a.d"):
        run_tiny_pipeline(pipe, steps=3)
    calls = []

    def breaks_at_the_second_call(module, args):
        calls.append(1)
        norm.eps = 0.1 if len(calls) >= 2 else eps

    hook = pipe.transformer.register_forward_pre_hook(breaks_at_the_second_call)
    try:
        with capture(pipe, tmp_path / "b.d"):
            run_tiny_pipeline(pipe, steps=3)
    finally:
        hook.remove()
        norm.eps = eps
    report = compare_dumps(Dump(tmp_path / "a.d"), Dump(tmp_path / "b.d"))
    first = report.as_dict()["first_divergence"]
    assert _names(first) == (f"transformer.{path}", True, 1, 0) and first["class"] == "LayerNorm"
    assert first["error"] > 100 * first["tolerance"] and first["input_error"] == 0.0
    assert not [c for c in report.divergent if c.step < 1]


@pytest.mark.slow
def test_a_fused_attention_op_with_a_changed_scale_in_one_module_is_named_first(tmp_path, monkeypatch):
    """Strategy npu on the emulated torch_npu: npu_fusion_attention given 1.5x the scale in its second call (the
    second transformer block's) — the routed attention call inside that block's attn1 is named first."""
    import types

    from npu_port.integrations.diffusers.tiny import run_tiny, tiny_dit
    from npu_port.strategy.api import set_attention_strategy

    from ..conftest import emulated_torch_npu

    visible = types.SimpleNamespace(is_available=lambda: True, get_device_name=lambda index=0: "Ascend910B2")
    monkeypatch.setattr(torch, "npu", visible, raising=False)  # the strategy's device check: an NPU is there
    with emulated_torch_npu() as npu:
        model = tiny_dit()
        handle = set_attention_strategy("npu", target=model)
        try:
            with capture(model, tmp_path / "a.d"):
                run_tiny(model)
            exact, calls = npu.npu_fusion_attention, []

            def scaled_once(*args, **kwargs):
                calls.append(1)
                if len(calls) == 2:
                    kwargs["scale"] = kwargs["scale"] * 1.5
                return exact(*args, **kwargs)

            monkeypatch.setattr(npu, "npu_fusion_attention", scaled_once)
            with capture(model, tmp_path / "b.d"):
                run_tiny(model)
        finally:
            handle.restore()
    assert len(calls) == 2  # one call per block: the float32 calls go to npu_fusion_attention
    first = compare_dumps(Dump(tmp_path / "a.d"), Dump(tmp_path / "b.d")).as_dict()["first_divergence"]
    assert (first["kind"], *_names(first)) == ("attention", "transformer_blocks.1.attn1", True, 0, 0)
    assert first["class"] == "attention(is_causal=False, scale=0.25)" and first["input_error"] == 0.0
    assert first["error"] > 100 * first["tolerance"]
