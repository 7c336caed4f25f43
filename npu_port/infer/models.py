"""Loading the pipeline to run: a built-in tiny one, a local directory, or a hub id — or one clear error line.

The tiny pipelines are built from configs the first time, saved under the npu-port cache and then loaded with
``from_pretrained`` like any downloaded model, so the main job exercises the normal loading path on a fresh machine
with no network. Their weights are random. A hub id is loaded with the hub's offline mode respected
(``HF_HUB_OFFLINE=1`` means local files only). :func:`describe_model` says what a model is and what it accepts
before anything is loaded (for a hub id: nothing yet), so that bad input is refused first.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Union

import torch

from ..errors import InferenceError
from .limits import BUILTIN_LIMITS, ModelLimits, directory_limits, pipeline_limits
from .paths import CacheLocation


def _build_text2image(directory: str) -> None:
    from ..integrations.diffusers.tiny_text2image import build_tiny_text2image

    build_tiny_text2image(directory)


def _build_dit(directory: str) -> None:
    from ..integrations.diffusers.tiny import tiny_dit_pipeline

    tiny_dit_pipeline(save_dir=directory)


def _build_flux(directory: str) -> None:
    from ..integrations.diffusers.tiny_flux import build_tiny_flux

    build_tiny_flux(directory)


def _build_wan(directory: str) -> None:
    from ..integrations.diffusers.tiny_wan import build_tiny_wan

    build_tiny_wan(directory)


#: Built-in models: name -> (builder, one-line description). Bump the version suffix when a builder changes.
TINY_MODELS: Dict[str, tuple] = {
    "tiny": (_build_text2image, "tiny Stable-Diffusion-style text-to-image pipeline (CLIP text encoder, UNet, VAE)"),
    "tiny-dit": (_build_dit, "tiny class-conditional DiT pipeline (1000 classes, 16x16 images)"),
    "tiny-flux": (_build_flux, "tiny Flux text-to-image pipeline (4 heads of 64, 128x128 images, true CFG)"),
    "tiny-wan": (_build_wan, "tiny Wan text-to-video pipeline (4 heads of 64, 5 frames of 64x64)"),
}
_TINY_VERSION = "v2"


#: ``--dtype`` choices of the script and the demo; "auto" is float32 on a CPU (where half precision is slow or
#: emulated) and float16 on an accelerator.
DTYPES = ("auto", "float32", "float16", "bfloat16")


def resolve_dtype(text: str, device: Union[torch.device, str]) -> torch.dtype:
    """``--dtype`` for ``device`` (a device, or a device type such as ``"npu"``: a plan resolves the dtype of a
    device this machine may not have)."""
    if text not in DTYPES:
        raise InferenceError(f"unknown dtype {text!r}; valid dtypes: {', '.join(DTYPES)}")
    if text == "auto":
        device_type = device if isinstance(device, str) else device.type
        return torch.float32 if device_type == "cpu" else torch.float16
    return getattr(torch, text)


@dataclass
class LoadedPipeline:
    """A pipeline on its device, with what the report needs to say about it."""

    pipe: Any
    model: str  # as requested
    source: str  # the directory it was loaded from, or the hub id
    kind: str  # "text-to-image", "text-to-video" or "class-conditional"
    device: torch.device
    dtype: torch.dtype
    random_weights: bool
    limits: ModelLimits  # what a request may ask of it (npu_port.infer.limits)
    text_encoder_device: Optional[torch.device] = None  # set: prompts are encoded there, embeddings moved
    disk_cache: bool = True  # False: the cache folder cannot be written; auto keeps its decisions in memory only

    @property
    def vae_scale_factor(self) -> int:
        """How many pixels one latent covers per side (from the VAE's config; not every pipeline stores it)."""
        return self.limits.factor

    @property
    def native_size(self) -> Optional[int]:
        """The one image size a class-conditional DiT produces (its config fixes it), else None."""
        return self.limits.native_size


@dataclass(frozen=True)
class ModelPlan:
    """What ``--model`` names, known before loading: where it comes from and, unless it is a hub id, its kind and
    limits (read from the built-in table or the directory's config JSON files)."""

    model: str
    source: str  # a directory, or the hub id
    builtin: bool
    limits: Optional[ModelLimits]  # None for a hub id: known only once loaded

    @property
    def kind(self) -> Optional[str]:
        return self.limits.kind if self.limits else None


def describe_model(model: str) -> ModelPlan:
    """``model`` checked and described without loading it (a missing directory or one that is not a pipeline is
    refused here)."""
    if model in TINY_MODELS:
        return ModelPlan(model, model, True, BUILTIN_LIMITS[model])
    source = os.path.expanduser(model)
    if not os.path.exists(source):
        if _looks_like_path(model):
            raise InferenceError(
                f"model directory {model!r} does not exist; give a diffusers pipeline directory (with "
                f"model_index.json), a hub id, or one of the built-in models: {', '.join(TINY_MODELS)}"
            )
        return ModelPlan(model, source, False, None)
    if not os.path.isfile(os.path.join(source, "model_index.json")):
        raise InferenceError(
            f"{model!r} is not a diffusers pipeline directory (no model_index.json in it); save one with "
            "pipe.save_pretrained(DIR)"
        )
    return ModelPlan(model, source, False, directory_limits(source))


def tiny_model_dir(
    name: str, on_build: Optional[Callable[[str], None]] = None, cache: Optional[CacheLocation] = None
) -> Path:
    """Where the built tiny model lives (built on first use; a partial build is never left behind). ``cache``: the
    cache location checked by :func:`~npu_port.infer.paths.cache_location` (default: the npu-port cache)."""
    builder, _ = TINY_MODELS[name]
    target = (cache or CacheLocation.default()).models / f"{name}-{_TINY_VERSION}"
    if (target / "model_index.json").is_file():
        return target
    if on_build is not None:
        on_build(f"building the {name} model (random weights) in {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        builder(str(staging))
        try:
            staging.rename(target)
        except OSError:  # another process built it meanwhile
            if not (target / "model_index.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or os.sep in model.replace("/", "", 1) or model.endswith(os.sep)


def _from_pretrained(source: str, model: str, local_files_only: bool, dtype: torch.dtype) -> Any:
    from diffusers import DiffusionPipeline

    try:
        with warnings.catch_warnings():  # diffusers >= 0.42 renamed torch_dtype to dtype; older ones know only this
            warnings.filterwarnings("ignore", message="`torch_dtype` is deprecated", category=FutureWarning)
            return DiffusionPipeline.from_pretrained(source, local_files_only=local_files_only, torch_dtype=dtype)
    except Exception as exc:  # any loader failure becomes one line naming the model and the way out
        first_line = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        if os.path.isdir(source):
            raise InferenceError(f"cannot load the pipeline in {source!r}: {first_line}") from None
        mode = "offline (HF_HUB_OFFLINE=1): only locally cached files are used" if local_files_only else "online"
        raise InferenceError(
            f"model {model!r} is not a local directory and could not be loaded from the hub ({mode}): {first_line}. "
            f"Give a diffusers pipeline directory, or one of the built-in models: {', '.join(TINY_MODELS)}"
        ) from None


def _limits(pipe: Any, model: str) -> ModelLimits:
    present = {name: component is not None for name, component in pipe.components.items()}
    transformer = getattr(pipe, "transformer", None)
    limits = pipeline_limits(
        type(pipe).__name__,
        present,
        dict(pipe.vae.config),
        dict(transformer.config) if transformer is not None else None,
    )
    return BUILTIN_LIMITS.get(model, limits)


def load_pipeline(
    model: str,
    device: torch.device,
    dtype: torch.dtype,
    *,
    text_encoder_device: Optional[torch.device] = None,
    progress_bar: bool = True,
    on_build: Optional[Callable[[str], None]] = None,
    cache: Optional[CacheLocation] = None,
) -> LoadedPipeline:
    """Load ``model`` (a built-in name, a directory or a hub id) onto ``device`` in ``dtype``.

    ``text_encoder_device``: keep the text encoder there (in float32) instead, to save device memory; prompts are
    then encoded there and only the embeddings move. ``on_build`` is told when a tiny model is built the first time.
    ``cache``: where built models and auto's decisions may be kept (:func:`~npu_port.infer.paths.cache_location`;
    default the npu-port cache); with no writable cache a tiny model is built in a temporary folder.
    """
    plan = describe_model(model)
    cache = cache or CacheLocation.default()
    if plan.builtin:
        source = str(tiny_model_dir(model, on_build, cache))
        pipe = _from_pretrained(source, model, local_files_only=True, dtype=dtype)
    else:
        source = plan.source
        pipe = _from_pretrained(source, model, _offline() or os.path.isdir(source), dtype)
    limits = _limits(pipe, model)
    pipe.to(device)
    if text_encoder_device is not None:
        limits.check_text_encoder_device(model)
        pipe.text_encoder.to(device=text_encoder_device, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=not progress_bar)
    return LoadedPipeline(
        pipe,
        model,
        source,
        limits.kind,
        device,
        dtype,
        plan.builtin,
        limits,
        text_encoder_device,
        disk_cache=cache.root is not None,
    )
