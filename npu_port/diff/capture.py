"""Record a run module by module: every module's inputs and outputs, and every attention call npu-port routes, as
statistics and a fixed sample (``diff/stats.py``), streamed into a dump (``diff/dump.py``).

    with npu_port.diff.capture(pipe, "run.d", meta={"strategy": "sdpa"}):
        pipe("a lighthouse", num_inference_steps=4)

What is hooked:

- a model (``torch.nn.Module``): it and every submodule, named by ``named_modules()`` (the model itself is
  ``(model)``); each call of the model is a step;
- a pipeline (anything with a ``components`` dict, as diffusers pipelines have): every component that is a module,
  named by component (``unet.down_blocks.0.attentions.0``); each call of the denoiser (``unet*`` / ``transformer*``)
  is a step;
- nothing (``target=None``, what ``npu-port run --dump`` uses): every module the process calls, found when it is first
  called outside any other module (a root) and named by its class (``UNet2DConditionModel.mid_block``, a second root
  of the same class ``CLIPTextModel#1``); each call of a diffusers UNet or transformer root is a step.

Hooks are forward pre-hooks and forward hooks with keyword arguments (so ``encoder_hidden_states=`` is seen), plus a
watcher on npu-port's attention router (``attn/watch.py``). All of it is removed when the block ends, error or
Ctrl-C included; the dump then says whether the run finished. Records are aligned between runs by
``(kind, module, step, call, io, index)``: the same code on two machines produces the same keys.
"""

from __future__ import annotations

import fnmatch
import os
import platform
import sys
import time
import weakref
from collections import Counter
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from .._version import __version__
from .dump import DumpWriter
from .stats import SAMPLE, tensor_stats

#: At most this many tensors are recorded per call side (inputs, outputs); nested containers to this depth.
MAX_TENSORS = 32
_MAX_DEPTH = 4
ROOT = "(model)"
#: Pipeline components whose calls are denoising steps.
DENOISER_PREFIXES = ("unet", "transformer", "prior")


def _flatten(value: Any, name: str, depth: int = 0) -> Iterator[Tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield name, value
    elif depth >= _MAX_DEPTH:
        return
    elif isinstance(value, dict):  # diffusers' BaseOutput and transformers' ModelOutput are dicts too
        for key, item in value.items():
            yield from _flatten(item, f"{name}.{key}", depth + 1)
    elif isinstance(value, (list, tuple)):
        for position, item in enumerate(value):
            yield from _flatten(item, f"{name}[{position}]", depth + 1)


def _inputs(args: Sequence[Any], kwargs: Dict[str, Any]) -> List[Tuple[str, torch.Tensor]]:
    found = list(_flatten(tuple(args), "args"))
    for key, value in (kwargs or {}).items():
        found.extend(_flatten(value, f"kwargs.{key}", 1))
    return found[:MAX_TENSORS]


def _outputs(output: Any) -> List[Tuple[str, torch.Tensor]]:
    return list(_flatten(output, "out"))[:MAX_TENSORS]


def is_denoiser(module: torch.nn.Module) -> bool:
    """A diffusers denoiser root (a UNet or a transformer model, a ControlNet excepted): its calls are steps."""
    name = type(module).__name__
    if "ControlNet" in name or not ("UNet" in name or "Transformer" in name):
        return False
    diffusers = sys.modules.get("diffusers")
    mixin = getattr(diffusers, "ModelMixin", None) if diffusers is not None else None
    return mixin is not None and isinstance(module, mixin)


def _parents(module: torch.nn.Module) -> List[torch.nn.Module]:
    """The modules that hold ``module`` among their submodules (their ``_modules`` dict refers to it)."""
    import gc

    found = []
    for holder in gc.get_referrers(module):
        if not isinstance(holder, dict) or not any(value is module for value in holder.values()):
            continue
        for owner in gc.get_referrers(holder):
            candidates = [owner]
            if isinstance(owner, dict):  # the owner's __dict__ (where instance attributes live in a dict)
                candidates = [o for o in gc.get_referrers(owner) if isinstance(o, torch.nn.Module)]
            for candidate in candidates:
                if isinstance(candidate, torch.nn.Module) and candidate.__dict__.get("_modules") is holder:
                    found.append(candidate)
    return found


def topmost_parent(module: torch.nn.Module, limit: int = 32) -> torch.nn.Module:
    """The outermost module ``module`` belongs to (itself when nothing holds it); the first parent is followed
    where several hold it, and at most ``limit`` levels."""
    seen = {id(module)}
    current = module
    for _ in range(limit):
        parents = [p for p in _parents(current) if id(p) not in seen]
        if not parents:
            break
        current = parents[0]
        seen.add(id(current))
    return current


def versions() -> Dict[str, Optional[str]]:
    """The versions a dump records: npu-port, Python, torch and, when imported, torch_npu, diffusers, transformers."""
    found: Dict[str, Optional[str]] = {"npu_port": __version__, "python": platform.python_version()}
    found["torch"] = torch.__version__
    for name in ("torch_npu", "diffusers", "transformers"):
        module = sys.modules.get(name)
        found[name] = getattr(module, "__version__", None) if module is not None else None
    return found


class Capture:
    """The context manager :func:`capture` returns (see the module docstring). After the block: ``path`` (the
    dump), ``records`` (how many), ``complete``."""

    def __init__(
        self,
        target: Any,
        path: Union[str, os.PathLike],
        *,
        full: Union[bool, Sequence[str]] = (),
        sample_size: int = SAMPLE,
        meta: Optional[Dict[str, Any]] = None,
        progress: bool = False,
    ) -> None:
        if isinstance(full, str):
            full = (full,)
        if not isinstance(sample_size, int) or isinstance(sample_size, bool) or sample_size < 1:
            raise ValueError(f"sample_size must be a positive integer, not {sample_size!r}")
        self.target = target
        self.full = full
        self.sample_size = sample_size
        self._meta = dict(meta or {})
        self.path = path
        self.progress = progress
        self.records = 0
        self.complete = False
        self._writer: Optional[DumpWriter] = None
        self._names: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()
        self._denoisers: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
        self._roots: Counter = Counter()
        self._handles: List[Any] = []
        self._stack: List[Tuple[torch.nn.Module, str, int, int]] = []  # (module, path, step, call)
        self._calls: Counter = Counter()
        self.step = -1
        self._bar = None
        self._watcher = None
        self.failure: Optional[str] = None

    # ---- naming ------------------------------------------------------------------------------------------------

    def _hook_tree(self, root: torch.nn.Module, root_name: str, prefix: str) -> None:
        for name, module in root.named_modules(remove_duplicate=False):
            if module in self._names:
                continue
            self._names[module] = (prefix + name) if name else root_name
            self._handles.append(module.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post, with_kwargs=True, always_call=True))

    def _hook_target(self) -> None:
        target = self.target
        if isinstance(target, torch.nn.Module):
            self._hook_tree(target, ROOT, "")
            self._denoisers.add(target)
            return
        components = getattr(target, "components", None)
        if not isinstance(components, dict):
            raise TypeError(
                f"capture() takes a torch.nn.Module, a pipeline with a 'components' dict, or None (every module the "
                f"process calls), not {type(target).__name__}"
            )
        for name, component in components.items():
            if isinstance(component, torch.nn.Module):
                self._hook_tree(component, name, f"{name}.")
                if name.startswith(DENOISER_PREFIXES):
                    self._denoisers.add(component)

    def _discover(self, module: torch.nn.Module, args: Tuple[Any, ...]) -> None:
        """Global pre-hook (``target=None``): name and hook a module the first time it is called. Its own hooks
        are added now, so for this first call its inputs are recorded here (positional ones: a global pre-hook
        sees no keyword arguments) and its output by its own forward hook.

        A module called without its parent's ``__call__`` (DiT's ``forward_with_cfg`` calls ``self.forward``, a VAE's
        ``decode`` is not ``forward``) would look like a root of its own; its parents are found instead (the modules
        holding it in ``_modules``, read through the garbage collector once per tree) and the whole tree is named from
        the topmost one: ``DiT.blocks.3``, ``AutoencoderKL.decoder``."""
        if module in self._names:
            return
        top = topmost_parent(module)
        if top is not module and top not in self._names:
            self._name_root(top)
        if module in self._names:  # named as part of its parent's tree
            self._pre(module, args, {})
            return
        if self._stack:  # a module made or called inside another's forward, not among its submodules
            _, parent, _, _ = self._stack[-1]
            base = f"{parent}/{type(module).__name__}"
            self._hook_tree(module, base, f"{base}.")
        else:
            self._name_root(module)
        self._pre(module, args, {})

    def _name_root(self, root: torch.nn.Module) -> None:
        cls = type(root).__name__
        base = cls if not self._roots[cls] else f"{cls}#{self._roots[cls]}"
        self._roots[cls] += 1
        if is_denoiser(root):
            self._denoisers.add(root)
        self._hook_tree(root, base, f"{base}.")

    # ---- recording ---------------------------------------------------------------------------------------------

    def _wants_full(self, path: str) -> bool:
        if self.full is True:
            return True
        return any(fnmatch.fnmatchcase(path, pattern) for pattern in self.full or ())

    def _record(self, kind: str, path: str, cls: str, step: int, call: int, io: str, tensors) -> None:
        writer = self._writer
        if writer is None or self.failure is not None:
            return
        full = self._wants_full(path)
        for index, (name, tensor) in enumerate(tensors):
            record = {"kind": kind, "module": path, "class": cls, "step": step, "call": call, "io": io}
            record.update(index=index, name=name, device=str(tensor.device))
            try:
                record.update(tensor_stats(tensor, self.sample_size))
            except Exception as exc:  # a tensor with no data to read (meta, sparse, a fake): its shape is kept
                record.update(shape=list(tensor.shape), dtype=str(tensor.dtype).replace("torch.", ""))
                record["unreadable"] = f"{type(exc).__name__}: {exc}"[:200]
                full_copy = None
            else:
                full_copy = tensor if full else None
            try:
                writer.add(record, full_copy)
            except Exception as exc:  # the dump cannot be written (disk full, ...): the user's run goes on
                self._stop_recording(f"{type(exc).__name__}: {exc}")
                return
        self.records = writer.count
        if self._bar is not None:
            self._bar.n = writer.count
            self._bar.set_postfix_str(f"{writer.bytes_written / 2**20:.1f} MiB", refresh=False)
            self._bar.refresh() if writer.count % 200 < len(tensors) else None

    def _stop_recording(self, reason: str) -> None:
        """Recording failed: say so once, keep what was written (the dump is marked incomplete with the reason) and
        let the user's run go on unrecorded — a recording must never be what breaks the run it watches."""
        import warnings

        self.failure = reason
        message = f"npu-port diff: recording stopped ({reason}); the run goes on, the dump keeps what was written"
        warnings.warn(message, stacklevel=2)
        self._remove()

    def _pre(self, module: torch.nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        path = self._names.get(module)
        if path is None or self._writer is None:
            return
        if module in self._denoisers and not any(m in self._denoisers for m, _, _, _ in self._stack):
            self.step += 1
        call = self._calls[("module", path, self.step)]
        self._calls[("module", path, self.step)] += 1
        self._stack.append((module, path, self.step, call))
        self._record("module", path, type(module).__name__, self.step, call, "in", _inputs(args, kwargs))

    def _post(self, module: torch.nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], output: Any) -> None:
        if self._writer is None or module not in self._names:
            return
        while self._stack and self._stack[-1][0] is not module:  # a child that raised (its hook did not pop)
            self._stack.pop()
        if not self._stack:
            return
        _, path, step, call = self._stack.pop()
        self._record("module", path, type(module).__name__, step, call, "out", _outputs(output))

    def _attention(self, router, query, key, value, attn_mask, is_causal, scale, output) -> None:
        path = self._stack[-1][1] if self._stack else "(no module)"
        counter = ("attention", path, self.step)
        call = self._calls[counter]
        self._calls[counter] += 1
        inputs = [("query", query), ("key", key), ("value", value)]
        if isinstance(attn_mask, torch.Tensor):
            inputs.append(("attn_mask", attn_mask))
        cls = f"attention(is_causal={bool(is_causal)}, scale={scale})"
        self._record("attention", path, cls, self.step, call, "in", inputs)
        if isinstance(output, tuple):  # (out, lse)
            self._record("attention", path, cls, self.step, call, "out", [("out", output[0]), ("lse", output[1])])
        else:
            self._record("attention", path, cls, self.step, call, "out", [("out", output)])

    # ---- the block ---------------------------------------------------------------------------------------------

    def _meta_now(self) -> Dict[str, Any]:
        meta = {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": platform.node(),
            "argv": list(sys.argv),
            "versions": versions(),
            "sample_size": self.sample_size,
            "full": True if self.full is True else list(self.full or ()),
            "target": "process" if self.target is None else type(self.target).__name__,
        }
        rank = os.environ.get("RANK")
        if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1":
            meta.update(rank=int(rank), world_size=int(os.environ["WORLD_SIZE"]))
        meta.update(self._meta)
        return meta

    def note(self, **items: Any) -> None:
        """Add ``items`` to the dump's meta (written when the block ends): what is known only after the run, such
        as the strategy ``auto`` resolved to."""
        self._meta.update(items)
        if self._writer is not None:
            self._writer.meta.update(items)

    def __enter__(self) -> "Capture":
        from ..attn import watch

        if self.full:
            try:  # full tensors are written as safetensors: say so before the run, not at its end
                import safetensors  # noqa: F401
            except ImportError:
                raise ImportError("full tensors are written with safetensors: pip install safetensors") from None
        self._writer = DumpWriter(self.path, self._meta_now())
        self.path = self._writer.path
        try:
            if self.target is None:
                from torch.nn.modules.module import register_module_forward_pre_hook

                self._handles.append(register_module_forward_pre_hook(self._discover))
            else:
                self._hook_target()
        except BaseException:
            self._remove()
            self._writer.discard()
            self._writer = None
            raise
        self._watcher = self._attention
        watch.WATCHERS.append(self._watcher)
        if self.progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(desc="npu-port diff: recording", unit=" tensors", leave=False)
        return self

    def _remove(self) -> None:
        from ..attn import watch

        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._watcher is not None and self._watcher in watch.WATCHERS:
            watch.WATCHERS.remove(self._watcher)
        self._watcher = None

    def __exit__(self, exc_type, exc, tb) -> None:
        self._remove()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        writer, self._writer = self._writer, None
        if writer is not None:
            self.records = writer.count
            self.complete = exc_type is None and self.failure is None
            writer.meta["steps"] = self.step + 1
            if self.failure is not None:
                writer.meta["failure"] = self.failure
            self.path = writer.close(complete=self.complete)
        self._names = weakref.WeakKeyDictionary()
        self._stack.clear()


def capture(
    target: Any = None,
    path: Union[str, os.PathLike] = "npu-port-dump.d",
    *,
    full: Union[bool, Sequence[str]] = (),
    sample_size: int = SAMPLE,
    meta: Optional[Dict[str, Any]] = None,
    progress: bool = False,
) -> Capture:
    """Record ``target``'s run into the dump folder ``path`` (see the module docstring).

    ``full``: module paths (shell patterns: ``"unet.mid_block.*"``) whose inputs and outputs are also kept whole, or
    True for every module — what lets a comparison re-run a module on the other run's inputs. ``meta``: what to say
    about the run (strategy, dtype, ...), kept in the dump's index. The destination must not exist yet.
    """
    return Capture(target, path, full=full, sample_size=sample_size, meta=meta, progress=progress)
