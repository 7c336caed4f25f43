"""The tiny models the loader tests save and load back with a ``device_map`` (tests/device/test_redirect_from_pretrained.py,
tests/runtime/test_handled_loaders.py): one GPT-2 and one conditional UNet, which supports ``device_map="auto"`` in
every diffusers release."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import UNet2DConditionModel
from transformers import GPT2Config, GPT2LMHeadModel


def save_tiny_models(root: Path) -> None:
    """Save ``root/gpt2`` and ``root/unet`` (seeded: the same weights every time)."""
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16)).save_pretrained(
        root / "gpt2"
    )
    UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(8, 16),
        layers_per_block=1,
        norm_num_groups=8,
        cross_attention_dim=8,
        attention_head_dim=2,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    ).save_pretrained(root / "unet")
