"""The tiny pipelines the diff tests run: the SD-style text-to-image one (tiny UNet, CLIP text encoder) built from
configs into a folder and loaded back in a dtype, and the tiny DiT one (``npu_port.integrations.diffusers.tiny``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from npu_port.integrations.diffusers.tiny import run_tiny_pipeline, tiny_dit_pipeline


def text2image_pipeline(folder: Path, dtype: torch.dtype = torch.float32):
    """The built-in ``tiny`` pipeline, built in ``folder`` the first time, loaded in ``dtype``."""
    from diffusers import DiffusionPipeline

    from npu_port.integrations.diffusers.tiny_text2image import build_tiny_text2image

    if not (Path(folder) / "model_index.json").is_file():
        build_tiny_text2image(str(folder))
    with warnings.catch_warnings():  # diffusers >= 0.42 renamed torch_dtype to dtype; older ones know only this
        warnings.filterwarnings("ignore", message="`torch_dtype` is deprecated", category=FutureWarning)
        pipe = DiffusionPipeline.from_pretrained(str(folder), torch_dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_text2image(pipe, steps: int = 2) -> None:
    """``steps`` denoising steps of one prompt with classifier-free guidance (a batch of 2 per UNet call)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        pipe("a red house", num_inference_steps=steps, generator=generator, output_type="pt")


def dit_pipeline(folder: Path, dtype: torch.dtype = torch.float32):
    """The tiny DiT pipeline, saved in ``folder`` the first time and loaded back, in ``dtype``."""
    pipe = tiny_dit_pipeline(save_dir=None if (Path(folder) / "model_index.json").is_file() else str(folder))
    return pipe.to(dtype=dtype)


def run_dit(pipe, steps: int = 2) -> None:
    run_tiny_pipeline(pipe, steps=steps)
