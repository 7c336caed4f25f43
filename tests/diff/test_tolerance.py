"""The per-dtype tolerances against what rounding really does: a float16 or bfloat16 run of the tiny pipelines
compared with a float32 run diverges nowhere, yet its rounding is plainly visible (the comparison did see half
precision); the numbers behind :data:`npu_port.diff.compare.TOLERANCE` come from here."""

from __future__ import annotations

import pytest
import torch

from npu_port.diff import Dump, capture, compare_dumps
from npu_port.diff.compare import AMPLIFY, TOLERANCE

from .pipelines import dit_pipeline, run_dit, run_text2image, text2image_pipeline


def _one_step(pipe) -> None:
    run_text2image(pipe, steps=1)  # the UNet pipeline's text encoder and VAE are most of its modules


PIPELINES = {"dit": (dit_pipeline, run_dit), "unet": (text2image_pipeline, _one_step)}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_half_precision_rounding_is_within_tolerance_and_visible(tmp_path, text2image_dir, name):
    build, run = PIPELINES[name]
    folder = text2image_dir if name == "unet" else tmp_path / "pipe"
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        pipe = build(folder, dtype)
        with capture(pipe, tmp_path / f"{dtype}.d"):
            run(pipe)
    reference = Dump(tmp_path / f"{torch.float32}.d")
    for dtype, key in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
        report = compare_dumps(reference, Dump(tmp_path / f"{dtype}.d"))
        assert report.as_dict()["first_divergence"] is None, (key, report.as_dict()["first_divergence"])
        errors = [c.output_error for c in report.calls]
        assert TOLERANCE["float32"] < max(errors) < TOLERANCE[key]  # rounding shows, and stays within
        first = report.calls[0]  # the first module: its inputs come in rounded, it adds a rounding or two
        assert first.output_error * AMPLIFY <= TOLERANCE[key], (first.module, first.output_error)
        assert {p.b["dtype"] for c in report.calls for p in c.outputs} >= {key}
