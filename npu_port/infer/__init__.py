"""Running a diffusers pipeline on this machine's device with an attention strategy, measured and compared.

Shared by ``npu-port infer`` (``scripts/inference_npu.py``) and the Gradio demo: :mod:`.models` loads a pipeline
(the tiny built-in ones, a local directory or a hub id), :mod:`.run` generates one image with per-step timings and
peak memory, :mod:`.compare` runs the same seed under several strategies and measures how far each image is from
the first.
"""

from .compare import Comparison, compare_strategies
from .models import TINY_MODELS, LoadedPipeline, load_pipeline
from .run import GenerationRequest, GenerationResult, generate

__all__ = [
    "TINY_MODELS",
    "Comparison",
    "GenerationRequest",
    "GenerationResult",
    "LoadedPipeline",
    "compare_strategies",
    "generate",
    "load_pipeline",
]
