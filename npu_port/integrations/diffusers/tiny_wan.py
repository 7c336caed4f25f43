"""A tiny Wan text-to-video pipeline (``WanPipeline``), built entirely from configs: no download, no hub.

``npu-port infer --model tiny-wan`` runs it so that the video path — Wan's 3-D transformer with its context-parallel
plan (``_cp_plan``), 3-D rotary embeddings, cross-attention to UMT5 text, the causal video VAE (4x in time, 8x in
space), flow matching with UniPC, classifier-free guidance as two transformer calls a step — works on a fresh
machine with no network. Few layers keep it small, but the attention has a real model's head shape: 4 heads of head
dim 64 (Wan 2.1 1.3B has 12 of 128). At the default 5 frames of 64x64 (2 latent frames of 8x8, patched 2x2 into
2 x 4 x 4 = 32 video tokens) and 32 text tokens, both sequences split evenly over 2, 4 or 8 ranks. Weights are
random (seeded): the videos are noise-like, good for timing, for comparing attention paths and parallel layouts.
"""

from __future__ import annotations

from .tiny import _reseed
from .tiny_flux import HEAD_DIM, HEADS, T5_DIM, t5_style_tokenizer, tiny_t5_encoder

#: UMT5 tokens per prompt (``max_sequence_length``; the pipeline pads the embeddings to it). Its default, 512, would
#: give every prompt 512 text tokens: the pipeline must be called with this.
TEXT_TOKENS = 32
#: Default video: 5 frames (4k + 1: the VAE keeps the first frame and packs every 4 after it), 64x64.
DEFAULT_FRAMES = 5
DEFAULT_SIZE = 64
LATENT_CHANNELS = 16


def tiny_wan_transformer(seed: int = 0):
    """``WanTransformer3DModel``: 4 heads of 64, 2 layers (self-attention over the video tokens, cross-attention to
    the text), patches of 1 frame x 2 x 2 latents."""
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=HEADS,
        attention_head_dim=HEAD_DIM,
        in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS,
        text_dim=T5_DIM,  # UMT5's width
        freq_dim=32,
        ffn_dim=2 * HEADS * HEAD_DIM,
        num_layers=2,
    )
    return _reseed(model, seed)


def tiny_wan_vae(seed: int = 0):
    """``AutoencoderKLWan``: 16 latent channels, 4x in time and 8x in space (as Wan 2.1's), narrow and one residual
    block a level."""
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    model = AutoencoderKLWan(
        base_dim=8,
        z_dim=LATENT_CHANNELS,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * LATENT_CHANNELS,
        latents_std=[1.0] * LATENT_CHANNELS,
    )
    return _reseed(model, seed)


def build_tiny_wan(save_dir: str, seed: int = 0) -> None:
    """Build the tiny Wan pipeline and ``save_pretrained`` it to ``save_dir`` (load it with ``from_pretrained``)."""
    from diffusers import UniPCMultistepScheduler, WanPipeline

    tokenizer = t5_style_tokenizer()
    pipe = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=tiny_t5_encoder(len(tokenizer), seed + 2, umt5=True),
        transformer=tiny_wan_transformer(seed),
        vae=tiny_wan_vae(seed + 1),
        scheduler=UniPCMultistepScheduler(  # as Wan 2.1's diffusers release: flow matching, shift 3
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0, num_train_timesteps=1000
        ),
    )
    pipe.save_pretrained(save_dir)
