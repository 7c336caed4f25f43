"""Shared by the infer tests: one npu-port cache per test module, so that each built-in tiny model is built once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def _module_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("npu-port-models")


@pytest.fixture
def model_cache(_module_cache, monkeypatch):
    """One npu-port cache for the module (over the top conftest's per-test one), so the tiny models are built once."""
    monkeypatch.setenv("NPU_PORT_CACHE_DIR", str(_module_cache))
    return _module_cache
