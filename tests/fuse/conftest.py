"""Set-up for the fused-op tests: the torch_npu emulator (with its fused DiT ops) and the MindIE-SD fake, the device
rule widened to CPU tensors, and a check after every test that no fuse patch was left behind."""

from __future__ import annotations

import sys

import pytest

from npu_port import _optional, _patching
from npu_port.fuse import backend
from npu_port.fuse.check import KEY_PREFIX

from ..emulators import torch_npu_emulator
from ..fakes import mindiesd_fake


def fuse_patches():
    return _patching.active(lambda key: isinstance(key, str) and key.startswith(KEY_PREFIX))


@pytest.fixture(autouse=True)
def no_fuse_patch_left_behind():
    assert fuse_patches() == []
    yield
    leftover = fuse_patches()
    for patch in leftover:  # clean up, so one failure does not cascade
        while patch.users > 0:
            _patching.release(patch)
    assert leftover == [], "a test left fused-op patches installed"


@pytest.fixture
def npu(monkeypatch):
    """``torch_npu`` = the emulator; the fused ops take CPU tensors meanwhile."""
    module = torch_npu_emulator.install(monkeypatch)
    monkeypatch.setattr(backend, "DEVICE_TYPES", ("npu", "cpu"))
    return module


@pytest.fixture
def no_torch_npu(monkeypatch):
    """This machine as it is: no torch_npu (and nothing cached about it)."""
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    _optional.forget("torch_npu")
    yield
    _optional.forget("torch_npu")


@pytest.fixture
def mindiesd(monkeypatch):
    """``mindiesd`` = the fake, already imported (as after an early ``import mindiesd``)."""
    module = mindiesd_fake.build_module()
    monkeypatch.setitem(sys.modules, "mindiesd", module)
    monkeypatch.setattr(backend, "DEVICE_TYPES", ("npu", "cpu"))
    return module
