"""``npu_port.device.autocast`` and ``grad_scaler``, what ``npu-port fix`` writes for CUDA autocast and GradScaler:
on CUDA the very call torch makes, elsewhere the detected device's, and on the torch versions and devices where torch's
own call would raise, what CUDA code does without CUDA (off, with a warning) instead of a crash."""

from __future__ import annotations

import sys
import types
import warnings

import pytest
import torch
from torch import nn

from npu_port.device import autocast, grad_scaler


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv("NPU_PORT_DEVICE", raising=False)


@pytest.fixture
def linear():
    torch.manual_seed(0)
    return nn.Linear(8, 4), torch.randn(3, 8)


def _state(context):
    """What a torch.autocast object will do: its device, dtype, enabled and cache flags."""
    return context.device, context.fast_dtype, context._enabled, context._cache_enabled


def test_autocast_runs_the_region_on_the_detected_device_in_cudas_dtype(linear):
    """No dtype means CUDA's (float16), not the CPU's own bfloat16: the region computes what the code was written to
    compute, as ``npu-port run`` makes ``torch.autocast("cuda")`` do."""
    model, x = linear
    with torch.autocast("cpu", dtype=torch.float16):
        expected = model(x)
    with autocast():
        default = model(x)
    with autocast(torch.bfloat16):
        bf16 = model(x)
    with autocast(dtype=torch.float16, enabled=False):
        off = model(x)
    assert default.dtype == torch.float16 and torch.equal(default, expected)
    assert bf16.dtype == torch.bfloat16 and off.dtype == torch.float32

    @autocast(dtype=torch.float16, cache_enabled=True)
    def forward(inputs):
        return model(inputs), torch.is_autocast_cache_enabled()

    decorated, cache = forward(x)
    assert torch.equal(decorated, expected) and cache is True
    with autocast(cache_enabled=False):
        assert torch.is_autocast_cache_enabled() is False


def test_autocast_follows_the_cuda_dtype_the_program_set(linear):
    model, x = linear
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    try:
        with autocast():
            assert model(x).dtype == torch.bfloat16
    finally:
        torch.set_autocast_dtype("cuda", torch.float16)


@pytest.mark.parametrize(
    "arguments",
    [{}, {"dtype": torch.bfloat16}, {"enabled": False}, {"cache_enabled": False, "dtype": torch.float16}],
)
def test_on_cuda_autocast_is_torch_autocast_for_cuda_with_the_same_arguments(arguments):
    """``device="cuda"`` stands for a CUDA machine: the object is ``torch.autocast("cuda", **arguments)``'s twin (here
    both are off with torch's warning: this machine has no CUDA)."""
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        ours, torchs = autocast(**arguments, device="cuda"), torch.autocast("cuda", **arguments)
    assert type(ours) is torch.autocast and _state(ours) == _state(torchs)


def test_torch_2_1s_cpu_autocast_takes_bfloat16_only_so_another_dtype_runs_off_with_a_warning(linear, monkeypatch):
    """torch 2.1's CPU autocast raises on entering with float16 ("Currently, AutocastCPU only support Bfloat16 as the
    autocast_cpu_dtype"): the region runs in float32 instead, as CUDA autocast does without CUDA."""
    model, x = linear
    monkeypatch.setattr(torch, "__version__", "2.1.2+cpu")
    with pytest.warns(UserWarning) as caught:
        context = autocast(dtype=torch.float16)
    assert [str(w.message) for w in caught] == [
        "npu-port: torch 2.1.2+cpu has no cpu autocast to torch.float16: the region runs without autocast (float32)"
    ]
    assert _state(context) == ("cpu", torch.bfloat16, False, torch.is_autocast_cache_enabled())
    with context:
        assert model(x).dtype == torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with autocast(torch.bfloat16):  # bfloat16 it has
            assert model(x).dtype == torch.bfloat16
        autocast(dtype=torch.float16, enabled=False)  # off anyway: nothing to say


def test_a_device_this_torch_has_no_autocast_for_runs_off_with_a_warning(monkeypatch):
    monkeypatch.setattr(torch.amp.autocast_mode, "is_autocast_available", lambda kind: kind != "mps")
    with pytest.warns(UserWarning, match="has no mps autocast to torch.float16: the region runs without autocast"):
        context = autocast(device="mps")
    assert context._enabled is False


def test_grad_scaler_on_the_cpu_is_torch_amp_grad_scaler_with_the_arguments_given():
    scaler = grad_scaler(2.0**10, 3.0, 0.25, 7)
    assert type(scaler) is torch.amp.GradScaler and scaler._device == "cpu" and scaler.is_enabled()
    assert (scaler._init_scale, scaler._growth_factor, scaler._backoff_factor, scaler._growth_interval) == (
        1024.0,
        3.0,
        0.25,
        7,
    )
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    assert torch.equal(model.weight.grad, torch.full((1, 2), 1024.0))  # scaled
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(model.weight.grad, torch.ones(1, 2))  # unscaled before the step
    assert grad_scaler(enabled=False).is_enabled() is False


def test_on_cuda_grad_scaler_is_what_torch_cuda_amp_grad_scaler_makes():
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        ours = grad_scaler(init_scale=8.0, device="cuda")
        torchs = torch.cuda.amp.GradScaler(init_scale=8.0)
    assert isinstance(torchs, type(ours)) and ours._device == torchs._device == "cuda"
    assert ours.is_enabled() == torchs.is_enabled()  # off here: this machine has no CUDA


def test_before_torch_2_3_there_is_no_cpu_scaler_so_scaling_is_off_with_a_warning(monkeypatch):
    monkeypatch.delattr(torch.amp, "GradScaler")
    monkeypatch.setattr(torch, "__version__", "2.2.2+cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scaler = grad_scaler(init_scale=4.0)
    assert [str(w.message) for w in caught if w.category is UserWarning] == [  # not torch 2.13's deprecation
        "npu-port: torch 2.2.2+cpu has no GradScaler for cpu (torch.amp.GradScaler comes with torch 2.3): gradient "
        "scaling is off"
    ]
    assert isinstance(scaler, torch.cuda.amp.GradScaler) and not scaler.is_enabled()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        cuda = grad_scaler(device="cuda")
    assert type(cuda) is torch.cuda.amp.GradScaler  # torch.cuda.amp's own, the only one before 2.3


def test_on_an_npu_grad_scaler_is_torch_npus_and_gets_every_argument_by_name(monkeypatch):
    """torch_npu's GradScaler takes ``dynamic`` before ``enabled``: passed by position, ``enabled`` would land there.
    A stand-in with its signature records what it was given."""
    made = []

    class NpuGradScaler:
        def __init__(
            self,
            init_scale=2.0**16,
            growth_factor=2.0,
            backoff_factor=0.5,
            growth_interval=2000,
            dynamic=True,
            enabled=True,
        ):
            made.append((init_scale, growth_factor, backoff_factor, growth_interval, dynamic, enabled))

    package, npu, amp = (types.ModuleType(name) for name in ("torch_npu", "torch_npu.npu", "torch_npu.npu.amp"))
    amp.GradScaler, npu.amp, package.npu = NpuGradScaler, amp, npu
    monkeypatch.setitem(sys.modules, "torch_npu", package)
    monkeypatch.setitem(sys.modules, "torch_npu.npu", npu)
    monkeypatch.setitem(sys.modules, "torch_npu.npu.amp", amp)
    scaler = grad_scaler(2.0**12, 2.0, 0.5, 100, False, device="npu")
    assert type(scaler) is NpuGradScaler and made == [(4096.0, 2.0, 0.5, 100, True, False)]
