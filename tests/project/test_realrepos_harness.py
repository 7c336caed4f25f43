"""benchmarks/realrepos: the comparison fails closed and the hand port refuses an edit that no longer matches."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

HARNESS = Path(__file__).resolve().parents[2] / "benchmarks" / "realrepos"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"realrepos_{name}", HARNESS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


compare = _load("compare").compare
handport = _load("handport")


def _gif(path: Path, frames) -> None:
    images = [Image.fromarray(np.full((4, 4, 3), level, np.uint8)) for level in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=100, loop=0)


def test_every_gif_frame_and_tensor_is_compared_and_timestamped_folders_match(tmp_path):
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    for run, last_frame, value in ((run_a, 10, 1.0), (run_b, 13, 1.25)):
        folder = run / "samples" / ("prompts-2026-11-23T19-07-31" if run is run_a else "prompts-2026-11-23T19-08-02")
        folder.mkdir(parents=True)
        _gif(folder / "sample.gif", [0, last_frame])
        (run / "capture").mkdir()
        torch.save([torch.tensor([value, -4.0])], run / "capture" / "Decoder-0000.pt")
    result = compare(str(run_a), str(run_b))
    assert result["compared"] == 2 and result["missing"] == []
    assert result["image"] == 3.0 and result["float"] == 0.25 and result["float_scale"] == 4.0
    assert result["verdict"] == "compared"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_value_is_a_difference_never_within(tmp_path, bad):
    for run, value in ((tmp_path / "a", 1.0), (tmp_path / "b", bad)):
        run.mkdir()
        torch.save({"w": torch.tensor([value])}, run / "weights.bin")
    result = compare(str(tmp_path / "a"), str(tmp_path / "b"))
    assert result["nonfinite"] == ["weights.bin"] and result["float"] is None and result["verdict"] == "differs"


def test_a_file_written_by_one_run_only_is_missing(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for run in ("a", "b"):
        np.save(tmp_path / run / "display-0000.npy", np.zeros((2, 2)))
    np.save(tmp_path / "a" / "display-0001.npy", np.zeros((2, 2)))
    result = compare(str(tmp_path / "a"), str(tmp_path / "b"))
    assert result["missing"] == ["display-0001.npy"] and result["verdict"] == "differs"


def test_the_hand_port_refuses_an_edit_that_matches_a_different_number_of_times(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "demo.py").write_text("DEVICE = 'cuda'\nx.cuda()\nx.cuda()\n", encoding="utf-8")
    monkeypatch.setitem(handport.EDITS, "toy", [("demo.py", r"\.cuda\(\)", ".cpu()", 1)])
    with pytest.raises(SystemExit, match=r"demo.py: .* matched 2 times, expected 1"):
        handport.port("toy", str(repo), str(tmp_path / "out"))
    monkeypatch.setitem(handport.EDITS, "toy", [("demo.py", r"\.cuda\(\)", ".cpu()", 2)])
    handport.port("toy", str(repo), str(tmp_path / "out"))
    assert (tmp_path / "out" / "demo.py").read_text(encoding="utf-8") == "DEVICE = 'cuda'\nx.cpu()\nx.cpu()\n"


run_module = _load("run")


def _item(npu_error, hand_error, reference_exit=0):
    compared = {"verdict": "compared", "float": 0.009, "float_scale": 1.5, "image": 68}
    return {
        "npuport": {"exit": 0},
        "handport": {"exit": 0},
        "compare": compared,
        "reference64": {"exit": reference_exit},
        "vs_reference64": {"verdict": "compared", "float": npu_error},
        "hand_vs_reference64": {"verdict": "compared", "float": hand_error},
    }


@pytest.mark.parametrize(
    "npu_error, hand_error, reference_exit, expected",
    [
        (9.1e-3, 7.1e-3, 0, "works (float16: as close to float64 as the hand port)"),
        (1.5e-2, 7.1e-3, 0, "DIFFERS from float64"),
        (float("nan"), 7.1e-3, 0, "DIFFERS from float64"),
        (9.1e-3, 7.1e-3, 1, "DIFFERS (no float64 reference)"),
    ],
)
def test_a_half_precision_run_is_judged_against_float64_not_against_the_other_float16_run(
    npu_error, hand_error, reference_exit, expected
):
    assert run_module.verdict(_item(npu_error, hand_error, reference_exit)) == expected


def test_a_float32_run_still_needs_float32_agreement():
    item = _item(1e-6, 1e-6)
    for key in ("reference64", "vs_reference64", "hand_vs_reference64"):
        del item[key]
    assert run_module.verdict(item) == "DIFFERS"
    item["compare"] = {"verdict": "compared", "float": 1e-5, "float_scale": 1.5, "image": 1}
    assert run_module.verdict(item) == "works"
