"""What one model accepts, and what one request may cost: the single definition ``npu-port infer`` and the demo share.

A request is bounded before any work starts: steps, height and width (a multiple of the model's factor — the VAE's,
times what the transformer packs into one token — at most the model's largest side), the frames of a video model
(``4k + 1`` for a VAE that packs 4 frames after the first), the class id of a class-conditional model, the seed, the
guidance scale. The built-in tiny
models get limits that keep one request to seconds on a CPU (their attention grows with the fourth power of the
side: 512 px would ask for a 32 GiB score matrix); other models get the general bounds, narrowed by what their
config fixes (a DiT's one image size, its number of classes). The limits of a built-in model or a local directory
are known before the model is loaded — from the table below or from the directory's config JSON files, never its
weights — so bad input is refused before the (possibly long) load.
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ..errors import InferenceError

#: General bounds for a model npu-port knows nothing special about (local directories and hub ids).
MAX_STEPS = 200
MAX_SIDE = 2048
MAX_FRAMES = 257
#: Seeds are the CPU generator's: ``torch.Generator.manual_seed`` takes 0 .. 2**63 - 1 (``--seed`` and the demo).
MAX_SEED = 2**63 - 1

TEXT_TO_IMAGE = "text-to-image"
TEXT_TO_VIDEO = "text-to-video"
CLASS_CONDITIONAL = "class-conditional"


@dataclass(frozen=True)
class ModelLimits:
    """The bounds of one model. ``native_size``: the one side a class-conditional DiT makes (else None);
    ``classes``: how many class ids it takes (else None); ``factor``: sizes are multiples of it (the VAE's, times
    the transformer's packing or patch). A video model's frames are ``frame_factor * k + 1``, at most ``max_frames``.

    ``defaults``: pipeline call arguments used when the request leaves them out (``height``, ``width``,
    ``num_frames``) or does not set them at all (``max_sequence_length``) — a built-in model's own sizes, where the
    pipeline's defaults are a real model's (Flux: 1024 px and 512 text tokens). ``encoder_apart``: whether
    ``--text-encoder-device`` can encode its prompts apart (one text encoder, Stable Diffusion's ``encode_prompt``)."""

    kind: str
    factor: int
    max_side: int = MAX_SIDE
    max_steps: int = MAX_STEPS
    native_size: Optional[int] = None
    classes: Optional[int] = None
    basis: str = "general bounds"  # why these limits: shown in messages and the demo's header
    frame_factor: int = 1
    max_frames: int = MAX_FRAMES
    defaults: Tuple[Tuple[str, int], ...] = ()
    encoder_apart: bool = True

    def lowered(self, *, max_side: Optional[int] = None, max_steps: Optional[int] = None) -> "ModelLimits":
        """These limits, lowered by the demo's ``--max-side`` / ``--max-steps`` (which can never raise them)."""
        if max_side is not None and not self.factor <= max_side <= self.max_side:
            raise InferenceError(
                f"--max-side must be between {self.factor} and {self.max_side} for this model ({self.basis}), "
                f"got {max_side}"
            )
        if max_steps is not None and not 1 <= max_steps <= self.max_steps:
            raise InferenceError(
                f"--max-steps must be between 1 and {self.max_steps} for this model ({self.basis}), got {max_steps}"
            )
        return replace(
            self,
            max_side=self.max_side if max_side is None else max_side,
            max_steps=self.max_steps if max_steps is None else max_steps,
        )

    def check(self, request: Any) -> None:
        """Refuse what this model cannot (or may not) do, with the valid range, before any work starts."""
        check_seed(request.seed)
        check_guidance(request.guidance_scale)
        if not 1 <= request.steps <= self.max_steps:
            raise InferenceError(f"steps must be between 1 and {self.max_steps}, got {request.steps}")
        for name in ("height", "width"):
            value = getattr(request, name)
            if value is None:
                continue
            if self.native_size is not None and value != self.native_size:
                raise InferenceError(
                    f"{name} {value}: this class-conditional DiT makes {self.native_size}x{self.native_size} images "
                    "only (its transformer's sample size fixes it); leave --height/--width out"
                )
            if not self.factor <= value <= self.max_side or value % self.factor:
                raise InferenceError(
                    f"{name} must be a multiple of {self.factor} between {self.factor} and {self.max_side} for this "
                    f"model, got {value}"
                )
        if self.kind == CLASS_CONDITIONAL and self.classes and not 0 <= request.class_label < self.classes:
            raise InferenceError(
                f"class must be between 0 and {self.classes - 1} for this model, got {request.class_label}"
            )
        frames = getattr(request, "frames", None)
        if frames is None:
            return
        if self.kind in (TEXT_TO_IMAGE, CLASS_CONDITIONAL):
            raise InferenceError(f"--frames is for text-to-video models; this model is {self.kind} (one image)")
        if not 1 <= frames <= self.max_frames or (frames - 1) % self.frame_factor:
            form = f"{self.frame_factor}k+1 (1, {1 + self.frame_factor}, ...) " if self.frame_factor > 1 else ""
            raise InferenceError(f"frames must be {form}between 1 and {self.max_frames} for this model, got {frames}")

    def check_text_encoder_device(self, model: str) -> None:
        """Refuse ``--text-encoder-device`` for a model whose prompts cannot be encoded apart, saying why."""
        if self.kind == CLASS_CONDITIONAL:
            raise InferenceError(f"--text-encoder-device: {model!r} is class-conditional and has no text encoder")
        if not self.encoder_apart:
            raise InferenceError(
                f"--text-encoder-device: {model!r} is a {self.kind} pipeline whose prompts npu-port cannot encode "
                "apart (it supports pipelines with one text encoder and Stable Diffusion's encode_prompt); leave it "
                "out to keep the text encoder on the device"
            )

    @property
    def call_defaults(self) -> Dict[str, int]:
        return dict(self.defaults)


#: What is checked of a hub id before it is loaded: the general bounds, any size (its VAE's factor is not known yet).
UNKNOWN_MODEL = ModelLimits("unknown until loaded", factor=1)


def check_seed(seed: int) -> int:
    if not 0 <= seed <= MAX_SEED:
        raise InferenceError(f"seed must be between 0 and {MAX_SEED}, got {seed}")
    return seed


def check_guidance(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise InferenceError(f"guidance scale must be a finite number >= 0, got {value:g}")
    return value


def check_tolerance(value: float, label: str = "tolerance") -> float:
    """A comparison tolerance: finite and >= 0 (NaN would make every comparison pass)."""
    if not math.isfinite(value) or value < 0:
        raise InferenceError(f"{label} must be a finite number >= 0, got {value:g}")
    return value


#: The built-in models' limits (the tests check them against the built models' configs). Measured on a 2-thread
#: CPU: the tiny text-to-image model takes ~15 ms a step at 64 px, ~0.26 s at 128 px with the exact math kernel, 5 s
#: at 256 px, and cannot run 512 px at all; the tiny DiT makes 16 px images, 200 steps in 0.2 s. On one thread of
#: that CPU tiny-flux takes ~12 ms a step at 128 px and ~150 ms at 512 px (50 steps: 8 s); tiny-wan ~6 ms a step
#: for 5 frames of 64 px and ~60 ms for 33 frames of 128 px, plus 2 s to decode them (256 px would be 0.4 s a step
#: and 10 s to decode).
BUILTIN_LIMITS: Dict[str, ModelLimits] = {
    "tiny": ModelLimits(TEXT_TO_IMAGE, factor=2, max_side=128, max_steps=50, basis="built-in tiny model"),
    "tiny-dit": ModelLimits(
        CLASS_CONDITIONAL, factor=2, max_steps=200, native_size=16, classes=1000, basis="built-in tiny-dit model"
    ),
    # VAE factor 8, latents packed 2x2: sides are multiples of 16; 128 px = 64 image tokens, 32 text tokens
    "tiny-flux": ModelLimits(
        TEXT_TO_IMAGE,
        factor=16,
        max_side=512,
        max_steps=50,
        basis="built-in tiny-flux model",
        defaults=(("height", 128), ("width", 128), ("max_sequence_length", 32)),
        encoder_apart=False,
    ),
    # VAE 4x in time, 8x in space, patches of 2x2: 5 frames of 64x64 = 2 x 4 x 4 = 32 video tokens, 32 text tokens
    "tiny-wan": ModelLimits(
        TEXT_TO_VIDEO,
        factor=16,
        max_side=128,
        max_steps=50,
        basis="built-in tiny-wan model",
        frame_factor=4,
        max_frames=33,
        defaults=(("height", 64), ("width", 64), ("num_frames", 5), ("max_sequence_length", 32)),
        encoder_apart=False,
    ),
}


def _read_config(path: Path) -> Dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InferenceError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise InferenceError(f"{path} is not a JSON object")
    return data


def _sample(value: Any) -> Optional[int]:
    value = value[0] if isinstance(value, (list, tuple)) and value else value
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def pipeline_class(class_name: str) -> Optional[type]:
    """diffusers' pipeline class of that name (its module is imported; no weights), or None when diffusers has none
    (a custom pipeline) or is not installed."""
    try:
        import diffusers
    except ImportError:
        return None
    try:
        found = getattr(diffusers, class_name, None)
    except Exception:  # noqa: BLE001 - a lazy module whose import fails: treat as unknown
        return None
    return found if isinstance(found, type) else None


def _parameters(function: Any) -> Tuple[str, ...]:
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return ()


def is_video_pipeline(cls: Optional[type]) -> bool:
    """A pipeline whose call takes ``num_frames`` makes videos (Wan, HunyuanVideo, CogVideoX, LTX, Mochi, ...)."""
    return cls is not None and "num_frames" in _parameters(cls.__call__)


def packs_latents(cls: Optional[type]) -> bool:
    """Flux-style pipelines pack 2x2 latent patches into one token, so sides must be multiples of twice the VAE's
    factor (told by the diffusers adapter: :func:`npu_port.upstream.diffusers.pipelines.packs_latents`)."""
    from ..upstream.diffusers.pipelines import packs_latents as packs

    return packs(cls)


#: Stable Diffusion's ``encode_prompt`` arguments, which ``--text-encoder-device`` calls positionally.
_SD_ENCODE_PROMPT = ("prompt", "device", "num_images_per_prompt", "do_classifier_free_guidance", "negative_prompt")


def encodes_prompts_apart(cls: Optional[type], text_encoders: int) -> bool:
    """Whether npu-port can encode this pipeline's prompts on another device: one text encoder and Stable
    Diffusion's ``encode_prompt`` (SDXL, SD3 and Flux have two or three encoders and other signatures; video
    pipelines other signatures). An unknown class is given the benefit of the doubt (it was so before)."""
    if cls is None:
        return text_encoders <= 1
    return text_encoders <= 1 and _parameters(getattr(cls, "encode_prompt", None))[1:6] == _SD_ENCODE_PROMPT


def pipeline_kind(class_name: str, *, has_text_encoder: bool, has_transformer: bool, video: bool = False) -> str:
    """Text-to-image (it has a text encoder), text-to-video (a text encoder and ``num_frames``) or class-conditional
    (a transformer and no text encoder); npu-port infer runs those kinds and refuses any other pipeline with one
    line."""
    if has_text_encoder:
        return TEXT_TO_VIDEO if video else TEXT_TO_IMAGE
    if has_transformer:
        return CLASS_CONDITIONAL
    raise InferenceError(
        f"{class_name} is neither a text-to-image or text-to-video pipeline (with a text encoder) nor a "
        "class-conditional DiT; npu-port infer runs those kinds"
    )


def _spatial_patch(transformer: Optional[Dict[str, Any]]) -> int:
    """The transformer's patch side in latents: ``patch_size`` as an int, or (frames, height, width)'s height."""
    patch = (transformer or {}).get("patch_size")
    if isinstance(patch, (list, tuple)) and len(patch) == 3:
        patch = patch[1]
    return patch if isinstance(patch, int) and not isinstance(patch, bool) and patch > 0 else 1


def _vae_factor(vae: Dict[str, Any]) -> int:
    spatial = vae.get("scale_factor_spatial") or vae.get("spatial_compression_ratio")
    if isinstance(spatial, int) and spatial > 0:
        return spatial
    blocks = vae.get("block_out_channels") or [0] * 4
    return 2 ** (len(blocks) - 1)


def _frame_factor(vae: Dict[str, Any]) -> int:
    """How many frames a video VAE packs after the first (1: not known, any count)."""
    temporal = vae.get("scale_factor_temporal") or vae.get("temporal_compression_ratio")
    if isinstance(temporal, int) and temporal > 0:
        return temporal
    downsample = vae.get("temperal_downsample")  # sic: Wan's VAE
    if isinstance(downsample, list):
        return 2 ** sum(bool(step) for step in downsample)
    return 1


def limits_from_configs(
    kind: str,
    vae: Dict[str, Any],
    transformer: Optional[Dict[str, Any]],
    *,
    packing: int = 1,
    encoder_apart: bool = True,
) -> ModelLimits:
    """General bounds narrowed by a pipeline's configs (``vae`` and ``transformer`` as config dicts). ``packing``:
    latent patches the pipeline packs into one token per side (2 for Flux); a video transformer's own patch is read
    from its config."""
    factor = _vae_factor(vae) * packing
    if kind == TEXT_TO_VIDEO:
        return ModelLimits(
            kind,
            factor=factor * _spatial_patch(transformer),
            frame_factor=_frame_factor(vae),
            encoder_apart=encoder_apart,
        )
    if kind != CLASS_CONDITIONAL or transformer is None:
        return ModelLimits(kind, factor=factor, encoder_apart=encoder_apart)
    sample = _sample(transformer.get("sample_size"))
    classes = transformer.get("num_embeds_ada_norm")
    return ModelLimits(
        kind,
        factor=factor,
        native_size=sample * factor if sample else None,
        classes=int(classes) if isinstance(classes, int) and classes > 0 else None,
    )


def pipeline_limits(
    class_name: str,
    present: Dict[str, bool],
    vae: Dict[str, Any],
    transformer: Optional[Dict[str, Any]],
) -> ModelLimits:
    """The kind and limits of a pipeline from its class name, which components it has (``present``: component name
    -> whether it is there) and its VAE's and transformer's configs: one definition for a loaded pipeline and a
    saved directory."""
    cls = pipeline_class(class_name)
    kind = pipeline_kind(
        class_name,
        has_text_encoder=present.get("text_encoder", False),
        has_transformer=present.get("transformer", False),
        video=is_video_pipeline(cls),
    )
    encoders = sum(1 for name, there in present.items() if there and name.startswith("text_encoder"))
    return limits_from_configs(
        kind,
        vae,
        transformer,
        packing=2 if packs_latents(cls) else 1,
        encoder_apart=encodes_prompts_apart(cls, encoders),
    )


def _present(entry: Any) -> bool:
    """A component of ``model_index.json``: ``["library", "Class"]``, or ``[null, null]`` when left out."""
    return isinstance(entry, (list, tuple)) and any(part is not None for part in entry)


def directory_limits(directory: str) -> ModelLimits:
    """The kind and limits of a saved pipeline directory, from its config JSON files (no weights are read)."""
    root = Path(directory)
    index = _read_config(root / "model_index.json")
    present = {name: _present(entry) for name, entry in index.items() if not name.startswith("_")}
    transformer = _read_config(root / "transformer" / "config.json") if present.get("transformer") else None
    return pipeline_limits(
        str(index.get("_class_name", "this pipeline")), present, _read_config(root / "vae" / "config.json"), transformer
    )
