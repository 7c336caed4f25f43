"""One table of loader and factory forms that take a device, tested both ways: for each CUDA-written line, the codes
``npu-port scan`` lists as handled are the codes the redirect books for running it on a cpu target (through the one
table, :mod:`npu_port.runtime.handled`), at that very line — and the line then gives what the same line written for
the cpu gives. Where scan lists nothing, run books nothing.

Two documented exceptions, each a row of its own: a CUDA ordinal (``device=0``) is no literal scan reports, but run
counts it as NPU310 where torch reads it as a CUDA device (README: "CUDA ordinals ... too"); and a ``torch.device``
given to safetensors fails on CUDA as well (safetensors takes a name or an ordinal only), so run leaves it to fail
with the same error, and books nothing, while scan still lists the ``torch.device("cuda")`` literal."""

from __future__ import annotations

import io
import runpy
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Optional, Set

import pytest
import safetensors.torch
import torch
from torch.utils.data import TensorDataset

from npu_port.device.redirect import redirect_cuda
from npu_port.runtime import handled
from npu_port.scan.engine import scan_file
from npu_port.scan.rule import rules

from ..loader_models import save_tiny_models

pytestmark = pytest.mark.filterwarnings("ignore:`torch_dtype` is deprecated:FutureWarning")

HEADER = """import torch
import safetensors.torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch.utils.data import DataLoader
from transformers import GPT2LMHeadModel
from diffusers import UNet2DConditionModel


def probe(p):
    return {line}
"""
#: The line of ``return ...`` in HEADER.
LINE = 11


@dataclass(frozen=True)
class Form:
    line: str  # written for CUDA
    cpu: Optional[str]  # the same written for the cpu (None: the line fails on CUDA too; compared with itself)
    scan: Set[str]  # the handled codes scan gives it
    run: Optional[Set[str]] = None  # the codes run books, when not scan's (a documented exception)


FORMS: Dict[str, Form] = {
    # safetensors
    "load_file": Form('load_file(p["lora"], device="cuda")', 'load_file(p["lora"])', {"NPU310"}),
    "load_file_indexed": Form(
        'safetensors.torch.load_file(p["lora"], device="cuda:1")', 'safetensors.torch.load_file(p["lora"])', {"NPU310"}
    ),
    "load_file_ordinal": Form('load_file(p["lora"], device=0)', 'load_file(p["lora"])', set(), run={"NPU310"}),
    "load_file_torch_device": Form('load_file(p["lora"], device=torch.device("cuda"))', None, {"NPU310"}, run=set()),
    "safe_open_get_tensor": Form(
        'safe_open(p["lora"], framework="pt", device="cuda").get_tensor("w")',
        'safe_open(p["lora"], framework="pt", device="cpu").get_tensor("w")',
        {"NPU310"},
    ),
    "safe_open_get_slice": Form(
        'safe_open(p["lora"], framework="pt", device="cuda:0").get_slice("w")[1:]',
        'safe_open(p["lora"], framework="pt").get_slice("w")[1:]',
        {"NPU310"},
    ),
    "load_bytes": Form('safetensors.torch.load(p["lora_bytes"])', 'safetensors.torch.load(p["lora_bytes"])', set()),
    # torch.load's map_location (the checkpoint's storages are tagged cuda:0 and cuda:1)
    "map_location_str": Form(
        'torch.load(p["ckpt"], map_location="cuda")', 'torch.load(p["ckpt"], map_location="cpu")', {"NPU310"}
    ),
    "map_location_indexed": Form(
        'torch.load(p["ckpt"], map_location="cuda:1")', 'torch.load(p["ckpt"], map_location="cpu")', {"NPU310"}
    ),
    "map_location_device": Form(
        'torch.load(p["ckpt"], map_location=torch.device("cuda", 0))',
        'torch.load(p["ckpt"], map_location="cpu")',
        {"NPU310"},
    ),
    "map_location_dict": Form(
        'torch.load(p["ckpt"], map_location={"cuda:0": "cuda:1", "cuda:1": "cuda:0"})',
        'torch.load(p["ckpt"], map_location={"cuda:0": "cpu", "cuda:1": "cpu"})',
        {"NPU310"},
    ),
    "map_location_dict_to_cpu": Form(
        'torch.load(p["ckpt"], map_location={"cuda:0": "cpu", "cuda:1": "cpu"})',
        'torch.load(p["ckpt"], map_location={"cuda:0": "cpu", "cuda:1": "cpu"})',
        set(),
    ),
    "map_location_callable": Form(
        'torch.load(p["ckpt"], map_location=lambda storage, loc: storage.cuda())',
        'torch.load(p["ckpt"], map_location=lambda storage, loc: storage)',
        {"NPU301"},
    ),
    "map_location_none": Form('torch.load(p["ckpt"])', 'torch.load(p["ckpt"], map_location="cpu")', set()),
    "map_location_int": Form('torch.load(p["ckpt"], map_location=0)', None, set()),
    # from_pretrained's device_map (accelerate)
    "device_map_str": Form(
        'GPT2LMHeadModel.from_pretrained(p["gpt2"], device_map="cuda", torch_dtype=torch.float16)',
        'GPT2LMHeadModel.from_pretrained(p["gpt2"], device_map="cpu", torch_dtype=torch.float16)',
        {"NPU310"},
    ),
    "device_map_dict": Form(
        'GPT2LMHeadModel.from_pretrained(p["gpt2"], device_map={"": "cuda:0"})',
        'GPT2LMHeadModel.from_pretrained(p["gpt2"], device_map={"": "cpu"})',
        {"NPU310"},
    ),
    "device_map_ordinal": Form(
        'GPT2LMHeadModel.from_pretrained(p["gpt2"], device_map={"": 0})',
        'GPT2LMHeadModel.from_pretrained(p["gpt2"], device_map={"": "cpu"})',
        set(),
    ),
    "device_map_auto": Form(
        'UNet2DConditionModel.from_pretrained(p["unet"], device_map="auto", torch_dtype=torch.float16)',
        'UNet2DConditionModel.from_pretrained(p["unet"], device_map="auto", torch_dtype=torch.float16)',
        set(),
    ),
    "device_map_diffusers": Form(
        'UNet2DConditionModel.from_pretrained(p["unet"], device_map={"": "cuda"})',
        'UNet2DConditionModel.from_pretrained(p["unet"], device_map={"": "cpu"})',
        {"NPU310"},
    ),
    # pin_memory
    "factory_pin_memory": Form("torch.ones(3, pin_memory=True)", "torch.ones(3)", set()),
    "factory_cuda_pin_memory": Form(
        'torch.arange(4, device="cuda", pin_memory=True)', 'torch.arange(4, device="cpu")', {"NPU310"}
    ),
    "data_loader_pin_memory": Form(
        'list(DataLoader(p["data"], batch_size=2, pin_memory=True))', 'list(DataLoader(p["data"], batch_size=2))', set()
    ),
    "data_loader_pin_memory_device": Form(
        'list(DataLoader(p["data"], batch_size=2, pin_memory=True, pin_memory_device="cuda"))',
        'list(DataLoader(p["data"], batch_size=2))',
        {"NPU310"},
    ),
    "tensor_pin_memory": Form("torch.ones(3).pin_memory()", "torch.ones(3)", set()),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader_inputs")
    lora = {"w": torch.arange(6.0).reshape(3, 2), "b": torch.ones(2, dtype=torch.float16)}
    safetensors.torch.save_file(lora, str(root / "lora.safetensors"))
    tensors = {"a": torch.arange(2.0), "b": torch.arange(3.0) * 2}
    tags = {8: "cuda:0", 12: "cuda:1"}  # by storage size: saved as if on two GPUs
    entry = (-1, lambda storage: tags.get(storage.nbytes()), lambda storage, location: None)
    torch.serialization._package_registry.insert(0, entry)
    try:
        torch.save(tensors, str(root / "ckpt.pt"))
    finally:
        torch.serialization._package_registry.remove(entry)
    save_tiny_models(root)
    return {
        "lora": str(root / "lora.safetensors"),
        "lora_bytes": (root / "lora.safetensors").read_bytes(),
        "ckpt": str(root / "ckpt.pt"),
        "gpt2": str(root / "gpt2"),
        "unet": str(root / "unet"),
        "data": TensorDataset(torch.arange(10.0).reshape(5, 2)),
    }


def _probe(folder, name: str, line: str) -> str:
    path = folder / f"{name}.py"
    path.write_text(HEADER.format(line=line))
    return str(path)


def _run(path: str, p: Dict[str, Any]) -> Any:
    try:
        return runpy.run_path(path)["probe"](p)
    except Exception as exc:  # noqa: BLE001 - a failure is an outcome, compared like a value
        return f"{type(exc).__name__}: {exc}"


def _comparable(value: Any) -> Any:
    """Tensors, containers and models as plain data (a model as its state dict), for an exact comparison."""
    if isinstance(value, torch.nn.Module):
        value = value.state_dict()
    if isinstance(value, torch.Tensor):
        return ("tensor", value.device.type, value.dtype, value.tolist())
    if isinstance(value, dict):
        return {key: _comparable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_comparable(item) for item in value]
    return value


@pytest.mark.parametrize("name", sorted(FORMS))
def test_scan_and_run_agree_on_each_loader_form(tmp_path, inputs, name):
    form = FORMS[name]
    path = _probe(tmp_path, name, form.line)
    scanned = {f.code: f.line for f in scan_file(path, False, rules()).findings if f.severity == "handled"}
    assert set(scanned) == form.scan
    assert all(line == LINE for line in scanned.values())

    with redirect_cuda("cpu") as redirect:
        got = _run(path, inputs)
        booked = handled.by_rule([(handled.REDIRECT, redirect.hit_log().snapshot())])
    expected_codes = form.scan if form.run is None else form.run
    assert set(booked) == expected_codes, (booked, redirect)
    for code in booked:
        assert f"{path}:{LINE}" in booked[code]["where"]  # booked at the line scan reports

    if form.cpu is None:  # fails on CUDA too: the same failure with and without npu-port
        assert isinstance(got, str)
        assert got == _run(path, inputs)
        return
    expected = _run(_probe(tmp_path, f"{name}_cpu", form.cpu), inputs)
    assert not isinstance(expected, str), expected
    assert _comparable(got) == _comparable(expected)


def test_the_exceptions_are_the_two_documented_ones():
    exceptions = {name: (form.scan, form.run) for name, form in FORMS.items() if form.run is not None}
    assert exceptions == {
        "load_file_ordinal": (set(), {"NPU310"}),  # a CUDA ordinal, counted where torch reads it
        "load_file_torch_device": ({"NPU310"}, set()),  # safetensors refuses a torch.device on CUDA too
    }


def test_without_npu_port_every_cuda_form_that_scan_reports_fails_or_warns_here(tmp_path, inputs):
    """The forms are real problems: each one scan reports fails on this CPU-only machine without the redirect — or,
    for a DataLoader's ``pin_memory_device`` (which torch 2.7 onwards ignores), warns that it cannot pin."""
    for name, form in FORMS.items():
        if form.scan and form.cpu is not None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                outcome = _run(_probe(tmp_path, name, form.line), inputs)
            warned = any("pin_memory" in str(w.message) for w in caught)
            assert isinstance(outcome, str) or (name.startswith("data_loader") and warned), name


def test_a_checkpoint_saved_on_two_gpus_is_what_the_table_loads(inputs):
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on a CUDA device"):
        torch.load(inputs["ckpt"])
    loaded = torch.load(io.BytesIO(open(inputs["ckpt"], "rb").read()), map_location="cpu")
    assert torch.equal(loaded["a"], torch.arange(2.0)) and torch.equal(loaded["b"], torch.arange(3.0) * 2)
