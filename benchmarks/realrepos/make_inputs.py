"""Tiny random checkpoints and inputs for the real-repository harness (run inside the project's own venv).

usage: make_inputs.py {tav,animatediff,dit,raft} --repo FETCHED_REPO --out DIR

Everything here is made by this script from configs and seeded random numbers: no hub, no download. The shapes are
the ones each project's loading code expects; the sizes are as small as the code allows so that a whole run takes
seconds on a 2-core CPU. The project's own classes are imported from --repo where the checkpoint must match them
exactly (AnimateDiff's motion module, DiT, RAFT); nothing from the repository is copied.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

SEED = 0
TEXT_DIM = 32


def _seeded(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)


def _randomize(module: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """Overwrite every parameter with seeded noise, so zero-initialised layers (adaLN, proj_out) do something."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator) * scale
            is_norm_weight = name.endswith("weight") and param.ndim == 1
            param.copy_(1.0 + noise if is_norm_weight else noise)


# ---- a tiny Stable-Diffusion v1 layout (diffusers 0.11-era names), shared by Tune-A-Video and AnimateDiff --------


def _clip_tokenizer(directory: str):
    """A real CLIPTokenizer over the 256 byte symbols (every prompt tokenizes, one token per character), no merges."""
    from transformers import CLIPTokenizer
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate(symbols + [s + "</w>" for s in symbols])}
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as fh:
        json.dump(vocab, fh)
    with open(os.path.join(directory, "merges.txt"), "w", encoding="utf-8") as fh:
        fh.write("#version: 0.2\n")
    tokenizer = CLIPTokenizer(
        os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt"), model_max_length=77
    )
    tokenizer.save_pretrained(directory)
    return tokenizer


def tiny_vae(seed: int):
    from diffusers import AutoencoderKL

    _seeded(seed)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(16, 32),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=32,
    )


#: The keys of stable-diffusion-v1-4's unet/config.json (written by diffusers 0.2): the 3-D UNets of Tune-A-Video and
#: AnimateDiff take their own defaults for the rest (a saved "mid_block_type" of the 2-D class would be refused).
V14_UNET_KEYS = {
    "_class_name",
    "_diffusers_version",
    "act_fn",
    "attention_head_dim",
    "block_out_channels",
    "center_input_sample",
    "cross_attention_dim",
    "down_block_types",
    "downsample_padding",
    "flip_sin_to_cos",
    "freq_shift",
    "in_channels",
    "layers_per_block",
    "mid_block_scale_factor",
    "norm_eps",
    "norm_num_groups",
    "out_channels",
    "sample_size",
    "up_block_types",
}


def _keep_v14_unet_keys(path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        config = json.load(fh)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({k: v for k, v in config.items() if k in V14_UNET_KEYS}, fh, indent=2)


def make_tiny_sd(out: str, seed: int = SEED) -> None:
    """model_index.json + tokenizer / text_encoder / vae / unet / scheduler, as a v1-4 checkout has them.

    The UNet has four blocks (three cross-attention down blocks and a plain one) because Tune-A-Video's and
    AnimateDiff's ``from_pretrained_2d`` hard-code that layout; widths 32/32/64/64, two heads, one layer per block.
    """
    from diffusers import DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = _clip_tokenizer(os.path.join(out, "tokenizer"))
    _seeded(seed + 1)
    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    text_config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=TEXT_DIM,
        intermediate_size=2 * TEXT_DIM,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=77,
        projection_dim=TEXT_DIM,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=end,
        pad_token_id=end,
    )
    CLIPTextModel(text_config).save_pretrained(os.path.join(out, "text_encoder"))
    tiny_vae(seed + 2).save_pretrained(os.path.join(out, "vae"))
    _seeded(seed + 3)
    UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        block_out_channels=(32, 32, 64, 64),  # 32: the motion module's GroupNorm has 32 groups
        layers_per_block=1,
        norm_num_groups=8,
        cross_attention_dim=TEXT_DIM,
        attention_head_dim=2,
    ).save_pretrained(os.path.join(out, "unet"))
    _keep_v14_unet_keys(os.path.join(out, "unet", "config.json"))
    DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    ).save_pretrained(os.path.join(out, "scheduler"))
    index = {
        "_class_name": "StableDiffusionPipeline",
        "_diffusers_version": "0.11.1",
        "scheduler": ["diffusers", "DDIMScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "unet": ["diffusers", "UNet2DConditionModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    }
    with open(os.path.join(out, "model_index.json"), "w", encoding="utf-8") as fh:
        json.dump(index, fh, indent=2)


def _write_yaml(path: str, data) -> None:
    from omegaconf import OmegaConf

    OmegaConf.save(OmegaConf.create(data), path)


# ---- Tune-A-Video: train_tuneavideo.py --config (1 training step, then its validation: DDIM inversion + sampling) --


def make_tav(repo: str, out: str) -> None:
    import imageio

    make_tiny_sd(os.path.join(out, "sd"))
    rng = np.random.default_rng(SEED)
    base = rng.integers(0, 256, size=(40, 40, 3), dtype=np.uint8)
    frames = [np.ascontiguousarray(base[i : i + 32, i : i + 32]) for i in range(8)]  # a pattern drifting 1 px / frame
    imageio.mimwrite(os.path.join(out, "video.mp4"), frames, fps=8, macro_block_size=1)
    config = {
        "pretrained_model_path": os.path.join(out, "sd"),
        "output_dir": "./outputs/tiny",
        "train_data": {
            "video_path": os.path.join(out, "video.mp4"),
            "prompt": "a man is skiing",
            "n_sample_frames": 4,
            "width": 32,
            "height": 32,
            "sample_start_idx": 0,
            "sample_frame_rate": 2,
        },
        "validation_data": {
            "prompts": ["mickey mouse is skiing on the snow"],
            "video_length": 4,
            "width": 32,
            "height": 32,
            "num_inference_steps": 2,
            "guidance_scale": 12.5,
            "use_inv_latent": True,
            "num_inv_steps": 2,
        },
        "learning_rate": 3e-5,
        "train_batch_size": 1,
        "max_train_steps": 1,
        "checkpointing_steps": 1000,
        "validation_steps": 1,
        "trainable_modules": ["attn1.to_q", "attn2.to_q", "attn_temp"],
        "seed": 33,
        "mixed_precision": "no",  # the repo's fp16: config-fp16-noxformers.yaml (fails on a CPU, hand port too)
        "use_8bit_adam": False,
        "gradient_checkpointing": True,
        "enable_xformers_memory_efficient_attention": True,
    }
    _write_yaml(os.path.join(out, "config.yaml"), config)  # as the repo's configs: xformers on
    config["enable_xformers_memory_efficient_attention"] = False
    _write_yaml(os.path.join(out, "config-noxformers.yaml"), config)
    config["mixed_precision"] = "fp16"
    _write_yaml(os.path.join(out, "config-fp16-noxformers.yaml"), config)
    _make_tav_readme_inference(repo, out)


#: The README's inference snippet is run as written, but for its paths and sizes (each must match exactly once).
README_SUBSTITUTIONS = [
    ('"./checkpoints/stable-diffusion-v1-4"', "{sd!r}"),
    ('"./outputs/man-skiing"', "{model!r}"),
    ("ddim_latent-500.pt", "ddim_latent-1.pt"),
    (
        "video_length=24, height=512, width=512, num_inference_steps=50",
        "video_length=4, height=32, width=32, num_inference_steps=2",
    ),
]
#: ... and the hand port of it: the CPU, no xformers.
README_HANDPORT = [
    ("'cuda'", "'cpu'"),
    ('"cuda"', '"cpu"'),
    ("pipe.enable_xformers_memory_efficient_attention()\n", ""),
]


def _readme_snippet(repo: str) -> str:
    with open(os.path.join(repo, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    start = text.index("```python", text.index("### Inference")) + len("```python")
    return text[start : text.index("```", start)].lstrip("\n")


def _substitute(text: str, pairs, what: str) -> str:
    for old, new in pairs:
        if text.count(old) != 1 and what == "README snippet":
            sys.exit(f"make_inputs.py: the {what} has {text.count(old)} of {old!r}, expected 1")
        text = text.replace(old, new)
    return text


def _make_tav_readme_inference(repo: str, out: str) -> None:
    """A fine-tuned model folder as train_tuneavideo.py saves it (a 3-D UNet, an inverted latent), and the README's
    inference snippet, taken from the fetched README at set-up time (so none of it is in this repository)."""
    sys.path.insert(0, repo)
    from tuneavideo.models.unet import UNet3DConditionModel

    model = os.path.join(out, "tuned")
    unet = UNet3DConditionModel.from_pretrained_2d(os.path.join(out, "sd"), subfolder="unet")
    generator = torch.Generator().manual_seed(SEED + 4)
    with torch.no_grad():  # the temporal attention is zero-initialised: give it weights, as fine-tuning would
        for name, param in unet.named_parameters():
            if "attn_temp" in name:
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    unet.save_pretrained(os.path.join(model, "unet"))
    os.makedirs(os.path.join(model, "inv_latents"), exist_ok=True)
    torch.save(
        torch.randn((1, 4, 4, 16, 16), generator=generator), os.path.join(model, "inv_latents", "ddim_latent-1.pt")
    )
    pairs = [(old, new.format(sd=os.path.join(out, "sd"), model=model)) for old, new in README_SUBSTITUTIONS]
    snippet = _substitute(_readme_snippet(repo), pairs, "README snippet")
    with open(os.path.join(out, "readme_inference.py"), "w", encoding="utf-8") as fh:
        fh.write(snippet)
    handport = _substitute(snippet, README_HANDPORT, "hand port")
    with open(os.path.join(out, "readme_inference_handport.py"), "w", encoding="utf-8") as fh:
        fh.write(handport)
    with open(os.path.join(out, "readme_inference_float64.py"), "w", encoding="utf-8") as fh:
        fh.write(handport.replace("torch.float16", "torch.float64"))  # the reference both float16 runs are judged by


# ---- AnimateDiff: python -m scripts.animate --config (motion module v1-style, 2 DDIM steps, 4 frames of 32x32) ---


def make_animatediff(repo: str, out: str) -> None:
    make_tiny_sd(os.path.join(out, "sd"))
    inference = {
        "unet_additional_kwargs": {
            "use_inflated_groupnorm": True,
            "use_motion_module": True,
            "motion_module_resolutions": [1, 2, 4, 8],
            "motion_module_mid_block": False,
            "motion_module_type": "Vanilla",
            "motion_module_kwargs": {
                "num_attention_heads": 2,
                "num_transformer_block": 1,
                "attention_block_types": ["Temporal_Self", "Temporal_Self"],
                "temporal_position_encoding": True,
                "temporal_attention_dim_div": 1,
                "zero_initialize": True,
            },
        },
        "noise_scheduler_kwargs": {
            "beta_start": 0.00085,
            "beta_end": 0.012,
            "beta_schedule": "linear",
            "steps_offset": 1,
            "clip_sample": False,
        },
    }
    _write_yaml(os.path.join(out, "inference.yaml"), inference)
    sys.path.insert(0, repo)
    from animatediff.models.unet import UNet3DConditionModel

    unet = UNet3DConditionModel.from_pretrained_2d(
        os.path.join(out, "sd"), subfolder="unet", unet_additional_kwargs=inference["unet_additional_kwargs"]
    )
    motion = {k: v for k, v in unet.state_dict().items() if "motion_modules." in k and "pos_encoder.pe" not in k}
    generator = torch.Generator().manual_seed(SEED + 5)
    motion = {
        k: torch.randn(v.shape, generator=generator) * 0.05
        + (1.0 if v.ndim == 1 and k.endswith("norm.weight") else 0.0)
        for k, v in motion.items()
    }
    torch.save(motion, os.path.join(out, "mm_tiny.ckpt"))
    _write_yaml(
        os.path.join(out, "prompts.yaml"),
        [
            {
                "inference_config": os.path.join(out, "inference.yaml"),
                "motion_module": os.path.join(out, "mm_tiny.ckpt"),
                "dreambooth_path": "",
                "lora_model_path": "",
                "seed": [8893659352891878017],
                "steps": 2,
                "guidance_scale": 8,
                "prompt": ["close up photo of a rabbit, forest, haze"],
                "n_prompt": ["semi-realistic, cgi, 3d, render, sketch"],
            }
        ],
    )


# ---- DiT: sample.py / sample_ddp.py --model DiT-S/8 --ckpt ..., VAE under ./stabilityai/sd-vae-ft-{mse,ema} ------


def make_dit(repo: str, out: str) -> None:
    sys.path.insert(0, repo)
    from models import DiT_models

    model = DiT_models["DiT-S/8"](input_size=32, num_classes=1000)  # --image-size 256 -> latent 32, 16 tokens
    _randomize(model, SEED + 7, scale=0.02)
    torch.save(model.state_dict(), os.path.join(out, "DiT-S-8-tiny.pt"))
    for name in ("mse", "ema"):
        tiny_vae(SEED + 8).save_pretrained(os.path.join(out, "stabilityai", f"sd-vae-ft-{name}"))


# ---- RAFT: evaluate.py --dataset sintel / demo.py --path, small model, with and without --alternate_corr --------


def _write_flo(path: str, flow: np.ndarray) -> None:
    height, width = flow.shape[:2]
    with open(path, "wb") as fh:
        np.array([202021.25], np.float32).tofile(fh)
        np.array([width, height], np.int32).tofile(fh)
        flow.astype(np.float32).tofile(fh)


def make_raft(repo: str, out: str) -> None:
    from PIL import Image

    sys.path.insert(0, os.path.join(repo, "core"))
    from raft import RAFT

    _seeded(SEED + 9)
    args = argparse.Namespace(small=True, mixed_precision=False, alternate_corr=False, dropout=0)
    model = torch.nn.DataParallel(RAFT(args))  # evaluate.py / demo.py load a DataParallel state dict
    torch.save(model.state_dict(), os.path.join(out, "raft-small-tiny.pth"))

    rng = np.random.default_rng(SEED)
    height, width = 128, 160  # 1/8 resolution 16x20: its 4-level pyramids keep >= 2 px a side (else NaN / errors)
    texture = rng.integers(0, 256, size=(height + 8, width + 8, 3), dtype=np.uint8)
    frames = [texture[2 * i : 2 * i + height, 3 * i : 3 * i + width] for i in range(3)]  # moves (-3, -2) px / frame
    flow = np.zeros((height, width, 2), np.float32)
    flow[..., 0], flow[..., 1] = -3.0, -2.0
    sintel = os.path.join(out, "datasets", "Sintel", "training")
    for dstype in ("clean", "final"):
        os.makedirs(os.path.join(sintel, dstype, "tiny_1"), exist_ok=True)
        for i, frame in enumerate(frames):
            Image.fromarray(np.ascontiguousarray(frame)).save(
                os.path.join(sintel, dstype, "tiny_1", f"frame_{i + 1:04d}.png")
            )
    os.makedirs(os.path.join(sintel, "flow", "tiny_1"), exist_ok=True)
    for i in range(len(frames) - 1):
        _write_flo(os.path.join(sintel, "flow", "tiny_1", f"frame_{i + 1:04d}.flo"), flow)
    os.makedirs(os.path.join(out, "demo-frames"), exist_ok=True)
    for i, frame in enumerate(frames):
        Image.fromarray(np.ascontiguousarray(frame)).save(os.path.join(out, "demo-frames", f"frame_{i + 1:04d}.png"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("project", choices=["tav", "animatediff", "dit", "raft"])
    parser.add_argument("--repo", required=True, help="the project's fetched source (read, never copied)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    {"tav": make_tav, "animatediff": make_animatediff, "dit": make_dit, "raft": make_raft}[args.project](
        os.path.abspath(args.repo), os.path.abspath(args.out)
    )
    print(f"make_inputs.py: {args.project} inputs in {args.out}")


if __name__ == "__main__":
    main()
