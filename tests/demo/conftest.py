"""The tiny models the demo's tests share (built once per session, in one npu-port cache that the demo servers the
tests start use too)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from npu_port.infer import load_pipeline


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    """One npu-port cache for the tests' process and the demo servers, so the tiny models build once."""
    return tmp_path_factory.mktemp("demo-models")


def _load(model: str, models_dir: Path):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NPU_PORT_CACHE_DIR", str(models_dir))
        return load_pipeline(model, torch.device("cpu"), torch.float32, progress_bar=False)


@pytest.fixture(scope="session")
def tiny(models_dir):
    return _load("tiny", models_dir)


@pytest.fixture(scope="session")
def tiny_dit(models_dir):
    return _load("tiny-dit", models_dir)
