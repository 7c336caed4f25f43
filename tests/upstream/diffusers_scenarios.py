"""What the diffusers removal tests run: the built-in tiny pipelines (built once per module into a temporary cache),
run on diffusers' own path with no strategy, and their images as 8-bit pixels (what a saved PNG holds)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch


def load_tiny(name: str, tmp_path_factory: Any) -> Any:
    """The built-in pipeline ``name`` on the CPU in float32, built into a fresh cache folder."""
    from npu_port.infer.models import load_pipeline

    saved = os.environ.get("NPU_PORT_CACHE_DIR")
    os.environ["NPU_PORT_CACHE_DIR"] = str(tmp_path_factory.mktemp("npu-port-models"))
    try:
        return load_pipeline(name, torch.device("cpu"), torch.float32, progress_bar=False)
    finally:
        if saved is None:
            os.environ.pop("NPU_PORT_CACHE_DIR", None)
        else:
            os.environ["NPU_PORT_CACHE_DIR"] = saved


def pixels(image: Any) -> np.ndarray:
    return (np.clip(np.asarray(image), 0.0, 1.0) * 255).round().astype(np.uint8)


def run_plain(loaded: Any, steps: int = 2, seed: int = 0) -> np.ndarray:
    """The pipeline called as a user calls it (no strategy on it): whatever is process-wide applies."""
    from npu_port.infer.run import GenerationRequest, call_arguments

    request = GenerationRequest(steps=steps, seed=seed)
    with torch.no_grad():
        output = loaded.pipe(**call_arguments(loaded, request, torch.Generator("cpu").manual_seed(seed)))
    return pixels(output.images[0])
