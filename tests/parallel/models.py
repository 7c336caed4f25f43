"""Tiny diffusers transformers with a context-parallel plan and real head dims (4 heads x 64), and their inputs: what
the parallel tests run on one process and on several.

Both carry key masks the way a real model would have to under context parallelism: split with the sequence by the
model's ``_cp_plan`` (never a whole-sequence mask on every rank).

* :class:`MaskedFlux` — Flux's joint text+image attention with a text mask: ``encoder_attention_mask`` is listed
  in the plan, split like ``encoder_hidden_states``, and widened to a joint key mask (text keys first, then image).
* :class:`MaskedWan` — Wan's self-attention (``attn1``, context-parallel) and text cross-attention (``attn2``, which
  diffusers runs without context parallelism: the backend's non-parallel path). ``attn2`` gets a fixed text key mask
  from its processor; ``attn1`` gets a key mask over the video tokens through a pass-through module listed in the
  plan, so the mask is split exactly as ``blocks.0``'s hidden states are.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from diffusers import FluxTransformer2DModel, UNet2DConditionModel, WanTransformer3DModel
from diffusers.models._modeling_parallel import ContextParallelInput
from diffusers.models.cache_utils import CacheMixin
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

HEADS = 4
HEAD_DIM = 64

# ---- Flux ---------------------------------------------------------------------------------------------------------

FLUX_IMAGE = (8, 8)  # latent grid: 64 image tokens (patch size 1)
FLUX_TEXT = 16
FLUX_TEXT_KEPT = 10  # text tokens the mask keeps; the rest are padding


class MaskedFlux(FluxTransformer2DModel):
    """Flux with a text key mask that goes through the plan (``encoder_attention_mask``, split like the text)."""

    _cp_plan = {
        **FluxTransformer2DModel._cp_plan,
        "": {
            **FluxTransformer2DModel._cp_plan[""],
            "encoder_attention_mask": ContextParallelInput(split_dim=1, expected_dims=2, split_output=False),
        },
    }

    def forward(self, hidden_states, encoder_hidden_states=None, encoder_attention_mask=None, **kwargs):
        if encoder_attention_mask is not None:
            batch, image = hidden_states.shape[:2]
            joint = torch.cat([encoder_attention_mask.bool(), torch.ones(batch, image, dtype=torch.bool)], dim=1)
            attention = dict(kwargs.pop("joint_attention_kwargs", None) or {}, attention_mask=joint[:, None, None, :])
            kwargs["joint_attention_kwargs"] = attention
        return super().forward(hidden_states, encoder_hidden_states=encoder_hidden_states, **kwargs)


def flux_model() -> MaskedFlux:
    torch.manual_seed(0)
    model = MaskedFlux(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=HEAD_DIM,
        num_attention_heads=HEADS,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=(16, 24, 24),
    )
    return model.eval()


def flux_inputs(masked: bool) -> Dict[str, Any]:
    gen = torch.Generator().manual_seed(1)
    rows, cols = FLUX_IMAGE
    image = rows * cols
    img_ids = torch.zeros(image, 3)
    img_ids[:, 1] = torch.arange(image) // cols
    img_ids[:, 2] = torch.arange(image) % cols
    mask = torch.ones(1, FLUX_TEXT, dtype=torch.bool)
    mask[:, FLUX_TEXT_KEPT:] = False
    return dict(
        hidden_states=torch.randn(1, image, 16, generator=gen),
        encoder_hidden_states=torch.randn(1, FLUX_TEXT, 32, generator=gen),
        pooled_projections=torch.randn(1, 32, generator=gen),
        timestep=torch.tensor([0.5]),
        img_ids=img_ids,
        txt_ids=torch.zeros(FLUX_TEXT, 3),
        encoder_attention_mask=mask if masked else None,
        return_dict=False,
    )


# ---- Wan ----------------------------------------------------------------------------------------------------------

WAN_LATENT = (4, 3, 8, 8)  # channels, frames, height, width: 3 * 4 * 4 = 48 video tokens (patch 1 x 2 x 2)
WAN_TEXT = 16
WAN_TEXT_KEPT = 11


class KeyMaskedWanProcessor(WanAttnProcessor):
    """Wan's processor with a key mask of its own: a fixed one (the text mask of ``attn2``), or the one the model
    sets for the current forward (``attn1``'s video mask, already split by the plan)."""

    def __init__(self, key_mask: Optional[torch.Tensor] = None) -> None:
        super().__init__()
        self.key_mask = key_mask

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        mask = self.key_mask if attention_mask is None else attention_mask
        return super().__call__(attn, hidden_states, encoder_hidden_states, mask, rotary_emb)


class KeyMaskSplit(torch.nn.Module):
    """Returns its input: listed in the plan, so under context parallelism it returns this rank's part of it."""

    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        return mask


class MaskedWan(WanTransformer3DModel):
    """Wan with ``video_mask`` (``(B, video tokens)``, bool): a key mask for the self-attention of every block."""

    _cp_plan = {
        **WanTransformer3DModel._cp_plan,
        "key_mask_split": {"mask": ContextParallelInput(split_dim=1, expected_dims=2, split_output=False)},
    }

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.key_mask_split = KeyMaskSplit()

    def forward(self, hidden_states, timestep, encoder_hidden_states, video_mask=None, **kwargs):
        local = None if video_mask is None else self.key_mask_split(video_mask)
        processors = [block.attn1.processor for block in self.blocks]
        for processor in processors:
            processor.key_mask = local
        try:
            return super().forward(hidden_states, timestep, encoder_hidden_states, **kwargs)
        finally:
            for processor in processors:
                processor.key_mask = None


def wan_text_mask() -> torch.Tensor:
    mask = torch.ones(1, WAN_TEXT, dtype=torch.bool)
    mask[:, WAN_TEXT_KEPT:] = False
    return mask


def wan_video_mask() -> torch.Tensor:
    """Keys kept in the self-attention: every third video token dropped (spread over every rank's part)."""
    channels, frames, height, width = WAN_LATENT
    tokens = frames * (height // 2) * (width // 2)
    return (torch.arange(tokens) % 3 != 1)[None]


def wan_model(seed: int = 0) -> MaskedWan:
    """``seed``: another seed gives other weights (Wan 2.2's second, low-noise transformer)."""
    torch.manual_seed(seed)
    channels = WAN_LATENT[0]
    model = MaskedWan(
        patch_size=(1, 2, 2),
        num_attention_heads=HEADS,
        attention_head_dim=HEAD_DIM,
        in_channels=channels,
        out_channels=channels,
        text_dim=32,
        freq_dim=32,
        ffn_dim=128,
        num_layers=2,
        rope_max_seq_len=32,
    ).eval()
    for block in model.blocks:
        block.attn1.set_processor(KeyMaskedWanProcessor())
        block.attn2.set_processor(KeyMaskedWanProcessor())
    return model


def set_text_mask(model: MaskedWan, masked: bool) -> None:
    """``attn2``'s processors mask the padding of the text, or nothing (a fixed mask, as a model that knows its
    prompt length would pass)."""
    for block in model.blocks:
        block.attn2.processor.key_mask = wan_text_mask() if masked else None


def wan_inputs(video_mask: bool) -> Dict[str, Any]:
    gen = torch.Generator().manual_seed(2)
    return dict(
        hidden_states=torch.randn(1, *WAN_LATENT, generator=gen),
        timestep=torch.tensor([500.0]),
        encoder_hidden_states=torch.randn(1, WAN_TEXT, 32, generator=gen),
        video_mask=wan_video_mask() if video_mask else None,
        return_dict=False,
    )


# ---- cases --------------------------------------------------------------------------------------------------------

#: mask variant -> what is masked. Flux: its text; Wan: the text (cross-attention, not context-parallel) or the
#: video keys of the self-attention (context-parallel, split by the plan).
MASKS = {"flux": ("none", "text"), "wan": ("none", "text", "video")}


def build(kind: str) -> torch.nn.Module:
    return flux_model() if kind == "flux" else wan_model()


def run(model: torch.nn.Module, kind: str, mask: str) -> torch.Tensor:
    """The model's output for the mask variant ``mask`` of :data:`MASKS`."""
    if kind == "flux":
        kwargs = flux_inputs(masked=mask == "text")
    else:
        set_text_mask(model, mask == "text")
        kwargs = wan_inputs(video_mask=mask == "video")
    with torch.no_grad():
        return model(**kwargs)[0]


# ---- classifier-free guidance --------------------------------------------------------------------------------------

CFG_STEPS = 3
CFG_SCALE = 5.0
CFG_LATENT = (1, 12, 8)  # batch, tokens, channels


class TinyDenoiser(torch.nn.Module, CacheMixin):
    """A denoiser called as diffusers' transformers are (``hidden_states``, ``timestep``, ``encoder_hidden_states``,
    ``return_dict``), nonlinear in all three so each guidance half and each step gives a different result; with
    diffusers' ``cache_context`` (``CacheMixin``), which pipelines wrap each guidance call in."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        channels = CFG_LATENT[-1]
        self.latent = torch.nn.Linear(channels, channels)
        self.text = torch.nn.Linear(channels, channels)

    def forward(self, hidden_states, timestep, encoder_hidden_states, return_dict=True):
        from diffusers.models.modeling_outputs import Transformer2DModelOutput

        text = self.text(encoder_hidden_states).mean(dim=1, keepdim=True)
        out = torch.tanh(self.latent(hidden_states) + text + timestep.reshape(-1, 1, 1) / 1000)
        return Transformer2DModelOutput(sample=out) if return_dict else (out,)


def cfg_inputs():
    gen = torch.Generator().manual_seed(4)
    latents = torch.randn(*CFG_LATENT, generator=gen)
    cond = torch.randn(1, 5, CFG_LATENT[-1], generator=gen)
    uncond = torch.randn(1, 5, CFG_LATENT[-1], generator=gen)
    return latents, cond, uncond


def _step(latents, noise_uncond, noise_cond):
    noise = noise_uncond + CFG_SCALE * (noise_cond - noise_uncond)
    return latents - 0.1 * noise


def alternate_guidance(model):
    """Wan's and Flux's way: a conditional call, then an unconditional one, per step. Returns the final latents and,
    per step, the conditional result as the pipeline saw it right after the first call (before the second)."""
    latents, cond, uncond = cfg_inputs()
    seen = []
    with torch.no_grad():
        for timestep in torch.linspace(900, 100, CFG_STEPS):
            t = timestep[None]
            noise_cond = model(hidden_states=latents, timestep=t, encoder_hidden_states=cond, return_dict=False)[0]
            seen.append(noise_cond.clone())
            noise_uncond = model(hidden_states=latents, timestep=t, encoder_hidden_states=uncond, return_dict=False)[0]
            latents = _step(latents, noise_uncond, noise_cond)
    return latents, seen


def batch_guidance(model):
    """Stable Diffusion's way: one call on the doubled batch (unconditional half first), split after."""
    latents, cond, uncond = cfg_inputs()
    with torch.no_grad():
        for timestep in torch.linspace(900, 100, CFG_STEPS):
            doubled = torch.cat([latents] * 2)
            t = timestep.expand(doubled.shape[0])
            noise = model(doubled, t, encoder_hidden_states=torch.cat([uncond, cond])).sample
            noise_uncond, noise_cond = noise.chunk(2)
            latents = _step(latents, noise_uncond, noise_cond)
    return latents, []


GUIDANCE = {"alternate": alternate_guidance, "batch": batch_guidance}


class ConditionedDenoiser(TinyDenoiser):
    """Wan image-to-video's shape: the latents come in with a condition concatenated on the channels (twice the
    channels), the output has the latents' channels only."""

    def __init__(self) -> None:
        super().__init__()
        channels = CFG_LATENT[-1]
        self.latent = torch.nn.Linear(2 * channels, channels)


def conditioned_guidance(model):
    """:func:`alternate_guidance` with the condition concatenated to the latents at every call (Wan i2v)."""
    latents, cond, uncond = cfg_inputs()
    image = torch.randn(latents.shape, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        for timestep in torch.linspace(900, 100, CFG_STEPS):
            t, inputs = timestep[None], torch.cat([latents, image], dim=-1)
            noise_cond = model(hidden_states=inputs, timestep=t, encoder_hidden_states=cond, return_dict=False)[0]
            noise_uncond = model(hidden_states=inputs, timestep=t, encoder_hidden_states=uncond, return_dict=False)[0]
            latents = _step(latents, noise_uncond, noise_cond)
    return latents


def flux_guidance(model, steps: int = 2):
    """Flux's true-CFG way on the masked Flux model: a conditional and an unconditional call per step (the
    unconditional text is another prompt with the same mask). Returns the final latents."""
    kwargs = flux_inputs(masked=True)
    latents, cond = kwargs.pop("hidden_states"), kwargs.pop("encoder_hidden_states")
    uncond = torch.randn(cond.shape, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for timestep in torch.linspace(0.9, 0.3, steps):
            kwargs["timestep"] = timestep[None]
            noise_cond = model(hidden_states=latents, encoder_hidden_states=cond, **kwargs)[0]
            noise_uncond = model(hidden_states=latents, encoder_hidden_states=uncond, **kwargs)[0]
            latents = _step(latents, noise_uncond, noise_cond)
    return latents


class Interrupted(Exception):
    """Raised by :func:`named_guidance` in the middle of a step: a run stopped by the user."""


def named_guidance(model, guided: bool = True, interrupt_at: Optional[int] = None):
    """A pipeline's loop as diffusers writes it (Flux, Wan, QwenImage): each call under ``cache_context("cond")`` or
    ``("uncond")``. ``guided=False``: guidance off, one "cond" call per step (Flux at a true-CFG scale of 1).
    ``interrupt_at``: raise :class:`Interrupted` right after that step's conditional call. Returns the final latents."""
    latents, cond, uncond = cfg_inputs()
    with torch.no_grad():
        for step, timestep in enumerate(torch.linspace(900, 100, CFG_STEPS)):
            t = timestep[None]
            with model.cache_context("cond"):
                noise_cond = model(hidden_states=latents, timestep=t, encoder_hidden_states=cond, return_dict=False)[0]
            if step == interrupt_at:
                raise Interrupted(step)
            if not guided:
                latents = latents - 0.1 * noise_cond
                continue
            with model.cache_context("uncond"):
                kwargs = dict(hidden_states=latents, timestep=t, encoder_hidden_states=uncond, return_dict=False)
                noise_uncond = model(**kwargs)[0]
            latents = _step(latents, noise_uncond, noise_cond)
    return latents


# ---- SDXL: guidance on a doubled batch, with nested conditioning ---------------------------------------------------


def sdxl_unet() -> UNet2DConditionModel:
    """A tiny SDXL-style UNet: ``addition_embed_type="text_time"``, so every call carries ``added_cond_kwargs`` (a
    dict of batched tensors) besides the latents."""
    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=8 * 6 + 32,
        norm_num_groups=8,
    ).eval()


def sdxl_guidance_call(unet: UNet2DConditionModel) -> torch.Tensor:
    """One guided SDXL step's call: the doubled latents, and the unconditional then conditional halves of the text
    and of ``added_cond_kwargs`` (pooled text and time ids differ per half, as in the pipeline)."""
    gen = torch.Generator().manual_seed(6)
    latents = torch.randn(1, 4, 8, 8, generator=gen)
    text = torch.randn(2, 7, 32, generator=gen)
    added = {"text_embeds": torch.randn(2, 32, generator=gen), "time_ids": torch.randn(2, 6, generator=gen)}
    with torch.no_grad():
        return unet(torch.cat([latents] * 2), torch.tensor(500), text, added_cond_kwargs=added, return_dict=False)[0]
