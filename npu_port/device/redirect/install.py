"""``redirect_cuda``: make CUDA-written code run on another device, for a scope, and undo it exactly.

Unlike torch_npu's ``transfer_to_npu`` (global, at import, irreversible), this patches only when installed, keeps
``torch.cuda.is_available()`` honest unless asked, rewrites device arguments and never other strings, leaves
``torch.jit.script`` alone, and restores every attribute to the identical object. Installs nest: the patches go on
with the first and come off with the last; nested redirects must agree on the target.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

from ...errors import RedirectError
from ...hits import HitLog
from ..detect import DeviceLike, get_device
from . import wrappers
from .cuda_api import cuda_api, nvtx_api
from .ledger import PatchLedger
from .mapping import DeviceMapper

#: torch functions whose ``device=`` keyword may name a CUDA device (those this torch has are patched).
FACTORY_FUNCTIONS = (
    "arange", "as_tensor", "asarray", "bartlett_window", "blackman_window", "empty", "empty_like", "empty_permuted",
    "empty_strided", "eye", "from_file", "full", "full_like", "hamming_window", "hann_window", "kaiser_window",
    "linspace", "logspace", "normal", "ones", "ones_like", "rand", "rand_like", "randint", "randint_like", "randn",
    "randn_like", "randperm", "range", "scalar_tensor", "sparse_compressed_tensor", "sparse_coo_tensor",
    "sparse_csr_tensor", "tensor", "tril_indices", "triu_indices", "zeros", "zeros_like",
)  # fmt: skip
#: Tensor methods whose ``device=`` keyword may name a CUDA device.
TENSOR_FACTORY_METHODS = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros")
#: The hit key counting ``torch.cuda.is_available()`` answering False (unless ``cuda_available=True``).
UNAVAILABLE = "torch.cuda.is_available() -> False"
#: The hit key counting ``torch.load`` calls without ``map_location`` that met CUDA-saved storages (put on the target).
CUDA_SAVED = "torch.load (CUDA-saved storages)"
#: Factories that take no ``pin_memory`` (or refuse pinning on every device: ``from_file``); the others have
#: ``pin_memory=True`` dropped on a cpu target.
NOT_PINNABLE = ("as_tensor", "asarray", "from_file", "range", "new_tensor")
#: The hit key counting ``pin_memory=True`` dropped on a cpu target (factories and ``DataLoader``).
UNPINNED = "pin_memory=True -> False (cpu target)"
#: The hit key counting ``from_pretrained`` device maps put on a cpu target that name no CUDA device (an ordinal, an
#: automatic map).
DEVICE_MAP_ON_CPU = "from_pretrained (ordinal or automatic map -> cpu)"

_lock = threading.RLock()


class _Installed:
    """The one live installation: its ledger, target, options and hits (counts and places, :mod:`npu_port.hits`)."""

    def __init__(self, target: torch.device, cuda_available: bool):
        self.target = target
        self.cuda_available = cuda_available
        self.ledger = PatchLedger()
        self.mapper = DeviceMapper(target.type)
        self.log = HitLog()
        self.depth = 0
        self.loader_hits: Tuple[Any, Any] = (self.log.counter("from_pretrained"), self.log.counter(DEVICE_MAP_ON_CPU))
        self.loaders: List[Any] = []  # the loader classes and modules patched (see :meth:`CudaRedirect.serve_loaders`)


_active: Optional[_Installed] = None


def _plan(state: _Installed) -> List[Tuple[Any, str, Any]]:
    """Every (owner, name, replacement) for ``state.target``; nothing is changed here."""
    import torch.distributed as dist
    import torch.nn.parallel
    import torch.utils.data

    mapper = state.mapper

    def hit(key: str):
        return state.log.counter(key)

    on_cpu = state.target.type == "cpu"

    def unpin(name: str) -> Any:
        return hit(UNPINNED) if on_cpu and name not in NOT_PINNABLE else None

    plan: List[Tuple[Any, str, Any]] = []
    for name in FACTORY_FUNCTIONS:
        if hasattr(torch, name):
            replacement = wrappers.device_keywords(
                getattr(torch, name), mapper, hit(f"torch.{name}"), unpin=unpin(name)
            )
            plan.append((torch, name, replacement))
    for name, position in (("set_default_device", 0), ("get_device_module", 0)):
        plan.append(
            (
                torch,
                name,
                wrappers.device_keywords(getattr(torch, name), mapper, hit(f"torch.{name}"), position=position),
            )
        )
    for owner in (torch, torch.serialization):
        plan.append(
            (owner, "load", wrappers.load(torch.serialization.load, mapper, hit("torch.load"), hit(CUDA_SAVED)))
        )
    plan.append((torch, "Generator", wrappers.generator_proxy(torch.Generator, mapper, hit("torch.Generator"))))

    for name in TENSOR_FACTORY_METHODS:
        original = getattr(torch.Tensor, name)
        plan.append(
            (torch.Tensor, name, wrappers.device_keywords(original, mapper, hit(f"Tensor.{name}"), unpin=unpin(name)))
        )
    plan.append((torch.Tensor, "to", wrappers.to(torch.Tensor.to, mapper, hit("Tensor.to"))))
    plan.append((torch.Tensor, "cuda", wrappers.tensor_cuda(mapper, hit("Tensor.cuda"))))
    if state.target.type == "cpu":
        plan.append((torch.Tensor, "pin_memory", wrappers.pin_memory_on_cpu(hit("Tensor.pin_memory"))))
    plan.append((torch.nn.Module, "to", wrappers.to(torch.nn.Module.to, mapper, hit("Module.to"))))
    plan.append(
        (
            torch.nn.Module,
            "to_empty",
            wrappers.device_keywords(torch.nn.Module.to_empty, mapper, hit("Module.to_empty")),
        )
    )
    plan.append((torch.nn.Module, "cuda", wrappers.module_cuda(mapper, hit("Module.cuda"))))
    storage = next(cls for cls in torch.UntypedStorage.__mro__ if "cuda" in vars(cls))  # torch.storage._StorageBase
    plan.append((storage, "cuda", wrappers.storage_cuda(mapper, hit("Storage.cuda"))))
    loader = torch.utils.data.DataLoader
    plan.append(
        (loader, "__init__", wrappers.data_loader_init(loader.__init__, mapper, hit("DataLoader"), hit(UNPINNED)))
    )
    plan.extend(_loader_patches(state))

    autocast = torch.amp.autocast_mode.autocast
    plan.append(
        (
            autocast,
            "__init__",
            wrappers.init_with_device(
                autocast.__init__, mapper, hit("autocast"), "device_type", cuda_default_dtype=True
            ),
        )
    )
    grad_scaler = getattr(torch.amp, "grad_scaler", None)  # torch >= 2.3; before, torch.cuda.amp's has no device
    if grad_scaler is not None:
        scaler = grad_scaler.GradScaler
        plan.append(
            (
                scaler,
                "__init__",
                wrappers.init_with_device(scaler.__init__, mapper, hit("GradScaler"), "device", cuda_by_default=True),
            )
        )
    plan.append((torch.backends.cuda, "sdp_kernel", wrappers.sdp_kernel(mapper, hit("torch.backends.cuda.sdp_kernel"))))

    for name, function in cuda_api(state.target, mapper).items():
        # classes (Stream, device, the legacy tensor types) stay as they are, for isinstance: not counted
        counted = function if isinstance(function, type) else _counted(function, hit(f"torch.cuda.{name}"))
        plan.append((torch.cuda, name, counted))
    for name, function in nvtx_api().items():
        plan.append((torch.cuda.nvtx, name, _counted(function, hit(f"torch.cuda.nvtx.{name}"))))
    if state.cuda_available:
        plan.append((torch.cuda, "is_available", lambda: True))
        plan.append((torch.Tensor, "is_cuda", property(lambda self: self.device.type in ("cuda", state.target.type))))
    else:
        plan.append((torch.cuda, "is_available", _false_answers_counted(torch.cuda.is_available, hit(UNAVAILABLE))))

    if dist.is_available():
        import torch.distributed.distributed_c10d as c10d

        for owner in (dist, c10d):
            plan.append(
                (
                    owner,
                    "init_process_group",
                    wrappers.process_group_backend(c10d.init_process_group, mapper, hit("init_process_group"), 0),
                )
            )
            plan.append(
                (owner, "new_group", wrappers.process_group_backend(c10d.new_group, mapper, hit("new_group"), None))
            )
        ddp = torch.nn.parallel.DistributedDataParallel
        plan.append((ddp, "__init__", wrappers.ddp_init(ddp.__init__, mapper, hit("DistributedDataParallel"))))
    return plan


def _loader_patches(state: _Installed) -> List[Tuple[Any, str, Any]]:
    """``from_pretrained`` of the transformers / diffusers loader classes, and safetensors' ``load_file``, imported
    so far and not yet patched."""
    from ...upstream.loaders import imported_device_functions, imported_loaders

    found = [cls for cls in imported_loaders() if cls not in state.loaders]
    state.loaders.extend(found)
    plan: List[Tuple[Any, str, Any]] = [
        (
            cls,
            "from_pretrained",
            wrappers.from_pretrained(vars(cls)["from_pretrained"], state.mapper, *state.loader_hits),
        )
        for cls in found
    ]
    for module, name, position in imported_device_functions():
        if module in state.loaders:
            continue
        state.loaders.append(module)
        original = getattr(module, name)
        hit = state.log.counter(name)
        plan.append((module, name, wrappers.device_name_or_ordinal(original, state.mapper, hit, position)))
    return plan


def _cache_device_constructors() -> None:
    """Fill torch's cached set of factory functions with the originals before any is wrapped.

    ``with torch.device("meta"):`` (how transformers and accelerate build models before loading weights) recognises
    factory calls by identity against ``torch.utils._device._device_constructors()``, an ``lru_cache``. Filled while
    our wrappers are in place, it would hold the wrappers, and every factory call inside such a context would be
    created on the default device instead — uninitialised buffers in loaded models. torch_npu's transfer_to_npu
    does the same at import.
    """
    try:
        from torch.utils._device import _device_constructors
    except ImportError:  # an older or newer torch without it: nothing to protect
        return
    _device_constructors()


def _false_answers_counted(is_available: Any, hit: Any) -> Any:
    """``torch.cuda.is_available``, still honest, counting its False answers: when a script then stops, npu-port run
    can say it probably refused to run without CUDA, and suggest ``--cuda-available``."""

    def counted() -> bool:
        answer = is_available()
        if not answer:
            hit()
        return answer

    counted.__name__ = counted.__qualname__ = "is_available"
    counted.__doc__ = is_available.__doc__
    counted.__wrapped__ = is_available
    return counted


def _counted(function: Any, hit: Any) -> Any:
    """Count calls of a ``torch.cuda`` replacement (a function: classes are kept as they are)."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        hit()
        return function(*args, **kwargs)

    counted.__name__ = counted.__qualname__ = getattr(function, "__name__", "redirected")
    counted.__doc__ = getattr(function, "__doc__", None)
    counted.__wrapped__ = function
    return counted


class CudaRedirect:
    """A scoped redirect of CUDA-written code to ``target``: a context manager, or ``install()`` / ``uninstall()``.

    ``target`` defaults to :func:`npu_port.get_device`. ``cuda_available=True`` makes ``torch.cuda.is_available()``
    (and ``Tensor.is_cuda`` for tensors on the target) answer True, for code that refuses to run otherwise; by
    default they stay honest. A cuda target changes nothing.
    """

    def __init__(self, target: DeviceLike = None, *, cuda_available: bool = False):
        if not isinstance(cuda_available, bool):  # bool("no") is True: a string would switch it on
            raise TypeError(
                f"cuda_available must be True or False, got {type(cuda_available).__name__} {cuda_available!r}"
            )
        self.target = get_device(target)
        self.cuda_available = cuda_available
        self._installs = 0

    @property
    def installed(self) -> bool:
        return self._installs > 0

    def install(self) -> "CudaRedirect":
        global _active
        with _lock:
            if self.target.type == "cuda":
                self._installs += 1
                return self
            if _active is not None:
                active, wanted = _active, self
                if (active.target.type, active.cuda_available) != (wanted.target.type, wanted.cuda_available):
                    raise RedirectError(
                        f"a cuda redirect to {active.target.type} (cuda_available={active.cuda_available}) is already "
                        f"installed; a nested redirect must use the same target and options, got {wanted.target.type} "
                        f"(cuda_available={wanted.cuda_available})"
                    )
            else:
                _cache_device_constructors()
                state = _Installed(self.target, self.cuda_available)
                try:
                    for owner, name, replacement in _plan(state):
                        state.ledger.replace(owner, name, replacement)
                except BaseException:
                    state.mapper.live = False
                    state.ledger.restore()
                    raise
                _active = state
            _active.depth += 1
            self._installs += 1
            return self

    def uninstall(self) -> bool:
        """Undo one :meth:`install` of this object; the last one out restores every patched attribute.

        Returns False (and changes nothing) when this object has nothing installed.
        """
        global _active
        with _lock:
            if self._installs == 0:
                return False
            self._installs -= 1
            if self.target.type == "cuda":
                return True
            _active.depth -= 1
            if _active.depth == 0:
                _active.mapper.live = False
                _active.ledger.restore()
                _active = None
            return True

    def serve_loaders(self) -> int:
        """Take the transformers / diffusers loader classes imported since the install (``npu-port run`` calls this
        as their modules are imported); how many were new. Their ``from_pretrained`` gets its ``device_map`` on the
        target; uninstalling restores them with everything else."""
        with _lock:
            if not self.installed or _active is None:
                return 0
            patches = _loader_patches(_active)
            for owner, name, replacement in patches:
                _active.ledger.replace(owner, name, replacement)
            return len(patches)

    def hits(self) -> Dict[str, int]:
        """How often each redirected entry point rewrote a call (empty once uninstalled)."""
        return dict(_active.log.counts) if _active is not None and self.installed else {}

    def hit_log(self) -> Optional[HitLog]:
        """The hits with their first places (what ``npu-port run --report`` lists by rule); None once uninstalled
        (and for a cuda target, which redirects nothing)."""
        return _active.log if _active is not None and self.installed else None

    def __enter__(self) -> "CudaRedirect":
        return self.install()

    def __exit__(self, *exc_info: Any) -> None:
        self.uninstall()

    def __repr__(self) -> str:
        state = "installed" if self.installed else "not installed"
        return f"CudaRedirect(target={str(self.target)!r}, cuda_available={self.cuda_available}, {state})"


def redirect_cuda(target: DeviceLike = None, *, cuda_available: bool = False) -> CudaRedirect:
    """A :class:`CudaRedirect` to ``target`` (not yet installed: use ``with`` or ``.install()``)."""
    return CudaRedirect(target, cuda_available=cuda_available)


def active_target() -> Optional[torch.device]:
    """The device CUDA calls are redirected to right now, or None."""
    return _active.target if _active is not None else None


def patched_attributes() -> List[Tuple[Any, str]]:
    """``(owner, name)`` of everything currently patched (for tests and ``npu-port run``'s summary)."""
    return [(patch.owner, patch.name) for patch in _active.ledger.patches] if _active is not None else []
