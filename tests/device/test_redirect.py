"""The cuda -> cpu redirect: CUDA-written code runs on the CPU with the outputs of the same code written for the CPU,
only device arguments are rewritten, and uninstalling gives back every patched attribute as the identical object."""

from __future__ import annotations

import io
import os
import re
import runpy
import socket
import subprocess
import sys
import warnings
from inspect import getattr_static
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import npu_port
from npu_port.device.redirect import patched_attributes, redirect_cuda
from npu_port.device.redirect.install import CUDA_SAVED
from npu_port.device.redirect.mapping import DeviceMapper
from npu_port.errors import DeviceError, RedirectError
from npu_port.upstream.loaders import imported_device_functions, imported_loaders

from ..reference import reference_attention

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parents[1] / "fixtures" / "redirect"

#: Everything the redirect may touch; their whole namespaces are compared before and after.
OWNERS = (
    torch,
    torch.Tensor,
    torch._C.TensorBase,
    torch.nn.Module,
    torch.cuda,
    torch.cuda.amp,
    torch.cuda.nvtx,
    torch.serialization,
    torch.backends.cuda,
    torch.amp.autocast_mode.autocast,
    torch.amp.grad_scaler.GradScaler,
    dist,
    c10d,
    torch.nn.parallel.DistributedDataParallel,
    torch.jit,
    torch.storage._StorageBase,
    torch.utils.data.DataLoader,
)

CUDA_DEVICES = ["cuda", "cuda:0", "cuda:1", torch.device("cuda"), torch.device("cuda", 1), 0, 1]


def _namespaces():
    return {owner: dict(vars(owner)) for owner in OWNERS}


def _assert_identical(before):
    for owner, namespace in before.items():
        now = dict(vars(owner))
        assert now.keys() == namespace.keys(), f"{owner}: names added or removed: {now.keys() ^ namespace.keys()}"
        changed = [name for name in namespace if now[name] is not namespace[name]]
        assert not changed, f"{owner}: not restored to the identical object: {changed}"


@pytest.fixture(autouse=True)
def _no_redirect_left_behind():
    assert patched_attributes() == []
    yield
    assert patched_attributes() == [], "a test left the redirect installed"


@pytest.fixture
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.cuda.amp.* deprecation notices
        yield


# --- exact restore -------------------------------------------------------------------------------------------------


def test_uninstall_restores_every_patched_attribute_by_identity():
    import safetensors.torch  # noqa: F401  (its load_file is patched too)

    before = _namespaces()
    # transformers' / diffusers' loaders and safetensors' load_file, once a test imported them
    owners = OWNERS + tuple(imported_loaders()) + tuple(module for module, _, _ in imported_device_functions())
    originals = {(owner, name): getattr_static(owner, name, None) for owner in owners for name in dir(owner)}
    redirect = redirect_cuda("cpu").install()
    patched = patched_attributes()
    assert len(patched) > 100
    for owner, name in patched:
        assert getattr_static(owner, name) is not originals.get((owner, name)), f"{owner}.{name} was not replaced"
    assert torch.Tensor.cuda is not torch._C.TensorBase.cuda
    assert redirect.uninstall() is True
    _assert_identical(before)
    assert torch.Tensor.cuda is torch._C.TensorBase.cuda
    assert "cuda" not in vars(torch.Tensor)
    for owner, name in patched:
        assert getattr_static(owner, name, None) is originals.get((owner, name))


def test_nested_and_repeated_installs_restore_once_the_last_is_undone():
    before = _namespaces()
    outer, inner = redirect_cuda("cpu"), redirect_cuda("cpu")
    with outer:
        count = len(patched_attributes())
        with inner:
            assert len(patched_attributes()) == count  # patched once, not twice
        assert torch.zeros(1, device="cuda").device.type == "cpu"  # still redirected after the inner exit
    _assert_identical(before)

    again = redirect_cuda("cpu")
    again.install()
    again.install()
    assert again.uninstall() is True
    assert patched_attributes() != []
    assert again.uninstall() is True
    assert again.uninstall() is False  # nothing left to undo: a no-op
    _assert_identical(before)


def test_a_nested_redirect_with_other_options_is_refused():
    with redirect_cuda("cpu"):
        with pytest.raises(RedirectError) as info:
            redirect_cuda("cpu", cuda_available=True).install()
    assert str(info.value) == (
        "a cuda redirect to cpu (cuda_available=False) is already installed; a nested redirect must use the same "
        "target and options, got cpu (cuda_available=True)"
    )


def test_an_exception_inside_the_scope_still_restores():
    before = _namespaces()
    with pytest.raises(ZeroDivisionError):
        with redirect_cuda("cpu"):
            raise ZeroDivisionError
    _assert_identical(before)


def test_unknown_target_is_a_clear_error():
    with pytest.raises(DeviceError, match=re.escape("unknown device 'gpu' (argument); valid devices: auto, npu, cuda")):
        redirect_cuda("gpu")


# --- honesty: is_available, jit, strings -----------------------------------------------------------------------------


def test_is_available_stays_honest_unless_asked():
    with redirect_cuda("cpu"):
        assert torch.cuda.is_available() is False
        assert torch.zeros(1, device="cuda").is_cuda is False
    with redirect_cuda("cpu", cuda_available=True):
        assert torch.cuda.is_available() is True
        assert torch.zeros(1, device="cuda").is_cuda is True
    assert torch.cuda.is_available() is False
    assert "is_cuda" not in vars(torch.Tensor)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torch_jit_script_keeps_working():
    def add_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    with redirect_cuda("cpu"):
        scripted = torch.jit.script(add_one)
        assert isinstance(scripted, torch.jit.ScriptFunction)
        assert torch.equal(scripted(torch.ones(2, device="cuda")), torch.full((2,), 2.0))


def test_torch_load_keeps_a_file_name_that_contains_cuda(tmp_path):
    path = tmp_path / "weights_cuda.pt"
    torch.save({"w": torch.arange(4.0)}, path)
    with redirect_cuda("cpu"):
        loaded = torch.load(str(path))
        loaded_positional_location = torch.load(str(path), "cuda:0")
    assert torch.equal(loaded["w"], torch.arange(4.0))
    assert torch.equal(loaded_positional_location["w"], torch.arange(4.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights_cuda.pt"]


@pytest.fixture
def cuda_tagged_checkpoint():
    """A checkpoint whose storages are tagged "cuda:0", as one saved on a GPU is (written without a GPU)."""
    registry = torch.serialization._package_registry
    entry = (-1, lambda storage: "cuda:0", lambda storage, location: None)
    registry.insert(0, entry)
    try:
        buffer = io.BytesIO()
        torch.save({"w": torch.arange(6.0).reshape(2, 3)}, buffer)
    finally:
        registry.remove(entry)
    return buffer.getvalue()


def test_a_checkpoint_saved_on_cuda_loads_onto_the_target(cuda_tagged_checkpoint):
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on a CUDA device"):
        torch.load(io.BytesIO(cuda_tagged_checkpoint))
    with redirect_cuda("cpu"):
        for location in (None, "cuda", torch.device("cuda", 0), {"cuda:0": "cuda:1"}):
            loaded = torch.load(io.BytesIO(cuda_tagged_checkpoint), map_location=location)
            assert loaded["w"].device.type == "cpu"
            assert torch.equal(loaded["w"], torch.arange(6.0).reshape(2, 3))


def test_torch_load_counts_a_cuda_map_location_apart_from_cuda_saved_storages(cuda_tagged_checkpoint):
    plain = io.BytesIO()
    torch.save({"w": torch.ones(2)}, plain)
    with redirect_cuda("cpu") as redirect:
        torch.load(io.BytesIO(plain.getvalue()))  # nothing of CUDA in the call or the file: nothing handled
        torch.load(io.BytesIO(plain.getvalue()), map_location={"cpu": "cpu"})  # a new dict, nothing mapped
        assert redirect.hits() == {}
        torch.load(io.BytesIO(cuda_tagged_checkpoint))
        torch.load(io.BytesIO(cuda_tagged_checkpoint), map_location="cuda")
        torch.load(io.BytesIO(cuda_tagged_checkpoint), map_location={"cuda:0": "cuda:1"})
        assert redirect.hits() == {CUDA_SAVED: 1, "torch.load": 2}


def test_hits_are_placed_at_the_lines_that_asked_for_cuda(quiet):
    line = sys._getframe().f_lineno
    with redirect_cuda("cpu") as redirect:
        torch.zeros(1, device="cuda")
        nn.Linear(2, 2).cuda()
        torch.cuda.amp.GradScaler()  # through torch.cuda.amp and typing_extensions' deprecation wrapper
        with torch.cuda.amp.autocast():
            torch.cuda.synchronize()
        for _ in range(3):
            torch.cuda.nvtx.range_push("step")
            torch.cuda.nvtx.range_pop()
        places = {kind: [place for _, place in where] for (kind, owner), where in redirect.hit_log().places.items()}
        owners = {owner for _, owner in redirect.hit_log().owned}
        counts = redirect.hits()
    assert places == {
        "torch.zeros": [(__file__, line + 2)],
        "Module.cuda": [(__file__, line + 3)],
        "GradScaler": [(__file__, line + 4)],
        "autocast": [(__file__, line + 5)],
        "torch.cuda.synchronize": [(__file__, line + 6)],
        "torch.cuda.nvtx.range_push": [(__file__, line + 8)],
        "torch.cuda.nvtx.range_pop": [(__file__, line + 9)],
    }
    assert owners == {"<project>"}  # each made by this file's own line (npu_port.hits: who made a call)
    assert counts["torch.cuda.nvtx.range_push"] == counts["torch.cuda.nvtx.range_pop"] == 3
    assert redirect.hit_log() is None  # uninstalled


def test_only_device_strings_are_rewritten():
    mapper = DeviceMapper("cpu")
    for untouched in ("cudax", "cuda_weights.pt", "my-cuda:0", "cuda:x", "CUDA", "cpu", "meta"):
        assert mapper.device(untouched) is untouched
    assert mapper.device(-1) == -1
    npu = DeviceMapper("npu")
    assert [npu.device(value) for value in ("cuda", "cuda:3", 2)] == ["npu", "npu:3", "npu:2"]
    assert DeviceMapper("cpu").device(torch.device("cuda", 3)) == torch.device("cpu")
    assert npu.map_location({"cuda:1": "cuda:0", "cpu": "cpu"}) == {"cuda:1": "npu:0", "cpu": "cpu"}


# --- device arguments -------------------------------------------------------------------------------------------------


FACTORIES = {
    "zeros": lambda device: torch.zeros(2, 3, device=device),
    "ones": lambda device: torch.ones(2, 3, device=device),
    "full": lambda device: torch.full((2, 3), 7.0, device=device),
    "tensor": lambda device: torch.tensor([[1.0, 2.0]], device=device),
    "as_tensor": lambda device: torch.as_tensor([1, 2, 3], device=device),
    "arange": lambda device: torch.arange(5, device=device),
    "linspace": lambda device: torch.linspace(0, 1, 5, device=device),
    "eye": lambda device: torch.eye(3, device=device),
    "empty_like": lambda device: torch.empty_like(torch.zeros(2), device=device).zero_(),
    "zeros_like": lambda device: torch.zeros_like(torch.ones(2), device=device),
    "new_zeros": lambda device: torch.ones(2).new_zeros(3, device=device),
    "new_tensor": lambda device: torch.ones(2).new_tensor([4.0, 5.0], device=device),
    "to": lambda device: torch.arange(3.0).to(device),
    "to_dtype": lambda device: torch.arange(3.0).to(device, torch.float64),
    "to_keyword": lambda device: torch.arange(3.0).to(device=device, dtype=torch.float16),
    "cuda": lambda device: torch.arange(3.0).cuda(device),
}


@given(name=st.sampled_from(sorted(FACTORIES)), device=st.sampled_from(CUDA_DEVICES))
def test_cuda_device_arguments_land_on_the_target(name, device):
    make = FACTORIES[name]
    expected = torch.arange(3.0) if name == "cuda" else make("cpu")  # Tensor.cuda("cpu") is not valid torch
    with redirect_cuda("cpu"):
        got = make(device)
    assert got.device == torch.device("cpu")
    assert got.dtype == expected.dtype
    assert torch.equal(got, expected)


def test_other_arguments_of_to_pass_through_untouched():
    x = torch.arange(4.0)
    with redirect_cuda("cpu"):
        assert x.to(torch.float64).dtype == torch.float64
        assert x.to(torch.zeros(1, dtype=torch.int32)).dtype == torch.int32
        assert x.to("cpu") is x
        assert x.to("meta").device.type == "meta"
        model = nn.Linear(2, 2).to("cuda:0", torch.float64)
        assert model.weight.dtype == torch.float64 and model.weight.device.type == "cpu"
        assert nn.Linear(2, 2).cuda(1).weight.device.type == "cpu"
        assert nn.Linear(2, 2).to_empty(device="cuda").weight.device.type == "cpu"


def test_generator_on_cuda_gives_the_cpu_stream_of_numbers():
    expected = torch.randn(5, generator=torch.Generator("cpu").manual_seed(3))
    with redirect_cuda("cpu"):
        generator = torch.Generator("cuda").manual_seed(3)
        default = torch.Generator()
        got = torch.randn(5, generator=generator, device="cuda")
        assert isinstance(generator, torch.Generator) and isinstance(default, torch.Generator)
        assert issubclass(type(generator), torch.Generator)
    assert generator.device == torch.device("cpu")
    assert torch.equal(got, expected)
    assert type(generator) is torch.Generator  # a real generator, usable after the redirect is gone


def test_sdp_kernel_maps_to_sdpa_kernel_and_still_attends():
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    with pytest.raises(RuntimeError, match="No viable backend for scaled_dot_product_attention"):
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v)
    with redirect_cuda("cpu"):
        with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=False, enable_mem_efficient=True):
            out = F.scaled_dot_product_attention(q, k, v)
        with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=True, enable_mem_efficient=False):
            math_out = F.scaled_dot_product_attention(q, k, v)
    expected = reference_attention(q, k, v)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(math_out.double(), expected, atol=1e-5, rtol=1e-5)


# --- the torch.cuda API -----------------------------------------------------------------------------------------------


def test_torch_cuda_api_answers_for_the_cpu(quiet):
    with redirect_cuda("cpu"):
        torch.cuda.init()
        torch.cuda.synchronize()
        torch.cuda.synchronize("cuda:0")
        pinned_source = torch.ones(3)
        assert pinned_source.pin_memory() is pinned_source
        torch.cuda.set_device(1)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.device_count() == 1
        assert torch.cuda.current_device() == 0
        assert torch.cuda.memory_allocated() == torch.cuda.max_memory_allocated(0) == 0
        free, total = torch.cuda.mem_get_info()
        assert 0 < free <= total
        properties = torch.cuda.get_device_properties(0)
        assert properties.total_memory == total and properties.name.startswith("cpu: ")
        assert torch.cuda.get_device_name() == properties.name
        assert torch.cuda.get_device_capability() == (0, 0)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.randn(64, 64) @ torch.randn(64, 64)
        end.record()
        end.synchronize()
        assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)
        with torch.cuda.device(0), torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda.nvtx.range_push("step")
            torch.cuda.nvtx.range_pop()
            with torch.cuda.nvtx.range("block {}", 1):
                pass
        assert torch.cuda.FloatTensor is torch.FloatTensor


def test_cuda_seeding_and_rng_state_drive_the_cpu_generator():
    torch.manual_seed(11)
    expected = torch.randn(4)
    with redirect_cuda("cpu"):
        torch.cuda.manual_seed(11)
        first = torch.randn(4, device="cuda")
        state = torch.cuda.get_rng_state()
        second = torch.randn(4, device="cuda")
        torch.cuda.set_rng_state(state)
        second_again = torch.randn(4, device="cuda")
    assert torch.equal(first, expected)
    assert torch.equal(second, second_again)


def test_autocast_and_grad_scaler_written_for_cuda(quiet):
    model = nn.Linear(8, 4)
    x = torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.float16):
        expected = model(x)
    with redirect_cuda("cpu"):
        with torch.cuda.amp.autocast():
            legacy = model(x)
        with torch.autocast("cuda"):
            modern = model(x)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            bf16 = model(x)
        scalers = [torch.cuda.amp.GradScaler(), torch.amp.GradScaler(), torch.amp.GradScaler("cuda")]
    assert legacy.dtype == modern.dtype == torch.float16
    assert torch.equal(legacy, expected) and torch.equal(modern, expected)
    assert bf16.dtype == torch.bfloat16
    assert [scaler._device for scaler in scalers] == ["cpu", "cpu", "cpu"]


def test_hits_count_the_rewritten_calls():
    with redirect_cuda("cpu") as redirect:
        torch.zeros(1, device="cuda")
        torch.zeros(1, device="cpu")
        torch.ones(2).cuda()
        torch.ones(2).to("cuda:0")
        hits = redirect.hits()
    assert hits == {"torch.zeros": 1, "Tensor.cuda": 1, "Tensor.to": 1}
    assert redirect.hits() == {}


# --- whole CUDA-written programs ---------------------------------------------------------------------------------------


def test_a_cuda_written_training_script_matches_the_same_script_written_for_cpu(quiet):
    cpu = runpy.run_path(str(REPO / "benchmarks" / "redirect" / "train_cpu.py"))["train"](12)
    with redirect_cuda("cpu"):
        cuda = runpy.run_path(str(REPO / "benchmarks" / "redirect" / "train_cuda.py"))["train"](12)
    assert cuda["device"] == "cpu"
    assert cuda["losses"] == cpu["losses"]
    assert all(torch.equal(a, b) for a, b in zip(cuda["params"], cpu["params"]))
    assert cuda["peak_memory"] == 0


def test_the_cuda_written_script_fails_without_the_redirect(quiet):
    train = runpy.run_path(str(REPO / "benchmarks" / "redirect" / "train_cuda.py"))["train"]
    with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
        train(1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.e2e
@pytest.mark.slow
def test_torchrun_two_processes_all_reduce_with_a_nccl_script():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("NPU_PORT_DEVICE", None)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), str(FIXTURES / "run_redirected.py"), "cpu", str(FIXTURES / "allreduce_nccl.py"),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = sorted(re.findall(r"rank=\d+ backend=\w+ sum=\S+ grads_equal=\w+", result.stdout))
    assert lines == [
        "rank=0 backend=gloo sum=3.0 grads_equal=True",
        "rank=1 backend=gloo sum=3.0 grads_equal=True",
    ]


def test_distributed_backend_mapping():
    from npu_port.distributed import default_backend, map_backend

    assert default_backend() == "gloo"
    assert default_backend("cpu") == "gloo"
    assert map_backend("nccl", "cpu") == "gloo"
    assert map_backend("nccl", "npu") == "hccl"
    assert map_backend("nccl", "cuda") == "nccl"
    assert map_backend("gloo", "npu") == "gloo"
    assert map_backend("cpu:gloo,cuda:nccl", "cpu") == "cpu:gloo"
    assert map_backend("cpu:gloo,cuda:nccl", "npu") == "cpu:gloo,npu:hccl"
    with pytest.raises(DeviceError) as info:
        map_backend("hccl", "cpu")
    assert str(info.value) == "backend 'hccl' needs an Ascend NPU; this process runs on cpu: use 'gloo'"


def test_public_names():
    assert npu_port.redirect_cuda is redirect_cuda
    assert npu_port.get_device() == torch.device("cpu")
    assert npu_port.distributed.default_backend() == "gloo"


def test_meta_device_contexts_still_see_factory_calls():
    """transformers builds models under ``with torch.device("meta")``, which finds factory calls by identity in a
    cached set; the redirect must not let that cache fill with its wrappers (loaded models got garbage buffers)."""
    from torch.utils._device import _device_constructors

    _device_constructors.cache_clear()
    with redirect_cuda("cpu"):
        with torch.device("meta"):
            made = [torch.arange(3), torch.tensor([1.0]), torch.zeros(2), torch.empty(1)]
    assert [t.device.type for t in made] == ["meta"] * 4
    assert torch.arange in _device_constructors() and torch.tensor in _device_constructors()


def test_a_torch_without_torch_amp_grad_scaler_is_redirected_without_its_scaler(monkeypatch):
    """torch < 2.3 has no ``torch.amp.grad_scaler`` (its scaler is ``torch.cuda.amp``'s, with no device): the
    redirect installs without it (that scaler disables itself off CUDA) instead of failing to start."""
    monkeypatch.delattr(torch.amp, "grad_scaler")
    with redirect_cuda("cpu"):
        assert torch.zeros(1, device="cuda").device.type == "cpu"
