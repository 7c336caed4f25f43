"""A profile written for one device (its ``device:`` key) is listed as unavailable where that device is not, with the
device layer's own reason — ``npu-port strategies`` and the demo's pickers both read it from ``strategy_entry``."""

from __future__ import annotations

import pytest

from npu_port.device import detect
from npu_port.device.detect import BackendStatus, device_requirement
from npu_port.reasons import Reason
from npu_port.strategy.registry import strategy_entry

MISSING = Reason("package-missing", "torch_npu is not installed; install it on an Ascend machine with CANN")


@pytest.fixture
def no_npu_but_a_gpu(monkeypatch):
    statuses = {
        "npu": BackendStatus("npu", False, 0, MISSING),
        "cuda": BackendStatus("cuda", True, 1),
        "cpu": BackendStatus("cpu", True, 1),
    }
    monkeypatch.setattr(detect, "backend_status", statuses.__getitem__)


def test_device_requirement_says_which_device_and_why_it_is_not_here(no_npu_but_a_gpu):
    needs = device_requirement("npu")
    assert needs == "needs an Ascend NPU: torch_npu is not installed; install it on an Ascend machine with CANN"
    assert needs.code == "package-missing"
    assert device_requirement("cuda") is None and device_requirement("cpu") is None and device_requirement(None) is None
    assert device_requirement("auto") is None  # a profile with `device: auto` takes the best device here


def test_a_profile_with_device_auto_is_listed_by_its_kernels(tmp_path, monkeypatch):
    (tmp_path / "anywhere.yaml").write_text("kind: profile\ndescription: the best device here\ndevice: auto\n"
                                            "kernel: math\n")  # fmt: skip
    monkeypatch.setenv("NPU_PORT_STRATEGY_PATH", str(tmp_path))
    entry = strategy_entry("anywhere")
    assert entry["device"] == "auto" and entry["available"] is True and entry["reasons"] == {}


def test_a_profile_for_a_missing_device_is_unavailable_with_the_device_reason_first(no_npu_but_a_gpu):
    ascend = strategy_entry("ascend-910b")
    assert ascend["available"] is False and ascend["device"] == "npu"
    assert list(ascend["reasons"])[0] == "device"
    assert ascend["reasons"]["device"] == [device_requirement("npu")]
    hopper = strategy_entry("hopper-safe")  # the device is here: its kernels decide
    assert hopper["available"] is True and hopper["device"] == "cuda" and "device" not in hopper["reasons"]
    safe = strategy_entry("cuda-safe-math")
    assert safe["device"] is None and safe["safe_math"] == {"fp32": True, "tf32": False} and safe["available"] is True
