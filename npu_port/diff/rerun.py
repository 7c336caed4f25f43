"""Origin by re-running: side B's module on side A's inputs, against side A's output.

The heuristic of :class:`~npu_port.diff.compare.CallResult` (its own error against its inputs' error) cannot tell a
module that adds a small error of its own to a large one it receives from one that only carries it. Re-running
settles it: when side A kept the call's inputs and outputs whole (``capture(full=[...])``), B's live module is called
on A's inputs (moved to the module's device and to the dtypes B's run gave them, without gradients) and its output
is compared with A's by the same measure (:func:`~npu_port.diff.compare.compare_pair`). Still different: the module
is the origin (``origin_by: "rerun"``); the same: the difference came from its inputs.

Only calls whose recorded inputs are the whole call can be re-run: positional tensors ``args[0..n-1]`` with no gap
and keyword tensors ``kwargs.NAME``. A call with nested inputs (a tuple argument), or one the module refuses (it also
took arguments that are not tensors, which a dump does not keep), keeps the heuristic's verdict. The module is
called once more: one with state of its own (a call counter, a cache) sees that call too.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch

from .capture import ROOT, _outputs
from .compare import CallResult, DiffReport, compare_pair
from .dump import Dump
from .stats import SAMPLE, tensor_stats

Modules = Union[torch.nn.Module, Any, Mapping[str, torch.nn.Module], Callable[[str], Optional[torch.nn.Module]]]

_ARG = re.compile(r"args\[(\d+)\]\Z")
_KWARG = re.compile(r"kwargs\.([A-Za-z_][A-Za-z0-9_]*)\Z")


def _submodule(root: torch.nn.Module, path: str) -> Optional[torch.nn.Module]:
    try:
        return root.get_submodule(path) if path else root
    except AttributeError:
        return None


def lookup(modules: Modules, path: str) -> Optional[torch.nn.Module]:
    """The module at ``path`` (a dump's module path) among ``modules``: a model (named as :func:`capture` names it,
    the model itself ``(model)``), a pipeline (``unet.mid_block``), a mapping or a callable from path to module."""
    if isinstance(modules, torch.nn.Module):
        return modules if path == ROOT else _submodule(modules, path)
    components = getattr(modules, "components", None)
    if isinstance(components, dict):
        name, _, rest = path.partition(".")
        component = components.get(name)
        return _submodule(component, rest) if isinstance(component, torch.nn.Module) else None
    if isinstance(modules, Mapping):
        return modules.get(path)
    return modules(path)


def check_modules(modules: Any) -> None:
    """Refuse, before any comparing, what :func:`lookup` cannot read."""
    if isinstance(modules, (torch.nn.Module, Mapping)) or isinstance(getattr(modules, "components", None), dict):
        return
    if not callable(modules):
        raise TypeError(
            f"modules_b must be side B's model or pipeline, or a mapping or a callable from module path to module, "
            f"not {type(modules).__name__}"
        )


def _placement(module: torch.nn.Module) -> torch.device:
    for tensor in list(module.parameters()) + list(module.buffers()):
        return tensor.device
    return torch.device("cpu")


def _dtype(name: Optional[str]) -> Optional[torch.dtype]:
    found = getattr(torch, name, None) if name else None
    return found if isinstance(found, torch.dtype) else None


def call_inputs(call: CallResult, a: Dump, device: torch.device) -> Optional[Tuple[List[Any], Dict[str, Any]]]:
    """``(args, kwargs)`` of the call rebuilt from side A's whole tensors, in the dtypes side B gave them; None when
    the recorded inputs are not the whole call (see the module docstring)."""
    positional: Dict[int, torch.Tensor] = {}
    keywords: Dict[str, torch.Tensor] = {}
    for pair in call.inputs:
        key = pair.a.get("tensor")
        if not key:
            return None
        tensor = a.tensor(key).to(device)
        dtype = _dtype(pair.b.get("dtype"))
        if dtype is not None and tensor.is_floating_point() and dtype.is_floating_point:
            tensor = tensor.to(dtype)
        name = str(pair.a.get("name"))
        arg, kwarg = _ARG.match(name), _KWARG.match(name)
        if arg:
            positional[int(arg.group(1))] = tensor
        elif kwarg:
            keywords[kwarg.group(1)] = tensor
        else:
            return None
    if sorted(positional) != list(range(len(positional))):
        return None
    return [positional[i] for i in range(len(positional))], keywords


def rerun_call(
    call: CallResult, a: Dump, module: torch.nn.Module, tolerance: Optional[float] = None
) -> Optional[Tuple[bool, float]]:
    """``(still_divergent, error)`` of ``module`` re-run on side A's inputs, or None when it cannot be re-run;
    ``tolerance`` as :func:`~npu_port.diff.compare.compare_pair` takes it."""
    if call.kind != "module" or not call.outputs or not all(p.a.get("tensor") for p in call.outputs):
        return None
    rebuilt = call_inputs(call, a, _placement(module))
    if rebuilt is None:
        return None
    args, kwargs = rebuilt
    try:
        with torch.no_grad():
            output = module(*args, **kwargs)
    except Exception:  # it needed what the dump does not keep: the heuristic decides
        return None
    produced = dict(_outputs(output))
    divergent, worst = False, 0.0
    for pair in call.outputs:
        tensor = produced.get(pair.a.get("name"))
        if tensor is None:
            return None
        record = dict(pair.a, **tensor_stats(tensor, int(a.meta.get("sample_size") or SAMPLE)))
        result = compare_pair(pair.a, record, (a.tensor(pair.a["tensor"]), tensor.detach().cpu()), tolerance)
        divergent = divergent or result.divergent
        worst = max(worst, result.error)
    return divergent, worst


def rerun_calls(report: DiffReport, a: Dump, modules_b: Modules, tolerance: Optional[float] = None) -> int:
    """Decide the origin of each divergent module call of ``report`` by re-running it where possible; returns how
    many calls were re-run."""
    done = 0
    for call in report.divergent:
        module = lookup(modules_b, call.module)
        if module is None:
            continue
        verdict = rerun_call(call, a, module, tolerance)
        if verdict is None:
            continue
        call.rerun, call.rerun_error = verdict
        call.origin_by = "rerun"
        done += 1
    return done
