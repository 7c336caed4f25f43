"""Tiny, seeded diffusers models built from configs, with matching seeded inputs (no model hub, no network).

Each builder returns a model in eval mode whose every forward takes a few milliseconds on a CPU, yet keeps the
structure that matters for attention: the UNet has self- and cross-attention ``Attention`` modules with
``AttnProcessor2_0``; the DiT is class-conditional; the SD3 transformer uses ``JointAttnProcessor2_0`` (calls
``F.scaled_dot_product_attention``); the Flux transformer uses ``FluxAttnProcessor`` (calls diffusers'
``dispatch_attention_fn`` in the (B, S, H, D) layout); the VAE's mid-block ``Attention`` has a group norm, a
residual connection and 4-D inputs. Every head dimension is 16, the smallest that Ascend's inference op
(``npu_fused_infer``, 16-aligned) accepts. The tests, the benchmarks and ``npu-port strategies --explain`` share
these builders; their weights are random, so their outputs are only good for comparing attention paths.

Weights are re-drawn from a seeded generator (``_reseed``) so that outputs do not depend on diffusers' init
defaults (some zero-initialise output layers, which would make every attention path give the same output).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Optional, Tuple

import torch

#: Cross-attention text length and width of the UNet / transformer encoders below.
TEXT_TOKENS = 5
TEXT_DIM = 16


def _reseed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Overwrite every parameter with seeded random values of a sensible scale; eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("weight") and param.ndim == 1:  # norm scales: around 1
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            elif param.ndim == 1:
                param.copy_(0.05 * torch.randn(param.shape, generator=gen))
            else:
                fan_in = param[0].numel()
                param.copy_(torch.randn(param.shape, generator=gen) / fan_in**0.5)
    return model.eval()


def tiny_unet(seed: int = 0, heads: Tuple[int, int] = (1, 2)):
    """``UNet2DConditionModel``: 4 latent channels, 8×8 samples, 5 text tokens of width 16; 8 ``Attention`` modules
    (self + cross attention in one down block, the mid block and two layers of one up block); ``heads``: per block
    (the second also the mid block's)."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(seed)
    model = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(16, 32),
        layers_per_block=1,
        norm_num_groups=8,
        cross_attention_dim=TEXT_DIM,
        attention_head_dim=tuple(heads),  # heads per block (diffusers' naming)
    )
    return _reseed(model, seed)


def tiny_dit(seed: int = 0, num_classes: int = 1000):
    """``DiTTransformer2DModel``, class-conditional (``num_embeds_ada_norm`` classes; 1000 because ``DiTPipeline``
    uses class 1000 as the guidance "null" class), learned sigma (8 output channels for 4 input channels), 8×8
    latents in 2×2 patches, 2 layers → 2 self-attention modules."""
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(seed)
    model = DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=8,
        num_layers=2,
        sample_size=8,
        patch_size=2,
        num_embeds_ada_norm=num_classes,
    )
    return _reseed(model, seed)


def tiny_sd3_transformer(seed: int = 0):
    """``SD3Transformer2DModel`` (MMDiT): 2 joint blocks with ``JointAttnProcessor2_0`` → 2 attention modules."""
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(seed)
    model = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=TEXT_DIM,
        caption_projection_dim=32,
        pooled_projection_dim=TEXT_DIM,
        out_channels=4,
        pos_embed_max_size=8,
    )
    return _reseed(model, seed)


def tiny_flux_transformer(seed: int = 0):
    """``FluxTransformer2DModel``: one double-stream and one single-stream block, both ``FluxAttention`` with
    ``FluxAttnProcessor`` (diffusers' dispatcher) → 2 attention modules; rotary embeddings on 3 axes."""
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=TEXT_DIM,
        pooled_projection_dim=TEXT_DIM,
        axes_dims_rope=(8, 4, 4),
    )
    return _reseed(model, seed)


def tiny_vae(seed: int = 0):
    """``AutoencoderKL``: 3-channel 16×16 images ↔ 4-channel 8×8 latents; one mid-block ``Attention`` in the encoder
    and one in the decoder (group norm, residual connection, 4-D input)."""
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    model = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=16,
    )
    return _reseed(model, seed)


def _randn(gen: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype)


def tiny_inputs(model: torch.nn.Module, batch_size: int = 2, seed: int = 0) -> Dict[str, Any]:
    """Seeded keyword arguments for ``model(**inputs)`` (any builder above), in the model's dtype and device.

    The VAE gets ``sample`` (an image; its forward encodes and decodes with the posterior's mode). Outputs are read
    with :func:`output_of`.
    """
    param = next(model.parameters())
    dtype, device = param.dtype, param.device
    gen = torch.Generator().manual_seed(seed)
    name = type(model).__name__
    if name == "UNet2DConditionModel":
        inputs = {
            "sample": _randn(gen, batch_size, 4, 8, 8, dtype=dtype),
            "timestep": torch.arange(1, batch_size + 1) * 7,
            "encoder_hidden_states": _randn(gen, batch_size, TEXT_TOKENS, TEXT_DIM, dtype=dtype),
        }
    elif name == "DiTTransformer2DModel":
        inputs = {
            "hidden_states": _randn(gen, batch_size, 4, 8, 8, dtype=dtype),
            "timestep": torch.arange(1, batch_size + 1) * 7,
            "class_labels": (torch.arange(batch_size) * 3 + 1) % model.config.num_embeds_ada_norm,
        }
    elif name == "SD3Transformer2DModel":
        inputs = {
            "hidden_states": _randn(gen, batch_size, 4, 8, 8, dtype=dtype),
            "encoder_hidden_states": _randn(gen, batch_size, TEXT_TOKENS, TEXT_DIM, dtype=dtype),
            "pooled_projections": _randn(gen, batch_size, TEXT_DIM, dtype=dtype),
            "timestep": (torch.arange(1, batch_size + 1) * 7).to(dtype),
        }
    elif name == "FluxTransformer2DModel":
        height = width = 4
        rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
        img_ids = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(-1, 3).to(dtype)
        inputs = {
            "hidden_states": _randn(gen, batch_size, height * width, 4, dtype=dtype),
            "encoder_hidden_states": _randn(gen, batch_size, TEXT_TOKENS, TEXT_DIM, dtype=dtype),
            "pooled_projections": _randn(gen, batch_size, TEXT_DIM, dtype=dtype),
            "timestep": (torch.arange(1, batch_size + 1) / 10).to(dtype),
            "img_ids": img_ids,
            "txt_ids": torch.zeros(TEXT_TOKENS, 3, dtype=dtype),
        }
    elif name == "AutoencoderKL":
        inputs = {"sample": _randn(gen, batch_size, 3, 16, 16, dtype=dtype)}
    else:
        raise TypeError(f"tiny_inputs: no inputs for {name}")
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def output_of(result: Any) -> torch.Tensor:
    """The main tensor of a diffusers model output (``.sample``, or the first element of a tuple)."""
    if isinstance(result, torch.Tensor):
        return result
    if isinstance(result, tuple):
        return result[0]
    return result.sample


def run_tiny(model: torch.nn.Module, batch_size: int = 2, seed: int = 0, **extra: Any) -> torch.Tensor:
    """One forward on :func:`tiny_inputs` under ``no_grad``; returns the output tensor."""
    with torch.no_grad():
        return output_of(model(**tiny_inputs(model, batch_size, seed), **extra))


#: name -> builder, for tests and benchmarks that loop over every tiny model.
BUILDERS = {
    "unet": tiny_unet,
    "dit": tiny_dit,
    "sd3": tiny_sd3_transformer,
    "flux": tiny_flux_transformer,
    "vae": tiny_vae,
}


def tiny_model(name: str, seed: int = 0) -> torch.nn.Module:
    """A tiny model by name (see :data:`BUILDERS`), or ``ValueError`` naming the valid ones."""
    builder = BUILDERS.get(name)
    if builder is None:
        raise ValueError(f"unknown tiny model {name!r}; valid: {', '.join(BUILDERS)}")
    return builder(seed)


def tiny_dit_pipeline(seed: int = 0, save_dir: Optional[str] = None):
    """A ``DiTPipeline`` (tiny DiT + tiny VAE + DDIM scheduler, 10 labelled classes), saved with
    ``save_pretrained`` and loaded back with ``from_pretrained`` so that it is what a user would load from disk.

    ``save_dir``: where to save it (a temporary directory, removed afterwards, when None).
    """
    from diffusers import DDIMScheduler, DiTPipeline

    id2label = {i: f"class {i}" for i in range(10)}
    pipe = DiTPipeline(transformer=tiny_dit(seed), vae=tiny_vae(seed + 1), scheduler=DDIMScheduler(), id2label=id2label)
    pipe.set_progress_bar_config(disable=True)
    if save_dir is not None:
        pipe.save_pretrained(save_dir)
        loaded = DiTPipeline.from_pretrained(save_dir, low_cpu_mem_usage=False)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            pipe.save_pretrained(os.path.join(tmp, "dit"))
            loaded = DiTPipeline.from_pretrained(os.path.join(tmp, "dit"), low_cpu_mem_usage=False)
    loaded.set_progress_bar_config(disable=True)
    loaded.labels = pipe.labels  # id2label is not part of the saved config
    return loaded


def run_tiny_pipeline(pipe, steps: int = 2, seed: int = 0) -> torch.Tensor:
    """Two DDIM steps for classes 1 and 3 with classifier-free guidance; the decoded images as a ``(B, C, H, W)``
    tensor (DiTPipeline before diffusers 0.41 ignores ``output_type="pt"`` and returns ``(B, H, W, C)`` numpy)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        out = pipe(class_labels=[1, 3], num_inference_steps=steps, generator=generator, output_type="pt")
    images = out.images
    if not isinstance(images, torch.Tensor):
        images = torch.from_numpy(images).permute(0, 3, 1, 2)
    return images
