"""Wrappers that rewrite CUDA device arguments in known positions and then call the original unchanged.

Each wrapper is as thin as possible: a call without a CUDA device argument pays one type check and goes straight
to the original, so a training loop under the redirect runs at the speed of the same loop written for the target.
``hit()`` counts the calls that were rewritten (``npu-port run`` reports them).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, List, Optional

import torch

from .mapping import DeviceMapper

Hit = Callable[[], None]


def device_keywords(
    original: Callable,
    mapper: DeviceMapper,
    hit: Hit,
    keyword: str = "device",
    position: Optional[int] = None,
    unpin: Optional[Hit] = None,
):
    """A factory function (``torch.zeros``...) whose ``keyword`` (or argument ``position``) may name a CUDA device.

    ``unpin`` (a cpu target, a factory that takes ``pin_memory``): ``pin_memory=True`` becomes False, counted by
    ``unpin``. Pinned memory only speeds copies to an accelerator, and torch refuses it where there is none —
    safetensors stages every CUDA load through ``torch.empty(..., pin_memory=True)``. The tensor is the same tensor,
    only not page-locked (``is_pinned()`` is False, as it is for every cpu tensor)."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            if unpin is not None and kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
                unpin()
            value = kwargs.get(keyword)
            if value is not None:
                mapped = mapper.device(value)
                if mapped is not value:
                    kwargs[keyword] = mapped
                    hit()
        if position is not None and len(args) > position:
            value = args[position]
            mapped = mapper.device(value)
            if mapped is not value:
                args = args[:position] + (mapped,) + args[position + 1 :]
                hit()
        return original(*args, **kwargs)

    return wrapper


def device_name_or_ordinal(original: Callable, mapper: DeviceMapper, hit: Hit, position: int, keyword: str = "device"):
    """A loader whose ``device`` is a name or an ordinal only (safetensors' ``load_file``): those are mapped, at the
    call the caller wrote; anything else (a ``torch.device``, which safetensors refuses on CUDA too) goes through
    as it is, so the loader's own error is the one raised."""

    def mapped(value: Any) -> Any:
        return mapper.device(value) if type(value) in (str, int) else value

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if keyword in kwargs:
            value = kwargs[keyword]
            kwargs[keyword] = new = mapped(value)
            if new is not value:
                hit()
        elif len(args) > position:
            value = args[position]
            new = mapped(value)
            if new is not value:
                args = args[:position] + (new,) + args[position + 1 :]
                hit()
        return original(*args, **kwargs)

    return wrapper


def load(original: Callable, mapper: DeviceMapper, hit: Hit, hit_saved: Optional[Hit] = None):
    """``torch.load``: only ``map_location`` is looked at, never the file name; CUDA storages land on the target.

    ``hit`` counts a ``map_location`` naming a CUDA device, rewritten; ``hit_saved`` a call whose ``map_location``
    said nothing about the CUDA-saved storages it met (None, a dict without their tag, a callable returning None;
    counted apart: no CUDA was written in that call, and most checkpoints hold none). A ``.safetensors`` path, which
    torch hands to safetensors with a device name, gets only its device mapped."""

    @functools.wraps(original)
    def wrapper(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if map_location is None or isinstance(map_location, dict) or callable(map_location):
            if _safetensors_path(f):  # torch refuses a dict or a callable there itself; None means "cpu"
                return original(f, map_location, *args, **kwargs)
            met: List[str] = []
            mapped = mapper.map_location(map_location, met.append)
            if isinstance(map_location, dict) and mapped != map_location:
                hit()
            result = original(f, mapped, *args, **kwargs)
            if met and hit_saved is not None:
                hit_saved()
            return result
        mapped = mapper.map_location(map_location)
        if mapped is not map_location:
            hit()
        return original(f, mapped, *args, **kwargs)

    return wrapper


def _safetensors_path(f: Any) -> bool:
    """What ``torch.load`` (2.9 onwards) passes to ``safetensors.torch.load_file``: a path ending ``.safetensors``."""
    if not isinstance(f, (str, os.PathLike)):
        return False
    path = os.fspath(f)
    return isinstance(path, str) and path.endswith(".safetensors")


def to(original: Callable, mapper: DeviceMapper, hit: Hit):
    """``Tensor.to`` / ``Module.to``: the first positional argument or ``device=`` may be a CUDA device or ordinal."""

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            first = args[0]
            kind = type(first)
            if kind is str or kind is torch.device or kind is int:
                mapped = mapper.device(first)
                if mapped is not first:
                    args = (mapped,) + args[1:]
                    hit()
        if kwargs:
            value = kwargs.get("device")
            if value is not None:
                mapped = mapper.device(value)
                if mapped is not value:
                    kwargs["device"] = mapped
                    hit()
        return original(self, *args, **kwargs)

    return wrapper


def tensor_cuda(mapper: DeviceMapper, hit: Hit):
    """``Tensor.cuda(device=None, non_blocking=False, memory_format=...)`` -> ``Tensor.to(<target>)``."""

    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, memory_format=torch.preserve_format):
        hit()
        target = mapper.target if device is None else mapper.device(device)  # None: the current device, as CUDA
        return self.to(target, non_blocking=non_blocking, memory_format=memory_format)

    cuda.__doc__ = f"Tensor.cuda redirected by npu-port to {mapper.target}."
    return cuda


def pin_memory_on_cpu(hit: Hit):
    """``Tensor.pin_memory()`` with a cpu target: pinning only speeds host-to-device copies, and there are none."""

    def pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
        hit()
        return self

    pin_memory.__doc__ = pin_memory_on_cpu.__doc__
    return pin_memory


def storage_cuda(mapper: DeviceMapper, hit: Hit):
    """``storage.cuda(device=None, non_blocking=False)`` -> ``storage.to(device=<target>)``: what
    ``torch.load(..., map_location=lambda storage, loc: storage.cuda())`` calls (a typed storage's ``cuda`` calls its
    untyped storage's, counted once)."""

    def cuda(self: Any, device: Any = None, non_blocking: bool = False) -> Any:
        hit()
        target = mapper.target if device is None else mapper.device(device)
        return self.to(device=target, non_blocking=non_blocking)

    cuda.__doc__ = f"storage.cuda redirected by npu-port to {mapper.target}."
    return cuda


#: Where ``DataLoader.__init__`` takes ``pin_memory`` positionally (after ``dataset, batch_size, shuffle, sampler,
#: batch_sampler, num_workers, collate_fn``: the same in every torch release).
_PIN_MEMORY_POSITION = 7


def data_loader_init(original: Callable, mapper: DeviceMapper, hit: Hit, unpin: Hit):
    """``DataLoader(..., pin_memory=True, pin_memory_device="cuda")``: a CUDA ``pin_memory_device`` goes to the
    target (``hit``); a cpu target, which has nothing to pin for, loads unpinned (``unpin``) — the same batches,
    without torch's warnings that no accelerator was found and that ``pin_memory_device`` is ignored."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs:
            device = kwargs.get("pin_memory_device")
            if device and mapper.is_cuda(device):  # a cpu target takes the default, "" (nothing is pinned)
                kwargs["pin_memory_device"] = mapper.device(device, ints=False) if mapper.indexed else ""
                hit()
            if not mapper.indexed and kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
                unpin()
        if not mapper.indexed and len(args) > _PIN_MEMORY_POSITION and args[_PIN_MEMORY_POSITION]:
            args = args[:_PIN_MEMORY_POSITION] + (False,) + args[_PIN_MEMORY_POSITION + 1 :]
            unpin()
        return original(self, *args, **kwargs)

    return __init__


#: ``device_map`` values with which accelerate places the weights itself, from each device's free memory.
AUTOMATIC_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def from_pretrained(original: Any, mapper: DeviceMapper, hit: Hit, hit_cpu: Hit):
    """``from_pretrained(..., device_map=...)`` of transformers' and diffusers' loaders (``original``: the
    classmethod object itself): the map is given to the library already on the target
    (:meth:`DeviceMapper.device_map`), so it takes its own path for that device from the start; ``hit`` counts a
    CUDA device named in it.

    On a cpu target an ordinal (``{"": 0}``, ``{"": local_rank}``) becomes ``"cpu"``, and an automatic map is
    computed as on a machine without CUDA: accelerate counts devices with ``torch.cuda.device_count()``, which the
    redirect answers with the cpu's 1, and would place weights on ordinal 0; during the call, on this thread, it
    answers 0. Both are counted by ``hit_cpu``. ``torch_dtype`` and every other argument pass through unchanged."""
    function = original.__func__

    @functools.wraps(function)
    def wrapper(cls: Any, *args: Any, **kwargs: Any) -> Any:
        device_map = kwargs.get("device_map")
        if device_map is None:
            return function(cls, *args, **kwargs)
        if type(device_map) is str and device_map in AUTOMATIC_MAPS:
            if mapper.indexed or mapper.counts_no_cuda_devices():  # an npu's devices are its own; a pipeline's
                return function(cls, *args, **kwargs)  # components, loaded inside its call, are counted with it
            hit_cpu()
            with mapper.without_cuda_devices():
                return function(cls, *args, **kwargs)
        mapped = mapper.device_map(device_map)
        if mapped is not device_map:
            kwargs["device_map"] = mapped
            (hit if _names_cuda(mapper, device_map) else hit_cpu)()
        return function(cls, *args, **kwargs)

    return classmethod(wrapper)


def _names_cuda(mapper: DeviceMapper, device_map: Any) -> bool:
    values = device_map.values() if isinstance(device_map, dict) else (device_map,)
    return any(mapper.is_cuda(value) for value in values)


def module_cuda(mapper: DeviceMapper, hit: Hit):
    """``Module.cuda(device=None)`` -> ``Module.to(<target>)``."""

    def cuda(self: torch.nn.Module, device: Any = None) -> torch.nn.Module:
        hit()
        return self.to(mapper.target if device is None else mapper.device(device))

    cuda.__doc__ = f"Module.cuda redirected by npu-port to {mapper.target}."
    return cuda


def init_with_device(
    original: Callable,
    mapper: DeviceMapper,
    hit: Hit,
    parameter: str,
    *,
    cuda_default_dtype: bool = False,
    cuda_by_default: bool = False,
):
    """``__init__`` of autocast / GradScaler: the device-type argument (first positional or ``parameter=``).

    ``GradScaler()`` means CUDA when no device is given (``cuda_by_default``), so that case is mapped too.
    CUDA autocast defaults to float16; when a CUDA autocast is redirected, that default is kept explicitly, so the
    computation is the one the code asked for rather than the target's own default (bfloat16 on cpu). Once the
    redirect is uninstalled it passes through: safe math may have wrapped it and still call it.
    """

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if not mapper.live:  # uninstalled, but still called by a patch made on top of ours (safe math's)
            return original(self, *args, **kwargs)
        if args and type(args[0]) is str and args[0] == "cuda":
            args = (mapper.target,) + args[1:]
        elif kwargs.get(parameter) == "cuda" or (cuda_by_default and not args and parameter not in kwargs):
            kwargs[parameter] = mapper.target
        else:
            return original(self, *args, **kwargs)
        hit()
        if cuda_default_dtype and len(args) < 2 and kwargs.get("dtype") is None:
            kwargs["dtype"] = torch.float16
        return original(self, *args, **kwargs)

    return __init__


class _GeneratorMeta(type):
    """Keeps ``isinstance(g, torch.Generator)`` true for real generators while torch.Generator is the proxy."""

    original: type

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, cls.original)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, cls.original)


def generator_proxy(original: type, mapper: DeviceMapper, hit: Hit) -> type:
    """``torch.Generator("cuda")`` makes a generator on the target; the objects made are real torch.Generators."""

    class Generator(metaclass=_GeneratorMeta):
        def __new__(cls, device: Any = "cpu"):
            mapped = mapper.device(device)
            if mapped is not device:
                hit()
            return original(mapped)

    Generator.original = original
    Generator.__doc__ = original.__doc__
    Generator.__module__ = "torch"
    return Generator


def sdp_kernel(mapper: DeviceMapper, hit: Hit):
    """``torch.backends.cuda.sdp_kernel(enable_flash=..., ...)`` -> ``torch.nn.attention.sdpa_kernel([...])``.

    On a target that implements neither flash nor math SDPA backends requested, math is added: the result is the
    same attention, where the CUDA-only selection would leave no kernel at all.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def redirected(
        enable_flash: bool = True,
        enable_math: bool = True,
        enable_mem_efficient: bool = True,
        enable_cudnn: bool = True,
    ):
        hit()
        chosen = [
            backend
            for backend, enabled in (
                (SDPBackend.FLASH_ATTENTION, enable_flash),
                (SDPBackend.EFFICIENT_ATTENTION, enable_mem_efficient),
                (SDPBackend.MATH, enable_math),
                (SDPBackend.CUDNN_ATTENTION, enable_cudnn),
            )
            if enabled
        ]
        if mapper.target == "cpu" and not {SDPBackend.FLASH_ATTENTION, SDPBackend.MATH} & set(chosen):
            chosen.append(SDPBackend.MATH)
        return sdpa_kernel(chosen)

    redirected.__doc__ = "torch.backends.cuda.sdp_kernel redirected by npu-port to torch.nn.attention.sdpa_kernel."
    return redirected


def process_group_backend(original: Callable, mapper: DeviceMapper, hit: Hit, position: Optional[int]):
    """``init_process_group`` / ``new_group``: ``nccl`` becomes the target's backend; ``device_id`` is mapped."""
    from ..distributed import map_backend

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if position is not None and len(args) > position:
            mapped = map_backend(args[position], mapper.target)
            if mapped != args[position]:
                args = args[:position] + (mapped,) + args[position + 1 :]
                hit()
        if kwargs.get("backend") is not None:
            mapped = map_backend(kwargs["backend"], mapper.target)
            if mapped != kwargs["backend"]:
                kwargs["backend"] = mapped
                hit()
        device_id = kwargs.get("device_id")
        if device_id is not None and mapper.target == "cpu":
            kwargs["device_id"] = None  # gloo binds no device
        elif device_id is not None:
            kwargs["device_id"] = torch.device(mapper.device(device_id))
        return original(*args, **kwargs)

    return wrapper


def ddp_init(original: Callable, mapper: DeviceMapper, hit: Hit):
    """``DistributedDataParallel(module, device_ids=[rank])``: a cpu module takes no device ids; npu keeps them."""

    @functools.wraps(original)
    def __init__(self: Any, module: Any, device_ids: Any = None, output_device: Any = None, *args: Any, **kwargs: Any):
        if device_ids is not None or output_device is not None:
            hit()
            if mapper.target == "cpu":
                device_ids, output_device = None, None
            else:
                device_ids = [mapper.device(d) for d in device_ids] if device_ids is not None else None
                output_device = mapper.device(output_device) if output_device is not None else None
        return original(self, module, device_ids, output_device, *args, **kwargs)

    return __init__
