"""A ready ``run(settings, scope)`` for :func:`~npu_port.diff.bisect.bisect` on a loaded diffusers pipeline: apply
the settings, run one request under :func:`~npu_port.diff.capture.capture`, undo the settings.

Settings it knows (:data:`KEYS`): ``strategy`` (a strategy name, YAML path or anything
``set_attention_strategy`` takes; None: the pipeline as loaded), ``fuse_ops`` (a list of ops; empty: none) and
``dtype`` (``"float32"``, ``"float16"``, ``"bfloat16"``; None: as loaded). A scope applies the whole-model value
first and then the scope's value to each named module on top, so those modules alone run the other value; every
handle is restored in reverse order afterwards, error or not. ``dtype`` has no scope (see ``bisect.py``); a run in
another dtype runs a copy of the pipeline, so the loaded weights are never rounded.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch

from .bisect import Scope, _plain
from .capture import capture
from .dump import Dump

#: The settings :class:`PipelineRunner` applies.
KEYS = ("strategy", "fuse_ops", "dtype")
DTYPES = ("float32", "float16", "bfloat16")


def check_settings(settings: Dict[str, Any]) -> None:
    """One clear error for a setting the runner cannot apply, before any run."""
    unknown = [key for key in settings if key not in KEYS]
    if unknown:
        raise ValueError(f"unknown setting {unknown[0]!r} for a pipeline run; valid settings: {', '.join(KEYS)}")
    dtype = settings.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid dtypes: {', '.join(DTYPES)}")
    ops = settings.get("fuse_ops")
    if ops is not None and (isinstance(ops, str) or not all(isinstance(op, str) for op in ops)):
        raise ValueError(f"fuse_ops must be a list of op names, not {ops!r}")


class PipelineRunner:
    """``run(settings, scope) -> Dump`` for a loaded pipeline; see the module docstring.

    ``request(pipe)`` runs the pipeline once (the same request every time: fixed seed) and applies no strategy of
    its own: ``infer.run.generate`` applies ``request.strategy`` on top of the runner's, so call the pipeline with
    ``infer.run.call_arguments`` instead. Dumps are written under
    ``workdir`` as ``run-NNN.d``; ``full``, ``sample_size``: passed to ``capture``.
    """

    def __init__(
        self,
        pipe: Any,
        request: Callable[[Any], Any],
        workdir: Union[str, os.PathLike],
        *,
        full: Union[bool, Sequence[str]] = (),
        sample_size: Optional[int] = None,
    ) -> None:
        if not isinstance(getattr(pipe, "components", None), dict):
            raise TypeError(f"PipelineRunner takes a diffusers pipeline (with .components), not {type(pipe).__name__}")
        self.pipe = pipe
        self.request = request
        self.workdir = os.fspath(workdir)
        self.full = full
        self.sample_size = sample_size
        self.count = 0

    def groups(self, key: str, value: Any) -> List[str]:
        """The modules ``value`` of ``key`` changes, in module order: the attention modules a strategy replaces, the
        places ``fuse_ops`` fuses. Found by applying it and undoing it at once."""
        if key == "strategy" and value is not None:
            handle = _apply_strategy(value, self.pipe)
            try:
                return [change.name for change in getattr(handle.applied, "modules", [])]
            finally:
                handle.restore()
        if key == "fuse_ops" and value:
            handle = _fuse(self.pipe, value)
            try:
                return list(dict.fromkeys(site.where for site in handle.sites))
            finally:
                handle.restore()
        return []

    def __call__(self, settings: Dict[str, Any], scope: Optional[Scope] = None) -> Dump:
        check_settings(settings)
        if scope is not None and scope.key not in ("strategy", "fuse_ops"):
            raise ValueError(f"{scope.key} cannot be applied to some modules only; scoped settings: strategy, fuse_ops")
        pipe = self._pipe_in(settings.get("dtype"))
        modules = _modules(pipe)
        handles: List[Any] = []
        try:
            if settings.get("strategy") is not None:
                handles.append(_apply_strategy(settings["strategy"], pipe))
            if settings.get("fuse_ops"):
                handles.append(_fuse(pipe, settings["fuse_ops"]))
            if scope is not None and scope.value:
                for name in scope.modules:
                    if name not in modules:
                        raise ValueError(f"no module {name!r} in the pipeline")
                    apply = _apply_strategy if scope.key == "strategy" else _fuse_on
                    handles.append(apply(scope.value, modules[name]))
            self.count += 1
            path = os.path.join(self.workdir, f"run-{self.count:03d}.d")
            options = {} if self.sample_size is None else {"sample_size": self.sample_size}
            meta = {"settings": {k: _plain(v) for k, v in settings.items()}}
            if scope is not None:
                meta["scope"] = {"key": scope.key, "value": _plain(scope.value), "modules": list(scope.modules)}
            with capture(pipe, path, full=self.full, meta=meta, **options) as recorder:
                self.request(pipe)
            return Dump(recorder.path)
        finally:
            for handle in reversed(handles):
                handle.restore()

    def _pipe_in(self, dtype: Optional[str]) -> Any:
        if dtype is None:
            return self.pipe
        wanted = getattr(torch, dtype)
        current = {p.dtype for c in self.pipe.components.values() if isinstance(c, torch.nn.Module)
                   for p in c.parameters() if p.is_floating_point()}  # fmt: skip
        if current == {wanted}:
            return self.pipe
        return copy.deepcopy(self.pipe).to(dtype=wanted)


def _modules(pipe: Any) -> Dict[str, torch.nn.Module]:
    found: Dict[str, torch.nn.Module] = {}
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module):
            found.update(component.named_modules(prefix=name))
    return found


def _apply_strategy(strategy: Any, target: Any) -> Any:
    from ..strategy.api import set_attention_strategy

    return set_attention_strategy(strategy, target=target)


def _fuse(target: Any, ops: Sequence[str]) -> Any:
    from ..fuse.api import fuse_ops

    return fuse_ops(target, list(ops))


def _fuse_on(ops: Sequence[str], module: torch.nn.Module) -> Any:
    return _fuse(module, ops)
