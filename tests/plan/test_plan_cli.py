"""``npu-port plan`` and ``npu-port run --plan``: each tiny pipeline's plan as text and JSON, counted independently;
910A/310P plans; unrouted calls; a script; exact errors before anything is loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from npu_port.cli.main import main
from tests.plan.test_record import CountSdpa

TINY = ["tiny", "tiny-dit", "tiny-flux", "tiny-wan"]
#: Where each tiny pipeline makes calls that npu-port does not route (today): the Wan VAE's attention block (a direct
#: F.scaled_dot_product_attention in diffusers). The text encoders are routed (transformers' attention interface).
UNROUTED_FROM = {"tiny": set(), "tiny-dit": set(), "tiny-flux": set(), "tiny-wan": {"vae"}}
#: Where routed calls carry T5's relative-position bias (a float bias, not a mask): T5 / UMT5 text encoders. The
#: Ascend kernels refuse a bias until they take it through the op's pse input; every other routed call is fused.
BIAS_FROM = {"tiny": set(), "tiny-dit": set(), "tiny-flux": {"text_encoder_2"}, "tiny-wan": {"text_encoder"}}


def _plan_json(capsys, *arguments):
    with CountSdpa() as counted:
        code = main(["plan", "--json", *arguments])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), counted.calls, captured.err


@pytest.mark.parametrize("model", TINY)
def test_each_tiny_pipeline_plan_counts_every_call_and_fuses_every_routed_one(model, model_cache, capsys):
    code, data, counted, _ = _plan_json(capsys, "--device", "npu", "--model", model)
    assert code == 0
    assert data["calls"] == counted > 0  # torch's SDPA, counted as torch dispatches it: once per call
    assert data["calls"] == sum(s["count"] for s in data["signatures"])
    assert data["fused"] == sum(s["count"] for s in data["signatures"] if s["fused"])
    assert (data["device"], data["chip"], data["strategy"], data["model"], data["dtype"]) == (
        "npu",
        "910B",
        "npu",
        model,
        "float16",
    )
    routed = [s for s in data["signatures"] if s["routed"]]
    bias = [s for s in routed if s["mask"] is not None and s["mask"]["values"] == "bias"]
    assert routed and all(s["fused"] and s["kernel"] == "npu_fused_infer" for s in routed if s not in bias)
    assert {c for s in bias for c in s["components"]} == BIAS_FROM[model]
    for signature in bias:  # T5's position bias: npu_fusion_attention's pse (scale 1); the inference op refuses it
        assert signature["kernel"] == "npu_fusion" and signature["fused"]
        assert "mask" in [r["code"] for r in signature["reasons"]["npu_fused_infer"]]
    assert data["fused"] == data["calls"]  # issue 17: every call of the four tiny pipelines fused on a 910B
    assert {c for s in data["signatures"] if not s["routed"] for c in s["components"]} == UNROUTED_FROM[model]
    for signature in data["signatures"]:
        assert signature["dtype"] == "float16" and signature["bytes"]["total"] > 0
        if not signature["routed"]:
            assert signature["kernel"] == "sdpa" and signature["reasons"] == {"sdpa": []}
            assert signature["sites"]


def test_tiny_dit_runs_every_call_fused_on_a_910b(model_cache, capsys):
    code, data, counted, _ = _plan_json(capsys, "--device", "npu", "--model", "tiny-dit", "--require-fused")
    assert code == 0 and data["fused"] == data["calls"] == counted
    assert data["summary"] == f"fused: {counted}/{counted} attention calls (100%) on npu (910B) with strategy npu"


@pytest.mark.parametrize("model", TINY)
def test_the_text_plan_of_each_tiny_pipeline(model, model_cache, capsys):
    assert main(["plan", "--device", "npu", "--model", model, "--json", "--output", str(model_cache / "p.json")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert json.loads((model_cache / "p.json").read_text()) == data
    assert main(["plan", "--device", "npu", "--model", model]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"plan: {model} on npu (910B), strategy npu (first: npu_fused_infer, npu_fusion), float16"
    assert lines[1] == (
        f"recorded on this machine: {data['calls']} attention calls in {len(data['signatures'])} signatures"
    )
    assert lines[3].split() == [
        "#", "calls", "query", "key/value", "dtype", "mask", "flags", "from", "routed", "kernel", "fused", "memory",
    ]  # fmt: skip
    rows = lines[4 : 4 + len(data["signatures"])]
    for row, signature in zip(rows, data["signatures"]):
        cells = row.split()
        assert cells[1] == str(signature["count"]) and cells[2] == "x".join(map(str, signature["shapes"]["query"]))
        kernel = (signature["kernel"] or "none can run it").split()  # a T5 bias refused by the Ascend kernels
        expected = ["yes" if signature["routed"] else "no", *kernel, "yes" if signature["fused"] else "no"]
        assert cells[-2 - len(expected) : -2] == expected
    assert lines[-1] == data["summary"]


@pytest.mark.parametrize("chip", ["910A", "310P"])
def test_chips_without_fused_attention_plan_nothing_fused_with_chip_reasons(chip, model_cache, capsys):
    code, data, counted, err = _plan_json(
        capsys, "--device", "npu", "--chip", chip, "--model", "tiny-dit", "--require-fused"
    )
    assert code == 1 and data["chip"] == chip and data["fused"] == 0 and data["calls"] == counted > 0
    assert err.strip().endswith(f"{counted} of {counted} attention calls would not run fused (--require-fused)")
    for signature in data["signatures"]:
        assert signature["kernel"] is None
        for kernel in ("npu_fused_infer", "npu_fusion"):
            assert [r["code"] for r in signature["reasons"][kernel]] == ["chip"]
            assert signature["reasons"][kernel][0]["message"].startswith(f"Ascend {chip} has no FlashAttentionScore")


def test_a_cuda_plan_with_the_sdpa_strategy(model_cache, capsys):
    code, data, counted, _ = _plan_json(capsys, "--device", "cuda", "--strategy", "sdpa", "--model", "tiny-dit")
    assert code == 0 and data["chip"] is None and data["calls"] == counted
    assert {s["kernel"] for s in data["signatures"]} == {"sdpa"}


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--model", "nope"], "model 'nope' is neither a built-in model nor a local diffusers directory; a plan runs "
         "the model on this machine: give a directory (saved with pipe.save_pretrained(DIR)) or one of: tiny, "
         "tiny-dit, tiny-flux, tiny-wan"),
        (["--model", "tiny", "--chip", "999"], "unknown Ascend chip '999'; valid chips: 910A, 910B, 910C, 950, 310P"),
        (["--model", "tiny", "--device", "tpu"], "unknown plan device 'tpu'; valid devices: npu, cuda, cpu"),
        (["--model", "tiny", "--device", "cuda", "--chip", "910B"],
         "--chip names an Ascend chip; it applies to --device npu, not 'cuda'"),
        (["--model", "tiny", "--strategy", "custom-processor"],
         "strategy 'custom-processor' installs a processor class and routes no call to a kernel: there is nothing "
         "to plan; give a kernel strategy (npu, auto, sdpa, ...)"),
        (["--model", "tiny", "--steps", "0"], "steps must be between 1 and 50, got 0"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_before_anything_is_loaded(arguments, message, monkeypatch, capsys, tmp_path):
    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr("npu_port.plan.models.load_pipeline", no_loading)
    assert main(["plan", *arguments]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"npu-port: {message}\n" and captured.out == ""


def test_a_missing_diffusers_is_one_line_with_the_install_command(monkeypatch, capsys):
    from npu_port import _optional

    monkeypatch.setitem(sys.modules, "diffusers", None)  # a None entry blocks the import
    monkeypatch.setattr(_optional, "extra_hint", lambda extra: f"pip install the {extra} extra")
    _optional.forget("diffusers")
    try:
        assert main(["plan", "--model", "tiny"]) == 2
    finally:
        _optional.forget("diffusers")
    assert capsys.readouterr().err == (
        "npu-port: a plan of a pipeline runs it here with diffusers, and diffusers is not installed; install it with "
        "pip install the diffusers extra (a script is planned with npu-port run --plan)\n"
    )


def test_an_unknown_strategy_names_the_valid_ones(capsys):
    assert main(["plan", "--model", "tiny", "--strategy", "nope"]) == 2
    assert capsys.readouterr().err.startswith(
        "npu-port: unknown attention strategy 'nope'; valid strategies: auto, chunked, custom-processor, flash, npu,"
    )


SCRIPT = """\
import sys
import torch
import torch.nn.functional as F
import npu_port

print("script output")
q = torch.randn(1, 2, 32, 64, dtype=torch.float16).cuda()
for _ in range(int(sys.argv[1])):
    npu_port.attention(q, q, q)
F.scaled_dot_product_attention(q, q, q, attn_mask=torch.randn(32, 32, dtype=torch.float16))  # a bias: never fused
"""


def _script(tmp_path, body=SCRIPT):
    path = tmp_path / "script.py"
    path.write_text(body)
    return str(path)


def test_run_plan_records_a_script_and_keeps_json_on_stdout(tmp_path, capsys):
    script = _script(tmp_path)
    with CountSdpa() as counted:
        code = main(["run", "--plan", "--device", "npu", "--chip", "910B", "--json", script, "3"])
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # the script's print went to stderr
    assert code == 0 and "script output" in captured.err
    assert data["calls"] == 4 == counted.calls and data["fused"] == 3 and data["model"] == script
    routed, unrouted = data["signatures"]
    assert (routed["count"], routed["routed"], routed["kernel"], routed["fused"]) == (3, True, "npu_fused_infer", True)
    assert (unrouted["count"], unrouted["routed"], unrouted["kernel"]) == (1, False, "sdpa")
    assert (unrouted["mask"]["values"], unrouted["fused"], unrouted["sites"]) == ("bias", False, [f"{script}:10"])


def test_run_plan_as_text_and_the_script_failure_wins(tmp_path, capsys):
    script = _script(tmp_path, SCRIPT + "raise SystemExit(3)\n")
    assert main(["run", "--plan", "--chip", "910A", "--require-fused", script, "2"]) == 3
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == "fused: 0/3 attention calls (0%) on npu (910A) with strategy npu"
    assert "script output" in captured.out
    assert "npu-port run --plan: the script stopped with exit code 3" in captured.err


def test_plan_flags_need_run_plan(tmp_path, capsys):
    assert main(["run", "--chip", "910B", _script(tmp_path), "1"]) == 2
    assert capsys.readouterr().err == (
        "npu-port: --chip applies to --plan only (npu-port run --plan --chip ... script.py)\n"
    )


@pytest.mark.e2e
def test_npu_port_plan_as_a_command(model_cache):
    result = subprocess.run(
        [sys.executable, "-m", "npu_port", "plan", "--device", "npu", "--json", "--model", "tiny-dit"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(result.stdout)
    assert data["fused"] == data["calls"] > 0
