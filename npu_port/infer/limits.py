"""What one model accepts, and what one request may cost: the single definition ``npu-port infer`` and the demo share.

A request is bounded before any work starts: steps, height and width (a multiple of the VAE's factor, at most the
model's largest side), the class id of a class-conditional model, the seed, the guidance scale. The built-in tiny
models get limits that keep one request to seconds on a CPU (their attention grows with the fourth power of the
side: 512 px would ask for a 32 GiB score matrix); other models get the general bounds, narrowed by what their
config fixes (a DiT's one image size, its number of classes). The limits of a built-in model or a local directory
are known before the model is loaded — from the table below or from the directory's config JSON files, never its
weights — so bad input is refused before the (possibly long) load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, Optional

from ..errors import InferenceError

#: General bounds for a model npu-port knows nothing special about (local directories and hub ids).
MAX_STEPS = 200
MAX_SIDE = 2048
#: Seeds are the CPU generator's: ``torch.Generator.manual_seed`` takes 0 .. 2**63 - 1 (``--seed`` and the demo).
MAX_SEED = 2**63 - 1

TEXT_TO_IMAGE = "text-to-image"
CLASS_CONDITIONAL = "class-conditional"


@dataclass(frozen=True)
class ModelLimits:
    """The bounds of one model. ``native_size``: the one side a class-conditional DiT makes (else None);
    ``classes``: how many class ids it takes (else None); ``factor``: sizes are multiples of it (the VAE's)."""

    kind: str
    factor: int
    max_side: int = MAX_SIDE
    max_steps: int = MAX_STEPS
    native_size: Optional[int] = None
    classes: Optional[int] = None
    basis: str = "general bounds"  # why these limits: shown in messages and the demo's header

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
#: at 256 px, and cannot run 512 px at all; the tiny DiT makes 16 px images, 200 steps in 0.2 s.
BUILTIN_LIMITS: Dict[str, ModelLimits] = {
    "tiny": ModelLimits(TEXT_TO_IMAGE, factor=2, max_side=128, max_steps=50, basis="built-in tiny model"),
    "tiny-dit": ModelLimits(
        CLASS_CONDITIONAL, factor=2, max_steps=200, native_size=16, classes=1000, basis="built-in tiny-dit model"
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


def pipeline_kind(class_name: str, *, has_text_encoder: bool, has_transformer: bool) -> str:
    """Text-to-image (it has a text encoder) or class-conditional (a transformer and no text encoder); npu-port
    infer runs those two kinds and refuses any other pipeline with one line."""
    if has_text_encoder:
        return TEXT_TO_IMAGE
    if has_transformer:
        return CLASS_CONDITIONAL
    raise InferenceError(
        f"{class_name} is neither a text-to-image pipeline (with a text encoder) nor a class-conditional DiT; "
        "npu-port infer runs those two kinds"
    )


def limits_from_configs(kind: str, vae: Dict[str, Any], transformer: Optional[Dict[str, Any]]) -> ModelLimits:
    """General bounds narrowed by a pipeline's configs (``vae`` and ``transformer`` as config dicts)."""
    blocks = vae.get("block_out_channels") or [0] * 4
    factor = 2 ** (len(blocks) - 1)
    if kind != CLASS_CONDITIONAL or transformer is None:
        return ModelLimits(kind, factor=factor)
    sample = _sample(transformer.get("sample_size"))
    classes = transformer.get("num_embeds_ada_norm")
    return ModelLimits(
        kind,
        factor=factor,
        native_size=sample * factor if sample else None,
        classes=int(classes) if isinstance(classes, int) and classes > 0 else None,
    )


def _present(entry: Any) -> bool:
    """A component of ``model_index.json``: ``["library", "Class"]``, or ``[null, null]`` when left out."""
    return isinstance(entry, (list, tuple)) and any(part is not None for part in entry)


def directory_limits(directory: str) -> ModelLimits:
    """The kind and limits of a saved pipeline directory, from its config JSON files (no weights are read)."""
    root = Path(directory)
    index = _read_config(root / "model_index.json")
    kind = pipeline_kind(
        str(index.get("_class_name", "this pipeline")),
        has_text_encoder=_present(index.get("text_encoder")),
        has_transformer=_present(index.get("transformer")),
    )
    transformer = _read_config(root / "transformer" / "config.json") if kind == CLASS_CONDITIONAL else None
    return limits_from_configs(kind, _read_config(root / "vae" / "config.json"), transformer)
