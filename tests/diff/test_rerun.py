"""Origin by re-running (``compare_dumps(a, b, modules_b=...)``): side B's module on side A's whole inputs.

The case the heuristic gets wrong: a module with a small defect of its own (0.2 %) behind a large drift it receives
(10 %). Its output error is no larger than its input error, so by the errors alone it only carries the drift;
re-run on side A's inputs it still differs, so it is an origin too.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from npu_port.diff import Dump, capture, compare_dumps


def _models():
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)).eval()
    b = copy.deepcopy(a)
    with torch.no_grad():
        b[0].weight.mul_(1.1)  # the large drift
        b[1].weight.mul_(1.002)  # the small defect of its own
    return a, b


def _dumps(tmp_path, full=True):
    a, b = _models()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    for model, name in ((a, "a.d"), (b, "b.d")):
        with capture(model, tmp_path / name, full=full), torch.no_grad():
            model(x)
    return Dump(tmp_path / "a.d"), Dump(tmp_path / "b.d"), b


def _verdicts(report):
    return {c.module: (c.origin, c.origin_by) for c in report.divergent}


def test_the_errors_alone_call_the_small_defect_carried(tmp_path):
    a, b, _ = _dumps(tmp_path)
    verdicts = _verdicts(compare_dumps(a, b))
    assert verdicts["0"] == (True, "inputs") and verdicts["1"] == (False, "inputs")


@pytest.mark.parametrize("how", ["model", "mapping", "callable"])
def test_re_running_on_side_a_inputs_finds_the_small_defect_and_clears_the_clean_module(tmp_path, how):
    a, b, model_b = _dumps(tmp_path)
    modules = {"model": model_b, "mapping": {"0": model_b[0], "1": model_b[1], "2": model_b[2]}}
    modules["callable"] = lambda path: model_b.get_submodule(path) if path != "(model)" else model_b
    report = compare_dumps(a, b, modules_b=modules[how])
    verdicts = _verdicts(report)
    assert verdicts["0"] == (True, "rerun") and verdicts["1"] == (True, "rerun") and verdicts["2"] == (False, "rerun")
    first = report.as_dict()["first_divergence"]
    assert (first["module"], first["origin"], first["origin_by"]) == ("0", True, "rerun")
    second = next(c for c in report.divergent if c.module == "1")
    assert second.rerun_error == pytest.approx(0.002, rel=0.3)  # its own error, not the 10 % it received
    assert second.input_error > 0.05


def test_without_side_a_full_tensors_the_heuristic_decides(tmp_path):
    a, b, model_b = _dumps(tmp_path, full=["2"])  # only module 2 kept whole
    verdicts = _verdicts(compare_dumps(a, b, modules_b=model_b))
    assert verdicts["1"] == (False, "inputs") and verdicts["2"] == (False, "rerun")


def test_modules_b_that_cannot_be_read_is_refused_before_comparing(tmp_path):
    a, b, _ = _dumps(tmp_path, full=())
    with pytest.raises(TypeError) as caught:
        compare_dumps(a, b, modules_b=42)
    assert str(caught.value) == (
        "modules_b must be side B's model or pipeline, or a mapping or a callable from module path to module, not int"
    )


@pytest.mark.slow
def test_re_running_an_attention_module_with_a_flipped_mask_confirms_it_and_clears_the_later_ones(tmp_path):
    from . import defect_models as dm

    clean, defective = dm.build("encoder"), dm.build("encoder")
    dm.switch_on(defective, "blocks.1.attn")
    for model, name in ((clean, "a.d"), (defective, "b.d")):
        with capture(model, tmp_path / name, full=["blocks.*"]):
            dm.run(model, "encoder")
    report = compare_dumps(Dump(tmp_path / "a.d"), Dump(tmp_path / "b.d"), modules_b=defective)
    first = report.as_dict()["first_divergence"]
    assert (first["module"], first["origin"], first["origin_by"]) == ("blocks.1.attn", True, "rerun")
    assert first["rerun_error"] == pytest.approx(first["error"])  # the same inputs: the whole error is its own
    verdicts = _verdicts(report)
    assert verdicts["blocks.2.attn"] == (False, "rerun") and verdicts["blocks.2"] == (False, "rerun")
    assert verdicts["(model)"] == (True, "inputs")  # not kept whole (full= named blocks only): the errors decide
