"""Loaders and factories that take a device, under the cuda redirect: safetensors (``load_file``, ``safe_open``,
``load``, ``load_model``), ``torch.load``'s ``map_location`` in every form torch takes, ``pin_memory=`` on the
factories and on ``DataLoader``, and ``storage.cuda()``.

On a cpu target each is run and compared with the same load written for the cpu (bit-exact: a load is a copy). On an
npu target, which this machine does not have, the wrappers are given a recording original and the arguments that
reach it are checked (safetensors' staging call keeps ``pin_memory=True`` there: torch_npu pins host memory). A
form that fails on CUDA too fails the same way here, with the same error."""

from __future__ import annotations

import io
import re
import warnings
from typing import Any, Dict, List

import pytest
import safetensors.torch
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors import safe_open
from torch.utils.data import DataLoader, TensorDataset

from npu_port.device.redirect import install, mapping, patched_attributes, redirect_cuda, wrappers
from npu_port.device.redirect.install import (
    CUDA_SAVED,
    FACTORY_FUNCTIONS,
    NOT_PINNABLE,
    TENSOR_FACTORY_METHODS,
    UNPINNED,
)
from npu_port.device.redirect.mapping import DeviceMapper
from npu_port.upstream.loaders import imported_loaders

#: What torch says to pin_memory=True on a machine without an accelerator (the failure safetensors' CUDA loads hit).
NO_PINNING = "pin_memory=True requires a CUDA or other accelerator backend"


@pytest.fixture(autouse=True)
def _no_redirect_left_behind():
    assert patched_attributes() == []
    yield
    assert patched_attributes() == [], "a test left the redirect installed"


class Recorder:
    """Stands in for a torch function on a device this machine lacks: keeps the arguments it was called with."""

    def __init__(self) -> None:
        self.calls: List[Any] = []

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append((args, kwargs))
        return "recorded"


def _counter(log: List[str], kind: str):
    return lambda: log.append(kind)


# --- safetensors ------------------------------------------------------------------------------------------------------


TENSORS = {
    "lora_A": torch.arange(12.0).reshape(3, 4) / 7,
    "lora_B": torch.linspace(-1, 1, 8, dtype=torch.float16).reshape(4, 2),
    "scale": torch.tensor([0.5], dtype=torch.bfloat16),
    "steps": torch.tensor([3, 1, 4], dtype=torch.int64),
}


@pytest.fixture
def lora_file(tmp_path):
    path = tmp_path / "lora.safetensors"
    safetensors.torch.save_file(TENSORS, str(path))
    return str(path)


def _assert_same_tensors(got: Dict[str, torch.Tensor], expected: Dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].device == torch.device("cpu"), name
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name


def test_without_the_redirect_a_cuda_load_fails_on_pinned_staging(lora_file):
    with pytest.raises(RuntimeError, match=re.escape(NO_PINNING)):
        safetensors.torch.load_file(lora_file, device="cuda")


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_load_file_with_a_cuda_name_lands_on_the_cpu_target(lora_file, device):
    with redirect_cuda("cpu") as redirect:
        loaded = safetensors.torch.load_file(lora_file, device=device)
        hits = redirect.hits()
    _assert_same_tensors(loaded, TENSORS)
    # mapped where it was written: safetensors never meets the CUDA name (nor stages through pinned memory)
    assert hits == {"load_file": 1}


@pytest.mark.parametrize("device", [0, 1])
def test_load_file_with_an_ordinal_lands_on_the_cpu_target(lora_file, device):
    with redirect_cuda("cpu") as redirect:
        loaded = safetensors.torch.load_file(lora_file, device=device)
        hits = redirect.hits()
    _assert_same_tensors(loaded, TENSORS)
    assert hits == {"load_file": 1}  # the ordinal is mapped where it was written, as a name is


def test_load_file_with_a_torch_device_fails_as_it_does_on_cuda(lora_file):
    """safetensors takes a device name or an ordinal, never a torch.device (``torch.device("cpu")`` neither): the
    redirect passes it through, and the error is safetensors' own."""
    for device in (torch.device("cuda"), torch.device("cpu")):
        with pytest.raises(Exception) as plain:
            safetensors.torch.load_file(lora_file, device=device)
        with redirect_cuda("cpu") as redirect:
            with pytest.raises(Exception) as redirected:
                safetensors.torch.load_file(lora_file, device=device)
            assert redirect.hits() == {}
        assert type(redirected.value) is type(plain.value)
        assert str(redirected.value) == str(plain.value) == f"device {device!r} is invalid"


def test_safe_open_get_tensor_and_get_slice_on_the_cpu_target(lora_file):
    with safe_open(lora_file, framework="pt", device="cpu") as f:
        expected = {"tensor": f.get_tensor("lora_A"), "slice": f.get_slice("lora_A")[1:, :2], "keys": sorted(f.keys())}
    with redirect_cuda("cpu") as redirect:
        with safe_open(lora_file, framework="pt", device="cuda") as f:
            got = {"tensor": f.get_tensor("lora_A"), "slice": f.get_slice("lora_A")[1:, :2], "keys": sorted(f.keys())}
        hits = redirect.hits()
    assert got["keys"] == expected["keys"]
    for name in ("tensor", "slice"):
        assert got[name].device.type == "cpu" and torch.equal(got[name], expected[name])
    assert hits["Tensor.to"] == 2 and hits[UNPINNED] >= 1


def test_load_from_bytes_takes_no_device_and_is_left_alone(lora_file):
    with open(lora_file, "rb") as f:
        data = f.read()
    with redirect_cuda("cpu") as redirect:
        loaded = safetensors.torch.load(data)
        assert redirect.hits() == {}
    _assert_same_tensors(loaded, TENSORS)


def test_load_model_with_a_cuda_device(tmp_path):
    torch.manual_seed(0)
    source = torch.nn.Linear(4, 3)
    path = str(tmp_path / "linear.safetensors")
    safetensors.torch.save_model(source, path)
    target = torch.nn.Linear(4, 3)
    with redirect_cuda("cpu"):
        safetensors.torch.load_model(target, path, device="cuda")
    assert torch.equal(target.weight, source.weight) and torch.equal(target.bias, source.bias)


def test_torch_load_of_a_safetensors_path_behaves_as_without_the_redirect(lora_file):
    """torch >= 2.9 hands a ``.safetensors`` path to safetensors with a device name (and refuses a callable): the
    redirect used to turn a missing ``map_location`` into a callable there. Either both load, or both fail alike."""

    def outcome(**kwargs):
        try:
            return "loaded", torch.load(lora_file, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the two outcomes are compared whatever they are
            return "failed", f"{type(exc).__name__}: {exc}"

    plain = outcome()
    with redirect_cuda("cpu") as redirect:
        redirected = outcome()
        with_cuda = outcome(map_location="cuda:1")
        assert redirect.hits() == {"torch.load": 1}  # "cuda:1" reaches safetensors as "cpu": nothing staged
    assert redirected[0] == plain[0] == with_cuda[0]
    if plain[0] == "loaded":
        _assert_same_tensors(redirected[1], TENSORS)
        _assert_same_tensors(with_cuda[1], TENSORS)
    else:
        assert redirected[1] == plain[1]


def test_on_an_npu_target_the_staging_keeps_pinned_memory_and_the_move_goes_to_the_npu():
    """What safetensors calls for ``device="cuda:1"``, given to the npu target's wrappers (recorded originals)."""
    npu, log = DeviceMapper("npu"), []
    empty = Recorder()
    wrappers.device_keywords(empty, npu, _counter(log, "torch.empty"))(
        [2, 3], dtype=torch.float16, device="cpu", pin_memory=True
    )
    assert empty.calls == [(([2, 3],), {"dtype": torch.float16, "device": "cpu", "pin_memory": True})]
    moved = Recorder()
    wrappers.to(moved, npu, _counter(log, "Tensor.to"))("tensor", "cuda:1", non_blocking=True)
    asarray = Recorder()
    wrappers.device_keywords(asarray, npu, _counter(log, "torch.asarray"))("storage", dtype=torch.uint8, device=1)
    assert moved.calls == [(("tensor", "npu:1"), {"non_blocking": True})]
    assert asarray.calls == [(("storage",), {"dtype": torch.uint8, "device": "npu:1"})]
    assert log == ["Tensor.to", "torch.asarray"]


# --- pin_memory= on the factories -------------------------------------------------------------------------------------


_ONES = torch.ones(2)
#: Arguments for each factory (every factory the redirect wraps has a row: checked below).
FACTORY_ARGUMENTS = {
    "arange": (3,), "as_tensor": ([1.0],), "asarray": ([1.0],), "bartlett_window": (4,), "blackman_window": (4,),
    "empty": (2,), "empty_like": (_ONES,), "empty_permuted": ((2, 3), (0, 1)), "empty_strided": ((2,), (1,)),
    "eye": (2,), "from_file": ("/dev/null",), "full": ((2,), 1.0), "full_like": (_ONES, 1.0), "hamming_window": (4,),
    "hann_window": (4,), "kaiser_window": (4,), "linspace": (0, 1, 3), "logspace": (0, 1, 3), "normal": (0.0, 1.0, (2,)),
    "ones": (2,), "ones_like": (_ONES,), "rand": (2,), "rand_like": (_ONES,), "randint": (3, (2,)),
    "randint_like": (_ONES, 3), "randn": (2,), "randn_like": (_ONES,), "randperm": (3,), "range": (0, 2),
    "scalar_tensor": (1.0,), "sparse_compressed_tensor": None, "sparse_coo_tensor": None, "sparse_csr_tensor": None,
    "tensor": ([1.0, 2.0],), "tril_indices": (3, 3), "triu_indices": (3, 3), "zeros": (2,), "zeros_like": (_ONES,),
}  # fmt: skip
METHOD_ARGUMENTS = {
    "new_empty": ((2,),), "new_empty_strided": ((2,), (1,)), "new_full": ((2,), 1.0), "new_ones": ((2,),),
    "new_tensor": ([1.0],), "new_zeros": ((2,),),
}  # fmt: skip


def _factory_call(name: str):
    if name in FACTORY_ARGUMENTS:
        arguments = FACTORY_ARGUMENTS[name]
        if arguments is None:  # sparse constructors: index and value tensors made at the call
            layout = {"layout": torch.sparse_csr} if name == "sparse_compressed_tensor" else {}
            return lambda **kw: getattr(torch, name)(*_sparse_arguments(name), check_invariants=True, **layout, **kw)
        return lambda **kw: getattr(torch, name)(*arguments, **kw)
    return lambda **kw: getattr(torch.ones(2), name)(*METHOD_ARGUMENTS[name], **kw)


def _sparse_arguments(name: str) -> tuple:
    if name == "sparse_coo_tensor":
        return torch.tensor([[0]]), torch.tensor([1.0]), (2,)
    rows = (torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([1.0]), (1, 1))
    return rows


def _outcome(call, **kwargs):
    torch.random.default_generator.manual_seed(0)  # (torch.manual_seed would seed CUDA too: a redirected call)
    try:
        result = call(**kwargs)
    except (RuntimeError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    if result.layout != torch.strided:
        result = result.to_dense()
    return result if result.dtype != torch.float32 or result.numel() == 0 else result.clone()


def test_every_wrapped_factory_has_arguments_here():
    assert set(FACTORY_ARGUMENTS) == set(FACTORY_FUNCTIONS) and set(METHOD_ARGUMENTS) == set(TENSOR_FACTORY_METHODS)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.parametrize(
    "name", [n for n in (*FACTORY_FUNCTIONS, *TENSOR_FACTORY_METHODS) if hasattr(torch, n) or n.startswith("new_")]
)
def test_pin_memory_true_is_dropped_on_a_cpu_target_exactly_where_torch_takes_it(name):
    """Where torch takes ``pin_memory`` it refuses True without an accelerator, and the redirect gives the unpinned
    result; where it takes none (or refuses it everywhere: ``from_file``) the error is torch's own, uncounted."""
    call = _factory_call(name)
    plain = _outcome(call, pin_memory=True)
    with redirect_cuda("cpu") as redirect:
        redirected = _outcome(call, pin_memory=True)
        hits = redirect.hits()
    if name in NOT_PINNABLE or name.startswith("sparse_"):
        assert isinstance(plain, str) and NO_PINNING not in plain
    if name in NOT_PINNABLE:
        assert redirected == plain and hits == {}
        return
    if not name.startswith("sparse_"):
        assert isinstance(plain, str) and plain.startswith(f"RuntimeError: {NO_PINNING}"), plain
    expected = _outcome(call)
    assert isinstance(redirected, torch.Tensor), redirected
    if name.startswith("empty") or name == "new_empty" or name == "new_empty_strided":
        assert redirected.shape == expected.shape and redirected.dtype == expected.dtype  # uninitialised values
    else:
        assert torch.equal(redirected, expected)
    assert hits == {UNPINNED: 1}


def test_a_cuda_factory_call_with_pin_memory_maps_the_device_and_drops_pinning():
    with redirect_cuda("cpu") as redirect:
        x = torch.zeros(3, device="cuda", pin_memory=True)
        y = torch.ones(2).new_ones(2, device="cuda:1", pin_memory=True)
        assert redirect.hits() == {"torch.zeros": 1, "Tensor.new_ones": 1, UNPINNED: 2}
    assert torch.equal(x, torch.zeros(3)) and torch.equal(y, torch.ones(2))


def test_on_an_npu_target_pin_memory_passes_through():
    npu, log = DeviceMapper("npu"), []
    zeros = Recorder()
    wrappers.device_keywords(zeros, npu, _counter(log, "torch.zeros"))(3, device="cuda:2", pin_memory=True)
    assert zeros.calls == [((3,), {"device": "npu:2", "pin_memory": True})] and log == ["torch.zeros"]


def test_tensor_pin_memory_is_the_tensor_itself_on_a_cpu_target():
    x = torch.arange(3.0)
    with redirect_cuda("cpu") as redirect:
        assert x.pin_memory() is x
        assert redirect.hits() == {"Tensor.pin_memory": 1}


# --- DataLoader -------------------------------------------------------------------------------------------------------


def _batches(loader):
    return [batch for (batch,) in loader]


#: DataLoader forms: (make one, the hits it counts on a cpu target).
LOADERS = {
    "pin_memory": (lambda ds: DataLoader(ds, batch_size=3, pin_memory=True), {UNPINNED: 1}),
    "pin_memory_device": (
        lambda ds: DataLoader(ds, batch_size=3, pin_memory=True, pin_memory_device="cuda"),
        {UNPINNED: 1, "DataLoader": 1},
    ),
    "device_only": (lambda ds: DataLoader(ds, batch_size=3, pin_memory_device="cuda:0"), {"DataLoader": 1}),
    "positional": (lambda ds: DataLoader(ds, 3, False, None, None, 0, None, True), {UNPINNED: 1}),  # 8th: pin_memory
    "unpinned": (lambda ds: DataLoader(ds, batch_size=3, pin_memory=False), {}),
}


@pytest.mark.parametrize("form", sorted(LOADERS))
def test_a_pinning_data_loader_gives_the_same_batches_on_a_cpu_target_without_warnings(form):
    make, expected_hits = LOADERS[form]
    dataset = TensorDataset(torch.arange(20.0).reshape(10, 2))
    expected = _batches(DataLoader(dataset, batch_size=3))
    with redirect_cuda("cpu") as redirect:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = _batches(make(dataset))
        hits = redirect.hits()
    assert [str(w.message) for w in caught] == []  # no "no accelerator is found", no "pin_memory_device is ignored"
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))
    assert hits == expected_hits


def test_on_an_npu_target_a_data_loader_keeps_pinning_on_the_npu():
    npu, log = DeviceMapper("npu"), []
    init = Recorder()
    wrapped = wrappers.data_loader_init(init, npu, _counter(log, "DataLoader"), _counter(log, UNPINNED))
    wrapped("loader", "dataset", batch_size=2, pin_memory=True, pin_memory_device="cuda:1")
    wrapped("loader", "dataset", 2, False, None, None, 0, None, True)
    assert init.calls == [
        (("loader", "dataset"), {"batch_size": 2, "pin_memory": True, "pin_memory_device": "npu:1"}),
        (("loader", "dataset", 2, False, None, None, 0, None, True), {}),
    ]
    assert log == ["DataLoader"]


# --- torch.load map_location ------------------------------------------------------------------------------------------


def _tagged_checkpoint(tags: Dict[str, str]) -> bytes:
    """A checkpoint whose tensors' storages are tagged as saved on the given devices (as one saved on GPUs is),
    written without a GPU. ``tags``: tensor name -> location tag; each tensor has a size of its own."""
    tensors = {name: torch.arange(float(index + 2)) * (index + 1) for index, name in enumerate(sorted(tags))}
    by_size = {tensors[name].nbytes: tag for name, tag in tags.items()}
    registry = torch.serialization._package_registry
    entry = (-1, lambda storage: by_size.get(storage.nbytes()), lambda storage, location: None)
    registry.insert(0, entry)
    try:
        buffer = io.BytesIO()
        torch.save(tensors, buffer)
    finally:
        registry.remove(entry)
    return buffer.getvalue()


def _expected(tags: Dict[str, str]) -> Dict[str, torch.Tensor]:
    return {name: torch.arange(float(index + 2)) * (index + 1) for index, name in enumerate(sorted(tags))}


TAGS = {"a": "cuda:0", "b": "cuda:1", "c": "cpu"}

#: map_location forms: (value, the hits one load of TAGS counts). A dict or callable that leaves a CUDA tag to the
#: default counts it as CUDA-saved storages put on the target; a CUDA device named counts as torch.load.
MAP_LOCATIONS = {
    "none": (None, {CUDA_SAVED: 1}),
    "str": ("cuda", {"torch.load": 1}),
    "str_indexed": ("cuda:1", {"torch.load": 1}),
    "device": (torch.device("cuda"), {"torch.load": 1}),
    "device_indexed": (torch.device("cuda", 1), {"torch.load": 1}),
    "cpu": ("cpu", {}),
    "dict_to_cuda": ({"cuda:0": "cuda:1"}, {"torch.load": 1, CUDA_SAVED: 1}),  # cuda:1 is not in it
    "dict_to_cpu": ({"cuda:0": "cpu"}, {CUDA_SAVED: 1}),
    "dict_all_cpu": ({"cuda:0": "cpu", "cuda:1": "cpu"}, {}),
    "callable_cuda": (lambda storage, location: storage.cuda(), {"Storage.cuda": 3}),
    "callable_cuda_index": (lambda storage, location: storage.cuda(1), {"Storage.cuda": 3}),
    "callable_keep": (lambda storage, location: storage, {}),
    "callable_none": (lambda storage, location: None, {CUDA_SAVED: 1}),
}


@pytest.mark.parametrize("form", sorted(MAP_LOCATIONS))
def test_every_map_location_form_loads_a_cuda_saved_checkpoint_onto_the_cpu_target(form):
    location, expected_hits = MAP_LOCATIONS[form]
    data = _tagged_checkpoint(TAGS)
    with redirect_cuda("cpu") as redirect:
        loaded = torch.load(io.BytesIO(data), map_location=location)
        hits = redirect.hits()
    _assert_same_tensors(loaded, _expected(TAGS))
    assert hits == expected_hits


def test_without_the_redirect_those_loads_fail():
    data = _tagged_checkpoint(TAGS)
    for form in ("none", "str", "dict_to_cpu", "callable_cuda"):
        with pytest.raises((RuntimeError, AssertionError, TypeError)):
            torch.load(io.BytesIO(data), map_location=MAP_LOCATIONS[form][0])


def test_an_int_map_location_is_refused_by_torch_with_or_without_the_redirect():
    data = _tagged_checkpoint({"a": "cpu"})
    with pytest.raises(TypeError) as plain:
        torch.load(io.BytesIO(data), map_location=0)
    with redirect_cuda("cpu") as redirect:
        with pytest.raises(TypeError) as redirected:
            torch.load(io.BytesIO(data), map_location=0)
        assert redirect.hits() == {}
    assert str(redirected.value) == str(plain.value) == "'int' object is not callable"


@given(
    tags=st.dictionaries(
        st.sampled_from("abcdef"), st.sampled_from(["cpu", "cuda", "cuda:0", "cuda:1", "cuda:7"]), min_size=1
    ),
    mapped=st.dictionaries(
        st.sampled_from(["cuda", "cuda:0", "cuda:1", "cuda:7", "cpu"]), st.sampled_from(["cpu", "cuda", "cuda:3"])
    ),
)
def test_any_checkpoint_with_any_dict_map_location_loads_the_same_values_on_the_cpu_target(tags, mapped):
    data = _tagged_checkpoint(tags)
    with redirect_cuda("cpu"):
        loaded = torch.load(io.BytesIO(data), map_location=mapped)
    _assert_same_tensors(loaded, _expected(tags))


def test_on_an_npu_target_each_form_restores_to_the_npu_device_the_cuda_tag_names(monkeypatch):
    restored = []
    monkeypatch.setattr(mapping, "default_restore_location", lambda storage, location: restored.append(location))
    npu, noted = DeviceMapper("npu"), []
    assert npu.map_location("cuda:1") == "npu:1" and npu.map_location("cuda") == "npu"
    assert npu.map_location(0) == 0  # torch takes no int: left as it is
    for form in (None, {"cuda:0": "cuda:2"}, lambda storage, location: None):
        restore = npu.map_location(form, noted.append)
        if isinstance(form, dict):
            assert restore == {"cuda:0": "npu:2"}
            restored.extend(restore.get(tag, tag) for tag in ("cuda:0", "cuda:1", "cuda", "cpu"))
        else:
            for tag in ("cuda:0", "cuda:1", "cuda", "cpu"):
                restore("storage", tag)
    assert restored == [
        *["npu:0", "npu:1", "npu", "cpu"],  # None
        *["npu:2", "npu:1", "npu", "cpu"],  # the dict: its own value, else the tag's npu
        *["npu:0", "npu:1", "npu", "cpu"],  # a callable that returned None
    ]
    assert noted == ["cuda:0", "cuda:1", "cuda", "cuda:1", "cuda", "cuda:0", "cuda:1", "cuda"]


def test_on_an_npu_target_storage_cuda_moves_to_the_npu():
    class Storage:
        def __init__(self):
            self.moves = []

        def to(self, *, device, non_blocking=False):
            self.moves.append((device, non_blocking))
            return self

    log: List[str] = []
    cuda = wrappers.storage_cuda(DeviceMapper("npu"), _counter(log, "Storage.cuda"))
    storage = Storage()
    cuda(storage)
    cuda(storage, 1, non_blocking=True)
    assert storage.moves == [("npu", False), ("npu:1", True)] and log == ["Storage.cuda", "Storage.cuda"]


def test_storage_cuda_on_the_cpu_target_is_the_storage_itself():
    storage = torch.arange(3.0).untyped_storage()
    with redirect_cuda("cpu") as redirect:
        assert storage.cuda() is storage and storage.cuda(1) is storage
        assert redirect.hits() == {"Storage.cuda": 2}


# --- a cuda target ----------------------------------------------------------------------------------------------------


def test_a_cuda_target_changes_nothing_the_loaders_run_as_written(monkeypatch, lora_file):
    """On a machine with CUDA the redirect installs nothing: safetensors, torch.load, the factories, DataLoader and the
    loaders' from_pretrained are the originals (told here without a GPU by answering the device lookup)."""
    monkeypatch.setattr(install, "get_device", lambda target: torch.device("cuda"))
    owners = (torch, torch.Tensor, torch.serialization, torch.storage._StorageBase, DataLoader, *imported_loaders())
    before = {owner: dict(vars(owner)) for owner in owners}
    with redirect_cuda("cuda") as redirect:
        assert redirect.installed and patched_attributes() == [] and redirect.serve_loaders() == 0
        assert all(vars(owner) == namespace for owner, namespace in before.items())
        with pytest.raises(RuntimeError, match=re.escape(NO_PINNING)):  # CUDA's own path, which needs a GPU
            safetensors.torch.load_file(lora_file, device="cuda")
        assert redirect.hits() == {}
