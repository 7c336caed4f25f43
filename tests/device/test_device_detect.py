"""Detection is honest (a broken torch_npu counts as absent, with its reason) and the device-generic helpers answer
for the CPU the way CUDA code expects."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from npu_port import _optional
from npu_port.device import (
    DEVICE_TYPES,
    autocast_device_type,
    autocast_dtype,
    backend_status,
    backends,
    device_count,
    empty_cache,
    get_device,
    manual_seed,
    max_memory_allocated,
    mem_get_info,
    memory_allocated,
    reset_peak_memory_stats,
    synchronize,
)
from npu_port.device.memory import host_memory_bytes
from npu_port.errors import DeviceError

REPO = Path(__file__).resolve().parents[2]
VALID = "valid devices: auto, npu, cuda, xpu, mps, cpu"


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("NPU_PORT_DEVICE", raising=False)


@pytest.fixture
def broken_torch_npu(tmp_path, monkeypatch):
    """A torch_npu that is installed but fails to import the way the real wheel does without CANN."""
    package = tmp_path / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text(
        'raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    _optional.forget("torch_npu")
    yield
    _optional.forget("torch_npu")


def test_this_cpu_machine_runs_on_cpu_and_says_why_not_elsewhere(no_env, no_torch_npu):
    assert get_device() == torch.device("cpu")
    statuses = backends()
    assert [status.type for status in statuses] == list(DEVICE_TYPES)
    assert statuses[-1].available and statuses[-1].count == 1
    npu = backend_status("npu")
    assert (npu.available, npu.count, npu.reason.code) == (False, 0, "package-missing")
    if torch.version.cuda is None:
        assert backend_status("cuda").reason == f"this torch {torch.__version__} has no CUDA support"


def test_a_broken_torch_npu_counts_as_absent_and_keeps_its_reason(no_env, broken_torch_npu):
    npu = backend_status("npu")
    assert not npu.available and npu.reason.code == "package-broken"
    assert (
        "torch_npu is installed but cannot be imported (ImportError: libhccl.so: cannot open shared object"
        in npu.reason
    )
    assert get_device() == torch.device("cpu")
    with pytest.raises(DeviceError) as info:
        get_device("npu")
    assert str(info.value).startswith("device 'npu' (argument) is not usable here: torch_npu is installed but cannot")
    assert str(info.value).endswith("; usable: cpu")


def test_environment_variable_and_argument(monkeypatch):
    monkeypatch.setenv("NPU_PORT_DEVICE", "cpu")
    assert get_device() == torch.device("cpu")
    monkeypatch.setenv("NPU_PORT_DEVICE", " AUTO ")
    assert get_device() == torch.device("cpu")
    monkeypatch.setenv("NPU_PORT_DEVICE", "tpu")
    assert get_device("cpu") == torch.device("cpu")  # an argument wins over the variable
    assert get_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(DeviceError, match=re.escape(f"unknown device 'tpu' ($NPU_PORT_DEVICE); {VALID}")):
        get_device()


@pytest.mark.parametrize(
    "text, message",
    [
        ("gpu", f"unknown device 'gpu' (argument); {VALID}"),
        ("cpu:x", "bad device 'cpu:x' (argument); write a type with an optional index, e.g. npu:0 or cpu"),
        ("auto:1", "bad device 'auto:1' (argument); write a type with an optional index, e.g. npu:0 or cpu"),
    ],
)
def test_bad_devices_are_named_with_the_valid_choices(no_env, text, message):
    with pytest.raises(DeviceError) as info:
        get_device(text)
    assert str(info.value) == message


def test_an_unknown_backend_type_is_refused():
    with pytest.raises(
        DeviceError, match=re.escape("unknown device type 'tpu'; valid types: npu, cuda, xpu, mps, cpu")
    ):
        backend_status("tpu")


@pytest.mark.e2e
@pytest.mark.slow
def test_with_an_npu_present_it_is_preferred_and_can_be_overridden():
    """In a child process (the renaming of torch's PrivateUse1 backend to "npu" cannot be undone): the torch_npu
    recorder stands in for a machine with one NPU."""
    script = textwrap.dedent(
        """
        import os, sys, torch
        sys.path.insert(0, sys.argv[1])
        from tests.fakes import torch_npu_recorder
        fake = torch_npu_recorder.build_module()
        sys.modules["torch_npu"] = fake
        torch.npu = fake.npu
        torch.utils.rename_privateuse1_backend("npu")
        import npu_port
        from npu_port.errors import DeviceError
        from npu_port.device.redirect import redirect_cuda
        print(npu_port.get_device(), npu_port.distributed.default_backend())
        os.environ["NPU_PORT_DEVICE"] = "cpu"
        print(npu_port.get_device())
        try:
            npu_port.get_device("npu:3")
        except DeviceError as exc:
            print(exc)
        with redirect_cuda("npu") as redirect:
            print(torch.cuda.device_count(), torch.cuda.is_available(), redirect.target)
        """
    )
    env = {key: value for key, value in os.environ.items() if key != "NPU_PORT_DEVICE"}
    result = subprocess.run(
        [sys.executable, "-c", script, str(REPO)], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "npu:0 hccl",
        "cpu",
        "device 'npu:3' (argument) does not exist: this machine has 1 npu device(s)",
        "1 False npu:0",
    ]


def test_helpers_answer_for_the_cpu(no_env):
    synchronize()
    empty_cache()
    reset_peak_memory_stats()
    assert memory_allocated() == max_memory_allocated("cpu") == 0
    free, total = mem_get_info()
    assert 0 < free <= total == host_memory_bytes()[1]
    assert device_count() == device_count("cpu") == 1
    assert autocast_device_type() == "cpu"
    assert autocast_dtype() == torch.bfloat16
    assert autocast_dtype("cuda") == autocast_dtype("npu:1") == torch.float16  # a lookup: no NPU needed
    with pytest.raises(DeviceError, match=re.escape("device 'npu' (argument) is not usable here: ")):
        memory_allocated("npu")
    manual_seed(5)
    first = torch.randn(3)
    torch.manual_seed(5)
    assert torch.equal(first, torch.randn(3))


def test_helpers_default_to_the_current_device_as_torch_cuda_does(no_env, monkeypatch):
    """``torch.cuda.synchronize()`` means the current device (``set_device(rank)``), not device 0: so does
    ``npu_port.device.synchronize()`` — what ``npu-port fix`` rewrites the former to."""
    from npu_port.device import helpers

    monkeypatch.setattr(
        helpers, "get_device", lambda device=None: torch.device("cuda", 0) if device is None else torch.device(device)
    )
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert helpers._device(None) == torch.device("cuda", 3)
    assert helpers._device("cuda:1") == torch.device("cuda", 1)  # a named device stays itself
    monkeypatch.setenv("NPU_PORT_DEVICE", "cuda:0")
    assert helpers._device(None) == torch.device("cuda", 0)  # the environment names one: it wins
