"""``from_pretrained(..., device_map=..., torch_dtype=...)`` of transformers and diffusers models under the cuda
redirect: tiny models saved to a temporary folder, loaded with each CUDA-written device map on a cpu target, must
do exactly what the same call written for the cpu does — the same weights in the same dtype (float16 stays float16),
or, where the installed library refuses that map (diffusers before 0.15 takes no device name), the same error.

On an npu target the wrapper is given a recording ``from_pretrained`` and the arguments that reach it are checked:
CUDA names become npu names, ordinals and automatic maps are the npu's own and stay."""

from __future__ import annotations

import threading
from typing import Any, Dict, List

import pytest
import torch
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DConditionModel, UNet2DModel
from transformers import GPT2LMHeadModel

from npu_port.device.redirect import install, patched_attributes, redirect_cuda, wrappers
from npu_port.device.redirect.install import DEVICE_MAP_ON_CPU
from npu_port.device.redirect.mapping import DeviceMapper
from npu_port.upstream import loaders

from ..loader_models import save_tiny_models

pytestmark = pytest.mark.filterwarnings("ignore:`torch_dtype` is deprecated:FutureWarning")


@pytest.fixture(autouse=True)
def _no_redirect_left_behind():
    assert patched_attributes() == []
    yield
    assert patched_attributes() == [], "a test left the redirect installed"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny GPT-2, a tiny conditional UNet (which supports ``device_map="auto"`` in every diffusers release) and a
    tiny DDPM pipeline (a pipeline's device map)."""
    root = tmp_path_factory.mktemp("tiny_models")
    save_tiny_models(root)
    unet = UNet2DModel(
        sample_size=8,
        block_out_channels=(8, 16),
        layers_per_block=1,
        norm_num_groups=8,
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
    )
    DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=10)).save_pretrained(root / "pipeline")
    return {
        "transformers": (GPT2LMHeadModel, str(root / "gpt2")),
        "diffusers": (UNet2DConditionModel, str(root / "unet")),
        "pipeline": (DDPMPipeline, str(root / "pipeline")),
    }


#: Each CUDA-written device map, with the same map written for the cpu, and the hit kind it counts on a cpu target.
DEVICE_MAPS = {
    "cuda": ("cuda", "cpu", "from_pretrained"),
    "cuda_indexed": ("cuda:0", "cpu", "from_pretrained"),
    "torch_device": (torch.device("cuda"), torch.device("cpu"), "from_pretrained"),
    "dict_cuda": ({"": "cuda:0"}, {"": "cpu"}, "from_pretrained"),
    "dict_ordinal": ({"": 0}, {"": "cpu"}, DEVICE_MAP_ON_CPU),
    "ordinal": (0, "cpu", DEVICE_MAP_ON_CPU),
    "auto": ("auto", "auto", DEVICE_MAP_ON_CPU),
    "balanced": ("balanced", "balanced", DEVICE_MAP_ON_CPU),
}


def _outcome(cls, path: str, **kwargs) -> Dict[str, Any]:
    try:
        model = cls.from_pretrained(path, **kwargs)
    except Exception as exc:  # noqa: BLE001 - compared with what the cpu-written call gives, whatever it is
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    state = (model.unet if isinstance(model, DDPMPipeline) else model).state_dict()
    return {
        "devices": {tensor.device.type for tensor in state.values()},
        "dtypes": {tensor.dtype for tensor in state.values()},
        "state": state,
    }


def _assert_same(got: Dict[str, Any], expected: Dict[str, Any]) -> None:
    assert got.keys() == expected.keys(), (got.get("error"), expected.get("error"))
    if "error" in expected:
        assert got["error"] == expected["error"]
        return
    assert got["devices"] == expected["devices"] == {"cpu"}
    assert got["dtypes"] == expected["dtypes"]
    assert got["state"].keys() == expected["state"].keys()
    for name, tensor in expected["state"].items():
        assert torch.equal(got["state"][name], tensor), name


@pytest.mark.parametrize("dtype", [None, torch.float16], ids=["default_dtype", "float16"])
@pytest.mark.parametrize("library", ["transformers", "diffusers", "pipeline"])
@pytest.mark.parametrize("form", sorted(DEVICE_MAPS))
def test_a_cuda_device_map_loads_as_the_cpu_written_map_does(saved, library, form, dtype):
    cls, path = saved[library]
    cuda_map, cpu_map, kind = DEVICE_MAPS[form]
    extra = {} if dtype is None else {"torch_dtype": dtype}
    expected = _outcome(cls, path, device_map=cpu_map, **extra)
    with redirect_cuda("cpu") as redirect:
        got = _outcome(cls, path, device_map=cuda_map, **extra)
        hits = redirect.hits()
    _assert_same(got, expected)
    if dtype is not None and "error" not in expected:
        assert got["dtypes"] == {torch.float16}  # what was asked, not the cpu's usual float32
    assert hits.get(kind) == 1
    assert hits.get({"from_pretrained": DEVICE_MAP_ON_CPU}.get(kind, "from_pretrained")) is None


def test_the_loaders_are_found_once_imported_and_restored_exactly(saved):
    found = loaders.imported_loaders()
    assert [cls.__name__ for cls in found] == ["PreTrainedModel", "ModelMixin", "DiffusionPipeline"]
    assert issubclass(GPT2LMHeadModel, found[0]) and issubclass(UNet2DConditionModel, found[1])
    before = {cls: vars(cls)["from_pretrained"] for cls in found}
    with redirect_cuda("cpu"):
        for cls in found:
            assert vars(cls)["from_pretrained"] is not before[cls]
    assert {cls: vars(cls)["from_pretrained"] for cls in found} == before
    assert all(vars(cls)["from_pretrained"] is before[cls] for cls in found)


def test_a_loader_imported_after_the_install_is_served_by_serve_loaders(monkeypatch):
    """What ``npu-port run`` does as transformers' or diffusers' module is imported after the redirect went in."""
    calls: List[Any] = []

    class LateLoader:
        @classmethod
        def from_pretrained(cls, path, **kwargs):
            calls.append((cls, path, kwargs))
            return "model"

    class Module:
        pass

    module = Module()
    module.LateLoader = LateLoader
    original = vars(LateLoader)["from_pretrained"]
    monkeypatch.setattr(loaders, "LOADERS", (("tests_late_loader_module", "LateLoader"),))
    with redirect_cuda("cpu") as redirect:
        assert redirect.serve_loaders() == 0  # not imported yet
        monkeypatch.setitem(__import__("sys").modules, "tests_late_loader_module", module)
        assert redirect.serve_loaders() == 1 and redirect.serve_loaders() == 0
        assert LateLoader.from_pretrained("p", device_map="cuda:1", torch_dtype=torch.float16) == "model"
        assert redirect.hits() == {"from_pretrained": 1}
    assert vars(LateLoader)["from_pretrained"] is original
    assert calls == [(LateLoader, "p", {"device_map": "cpu", "torch_dtype": torch.float16})]
    assert redirect.serve_loaders() == 0  # uninstalled: nothing to serve


def test_on_an_npu_target_cuda_names_become_npu_names_and_the_rest_passes_through():
    calls: List[Any] = []

    def record(cls, path, **kwargs):
        calls.append(kwargs)
        return cls

    log: List[str] = []
    load = wrappers.from_pretrained(
        classmethod(record), DeviceMapper("npu"), lambda: log.append("cuda"), lambda: log.append("cpu")
    ).__get__(None, object)
    for device_map in ("cuda", "cuda:1", {"": "cuda:0", "lm_head": "cpu"}, {"": 0}, 1, "auto", "balanced", "cpu"):
        load("p", device_map=device_map, torch_dtype=torch.float16)
    load("p")
    assert [call.get("device_map") for call in calls] == [
        "npu", "npu:1", {"": "npu:0", "lm_head": "cpu"}, {"": 0}, 1, "auto", "balanced", "cpu", None
    ]  # fmt: skip
    assert all(call.get("torch_dtype") is torch.float16 for call in calls[:-1]) and "max_memory" not in str(calls)
    assert log == ["cuda", "cuda", "cuda"]


def test_an_automatic_map_sees_no_cuda_device_on_its_own_thread_only():
    """While accelerate computes an automatic map for a cpu target, torch.cuda.device_count() answers 0 on that
    thread (a machine without CUDA), and the cpu's 1 everywhere else and afterwards."""
    seen: Dict[str, int] = {}
    inside, release = threading.Event(), threading.Event()

    def record(cls, path, **kwargs):
        seen["inside"] = torch.cuda.device_count()
        inside.set()
        release.wait(10)
        return kwargs

    with redirect_cuda("cpu") as redirect:
        mapper = install._active.mapper  # the one the installed torch.cuda.device_count reads
        load = wrappers.from_pretrained(classmethod(record), mapper, lambda: None, lambda: None).__get__(None, object)
        worker = threading.Thread(target=lambda: seen.setdefault("result", load("p", device_map="auto")))
        worker.start()
        assert inside.wait(10)
        seen["other_thread"] = torch.cuda.device_count()
        release.set()
        worker.join(10)
        seen["after"] = torch.cuda.device_count()
        assert redirect.hits()["torch.cuda.device_count"] == 3
    assert seen == {"inside": 0, "other_thread": 1, "after": 1, "result": {"device_map": "auto"}}
