"""CFG parallelism: two ranks compute the two guidance halves of a tiny denoiser and give one process's latents
(within 1e-6), with exactly one exchange per step, for both ways pipelines run guidance — two calls per step (Wan,
Flux) and one call on a doubled batch (Stable Diffusion); a pipeline that read rank 1's answer to the first call
before the second would get NaN, never a plausible wrong value. ``guidance_mode`` tells the two apart on diffusers'
own pipeline classes."""

from __future__ import annotations

import pytest
import torch

from npu_port.errors import ParallelError
from npu_port.parallel.cfg import guidance_mode

from . import models, workers
from .conftest import shared_ranks

ATOL = 1e-6


@pytest.fixture(scope="module")
def cfg_ranks(tmp_path_factory):
    return shared_ranks(tmp_path_factory, "cfg2", 2, workers.guidance_halves)


@pytest.fixture(scope="module")
def one_process():
    return {mode: loop(models.TinyDenoiser())[0] for mode, loop in models.GUIDANCE.items()}


@pytest.mark.e2e
@pytest.mark.parametrize("mode", list(models.GUIDANCE))
def test_two_ranks_give_the_single_process_latents_with_one_exchange_per_step(cfg_ranks, one_process, mode):
    expected = one_process[mode]
    assert [result[mode]["cfg_rank"] for result in cfg_ranks] == [0, 1]
    for rank, result in enumerate(cfg_ranks):
        run = result[mode]
        diff = (run["out"] - expected).abs().max().item()
        assert diff <= ATOL, f"rank {rank}: max |cfg parallel - one process| = {diff:.3g}"
        assert run["exchanges"] == models.CFG_STEPS
        step_bytes = torch.Size(models.CFG_LATENT).numel() * 4  # one rank's half (float32) to the other rank
        assert run["traffic"] == {
            "bytes": {"all_gather": models.CFG_STEPS * step_bytes},
            "calls": {"all_gather": models.CFG_STEPS},
        }
        assert torch.equal(run["restored"], run["alone"]), f"rank {rank}: not the single-process model after restore"


@pytest.mark.e2e
def test_a_pipeline_reading_the_unconditional_ranks_first_answer_early_gets_nan(cfg_ranks):
    """Rank 1 skips the conditional call and answers with a placeholder it fills during the second call: read
    before that, it is all NaN (fail closed); rank 0 computed the conditional half itself."""
    runs = [result["alternate"] for result in cfg_ranks]
    assert len(runs[0]["seen"]) == len(runs[1]["seen"]) == models.CFG_STEPS
    assert all(torch.isfinite(seen).all() for seen in runs[0]["seen"])
    assert all(torch.isnan(seen).all() for seen in runs[1]["seen"])


def _bare(name):
    import diffusers

    cls = getattr(diffusers, name)
    return cls.__new__(cls)  # guidance_mode reads the class's __call__: no weights needed


@pytest.mark.parametrize(
    "name, mode",
    [
        ("StableDiffusionPipeline", "batch"),
        ("StableDiffusionXLPipeline", "batch"),
        ("PixArtAlphaPipeline", "batch"),
        ("WanPipeline", "alternate"),
        ("FluxPipeline", "alternate"),
        ("QwenImagePipeline", "alternate"),
    ],
)
def test_guidance_mode_of_diffusers_pipelines(name, mode):
    assert guidance_mode(_bare(name)) == mode
    other = {"batch": "alternate", "alternate": "batch"}[mode]
    assert guidance_mode(_bare(name), other) == other  # an explicit mode is taken as given


def test_guidance_mode_errors():
    with pytest.raises(ParallelError) as info:
        guidance_mode(object())
    assert str(info.value) == (
        "cannot tell how object runs classifier-free guidance (one call on a doubled batch, or a conditional then an "
        "unconditional call); pass cfg_mode='batch' or cfg_mode='alternate'"
    )
    with pytest.raises(ParallelError) as info:
        guidance_mode(_bare("FluxPipeline"), "halves")
    assert str(info.value) == "unknown cfg mode 'halves'; valid modes: auto, batch, alternate"
