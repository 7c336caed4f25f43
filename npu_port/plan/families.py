"""Tiny models of every model family npu-port claims, for measuring which attention calls run fused on an NPU.

A coverage number is only worth what the calls behind it are worth, so each family here is built to give its
kernels what the real model gives them — not what is easiest to run:

* the real **head dim** (and so the op limits it meets): 40 and 80 for SD1.5's UNet, 64 for SDXL, SD3, CogVideoX
  and LTX, 72 for PixArt and DiT (not 16-aligned: ``npu_fused_infer`` refuses it, ``npu_fusion`` takes it), 128 for
  Flux, Wan and HunyuanVideo, 512 for the VAE's single mid-block head; only the number of heads and layers is cut;
* the real **mask forms**, as each pipeline passes them (each builder's docstring says which pipeline behaviour it
  reproduces): none for SD3, Flux, Wan and CogVideoX; diffusers' ``(1 - mask) * -10000`` text bias for PixArt, LTX
  and the UNet's ``encoder_attention_mask``; HunyuanVideo's boolean masks (its token refiner's ``(B, 1, S, S)``
  and its blocks' ``(B, 1, 1, N)``);
* the **routing** each family needs: every one goes through ``set_attention_strategy(..., target=model)``; the
  legacy ControlVideo-style UNet holds a repo-local ``FullyFrameAttention`` (legacy attention) beside diffusers
  ``Attention`` modules.

Every builder takes a seed, returns a model in eval mode in ``bfloat16`` (what an NPU run uses) with seeded random
weights, and :func:`run` does one forward on seeded ``bfloat16`` inputs shaped like the pipeline's (classifier-free
guidance batches of 2 where the pipeline uses them, text padded to a fixed length with shorter negative prompts).
The whole set runs in seconds on a CPU. Outputs are noise: these models exist for their attention calls.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Sequence, Tuple

import torch
from torch import nn

from ..integrations.diffusers.tiny import _reseed, output_of

#: The dtype of every model and input here: what a Stable Diffusion / DiT / video port runs on an Ascend NPU.
DTYPE = torch.bfloat16
#: CLIP's 77 tokens (SD1.5, SDXL, the legacy UNet); T5 / UMT5 / Llama prompts are cut to :data:`LONG_TEXT`.
CLIP_TOKENS = 77
LONG_TEXT = 32
#: Valid tokens per batch row of a padded text prompt: the prompt, then the (shorter) negative prompt.
PROMPT_LENGTHS = (21, 9)


def _finish(model: nn.Module, seed: int) -> nn.Module:
    """Seeded weights in :data:`DTYPE`, except those the model keeps in float32 (``_keep_in_fp32_modules``: Wan's
    norms and time embedding), as ``from_pretrained(torch_dtype=torch.bfloat16)`` loads them."""
    keep = getattr(model, "_keep_in_fp32_modules", None) or ()
    _reseed(model, seed)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and not any(part in name.split(".") for part in keep):
            tensor.data = tensor.data.to(DTYPE)
    return model


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(DTYPE)


def _text_mask(tokens: int, lengths: Sequence[int]) -> torch.Tensor:
    """A tokenizer's attention mask: ``(len(lengths), tokens)`` bool, True on each row's first ``length`` tokens."""
    return torch.arange(tokens)[None, :] < torch.tensor(lengths)[:, None]


def _timesteps(batch: int) -> torch.Tensor:
    return torch.full((batch,), 500.0, dtype=DTYPE)


# ---- the UNets ---------------------------------------------------------------------------------------------------


def sd15(seed: int = 0) -> nn.Module:
    """``UNet2DConditionModel`` with SD1.5's layout cut to two levels of 2 heads: head dims 40 and 80 (also the mid
    block's), as SD1.5's 8 heads at 320 and 640 channels give (its 160 at 1280 meets the same op limits as 80: 16-
    aligned, under 512); CLIP text of 77 x 768.

    Reproduces a UNet pipeline that passes the prompt's attention mask: ``encoder_attention_mask`` ``(B, 77)``,
    which ``UNet2DConditionModel`` turns into a ``(1 - mask) * -10000`` bias for every cross-attention (AudioLDM 2,
    Kandinsky 3 and DreamLite pass the prompt's mask to their UNets as ``encoder_attention_mask``;
    ``StableDiffusionPipeline`` passes none, and without it every SD1.5 call is fused, as in the SDXL row).
    """
    from diffusers import UNet2DConditionModel

    torch.manual_seed(seed)
    model = UNet2DConditionModel(
        sample_size=16,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(80, 160),
        layers_per_block=1,
        norm_num_groups=16,
        cross_attention_dim=768,
        attention_head_dim=2,  # diffusers' name for the number of heads in this class
    )
    return _finish(model, seed)


def _sd15_inputs(model: nn.Module, gen: torch.Generator) -> Dict[str, Any]:
    return {
        "sample": _randn(gen, 2, 4, 16, 16),
        "timestep": _timesteps(2),
        "encoder_hidden_states": _randn(gen, 2, CLIP_TOKENS, 768),
        "encoder_attention_mask": _text_mask(CLIP_TOKENS, PROMPT_LENGTHS),
    }


def sdxl(seed: int = 0) -> nn.Module:
    """``UNet2DConditionModel`` with SDXL's layout: no attention at the first level, ``transformer_layers_per_block``
    (1, 1, 2) (SDXL: 1, 2, 10), head dim 64 everywhere (SDXL: 5, 10 and 20 heads of 64), linear projections,
    ``addition_embed_type="text_time"`` with pooled text and the six size/crop ids, text of 77 x 2048.

    Reproduces ``StableDiffusionXLPipeline``: classifier-free guidance (batch 2), ``added_cond_kwargs`` with
    ``text_embeds`` and ``time_ids``, and no attention mask.
    """
    from diffusers import UNet2DConditionModel

    torch.manual_seed(seed)
    model = UNet2DConditionModel(
        sample_size=16,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        block_out_channels=(32, 64, 128),
        layers_per_block=1,
        norm_num_groups=16,
        transformer_layers_per_block=(1, 1, 2),
        attention_head_dim=(1, 1, 2),  # heads per level: 64 / 1 and 128 / 2 give head dim 64
        use_linear_projection=True,
        cross_attention_dim=2048,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=32 + 6 * 8,
    )
    return _finish(model, seed)


def _sdxl_inputs(model: nn.Module, gen: torch.Generator) -> Dict[str, Any]:
    time_ids = torch.tensor([[128.0, 128.0, 0.0, 0.0, 128.0, 128.0]] * 2, dtype=DTYPE)
    return {
        "sample": _randn(gen, 2, 4, 16, 16),
        "timestep": _timesteps(2),
        "encoder_hidden_states": _randn(gen, 2, CLIP_TOKENS, 2048),
        "added_cond_kwargs": {"text_embeds": _randn(gen, 2, 32), "time_ids": time_ids},
    }


def legacy_controlvideo(seed: int = 0) -> nn.Module:
    """A ControlVideo-style video UNet (:mod:`npu_port.integrations.legacy_attention.tiny`): two levels of 2 heads of
    40 and 80 (SD1.5's head dims), a repo-local legacy ``FullyFrameAttention`` over all frames' tokens and a diffusers
    ``Attention`` to the text in each block.

    Reproduces ControlVideo's pipeline: 4 frames of 8 x 8 latents (so 256 tokens per fully-frame attention), CLIP
    text of 77 x 768 repeated per frame, guidance batch 2, no attention mask.
    """
    from ..integrations.legacy_attention.tiny import TinyControlVideoUNet

    torch.manual_seed(seed)
    return _finish(TinyControlVideoUNet(channels=(80, 160), heads=2, text_dim=768), seed)


def _legacy_controlvideo_inputs(model: nn.Module, gen: torch.Generator) -> Dict[str, Any]:
    return {"sample": _randn(gen, 2, 4, 4, 8, 8), "encoder_hidden_states": _randn(gen, 2, CLIP_TOKENS, 768)}


def vae(seed: int = 0) -> nn.Module:
    """``AutoencoderKL`` whose mid blocks (encoder and decoder) have SD's single attention head of 512 channels
    (``npu_fused_infer``'s head-dim limit exactly), on 8 x 8 images -> 4 x 4 latents (16 tokens).

    Reproduces the SD / SDXL VAE's encode and decode (``forward`` runs both; pipelines call ``decode``): one
    self-attention per mid block, no mask.
    """
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    model = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(32, 512),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=16,
        sample_size=8,
    )
    return _finish(model, seed)


def _vae_inputs(model: nn.Module, gen: torch.Generator) -> Dict[str, Any]:
    return {"sample": _randn(gen, 1, 3, 8, 8)}


# ---- the image transformers --------------------------------------------------------------------------------------


def sd3(seed: int = 0) -> nn.Module:
    """``SD3Transformer2DModel`` (MMDiT): 2 heads of 64 (SD3: 24 of 64), 2 joint blocks, the first with SD3.5's dual
    attention (a second, image-only self-attention), RMS q/k norms.

    Reproduces ``StableDiffusion3Pipeline``: guidance batch 2, image and text tokens in one joint attention (16 x 16
    latents in 2 x 2 patches: 64 image tokens; 77 CLIP + 32 T5 text tokens), no attention mask.
    """
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(seed)
    model = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=2,
        attention_head_dim=64,
        num_attention_heads=2,
        joint_attention_dim=64,
        caption_projection_dim=128,
        pooled_projection_dim=64,
        pos_embed_max_size=16,
        dual_attention_layers=(0,),
        qk_norm="rms_norm",
    )
    return _finish(model, seed)


def _sd3_inputs(model: nn.Module, gen: torch.Generator) -> Dict[str, Any]:
    return {
        "hidden_states": _randn(gen, 2, 16, 16, 16),
        "encoder_hidden_states": _randn(gen, 2, CLIP_TOKENS + LONG_TEXT, 64),
        "pooled_projections": _randn(gen, 2, 64),
        "timestep": _timesteps(2),
    }


def flux(seed: int = 0) -> nn.Module:
    """``FluxTransformer2DModel``: 2 heads of 128 (Flux.1: 24 of 128), one double- and one single-stream block,
    guidance embedding (Flux.1-dev), 3-axis rotary embeddings of Flux's (16, 56, 56).

    Reproduces ``FluxPipeline``: batch 1 (guidance is distilled into the model), 8 x 8 packed image tokens and 32
    T5 tokens joined in one sequence, no attention mask (the pipeline passes none).
    """
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=128,
        num_attention_heads=2,
        joint_attention_dim=64,
        pooled_projection_dim=32,
        guidance_embeds=True,
        axes_dims_rope=(16, 56, 56),
    )
    return _finish(model, seed)


def _flux_inputs(model: nn.Module, gen: torch.Generator) -> Dict[str, Any]:
    side = 8
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    img_ids = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(-1, 3).to(DTYPE)
    return {
        "hidden_states": _randn(gen, 1, side * side, 64),
        "encoder_hidden_states": _randn(gen, 1, LONG_TEXT, 64),
        "pooled_projections": _randn(gen, 1, 32),
        "timestep": torch.full((1,), 0.5, dtype=DTYPE),
        "guidance": torch.full((1,), 3.5, dtype=DTYPE),
        "img_ids": img_ids,
        "txt_ids": torch.zeros(LONG_TEXT, 3, dtype=DTYPE),
    }


def pixart(seed: int = 0) -> nn.Module:
    """``PixArtTransformer2DModel``: 2 heads of 72 (PixArt-alpha / sigma: 16 of 72), one block, adaLN-single,
    cross-attention to T5 text.

    Reproduces ``PixArtAlphaPipeline`` / ``PixArtSigmaPipeline``: guidance batch 2 and the prompt's attention mask
    passed as ``encoder_attention_mask`` ``(B, tokens)``, which the model turns into a ``(1 - mask) * -10000``
    bias on the cross-attention (32 T5 tokens here; 120 / 300 in the pipelines).
    """
    from diffusers import PixArtTransformer2DModel

    torch.manual_seed(seed)
    model = PixArtTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=72,
        in_channels=4,
        out_channels=8,
        num_layers=1,
        cross_attention_dim=144,
        caption_channels=64,
        sample_size=8,
        patch_size=2,
    )
    return _finish(model, seed)


def _pixart_inputs(model: nn.Module, gen: torch.Generator) -> Dict[str, Any]:
    return {
        "hidden_states": _randn(gen, 2, 4, 8, 8),
        "encoder_hidden_states": _randn(gen, 2, LONG_TEXT, 64),
        "encoder_attention_mask": _text_mask(LONG_TEXT, PROMPT_LENGTHS).to(DTYPE),
        "timestep": _timesteps(2),
        "added_cond_kwargs": {"resolution": None, "aspect_ratio": None},
    }


def dit(seed: int = 0) -> nn.Module:
    """``DiTTransformer2DModel``: 2 heads of 72 (DiT-XL/2: 16 of 72), one block, class-conditional adaLN-zero.

    Reproduces ``DiTPipeline``: guidance batch 2 (the class and the "null" class 1000), self-attention only, no
    mask.
    """
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(seed)
    model = DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=72,
        in_channels=4,
        out_channels=8,
        num_layers=1,
        sample_size=8,
        patch_size=2,
        num_embeds_ada_norm=1000,
    )
    return _finish(model, seed)


def _dit_inputs(model: nn.Module, gen: torch.Generator) -> Dict[str, Any]:
    return {
        "hidden_states": _randn(gen, 2, 4, 8, 8),
        "timestep": _timesteps(2),
        "class_labels": torch.tensor([207, 1000]),
    }


# ---- the video transformers --------------------------------------------------------------------------------------


def wan(seed: int = 0) -> nn.Module:
    """``WanTransformer3DModel``: 2 heads of 128 (Wan 2.1 1.3B: 12 of 128, 14B: 40 of 128), one block of
    self-attention and cross-attention to UMT5 text, 3-D rotary embeddings.

    Reproduces ``WanPipeline``: guidance batch 2, 2 latent frames of 8 x 8 in 1 x 2 x 2 patches (32 video tokens),
    the text embeddings zero-padded to a fixed length (32 here, 512 there) and no attention mask: Wan attends to
    the padding.
    """
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=128,
        in_channels=16,
        out_channels=16,
        text_dim=64,
        freq_dim=32,
        ffn_dim=512,
        num_layers=1,
    )
    return _finish(model, seed)


def _wan_inputs(model: nn.Module, gen: torch.Generator) -> Dict[str, Any]:
    text = _randn(gen, 2, LONG_TEXT, 64) * _text_mask(LONG_TEXT, PROMPT_LENGTHS)[..., None].to(DTYPE)
    return {"hidden_states": _randn(gen, 2, 16, 2, 8, 8), "timestep": _timesteps(2), "encoder_hidden_states": text}


def hunyuan_video(seed: int = 0) -> nn.Module:
    """``HunyuanVideoTransformer3DModel``: 2 heads of 128 (HunyuanVideo: 24 of 128), one token-refiner layer, one
    double- and one single-stream block, guidance embedding, 3-D rotary embeddings of (16, 56, 56).

    Reproduces ``HunyuanVideoPipeline``: batch 1 (guidance is distilled), Llama text padded to a fixed length with
    its attention mask passed as ``encoder_attention_mask``: the token refiner's self-attention gets a boolean
    ``(B, 1, S, S)`` mask built from it, the video+text blocks a boolean ``(B, 1, 1, N)`` key-padding mask.
    """
    from diffusers import HunyuanVideoTransformer3DModel

    torch.manual_seed(seed)
    model = HunyuanVideoTransformer3DModel(
        in_channels=16,
        out_channels=16,
        num_attention_heads=2,
        attention_head_dim=128,
        num_layers=1,
        num_single_layers=1,
        num_refiner_layers=1,
        text_embed_dim=64,
        pooled_projection_dim=32,
        rope_axes_dim=(16, 56, 56),
    )
    return _finish(model, seed)


def _hunyuan_video_inputs(model: nn.Module, gen: torch.Generator) -> Dict[str, Any]:
    return {
        "hidden_states": _randn(gen, 1, 16, 2, 8, 8),
        "timestep": _timesteps(1),
        "encoder_hidden_states": _randn(gen, 1, LONG_TEXT, 64),
        "encoder_attention_mask": _text_mask(LONG_TEXT, PROMPT_LENGTHS[:1]).to(torch.int64),
        "pooled_projections": _randn(gen, 1, 32),
        "guidance": torch.full((1,), 6000.0, dtype=DTYPE),
    }


def cogvideox(seed: int = 0) -> nn.Module:
    """``CogVideoXTransformer3DModel``: 2 heads of 64 (CogVideoX-2b: 30 of 64, 5b: 48 of 64), one block whose single
    attention joins the text and video tokens, sin-cos positions (2b).

    Reproduces ``CogVideoXPipeline``: guidance batch 2, 2 latent frames of 8 x 8 in 2 x 2 patches (32 video tokens)
    after 32 text tokens (226 there), no attention mask (the pipeline passes none; T5's padding is attended to).
    """
    from diffusers import CogVideoXTransformer3DModel

    torch.manual_seed(seed)
    model = CogVideoXTransformer3DModel(
        num_attention_heads=2,
        attention_head_dim=64,
        in_channels=16,
        out_channels=16,
        time_embed_dim=32,
        text_embed_dim=64,
        num_layers=1,
        sample_width=8,
        sample_height=8,
        sample_frames=5,
        patch_size=2,
        max_text_seq_length=LONG_TEXT,
    )
    return _finish(model, seed)


def _cogvideox_inputs(model: nn.Module, gen: torch.Generator) -> Dict[str, Any]:
    return {
        "hidden_states": _randn(gen, 2, 2, 16, 8, 8),
        "encoder_hidden_states": _randn(gen, 2, LONG_TEXT, 64),
        "timestep": torch.tensor([500, 500]),
    }


def ltx(seed: int = 0) -> nn.Module:
    """``LTXVideoTransformer3DModel``: 2 heads of 64 (LTX-Video: 32 of 64), one block of self-attention and
    cross-attention to T5 text, RMS norm across heads, 3-D rotary embeddings.

    Reproduces ``LTXPipeline``: guidance batch 2, 2 latent frames of 4 x 4 packed to 32 tokens, and the prompt's
    boolean attention mask passed as ``encoder_attention_mask``, which the model turns into a
    ``(1 - mask) * -10000`` bias and the processor repeats per head: ``(B, heads, 1, tokens)``.
    """
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(seed)
    model = LTXVideoTransformer3DModel(
        in_channels=32,
        out_channels=32,
        num_attention_heads=2,
        attention_head_dim=64,
        cross_attention_dim=128,
        num_layers=1,
        caption_channels=64,
    )
    return _finish(model, seed)


def _ltx_inputs(model: nn.Module, gen: torch.Generator) -> Dict[str, Any]:
    return {
        "hidden_states": _randn(gen, 2, 2 * 4 * 4, 32),
        "encoder_hidden_states": _randn(gen, 2, LONG_TEXT, 64),
        "timestep": torch.tensor([500, 500]),
        "encoder_attention_mask": _text_mask(LONG_TEXT, PROMPT_LENGTHS),
        "num_frames": 2,
        "height": 4,
        "width": 4,
        "rope_interpolation_scale": (8 / 25, 32, 32),  # the pipeline's: temporal compression / frame rate, 32, 32
    }


#: Family name -> builder ``(seed=0) -> model`` (bfloat16, eval mode, seeded random weights).
FAMILIES: Dict[str, Callable[..., nn.Module]] = {
    "sd15": sd15,
    "sdxl": sdxl,
    "sd3": sd3,
    "flux": flux,
    "pixart": pixart,
    "dit": dit,
    "wan": wan,
    "hunyuan_video": hunyuan_video,
    "cogvideox": cogvideox,
    "ltx": ltx,
    "vae": vae,
    "legacy_controlvideo": legacy_controlvideo,
}

_INPUTS: Dict[str, Callable[[nn.Module, torch.Generator], Dict[str, Any]]] = {
    "sd15": _sd15_inputs,
    "sdxl": _sdxl_inputs,
    "sd3": _sd3_inputs,
    "flux": _flux_inputs,
    "pixart": _pixart_inputs,
    "dit": _dit_inputs,
    "wan": _wan_inputs,
    "hunyuan_video": _hunyuan_video_inputs,
    "cogvideox": _cogvideox_inputs,
    "ltx": _ltx_inputs,
    "vae": _vae_inputs,
    "legacy_controlvideo": _legacy_controlvideo_inputs,
}


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; valid families: {', '.join(FAMILIES)}")


def build(family: str, seed: int = 0) -> nn.Module:
    """The tiny model of ``family`` (see :data:`FAMILIES`); ``ValueError`` naming the valid families otherwise."""
    _check_family(family)
    return FAMILIES[family](seed)


def inputs(family: str, model: nn.Module, seed: int = 0) -> Dict[str, Any]:
    """Seeded keyword arguments for one forward of ``family``'s tiny ``model``, as its pipeline passes them."""
    _check_family(family)
    return _INPUTS[family](model, _gen(seed))


def run(family: str, model: nn.Module, seed: int = 0) -> torch.Tensor:
    """One forward of ``family``'s tiny ``model`` under ``torch.no_grad()``; the output tensor."""
    arguments = inputs(family, model, seed)
    with torch.no_grad():
        return output_of(model(**arguments))


# ---- the coverage table ------------------------------------------------------------------------------------------

#: The masking value diffusers' text masks hold: ``(1 - mask) * -10000.0`` (docs/explanation/masks-and-polarity.md).
DIFFUSERS_MASKED_VALUE = -10000.0
#: What the coverage table judges each family's calls for: label -> (chip, options of the ``npu`` strategy). The
#: second is what a diffusers user declares for pipelines that pass text masks; the third a chip with no fused op.
ASSESSMENTS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "910B": ("910B", {}),
    "910B masked_value=-10000": ("910B", {"masked_value": DIFFUSERS_MASKED_VALUE}),
    "910A": ("910A", {}),
}


def _unfused(plan: Any) -> Dict[str, Any]:
    """A signature that would not run fused: its calls, shapes, mask and every candidate's reasons."""
    signature = plan.signature
    return {
        "count": plan.count,
        "query": list(signature.query),
        "key": list(signature.key),
        "mask": signature.mask.describe() if signature.mask is not None else None,
        "routed": signature.routed,
        "kernel": plan.kernel,
        "reasons": {kernel: [r.as_dict() for r in found] for kernel, found in plan.reasons.items()},
    }


def coverage(family: str, seed: int = 0) -> Dict[str, Any]:
    """One row of the coverage table: ``family``'s tiny model run once here under a recording of the ``npu``
    strategy applied to it (``set_attention_strategy("npu", target=model)``'s routing), then judged per
    :data:`ASSESSMENTS`. ``calls`` / ``routed``: what was recorded; per assessment, ``fused`` and the signatures that
    would not be, with their reasons. ``dtypes``, ``head_dims``, ``masks``: what its calls carried."""
    from ..attn.target import Target
    from ..strategy.registry import resolve
    from . import assess, record_calls

    model = build(family, seed)
    recording = record_calls(lambda: run(family, model, seed), target_model=model, strategy="npu")
    masks = sorted({entry.signature.mask.describe() for entry in recording.entries if entry.signature.mask})
    row: Dict[str, Any] = {
        "family": family,
        "model": type(model).__name__,
        "calls": recording.calls,
        "routed": recording.routed,
        "dtypes": sorted({entry.signature.dtype for entry in recording.entries}),
        "head_dims": sorted({entry.signature.query[-1] for entry in recording.entries}),
        "masks": masks,
        "assessments": {},
    }
    for label, (chip, options) in ASSESSMENTS.items():
        strategy = resolve("npu").with_overrides(**options) if options else "npu"
        plan = assess(recording, Target.of("npu", chip), strategy)
        row["assessments"][label] = {
            "fused": plan.fused,
            "unfused": [_unfused(signature) for signature in plan.signatures if not signature.fused],
        }
    return row
