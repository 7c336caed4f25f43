"""A tiny Flux text-to-image pipeline (``FluxPipeline``), built entirely from configs: no download, no hub.

``npu-port infer --model tiny-flux`` runs it so that the Flux path — the MMDiT transformer with its context-parallel
plan (``_cp_plan``), the two text encoders, the 2x2 latent packing, flow matching and "true" classifier-free guidance
— works on a fresh machine with no network. Few heads and blocks keep it small, but the attention has the shapes a
real model gives its kernels: 4 heads of head dim 64 (Flux.1 has 24 of 128; 64 is what most DiTs use), 3-axis
rotary embeddings, image and text tokens joined in one sequence. At the default 128x128 (a 16x16 latent packed into
8x8 = 64 image tokens) and 32 text tokens both sequences split evenly over 2, 4 or 8 ranks. Weights are random
(seeded): the images are noise-like, good for timing, for comparing attention paths and parallel layouts.

The T5 tokenizer has T5's layout but is built with the ``tokenizers`` library (:func:`t5_style_tokenizer`), so any
ASCII prompt tokenizes without a SentencePiece model file.
"""

from __future__ import annotations

import string
import tempfile

from .tiny import _reseed
from .tiny_text2image import tiny_clip_text_encoder, tiny_clip_tokenizer

#: T5 tokens per prompt (``max_sequence_length``): a multiple of 8 so that context parallelism splits the text over
#: up to 8 ranks. The pipeline must be called with it (its default, 512, would pad every prompt to 512 tokens).
TEXT_TOKENS = 32
#: Image side by default: 128 px -> a 16x16 latent (VAE factor 8) -> 8x8 = 64 packed tokens.
DEFAULT_SIZE = 128
#: Width of the text streams: T5's d_model (the transformer's ``joint_attention_dim``) and CLIP's pooled output.
T5_DIM = 32
CLIP_DIM = 32
HEADS = 4
HEAD_DIM = 64
LATENT_CHANNELS = 16


def t5_style_tokenizer():
    """A T5-layout fast tokenizer built offline: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, SentencePiece's ``▁`` word
    marker and ``</s>`` appended, as T5's and UMT5's. Its Unigram vocabulary holds the printable ASCII characters and
    every pair of lowercase letters, each with and without the word marker, all equally likely — so a prompt splits
    into the fewest pieces (about one token per two letters: the default prompt takes 17 of :data:`TEXT_TOKENS`).
    Wrapped in ``PreTrainedTokenizerFast`` so that ``save_pretrained`` / ``from_pretrained`` work with any
    transformers version."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import Unigram
    from transformers import PreTrainedTokenizerFast

    pieces = [c for c in string.printable if not c.isspace()]
    pieces += [a + b for a in string.ascii_lowercase for b in string.ascii_lowercase]
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -1.0)]
    vocab += [("▁" + piece, -1.0) for piece in pieces] + [(piece, -1.0) for piece in pieces]
    tokenizer = Tokenizer(Unigram(vocab, unk_id=2, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=["$A", "</s>"], pair=["$A", "</s>", "$B", "</s>"], special_tokens=[("</s>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", model_max_length=512
    )


def tiny_t5_encoder(vocab_size: int, seed: int = 0, *, umt5: bool = False):
    """A 2-layer ``T5EncoderModel`` (Flux's second text encoder) or, with ``umt5``, ``UMT5EncoderModel`` (Wan's), of
    width :data:`T5_DIM` (4 heads of 8)."""
    import torch
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    config_class, model_class = (UMT5Config, UMT5EncoderModel) if umt5 else (T5Config, T5EncoderModel)
    torch.manual_seed(seed)
    config = config_class(
        vocab_size=vocab_size,
        d_model=T5_DIM,
        d_kv=T5_DIM // 4,
        d_ff=2 * T5_DIM,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return _reseed(model_class(config), seed)


def tiny_flux_transformer(seed: int = 0):
    """``FluxTransformer2DModel``: 4 heads of 64 (``axes_dims_rope`` 16 + 24 + 24 = 64), one double-stream and one
    single-stream block, no guidance embedding (so guidance is "true" CFG: two transformer calls a step)."""
    import torch
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4 * LATENT_CHANNELS,  # the pipeline packs 2x2 latent patches into one token
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=HEAD_DIM,
        num_attention_heads=HEADS,
        joint_attention_dim=T5_DIM,
        pooled_projection_dim=CLIP_DIM,
        guidance_embeds=False,
        axes_dims_rope=(16, 24, 24),
    )
    return _reseed(model, seed)


def tiny_flux_vae(seed: int = 0):
    """``AutoencoderKL`` as Flux's: 16 latent channels, factor 8 (four levels), no quant convs, a shift factor."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    model = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        latent_channels=LATENT_CHANNELS,
        norm_num_groups=8,
        sample_size=DEFAULT_SIZE,
        scaling_factor=0.3611,
        shift_factor=0.1159,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    return _reseed(model, seed)


def build_tiny_flux(save_dir: str, seed: int = 0) -> None:
    """Build the tiny Flux pipeline and ``save_pretrained`` it to ``save_dir`` (load it with ``from_pretrained``)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    with tempfile.TemporaryDirectory() as source:
        clip_tokenizer = tiny_clip_tokenizer(source)
    clip = tiny_clip_text_encoder(
        len(clip_tokenizer),
        clip_tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        clip_tokenizer.bos_token_id,
        seed + 2,
        width=CLIP_DIM,
    )
    t5_tokenizer = t5_style_tokenizer()
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(
            shift=3.0,
            use_dynamic_shifting=True,
            base_shift=0.5,
            max_shift=1.15,
            base_image_seq_len=64,  # the default size's tokens .. 512 px's, as Flux.1's 256 (512 px) .. 4096 (1024 px)
            max_image_seq_len=1024,
        ),
        vae=tiny_flux_vae(seed + 1),
        text_encoder=clip,
        tokenizer=clip_tokenizer,
        text_encoder_2=tiny_t5_encoder(len(t5_tokenizer), seed + 3),
        tokenizer_2=t5_tokenizer,
        transformer=tiny_flux_transformer(seed),
    )
    pipe.save_pretrained(save_dir)
