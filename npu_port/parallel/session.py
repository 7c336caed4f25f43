"""This process's part in a multi-device generation, and the switch that makes a diffusers pipeline use it.

``start()`` joins the process group that torchrun (or ``npu-port infer --nproc``) set up — the device's own backend
(hccl, nccl, gloo), one device per rank (``LOCAL_RANK``) — and builds one device mesh ("cfg", "ring", "ulysses").
``parallelize(pipe)`` then, with diffusers' own machinery:

* context parallelism: npu-port's attention backend (:mod:`.backend`) on every processor, then
  ``enable_parallelism(ContextParallelConfig(...))`` with the mesh's ("ring", "ulysses") part, so the model's
  ``_cp_plan`` hooks split and gather the sequence; a check before each split says which input cannot be split;
* CFG parallelism: the hook of :mod:`.cfg` on the denoiser, over the mesh's "cfg" dimension.

Everything is undone by the handle's ``restore()``: hooks removed, processors' backends and parallel configs back,
the backend unregistered from diffusers when its last user goes.

    session = npu_port.parallel.start(ulysses=2, ring=1, cfg_parallel=True)     # under torchrun --nproc-per-node 4
    handle = session.parallelize(pipe)
    image = pipe(prompt, generator=torch.Generator("cpu").manual_seed(0)).images[0]
    if session.is_main: image.save("out.png")
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional

import torch

from .. import _patching
from ..device import get_device
from ..device.distributed import default_backend
from ..errors import ParallelError
from ..upstream.diffusers import parallel as upstream
from .launch import put_back_environment, set_environment
from .layout import ParallelLayout, check_heads, check_plan, check_sequence, require

#: How long a collective may wait: the first step on an NPU compiles graphs for minutes, and a rank that is still
#: compiling must not be taken for a dead one (HCCL's own timeouts are set by the launcher, see .launch).
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ParallelError(f"environment variable {name}={value!r} is not a whole number") from None


def _rank_device(device_type: str, local_rank: int) -> torch.device:
    """One device per rank: ``LOCAL_RANK`` on an accelerator (set as the current device), the cpu otherwise."""
    if device_type == "cpu":
        return torch.device("cpu")
    device = torch.device(device_type, local_rank)
    module = getattr(torch, device_type, None)
    if module is not None and hasattr(module, "set_device"):
        module.set_device(device)
    return device


@dataclass
class ParallelSession:
    """This rank in a layout: its device, the mesh, and whether it created the process group (then ``close`` ends
    it)."""

    layout: ParallelLayout
    device: torch.device
    rank: int
    world: int
    mesh: Any
    owns_group: bool = False
    handles: List["ParallelHandle"] = field(default_factory=list)
    environment: dict = field(default_factory=dict)  # variables start() set for a world of one, with what was there
    closed: bool = False  # close() ran: a second one has no groups left to end

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes files and prints."""
        return self.rank == 0

    @property
    def cfg_rank(self) -> int:
        return self.mesh.get_local_rank("cfg")

    def parallelize(self, target: Any, *, cfg_mode: str = "auto", anything: bool = False) -> "ParallelHandle":
        """Make ``target`` (a pipeline with a ``transformer`` or ``unet``, or the model itself) run on this layout;
        undo with the handle's ``restore()``. ``anything``: diffusers' ``ulysses_anything`` (any head count)."""
        require(self.layout, anything)
        denoisers = _denoisers(target)
        if anything and self.layout.ring > 1:
            raise ParallelError(
                "ulysses_anything works with ring 1 only (diffusers' rule); give ring=1 or anything=False"
            )
        handle = ParallelHandle()
        try:
            for denoiser in denoisers:  # Wan 2.2 has two (high- and low-noise): both are split
                if self.layout.context_parallel:
                    _enable_context_parallel(denoiser, self, anything, handle)
            if self.layout.cfg:
                from .cfg import HOOK_NAME, guidance_mode, make_hook

                if denoisers == [target] and cfg_mode == "auto":
                    raise ParallelError("CFG parallel on a bare model: pass cfg_mode='batch' or 'alternate'")
                mode = guidance_mode(target, cfg_mode)
                for denoiser in denoisers:
                    hook = make_hook(mode, self.mesh.get_group("cfg"), self.cfg_rank)
                    _register_hook(denoiser, hook, HOOK_NAME, handle)
                    handle.cfgs.append(hook.split)
                    if hook.declined is not None and hook.declined not in handle.declines:
                        handle.declines.append(hook.declined)
        except BaseException:
            handle.restore()
            raise
        self.handles.append(handle)
        return handle

    def close(self) -> None:
        """Undo every ``parallelize`` and end the process group if this session started it, else the mesh's own
        subgroups (idempotent)."""
        for handle in reversed(self.handles):
            handle.restore()
        self.handles.clear()
        import torch.distributed as dist

        if self.closed or not dist.is_initialized():
            put_back_environment(self.environment)  # the caller may have ended the group itself
            self.environment = {}
            return
        self.closed = True
        if self.owns_group:
            dist.destroy_process_group()
            self.owns_group = False
        else:  # the caller's group stays; the mesh's own subgroups go (on HCCL each holds a communicator)
            for group in {id(g): g for g in self.mesh.get_all_groups()}.values():
                if group is not dist.group.WORLD:
                    dist.destroy_process_group(group)
        put_back_environment(self.environment)
        self.environment = {}


class ParallelHandle:
    """What one ``parallelize`` changed, undone in reverse by ``restore()`` (idempotent)."""

    def __init__(self) -> None:
        self._undo: List[Callable[[], None]] = []
        self._tracked: dict = {}  # id(module) -> (module, had a hook registry, had an instance forward)
        self.cfgs: List[Any] = []  # each denoiser's CFG split (its exchange count), when CFG parallelism is on
        #: what diffusers lacked and was done without (npu_port.upstream.Decline): CFG's calls told apart by order
        self.declines: List[Any] = []

    @property
    def cfg(self) -> Any:
        """The (first) denoiser's CFG split, or None."""
        return self.cfgs[0] if self.cfgs else None

    def on_restore(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def track(self, module: torch.nn.Module) -> None:
        """Remember whether ``module`` had a diffusers hook registry and its own ``forward`` before we hooked it:
        diffusers' ``remove_hook`` leaves an empty registry and an instance ``forward`` behind, which ``restore``
        then removes so the module is as it was."""
        if id(module) in self._tracked:
            return
        own = vars(module)
        self._tracked[id(module)] = (module, upstream.hook_registry_attribute() in own, "forward" in own)
        if len(self._tracked) == 1:
            self._undo.insert(0, self._clean_tracked)

    def _clean_tracked(self) -> None:
        attribute = upstream.hook_registry_attribute()
        for module, had_registry, had_forward in self._tracked.values():
            registry = vars(module).get(attribute)
            if not had_registry and registry is not None and not registry.hooks:
                delattr(module, attribute)
                if not had_forward:
                    vars(module).pop("forward", None)
        self._tracked.clear()

    def reset(self) -> None:
        """Forget a half-finished guidance step (after an interrupted run)."""
        for split in self.cfgs:
            split.reset()

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


def _denoisers(target: Any) -> List[torch.nn.Module]:
    """The models a pipeline denoises with (``transformer`` and Wan 2.2's ``transformer_2``, or ``unet``), or the
    model itself."""
    found = [getattr(target, n, None) for n in ("transformer", "transformer_2", "unet")]
    found = [m for m in found if isinstance(m, torch.nn.Module)]
    if found:
        return found
    if isinstance(target, torch.nn.Module):
        return [target]
    raise ParallelError(f"{type(target).__name__} has neither a transformer nor a unet to parallelize")


def _register_hook(module: torch.nn.Module, hook: Any, name: str, handle: ParallelHandle) -> None:
    handle.track(module)
    registry = upstream.hook_registry(module)
    registry.register_hook(hook, name)
    handle.on_restore(lambda: registry.remove_hook(name, recurse=False))


@contextlib.contextmanager
def _one_device_per_cpu_rank(device: torch.device) -> Iterator[None]:
    """diffusers places rank r on ``rank % torch.accelerator.device_count()``: 0 on a machine without an
    accelerator, a ZeroDivisionError. On a cpu the count is taken as 1 for the call (every rank on "cpu")."""
    patch = None
    accelerator = getattr(torch, "accelerator", None)
    if device.type == "cpu" and accelerator is not None and accelerator.device_count() == 0:
        patch = _patching.replace(accelerator, "device_count", lambda: 1, key="npu_port.parallel")
    try:
        yield
    finally:
        if patch is not None:
            _patching.release(patch)


def _enable_context_parallel(model: torch.nn.Module, session: ParallelSession, anything: bool, handle) -> None:
    from . import backend

    layout = session.layout
    check_plan(model)
    heads = getattr(getattr(model, "config", None), "num_attention_heads", None)
    if isinstance(heads, int):
        check_heads(heads, layout, anything, hint="anything=True")
    processors = backend.attention_processors(model)
    if not processors:
        raise ParallelError(
            f"{type(model).__name__}: none of its attention processors takes a diffusers dispatcher backend, so "
            "npu-port's context-parallel attention cannot be set on them (processors replaced by ones of another "
            "kind: restore those first)"
        )
    member = backend.register()
    handle.on_restore(backend.unregister)
    saved = [(p, p._attention_backend, getattr(p, "_parallel_config", None)) for p in processors]

    def put_back() -> None:
        for processor, old_backend, old_config in saved:
            processor._attention_backend = old_backend
            if hasattr(processor, "_parallel_config"):
                processor._parallel_config = old_config

    handle.on_restore(put_back)
    for processor in processors:
        processor._attention_backend = member
    config = upstream.context_parallel_config(
        ulysses_degree=layout.ulysses,
        ring_degree=layout.ring,
        mesh=session.mesh["ring", "ulysses"],
        ulysses_anything=anything and layout.ulysses > 1 and layout.ring == 1,
    )
    plan = upstream.cp_plan(model)
    had_config = "_parallel_config" in vars(model)
    handle.track(model)
    for where in plan:
        for module in upstream.plan_modules(model, where):
            handle.track(module)
    with _one_device_per_cpu_rank(session.device):
        model.enable_parallelism(config=config)

    def disable() -> None:
        upstream.remove_context_parallel(model, plan)
        if not had_config:
            vars(model).pop("_parallel_config", None)

    handle.on_restore(disable)
    _add_split_checks(model, plan, layout, handle)
    _register_hook(model, _processor_check(model, member), "npu_port_cp_processors", handle)


def _processor_check(model: torch.nn.Module, member: Any) -> Any:
    """A hook that refuses to run the model when one of its attention processors no longer uses npu-port's backend
    (replaced after ``parallelize``, by a custom-processor strategy say): the sequence is still split, so that
    processor would attend to this rank's part of it only — a wrong result, not an error, without this check."""

    class ProcessorCheck(upstream.model_hook()):
        def pre_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any):
            for name, sub in model.named_modules():
                processor = getattr(sub, "processor", None)
                if processor is not None and getattr(processor, "_attention_backend", None) is not member:
                    raise ParallelError(
                        f"{name}: its attention processor {type(processor).__name__} does not use npu-port's backend "
                        "(replaced after parallelize, or a processor that takes no dispatcher backend); under context "
                        "parallelism it would see this rank's part of the sequence only. Set processors before "
                        "parallelize, or restore() first"
                    )
            return args, kwargs

    return ProcessorCheck()


_NOT_PASSED = object()


def _argument(forward: Any, name: str, args: tuple, kwargs: dict) -> Any:
    """The argument ``name`` of a call of ``forward`` (a class's, ``self`` first): by keyword, else by its position
    in the signature; :data:`_NOT_PASSED` when the call did not pass it."""
    if name in kwargs:
        return kwargs[name]
    parameters = list(inspect.signature(forward).parameters)[1:]  # self
    if name in parameters and parameters.index(name) < len(args):
        return args[parameters.index(name)]
    return _NOT_PASSED


def _add_split_checks(model: torch.nn.Module, plan: dict, layout: ParallelLayout, handle: ParallelHandle) -> None:
    """Before each split of the plan, check the input splits evenly (diffusers' own check is a bare assert)."""
    split_input = upstream.split_input_type()

    class SplitCheck(upstream.model_hook()):
        def __init__(self, where: str, inputs: dict) -> None:
            super().__init__()
            self.where, self.inputs = where, inputs

        def pre_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any):
            for name, spec in self.inputs.items():
                if not isinstance(spec, split_input) or spec.split_output:
                    continue
                value = _argument(type(module).forward, name, args, kwargs)
                if value is _NOT_PASSED:  # diffusers' own split hook says so
                    continue
                dims_match = spec.expected_dims is None or getattr(value, "ndim", None) == spec.expected_dims
                if isinstance(value, torch.Tensor) and dims_match:
                    label = f"input {name!r} of {self.where or type(module).__name__}"  # ": N tokens, ..." follows
                    check_sequence(label, int(value.shape[spec.split_dim]), layout)
            return args, kwargs

    for where, inputs in plan.items():
        if not isinstance(inputs, dict):
            continue
        for module in upstream.plan_modules(model, where):
            _register_hook(module, SplitCheck(where, inputs), f"npu_port_cp_check---{where}", handle)


def start(
    layout: Optional[ParallelLayout] = None,
    *,
    ulysses: int = 1,
    ring: int = 1,
    cfg_parallel: bool = False,
    device: Any = None,
) -> ParallelSession:
    """Join (or start) the process group for ``layout`` on this rank's device and build the mesh.

    Under torchrun the environment gives RANK / WORLD_SIZE / LOCAL_RANK; a process started alone is a world of one
    (a layout of one process). The process count must be the layout's."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    layout = layout or ParallelLayout(ulysses, ring, cfg_parallel)
    require(layout)
    local_rank = _env_int("LOCAL_RANK") or 0
    kind = get_device(device).type
    rank_device = _rank_device(kind, local_rank)
    owns = False
    saved: dict = {}
    if not dist.is_initialized():
        if _env_int("WORLD_SIZE") is None:  # started alone: a world of one on a free port, put back by close()
            chosen = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0", "WORLD_SIZE": "1"}
            saved = set_environment(chosen)
        dist.init_process_group(
            default_backend(rank_device),
            timeout=COLLECTIVE_TIMEOUT,
            device_id=rank_device if kind != "cpu" else None,
        )
        owns = True
    world = dist.get_world_size()
    if world != layout.world:
        if owns:
            dist.destroy_process_group()
        put_back_environment(saved)
        raise ParallelError(
            f"{layout.describe()}, but {world} process{'es were' if world != 1 else ' was'} started; start "
            f"{layout.world} (torchrun --nproc-per-node {layout.world}) or change the layout"
        )
    mesh = init_device_mesh(
        kind, (2 if layout.cfg else 1, layout.ring, layout.ulysses), mesh_dim_names=("cfg", "ring", "ulysses")
    )
    return ParallelSession(layout, rank_device, dist.get_rank(), world, mesh, owns, environment=saved)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
