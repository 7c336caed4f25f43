"""Shared test set-up: hypothesis profiles, stand-ins for packages this machine does not have, and the library
version markers of the CI lanes.

The stand-ins (the torch_npu emulator, the xformers and flash_attn fakes) follow their packages' documented
contracts and say so; installing one also lets the matching kernel accept CPU tensors, since there is no NPU or GPU
here. Each is a context manager (usable inside hypothesis tests) and a fixture.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from packaging.version import Version

from npu_port import _optional
from npu_port.attn.kernels.flash_attn import FlashAttnKernel
from npu_port.attn.kernels.npu_fused_infer import NpuFusedInferKernel
from npu_port.attn.kernels.npu_fusion import NpuFusionKernel
from npu_port.attn.kernels.xformers import XformersKernel

from .emulators import torch_npu_emulator
from .fakes import flash_attn_fake, xformers_fake
from .versions import VERSIONED, installed_version


def pytest_configure(config):
    """Stop at once when this checkout is not what is imported (see :mod:`tests.checkout`)."""
    import npu_port
    from npu_port.strategy.loader import builtin_dirs

    from .checkout import ROOT, checkout_problems, guard_message

    problems = checkout_problems(ROOT, Path(npu_port.__file__).parent, builtin_dirs()[0])
    if problems:
        raise pytest.UsageError(guard_message(ROOT, problems))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:  # pytest-xdist: share the cores between the workers instead of oversubscribing them
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_unconfigure(config):
    """auto's line at exit would summarise the last test only, after pytest's own summary: the tests that check the
    line run a program of their own (tests/strategy/test_auto_quiet.py)."""
    from npu_port.strategy.summary import SUMMARY

    SUMMARY.claim()


settings.register_profile("dev", deadline=None, print_blob=True)
# CI explores the same examples every run (no flaky reds), and a failure prints the blob to reproduce it.
settings.register_profile("ci", deadline=None, print_blob=True, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@contextlib.contextmanager
def _installed(modules: dict, kernel_classes):
    saved_modules = {name: sys.modules.get(name) for name in modules}
    saved_devices = {cls: cls.__dict__.get("device_types") for cls in kernel_classes}
    sys.modules.update(modules)
    for cls in kernel_classes:
        cls.device_types = tuple(cls.device_types or ()) + ("cpu",)
    try:
        yield
    finally:
        for name, module in saved_modules.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        for cls, devices in saved_devices.items():
            cls.device_types = devices


@contextlib.contextmanager
def emulated_torch_npu():
    """``torch_npu`` = the emulator of the documented ops; the NPU kernels accept CPU tensors meanwhile."""
    module = torch_npu_emulator.build_module()
    with _installed({"torch_npu": module}, (NpuFusionKernel, NpuFusedInferKernel)):
        yield module


@contextlib.contextmanager
def fake_xformers():
    package, ops = xformers_fake.build_modules()
    with _installed({"xformers": package, "xformers.ops": ops}, (XformersKernel,)):
        yield ops


@contextlib.contextmanager
def fake_flash_attn():
    module = flash_attn_fake.build_module()
    with _installed({"flash_attn": module}, (FlashAttnKernel,)):
        yield module


@contextlib.contextmanager
def all_stand_ins():
    with emulated_torch_npu(), fake_xformers(), fake_flash_attn():
        yield


@pytest.fixture
def npu_emulator():
    with emulated_torch_npu() as module:
        yield module


@pytest.fixture
def xformers_stand_in():
    with fake_xformers() as ops:
        yield ops


@pytest.fixture
def flash_attn_stand_in():
    with fake_flash_attn() as module:
        yield module


@pytest.fixture(autouse=True)
def _isolated_strategy_state(tmp_path_factory, monkeypatch):
    """Every test gets its own auto cache directory and must leave no strategy applied process-wide."""
    monkeypatch.setenv("NPU_PORT_CACHE_DIR", str(tmp_path_factory.mktemp("npu-port-cache")))
    monkeypatch.delenv("NPU_PORT_STRATEGY_PATH", raising=False)
    from npu_port.strategy.summary import SUMMARY

    SUMMARY.reset()  # auto's line at exit summarises one test, not the picks of every test in this process
    yield
    from npu_port.strategy.process import STATE

    leaked = list(STATE.active)
    for handle in leaked:
        handle.restore()
    assert not leaked, f"test left strategies applied process-wide: {leaked}"


@pytest.fixture
def no_torch_npu(monkeypatch):
    """Make torch_npu absent even on a machine that has it (a None entry blocks the import)."""
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    _optional.forget("torch_npu")
    yield
    _optional.forget("torch_npu")


# ---- the version lanes -------------------------------------------------------------------------------------------
#
# .ci/run's oldest lanes run parts of the suite again under the diffusers and transformers that old projects pin
# (diffusers 0.11.1 with transformers 4.25.1, 0.14.0 with 4.30.2) and under the oldest releases on which the modern
# integration paths are claimed (npu_port/support.py). A test that needs something an older release does not have
# says so with @pytest.mark.diffusers_min("0.15") / @pytest.mark.transformers_min("4.52.1"); a test about the old
# versions' own layout with @pytest.mark.diffusers_below("0.15") / transformers_below(...). Such a test is deselected
# (not skipped) under a version outside its range: the run reports it as deselected, and nothing stands in for it.


def _in_version_range(item: pytest.Item, installed: "dict[str, Version | None]") -> bool:
    for distribution, version in installed.items():
        for marker in item.iter_markers(f"{distribution}_min"):
            if version is None or version < Version(marker.args[0]):
                return False
        for marker in item.iter_markers(f"{distribution}_below"):
            if version is None or version >= Version(marker.args[0]):
                return False
    return True


@pytest.hookimpl(tryfirst=True)  # before -m selects: an e2e test is slow, so the fast tier never runs one
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    for item in items:
        if item.get_closest_marker("e2e") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    installed = {distribution: installed_version(distribution) for distribution in VERSIONED}
    kept, deselected = [], []
    for item in items:
        (kept if _in_version_range(item, installed) else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


#: diffusers' xformers switches that npu-port's hook replaces on ModelMixin and DiffusionPipeline.
HOOKED = (
    "enable_xformers_memory_efficient_attention",
    "disable_xformers_memory_efficient_attention",
    "set_use_memory_efficient_attention_xformers",
)


@pytest.fixture
def xformers_hook():
    """npu-port's hook on diffusers' xformers switches (any diffusers version), checked to restore the very methods."""
    from npu_port.integrations.diffusers import classes
    from npu_port.integrations.legacy_attention import hook_enable_xformers

    kinds = [classes.load().DiffusionPipeline, __import__("diffusers").ModelMixin]
    originals = {(cls, name): vars(cls)[name] for cls in kinds for name in HOOKED}
    hook = hook_enable_xformers()
    try:
        yield hook
    finally:
        hook.restore()
    assert all(vars(cls)[name] is original for (cls, name), original in originals.items())
