"""``npu-port infer --nproc N``: the layout flags refused with one line before any process starts, and the image of
a multi-process run equal to the single-process one (uint8 difference <= 1) for Ulysses, ring and CFG parallelism."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest
from PIL import Image

from npu_port.cli.main import main
from npu_port.infer.models import tiny_model_dir


def infer(tmp_path, name, *arguments):
    return main(["infer", "--no-progress", "--steps", "3", "--output", str(tmp_path / f"{name}.png"), *arguments])


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--ulysses", "2"], "--ulysses / --ring / --cfg-parallel need --nproc N (the processes to split over)"),
        (["--nproc", "2", "--compare", "sdpa,chunked"], "--compare runs in one process; leave it out with --nproc 2"),
        (
            ["--nproc", "3", "--ulysses", "2"],
            "--ulysses 2 x --ring ? does not fill 3 processes: the sequence is split over 3 ranks; valid layouts: "
            "--ulysses 1 --ring 3, --ulysses 3 --ring 1",
        ),
        (
            ["--nproc", "3", "--cfg-parallel"],
            "--cfg-parallel needs an even --nproc (one half of guidance per rank), got 3",
        ),
        (
            ["--model", "tiny-flux", "--nproc", "8", "--ulysses", "8"],
            "the model has 4 attention heads, which do not split over --ulysses 8; valid Ulysses degrees: 1, 2, 4 (or "
            "--ulysses-anything, which pads the heads)",
        ),
        (
            ["--model", "tiny-flux", "--nproc", "2", "--ring", "2", "--height", "16", "--width", "48"],
            "'tiny-flux' at this size: the image tokens: 3 tokens, which do not split evenly over the 2 "
            "context-parallel ranks (ulysses 1 x ring 2); valid ulysses x ring products for it: 1, 3",
        ),
        (
            ["--model", "tiny-wan", "--nproc", "4", "--ring", "4", "--frames", "1", "--height", "16", "--width", "16"],
            "'tiny-wan' at this size: the video tokens: 1 token, fewer than the 4 context-parallel ranks (ulysses 1 "
            "x ring 4); valid ulysses x ring products for it: 1",
        ),
        (
            ["--model", "tiny-flux", "--nproc", "2", "--ulysses-anything", "--ring", "2"],
            "--ulysses-anything works with --ring 1 only (diffusers' rule)",
        ),
        (
            ["--model", "tiny", "--nproc", "2", "--cfg-parallel", "--guidance-scale", "1"],
            "--cfg-parallel splits classifier-free guidance, which is off at --guidance-scale 1; use a scale > 1 or "
            "leave --cfg-parallel out",
        ),
    ],
)
def test_impossible_layouts_are_one_line_before_any_process_starts(model_cache, tmp_path, capsys, arguments, message):
    assert infer(tmp_path, "x", *arguments) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"npu-port: {message}"
    assert not list(tmp_path.glob("x*"))


def test_a_strategy_that_replaces_the_processors_is_refused_with_context_parallelism(model_cache, tmp_path, capsys):
    processor = "diffusers.models.transformers.transformer_flux:FluxAttnProcessor"
    arguments = ["--model", "tiny-flux", "--nproc", "2", "--ulysses", "2", "--strategy", processor]
    assert infer(tmp_path, "x", *arguments) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"npu-port: strategy {processor!r} replaces the attention processors, and context parallelism needs "
        "npu-port's backend on every one (each rank would attend to its own part of the sequence only); use a "
        "kernel strategy (auto, sdpa, npu, ...) with --ulysses / --ring, or --cfg-parallel alone"
    )


def test_a_model_without_a_plan_is_refused_naming_the_models_that_have_one(model_cache, tmp_path, capsys):
    assert infer(tmp_path, "x", "--model", "tiny", "--nproc", "2", "--ulysses", "2") == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(
        "npu-port: 'tiny': its UNet2DConditionModel has no context-parallel plan (_cp_plan), so --ulysses / --ring "
        "cannot split it; models with one: "
    )
    assert "FluxTransformer2DModel" in line and "WanTransformer3DModel" in line
    assert line.endswith("(built in: tiny-flux, tiny-wan); --cfg-parallel alone works for any guided pipeline")


def test_cfg_parallel_refuses_a_guidance_distilled_model(model_cache, tmp_path, capsys):
    """A guidance-distilled Flux (``guidance_embeds``: FLUX.1-dev) is called once per step: no second half to run."""
    directory = tmp_path / "distilled-flux"
    shutil.copytree(tiny_model_dir("tiny-flux"), directory)
    config_path = directory / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config["guidance_embeds"] = True
    config_path.write_text(json.dumps(config))
    assert infer(tmp_path, "x", "--model", str(directory), "--nproc", "2", "--cfg-parallel") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"npu-port: {str(directory)!r}: its FluxTransformer2DModel is guidance-distilled (guidance_embeds): the "
        "pipeline calls it once per step, so --cfg-parallel has no second half to run; use --ulysses / --ring"
    )
    assert not list(tmp_path.glob("x*"))


def pixels(path):
    return np.asarray(Image.open(path)).astype(int)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("layout", [["--ulysses", "2"], ["--ring", "2"], ["--cfg-parallel"]], ids=" ".join)
def test_two_processes_write_the_image_of_one(model_cache, tmp_path, capsys, layout):
    assert infer(tmp_path, "one", "--model", "tiny-flux") == 0
    assert infer(tmp_path, "two", "--model", "tiny-flux", "--nproc", "2", *layout) == 0
    assert np.abs(pixels(tmp_path / "one.png") - pixels(tmp_path / "two.png")).max() <= 1
    data = json.loads((tmp_path / "two.json").read_text())
    parallel = data["parallel"]
    assert parallel["nproc"] == 2 and parallel["cfg_parallel"] == ("--cfg-parallel" in layout)
    assert [r["rank"] for r in parallel["ranks"]] == [0, 1]
    assert all(r["bytes_sent_per_step"] > 0 and r["median_step_s"] > 0 for r in parallel["ranks"])
    out = capsys.readouterr().out
    assert "rank 0 (cpu): first step" in out and "rank 1 (cpu): first step" in out


@pytest.mark.e2e
@pytest.mark.slow
def test_the_launcher_gives_this_process_its_signal_handlers_back(tmp_path):
    import signal

    from npu_port.parallel.launch import launch

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    assert launch(abs, (-3,), 1, {}) == {0: 3}
    assert {sig: signal.getsignal(sig) for sig in before} == before


@pytest.mark.e2e
@pytest.mark.slow
def test_a_rank_that_fails_stops_the_others_and_is_one_line(tmp_path):
    from npu_port.errors import ParallelError
    from npu_port.parallel.launch import launch

    started = time.monotonic()
    with pytest.raises(ParallelError) as info:
        launch(_fail_on_rank_1, (), 2, {})
    assert str(info.value) == "heads do not split"
    assert time.monotonic() - started < 60  # rank 0 was stopped, not waited for (it sleeps 120 s)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_rank_that_crashes_or_exits_is_a_failed_run_not_bad_input(capsys):
    from npu_port.errors import RankFailedError
    from npu_port.parallel.launch import launch

    with pytest.raises(RankFailedError) as info:
        launch(_crash_on_rank_1, ("raise",), 2, {})
    assert str(info.value) == "rank 1 failed: ZeroDivisionError: division by zero"
    assert "ZeroDivisionError" in capsys.readouterr().err  # its traceback, printed once
    with pytest.raises(RankFailedError) as info:
        launch(_crash_on_rank_1, ("exit",), 2, {})
    assert str(info.value) == "rank 1 exited with code 3 (no Python exception; see its output above)"


def _crash_on_rank_1(how):
    import os
    import time

    if os.environ["RANK"] == "1":
        if how == "exit":
            os._exit(3)
        1 / 0  # noqa: B018 - the crash under test
    time.sleep(120)


def _fail_on_rank_1():
    import os
    import time

    from npu_port.errors import ParallelError

    if os.environ["RANK"] == "1":
        raise ParallelError("heads do not split")
    time.sleep(120)  # rank 0 waits as in a collective: the launcher must stop it, not wait
