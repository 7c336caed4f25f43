"""CFG parallelism: two ranks compute the two guidance halves of a tiny denoiser and give one process's latents
(within 1e-6), with exactly one exchange per step, for both ways pipelines run guidance — two calls per step (Wan,
Flux) and one call on a doubled batch (Stable Diffusion); a pipeline that read rank 1's answer to the first call
before the second would get NaN, never a plausible wrong value. Calls named by diffusers' ``cache_context("cond")`` /
``("uncond")`` are told apart by name, so a step without its unconditional call (guidance off, an interrupted run) is
refused on both ranks until ``handle.reset()``; the doubled batch is split inside nested arguments too (SDXL's
``added_cond_kwargs``). ``guidance_mode`` tells the two ways apart on diffusers' own pipeline classes."""

from __future__ import annotations

import pytest
import torch

from npu_port.errors import ParallelError
from npu_port.parallel.cfg import guidance_mode

from . import models, workers
from .conftest import shared_ranks

ATOL = 1e-6
#: The SDXL UNet's convolutions and norms on a batch of 1 instead of 2 (or on another thread count): float32 parity.
UNET_ATOL = 1e-5


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
    """Rank 1 skips the conditional call (after the first step, where it runs it once to learn the output's shape)
    and answers with a placeholder it fills during the second call: read before that, it is all NaN (fail closed);
    rank 0 computed the conditional half itself."""
    runs = [result["alternate"] for result in cfg_ranks]
    assert len(runs[0]["seen"]) == len(runs[1]["seen"]) == models.CFG_STEPS
    assert all(torch.isfinite(seen).all() for seen in runs[0]["seen"])
    first, *later = runs[1]["seen"]
    torch.testing.assert_close(first, runs[0]["seen"][0], rtol=0, atol=0)  # the same conditional call, run here too
    assert later and all(torch.isnan(seen).all() for seen in later)


#: What the alternate mode says when a "cond" call comes while the previous step still waits for its "uncond" one.
STALE_STEP = (
    "ParallelError: CFG parallel: a conditional call came before the previous step's unconditional one (guidance off "
    "for a step, or an interrupted run: call handle.reset() first); run such a pipeline without --cfg-parallel"
)


def _assert_latents(got, expected, where, atol=ATOL):
    assert not isinstance(got, dict), f"{where}: {got}"
    diff = (got - expected).abs().max().item()
    assert diff <= atol, f"{where}: max |cfg parallel - one process| = {diff:.3g}"


@pytest.mark.e2e
def test_an_output_shaped_unlike_the_input_works_in_alternate_mode(cfg_ranks):
    """Wan image-to-video's form: the condition doubles the input channels, the output keeps the latents' (in Wan,
    16 out of 36). Rank 1 learns the output's shape on the first step."""
    for result in cfg_ranks:
        case = result["conditioned"]
        assert not isinstance(case["out"], dict), case["out"]
        torch.testing.assert_close(case["out"], case["alone"], rtol=0, atol=1e-6)


@pytest.mark.e2e
def test_calls_named_by_cache_context_give_the_single_process_latents(cfg_ranks):
    expected = models.named_guidance(models.TinyDenoiser())
    for rank, result in enumerate(cfg_ranks):
        named = result["named"]
        assert torch.equal(named["alone"], expected)
        _assert_latents(named["guided"], expected, f"rank {rank}")


@pytest.mark.e2e
def test_guidance_off_is_refused_on_both_ranks_instead_of_nan_and_reset_recovers(cfg_ranks):
    """With guidance off the pipeline makes one "cond" call per step: the second step's is refused (it would have
    read rank 1's NaN placeholder), and so is a guided run after it until ``handle.reset()``."""
    expected = models.named_guidance(models.TinyDenoiser())
    for rank, result in enumerate(cfg_ranks):
        named = result["named"]
        assert named["off"] == {"error": STALE_STEP}, f"rank {rank}"
        assert named["stale"] == {"error": STALE_STEP}, f"rank {rank}"
        _assert_latents(named["reset"], expected, f"rank {rank} after reset()")


@pytest.mark.e2e
def test_reset_after_an_interrupted_run_lets_the_next_run_match(cfg_ranks):
    expected = models.named_guidance(models.TinyDenoiser())
    for rank, result in enumerate(cfg_ranks):
        named = result["named"]
        assert named["interrupted"] == {"error": "Interrupted: 1"}, f"rank {rank}"
        _assert_latents(named["after interrupt"], expected, f"rank {rank} after an interrupted run and reset()")


@pytest.mark.e2e
def test_batch_mode_splits_nested_conditioning_of_an_sdxl_unet(cfg_ranks):
    """SDXL's ``added_cond_kwargs`` (pooled text, time ids) carry the doubled batch inside a dict: each rank takes
    its half of them as of the latents, and the output is one process's."""
    expected = models.sdxl_guidance_call(models.sdxl_unet())
    for rank, result in enumerate(cfg_ranks):
        sdxl = result["sdxl"]
        _assert_latents(sdxl["alone"], expected, f"rank {rank} alone", UNET_ATOL)  # one thread per rank: not bit-equal
        _assert_latents(sdxl["out"], sdxl["alone"], f"rank {rank}", UNET_ATOL)
        assert sdxl["exchanges"] == 1


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
