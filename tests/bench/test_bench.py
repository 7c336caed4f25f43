"""``npu-port bench`` and ``benchmarks/auto_pick.py`` on tiny shapes: what they write, and how they refuse.

Nothing here checks a speed: the numbers are whatever this machine gives. What is checked is the record — columns,
machine info, parity against float64, the kernel auto picked, a refusal's reason where a time would be — and that a
bad option names the valid ones.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

import npu_port
from npu_port._optional import extra_hint
from npu_port.attn import AttentionCall
from npu_port.bench import BenchError
from npu_port.bench.memory import AllocationTracker
from npu_port.bench.report import COLUMNS
from npu_port.bench.runner import Settings, choose, select_strategies
from npu_port.bench.shapes import SHAPES, parse_shapes
from npu_port.cli.main import main
from npu_port.strategy.registry import get_strategy

from ..conftest import emulated_torch_npu

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
TINY = "custom:1,2,128,16"
FAST = ["--repeats", "2", "--warmup", "1"]


def _csv(path: Path):
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        return reader.fieldnames, list(reader)


def test_tiny_shape_writes_csv_json_png_with_every_strategy_and_refusal(tmp_path, capsys):
    code = main(
        ["bench", "--shapes", TINY, "--strategies", "vanilla,sdpa,chunked,auto,npu", *FAST, "--output", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert code == 0, out

    header, rows = _csv(tmp_path / "bench.csv")
    assert tuple(header) == COLUMNS
    by_strategy = {r["strategy"]: r for r in rows}
    assert list(by_strategy) == ["vanilla", "sdpa", "chunked", "auto", "npu"]
    assert all(r["shape"] == "custom-1x2x128x16" and r["seq_q"] == "128" and r["dtype"] == "float32" for r in rows)
    for name in ("vanilla", "sdpa", "chunked", "auto"):
        row = by_strategy[name]
        assert row["status"] == "ok" and row["parity_ok"] == "True", row
        assert float(row["parity_max_abs_error"]) < 1e-5
        assert float(row["median_ms"]) > 0 and float(row["tflops"]) > 0 and row["runs"] == "2"
    assert by_strategy["vanilla"]["kernel"] == "math"
    # the materialising kernel's peak holds its 2 x 128 x 128 float32 scores; the fused one's does not
    assert float(by_strategy["vanilla"]["peak_mib"]) * 2**20 >= 2 * 128 * 128 * 4
    assert float(by_strategy["sdpa"]["peak_mib"]) < float(by_strategy["vanilla"]["peak_mib"])

    auto = by_strategy["auto"]
    assert auto["kernel"] in ("sdpa", "chunked", "math") and f"{auto['kernel']} " in auto["note"]
    assert auto["note"].startswith("probe: ") and "(picked)" in auto["note"]
    npu = by_strategy["npu"]
    assert npu["status"] == "unavailable" and npu["median_ms"] == "" and "torch_npu is not installed" in npu["note"]

    report = json.loads((tmp_path / "bench.json").read_text())
    for key in ("device_name", "torch", "cpu_count", "date", "python"):
        assert report["machine"][key], key
    assert report["settings"]["dtype"] == "float32" and report["settings"]["repeats"] == 2
    auto_cell = next(c for c in report["cells"] if c["strategy"] == "auto")
    assert {c["kernel"] for c in auto_cell["decision"]} >= {"sdpa", "chunked", "math", "npu_fusion"}
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    table = out.splitlines()
    assert table[0].startswith("npu-port bench on cpu")
    auto_line = next(line for line in table if line.split()[1:2] == ["auto"])
    assert auto_line.split()[2] == auto["kernel"]
    npu_line = next(line for line in table if line.split()[1:2] == ["npu"])
    assert "unavailable" in npu_line and "torch_npu is not installed" in npu_line
    assert "fastest correct strategy per shape: custom-1x2x128x16: " in out
    assert f"wrote {tmp_path / 'bench.csv'}, {tmp_path / 'bench.json'}, {tmp_path / 'bench.png'}" in out


def test_memory_budget_refuses_a_materialising_kernel_without_running_it(capsys):
    # math would need 2 x 1 x 1 x 2048² x 4 B = 32 MiB of scores; the budget is 1 MiB
    code = main(["bench", "--shapes", "custom:1,1,2048,8", "--strategies", "vanilla,chunked", *FAST,
                 "--memory-budget", "1MiB"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    vanilla = next(line for line in out.splitlines() if line.split()[1:2] == ["vanilla"])
    assert "refused" in vanilla
    assert "math would materialise 32 MiB of scores, over the 1 MiB memory budget (--memory-budget)" in vanilla
    chunked = next(line for line in out.splitlines() if line.split()[1:2] == ["chunked"])
    assert "refused" not in chunked


def test_controlvideo_shape_is_refused_for_math_from_its_size_alone():
    """61440 tokens: 483 GiB of float32 scores. Refused from ``score_bytes``; meta tensors prove nothing ran."""
    shape = SHAPES["video-15x4096"]
    q, k, v = (torch.empty(2, 8, 61440, 40, device="meta") for _ in range(3))
    call = AttentionCall.from_arguments(q, k, v)
    settings = Settings(device=torch.device("cpu"), dtype=torch.float32, memory_budget=64 << 30)
    cell, running = choose(get_strategy("vanilla"), shape, call, settings)
    assert running is None and cell.status == "refused" and cell.kernel == "math"
    assert cell.note == "math would materialise 450.0 GiB of scores, over the 64.0 GiB memory budget (--memory-budget)"


def test_default_shapes_leave_the_video_out_on_cpu_and_say_why():
    shapes, skipped = parse_shapes(None, "cpu")
    assert [s.name for s in shapes] == ["seq256", "seq512", "seq1024", "sd-64x64"]
    assert [name for name, _ in skipped] == ["video-15x4096"] and "--shapes all" in skipped[0][1]
    assert [s.name for s in parse_shapes(None, "cuda")[0]][-1] == "video-15x4096"
    assert [s.name for s in parse_shapes("all", "cpu")[0]][-1] == "video-15x4096"
    assert parse_shapes("all", "cpu")[1] == []
    shapes, _ = parse_shapes("seq256,custom:2,8,64,40,custom:1x1x32x8", "cpu")
    assert [(s.name, s.batch, s.heads, s.seq, s.head_dim) for s in shapes] == [
        ("seq256", 1, 12, 256, 64),
        ("custom-2x8x64x40", 2, 8, 64, 40),
        ("custom-1x1x32x8", 1, 1, 32, 8),
    ]
    sd = SHAPES["sd-64x64"]
    assert (sd.batch, sd.heads, sd.seq, sd.head_dim, sd.flops) == (2, 8, 4096, 40, 4 * 2 * 8 * 4096 * 4096 * 40)


def test_default_strategies_are_those_available_here_and_the_rest_are_explained():
    chosen, skipped = select_strategies(None)
    names = [s.name for s in chosen]
    assert {"vanilla", "sdpa", "chunked", "auto"} <= set(names)
    assert "npu" not in names and "custom-processor" not in names
    reasons = dict(skipped)
    assert reasons["npu"].startswith("cannot run on this machine: npu_fused_infer, npu_fusion: torch_npu is not")
    assert reasons["custom-processor"] == "routes no attention kernel (it installs a diffusers processor class)"
    assert all(get_strategy(n).kind == "strategy" for n in names)
    everything, skipped = select_strategies("all")  # unavailable ones too: their rows say why
    assert {"npu", "flash", "xformers"} <= {s.name for s in everything}
    assert [name for name, _ in skipped] == ["custom-processor"]


def test_bad_shapes_name_the_valid_ones(capsys):
    assert main(["bench", "--shapes", "seq999"]) == 2
    assert capsys.readouterr().err == (
        "npu-port: unknown bench shape 'seq999'; valid shapes: seq256, seq512, seq1024, sd-64x64, video-15x4096, "
        "default, all, custom:B,H,S,D (batch, heads, sequence length, head dim; e.g. custom:1,8,1024,64)\n"
    )
    assert main(["bench", "--shapes", "custom:1,2"]) == 2
    assert capsys.readouterr().err == (
        "npu-port: bad custom shape 'custom:1,2': write custom:B,H,S,D (batch, heads, sequence length, head dim; "
        "e.g. custom:1,8,1024,64), four positive integers\n"
    )
    with pytest.raises(BenchError, match="four positive integers"):
        parse_shapes("custom:0,1,1,1", "cpu")


def test_bad_strategies_name_the_valid_ones(capsys):
    assert main(["bench", "--strategies", "vanilla,fastest", "--shapes", TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"npu-port: unknown attention strategy 'fastest'; valid strategies: {', '.join(npu_port.list_strategies())}"
    )
    assert main(["bench", "--strategies", ",", "--shapes", TINY]) == 2
    assert capsys.readouterr().err.startswith("npu-port: --strategies names no strategy; valid strategies: auto, ")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dtype", "float8"], "argument --dtype: invalid choice: 'float8'"),
        (["--repeats", "0"], "argument --repeats: must be an integer >= 1, got '0'"),
        (["--warmup", "x"], "argument --warmup: must be an integer >= 0, got 'x'"),
    ],
)
def test_bad_numbers_and_dtypes_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_device_and_budget_are_explained(capsys):
    assert main(["bench", "--device", "gpu0", "--shapes", TINY]) == 2
    assert "npu-port: unknown device 'gpu0' (argument); valid devices: auto, npu, cuda, xpu, mps, cpu" in (
        capsys.readouterr().err
    )
    if not torch.cuda.is_available():
        assert main(["bench", "--device", "cuda", "--shapes", TINY]) == 2
        assert "npu-port: device 'cuda' (argument) is not usable here: this torch " in capsys.readouterr().err
    assert main(["bench", "--memory-budget", "lots", "--shapes", TINY]) == 2
    assert "npu-port: --memory-budget must be a byte count or a size such as '512MiB'" in (capsys.readouterr().err)


def test_missing_matplotlib_fails_before_measuring_and_no_plot_skips_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main(["bench", "--shapes", TINY, "--strategies", "sdpa", *FAST, "--output", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"bench.png needs matplotlib: {extra_hint('bench')}, or use --no-plot" in captured.err
    assert main(["bench", "--shapes", TINY, "--strategies", "sdpa", *FAST, "--output", str(tmp_path), "--no-plot"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.csv", "bench.json"]


def test_a_kernel_that_fails_is_reported_and_sets_the_exit_code(monkeypatch, capsys):
    from npu_port.attn.kernels.sdpa import SdpaKernel

    def broken(self, call):
        raise RuntimeError("device lost\nsecond line")

    monkeypatch.setattr(SdpaKernel, "run", broken)
    # (a router runs an unmasked call's prepared runner from its first call on: that fails as the device would)
    monkeypatch.setattr(SdpaKernel, "prepare", lambda self, call: lambda query, key, value: broken(self, call))
    assert main(["bench", "--shapes", TINY, "--strategies", "sdpa,vanilla", *FAST]) == 1
    out = capsys.readouterr().out
    sdpa = next(line for line in out.splitlines() if line.split()[1:2] == ["sdpa"])
    assert "failed" in sdpa and "sdpa failed: RuntimeError: device lost" in sdpa and "second line" not in sdpa


def _npu_line(capsys) -> str:
    return next(x for x in capsys.readouterr().out.splitlines() if x.split()[1:2] == ["npu"])


def test_emulated_npu_without_a_device_is_unavailable_and_with_one_runs(monkeypatch, capsys):
    from npu_port.attn.kernels.npu_fused_infer import NpuFusedInferKernel
    from npu_port.attn.kernels.npu_fusion import NpuFusionKernel

    with emulated_torch_npu():
        assert main(["bench", "--shapes", TINY, "--strategies", "npu", *FAST, "--device", "cpu"]) == 0
        line = _npu_line(capsys)
        assert "unavailable" in line and "torch_npu imports but no NPU is visible" in line

        # as if an NPU were visible: the emulated ops then run the npu strategy on CPU tensors
        for cls in (NpuFusedInferKernel, NpuFusionKernel):
            monkeypatch.setattr(cls, "device_reasons", lambda self: [])
        assert main(["bench", "--shapes", TINY, "--strategies", "npu", *FAST, "--dtype", "float16"]) == 0
        line = _npu_line(capsys)
        assert line.split()[2] == "npu_fused_infer" and "(!)" not in line
        # float32: the inference op refuses it, so select: first falls through to npu_fusion_attention
        assert main(["bench", "--shapes", TINY, "--strategies", "npu", *FAST]) == 0
        assert _npu_line(capsys).split()[2] == "npu_fusion"
        # a shape neither op can run (head_dim 1024 > 768) is refused with both kernels' reasons
        assert main(["bench", "--shapes", "custom:1,1,8,1024", "--strategies", "npu", *FAST]) == 0
        line = _npu_line(capsys)
        assert "refused" in line and "npu_fusion: head_dim 1024 > 768" in line


def test_the_tests_allocation_tracker_is_the_packages():
    from ..memory_tracker import AllocationTracker as tests_tracker

    assert tests_tracker is AllocationTracker


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_auto_pick_quick_mode_writes_its_json(tmp_path, capsys):
    auto_pick = _load("auto_pick")
    code = auto_pick.main(["--quick", "--out", str(tmp_path)])
    assert code in (0, 1)  # pass/fail is timing; on tiny shapes it is noise, not what this test checks
    report = json.loads((tmp_path / "auto_pick_cpu_float32_quick.json").read_text())
    assert report["machine"]["cpu_count"] >= 1 and report["config"]["trials"] == 1
    assert [row["shape"] for row in report["shapes"]] == ["custom-1x2x64x16", "custom-1x4x256x32"]
    for row in report["shapes"]:
        assert row["fastest"] in ("sdpa", "chunked", "math")
        assert row["candidates"]["npu_fusion"]["status"] == "refused"
        timed = {k: c for k, c in row["candidates"].items() if "median_ms" in c}
        assert set(timed) == {"sdpa", "chunked", "math"} and all(c["runs"] >= 3 for c in timed.values())
        (trial,) = row["trials"]
        assert trial["pick"] in timed and trial["ratio"] >= 1.0
        assert row["passed"] == (trial["ratio"] <= 1.05)
    assert report["passed"] == all(row["passed"] for row in report["shapes"]) == (code == 0)
    assert "wrote" in capsys.readouterr().out
