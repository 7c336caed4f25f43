"""A tiny Stable-Diffusion-style text-to-image pipeline, built entirely from configs: no download, no hub.

``npu-port infer`` / ``scripts/inference_npu.py`` run it by default so that the main job works on a fresh machine.
Its weights are random (seeded): the images are noise-like patterns, good for timing, for comparing attention
strategies and for proving a port faithful — not for looking at. The tokenizer is a real ``CLIPTokenizer`` whose
vocabulary holds the 256 byte symbols (so any prompt tokenizes, one token per character) and no merges.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Dict

from .tiny import TEXT_DIM, _reseed, tiny_unet, tiny_vae

#: CLIP's context length; prompts are padded / truncated to it as in Stable Diffusion.
MAX_TOKENS = 77


def _byte_symbols() -> Dict[int, str]:
    """GPT-2 / CLIP's byte-to-unicode table: every byte gets a printable symbol (what the BPE vocabulary uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    symbols = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            symbols.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(code) for code in symbols)))


def tiny_clip_tokenizer(directory: str):
    """A ``CLIPTokenizer`` over single byte symbols (with and without the word-end marker), saved in ``directory``."""
    from transformers import CLIPTokenizer

    symbols = list(_byte_symbols().values())
    vocab = {symbol: index for index, symbol in enumerate(symbols + [s + "</w>" for s in symbols])}
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    os.makedirs(directory, exist_ok=True)
    vocab_file, merges_file = os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt")
    with open(vocab_file, "w", encoding="utf-8") as fh:
        json.dump(vocab, fh)
    with open(merges_file, "w", encoding="utf-8") as fh:
        fh.write("#version: 0.2\n")
    return CLIPTokenizer(vocab_file, merges_file, model_max_length=MAX_TOKENS)


def tiny_clip_text_encoder(vocab_size: int, end_token: int, start_token: int, seed: int = 0, width: int = TEXT_DIM):
    """A 2-layer ``CLIPTextModel`` of ``width`` (one head; 16 by default: the tiny UNet's cross-attention width)."""
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    config = CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=2,
        num_attention_heads=1,
        max_position_embeddings=MAX_TOKENS,
        projection_dim=width,
        bos_token_id=start_token,
        eos_token_id=end_token,
        pad_token_id=end_token,
    )
    return _reseed(CLIPTextModel(config), seed)


def build_tiny_text2image(save_dir: str, seed: int = 0) -> None:
    """Build the tiny pipeline and ``save_pretrained`` it to ``save_dir`` (load it with ``from_pretrained``)."""
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    with tempfile.TemporaryDirectory() as source:
        tokenizer = tiny_clip_tokenizer(source)
    encoder = tiny_clip_text_encoder(
        len(tokenizer), tokenizer.convert_tokens_to_ids("<|endoftext|>"), tokenizer.bos_token_id, seed + 2
    )
    unet = tiny_unet(seed)
    unet.register_to_config(sample_size=32)  # 64x64 images by default (the VAE halves each side)
    pipe = StableDiffusionPipeline(
        vae=tiny_vae(seed + 1),
        text_encoder=encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=DDIMScheduler(clip_sample=False, set_alpha_to_one=False, steps_offset=1),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(save_dir)
