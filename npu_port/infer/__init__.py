"""Running a diffusers pipeline on this machine's device with an attention strategy, measured and compared.

Shared by ``npu-port infer`` (``scripts/inference_npu.py``) and the Gradio demo: :mod:`.models` loads a pipeline
(the tiny built-in ones, a local directory or a hub id), :mod:`.run` generates one image (or video) with per-step
timings and peak memory, :mod:`.compare` runs the same seed under several strategies and measures how far each image
is from the first. :mod:`.limits` bounds what a request may ask of a model (one definition for the script and the
demo), :mod:`.deadline` bounds how long it may run, :mod:`.paths` and :mod:`.strategies` check outputs and strategy
names before anything is loaded, and :mod:`.saving` writes an image and its report as one consistent pair.
"""

from .compare import Comparison, compare_strategies
from .deadline import Deadline, RequestTimeout
from .limits import MAX_SEED, ModelLimits
from .models import TINY_MODELS, LoadedPipeline, load_pipeline
from .run import GenerationRequest, GenerationResult, generate

__all__ = [
    "MAX_SEED",
    "TINY_MODELS",
    "Comparison",
    "Deadline",
    "ModelLimits",
    "RequestTimeout",
    "GenerationRequest",
    "GenerationResult",
    "LoadedPipeline",
    "compare_strategies",
    "generate",
    "load_pipeline",
]
