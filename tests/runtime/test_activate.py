"""``npu_port.activate`` installs everything ``npu-port run`` needs and ``deactivate`` takes all of it back; a
profile's ``safe_math`` forces float32 autocast and TF32 off for the run."""

from __future__ import annotations

import sys

import torch

import npu_port
from npu_port.device.redirect import patched_attributes
from npu_port.dropins.finder import StandInFinder, registered
from npu_port.runtime.launch import run_entry
from npu_port.runtime.locate import resolve_entry
from npu_port.runtime.watch_imports import ImportWatcher
from npu_port.strategy.tally import TALLY

from ..holding_applier import Model, holding_applier


def test_activate_then_deactivate_leaves_nothing_behind(tmp_path):
    ours = (StandInFinder, ImportWatcher)
    assert not [finder for finder in sys.meta_path if isinstance(finder, ours)]
    tensor_cuda, autocast_init = torch.Tensor.cuda, torch.amp.autocast_mode.autocast.__init__
    activation = npu_port.activate("cpu", watch=[str(tmp_path)])
    try:
        line = sys._getframe().f_lineno
        assert torch.zeros(1, device="cuda").device.type == "cpu"
        assert set(registered()) >= {"flash_attn", "xformers", "alt_cuda_corr"}
        import flash_attn

        q = torch.randn(1, 4, 2, 8)
        out = flash_attn.flash_attn_func(q, q, q)
        assert out.shape == q.shape
        summary = activation.summary()
        assert summary["device"] == "cpu" and summary["strategy"]["requested"] == "auto"
        assert summary["drop_ins"]["served"]["flash_attn"][0] == "flash_attn"
        assert summary["safe_math"] is None
        assert summary["by_rule"] == {
            "NPU101": {"name": "flash-attn-import", "count": 1, "where": [f"{__file__}:{line + 3}"]},
            "NPU110": {"name": "flash-attn-call", "count": 1, "where": [f"{__file__}:{line + 6}"]},
            "NPU310": {"name": "cuda-device-literal", "count": 1, "where": [f"{__file__}:{line + 1}"]},
        }
    finally:
        activation.deactivate()
    activation.deactivate()  # twice is safe
    assert not [finder for finder in sys.meta_path if isinstance(finder, ours)] and "flash_attn" not in sys.modules
    assert registered() == {} and patched_attributes() == []
    assert torch.Tensor.cuda is tensor_cuda and torch.amp.autocast_mode.autocast.__init__ is autocast_init


def test_a_safe_math_profile_keeps_autocast_in_float32_and_tf32_off():
    tf32 = torch.backends.cuda.matmul.allow_tf32
    autocast_init = torch.amp.autocast_mode.autocast.__init__
    a = torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
    activation = npu_port.activate("cpu", profile="cuda-safe-math")
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert (a @ a).dtype == torch.float32
        assert torch.backends.cuda.matmul.allow_tf32 is False
        assert activation.summary()["safe_math"] == {"fp32": True, "tf32": False}
        assert activation.summary()["strategy"]["requested"] == "cuda-safe-math"
    finally:
        activation.deactivate()
    assert torch.backends.cuda.matmul.allow_tf32 == tf32
    assert torch.amp.autocast_mode.autocast.__init__ is autocast_init
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16


def test_an_entry_script_whose_device_type_check_is_rewritten_runs(tmp_path):
    """The rewritten script needs the helper in its globals, which activate's init_globals gives too: given twice,
    it used to stop the script before its first line (TypeError: multiple values for keyword argument)."""
    script = tmp_path / "check.py"
    script.write_text('import torch\n\nassert torch.zeros(1, device="cuda").device.type == "cuda"\n')
    activation = npu_port.activate("cpu", watch=[str(tmp_path)])
    try:
        outcome = run_entry(resolve_entry(str(script), False), [], transform=activation.transform,
                            init_globals=activation.init_globals)  # fmt: skip
        checks = activation.summary()["device_checks"]
    finally:
        activation.deactivate()
    assert (outcome.status, outcome.error) == ("completed", None)
    assert [(c["line"], c["hits"]) for c in checks] == [(3, 1)]


def test_every_routed_attention_call_is_counted_and_the_summary_says_through_what():
    """The process-wide strategy's calls (drop-ins, legacy attention) and those of a strategy a hook applied to a
    pipeline are one count; the first summary line names the kernels that ran and, when not only the process-wide
    strategy routed, through what."""
    activation = npu_port.activate("cpu", "sdpa")
    q = torch.randn(1, 2, 4, 8)
    try:
        with holding_applier():
            assert activation.format_summary().splitlines()[0] == (
                "npu-port run: device cpu; attention strategy sdpa -> sdpa (none)"
            )
            model = Model()
            with TALLY.via("Pipe.enable_xformers_memory_efficient_attention()"):
                routed = npu_port.set_attention_strategy("chunked", target=model)
            for _ in range(3):
                model.attend(q, q, q)
            assert activation.format_summary().splitlines()[0] == (
                "npu-port run: device cpu; attention strategy sdpa -> chunked "
                "(chunked x3 via Pipe.enable_xformers_memory_efficient_attention())"
            )
            npu_port.attention(q, q, q)
            summary = activation.summary()
            routed.restore()
            assert activation.format_summary().splitlines()[0] == (
                "npu-port run: device cpu; attention strategy sdpa -> chunked+sdpa (chunked x3, sdpa x1: "
                "1 process-wide, 3 via Pipe.enable_xformers_memory_efficient_attention())"
            )
    finally:
        activation.deactivate()
    assert summary["attention_calls"] == {"chunked": 3, "sdpa": 1}
    assert summary["strategy"] == {"requested": "sdpa", "resolved": "chunked+sdpa"}
    assert summary["attention_routes"] == [
        {"via": "process-wide", "strategy": "sdpa", "calls": {"sdpa": 1}},
        {"via": "Pipe.enable_xformers_memory_efficient_attention()", "strategy": "chunked", "calls": {"chunked": 3}},
    ]
    assert TALLY.routes() == []  # deactivate closed the tally
