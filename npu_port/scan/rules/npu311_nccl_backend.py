"""NPU311: ``backend="nccl"`` for ``torch.distributed``."""

from __future__ import annotations

import ast
from typing import Any, Iterator, List, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import argument, guarded_finding, parameter_sources, single_value

#: Process-group constructors -> the position of their backend argument (None: keyword only).
GROUP_FUNCTIONS = {
    "torch.distributed.init_process_group": 0,
    "torch.distributed.distributed_c10d.init_process_group": 0,
    "torch.distributed.new_group": 2,
    "torch.distributed.distributed_c10d.new_group": 2,
    "torch.distributed.new_subgroups": None,
    "torch.distributed.new_subgroups_by_enumeration": None,
}
#: Launchers that pass their backend on to init_process_group.
LAUNCHERS = {"deepspeed.init_distributed": "dist_backend", "deepspeed.comm.init_distributed": "dist_backend"}
#: accelerate's kwargs handler, whose ``backend`` defaults to ``"nccl"``: ``to_kwargs()`` drops a value equal to the
#: default, and accelerate then picks the backend for the device itself.
ACCELERATE_KWARGS = frozenset(
    (
        "accelerate.InitProcessGroupKwargs",
        "accelerate.utils.InitProcessGroupKwargs",
        "accelerate.utils.dataclasses.InitProcessGroupKwargs",
    )
)
ACCELERATE_DEFAULT = (
    '`backend="nccl"` is accelerate\'s default, which it drops (it picks hccl / gloo for the device itself): '
    "harmless; leave the argument out to say so"
)


def _nccl(node: Optional[ast.AST]) -> bool:
    """``"nccl"`` or a per-device backend string naming it (``"cpu:gloo,cuda:nccl"``)."""
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and "nccl" in node.value.lower()


@register_rule
class NcclBackend(Rule):
    """``torch.distributed.init_process_group(backend="nccl")`` (also positional, ``new_group(backend="nccl")``,
    ``deepspeed.init_distributed(dist_backend="nccl")``, an argparse ``--backend`` option defaulting to
    ``"nccl"``, another library's keyword named ``*backend`` given ``"nccl"`` (lightning's
    ``DDPStrategy(process_group_backend="nccl")``, transformers' ``TrainingArguments(ddp_backend="nccl")``), a
    ``backend="nccl"`` parameter default of the file's own function that passes it on to one of these, or ``"nccl"``
    given to that parameter by the file's calls); in any case (``"NCCL"``: torch lower-cases it). accelerate's
    ``InitProcessGroupKwargs(backend="nccl")`` is reported as ``info``: that is its default, which ``to_kwargs()``
    drops, and accelerate picks hccl / gloo itself (``"NCCL"`` is not the default: it reaches torch, and is reported
    as any other).

    NCCL exists only on NVIDIA GPUs: elsewhere the call raises. Ascend speaks ``hccl``, a CPU ``gloo``.
    ``npu-port run`` maps ``nccl`` to the target's backend; ``npu-port fix`` writes
    ``npu_port.distributed.default_backend()`` (``"nccl"`` on CUDA) under ``--target npu-port``; by default torch's
    own ``torch.distributed.Backend.default_device_backend_map[<device type>]`` — ``"nccl"`` on CUDA, ``"hccl"``
    where torch_npu registered it for ``"npu"``, ``"gloo"`` on a CPU.

    Example::

        dist.init_process_group(backend="nccl", init_method="env://")  # NPU311
    """

    code = "NPU311"
    name = "nccl-backend"
    message = "the `nccl` backend exists only on NVIDIA GPUs"
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "safe"
    handled_by = "npu-port run (the CUDA redirect maps nccl to hccl / gloo)"
    triggers = ("nccl", "NCCL", "Nccl")  # torch takes the backend's name in any case

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in source.calls():
            value = None
            if qualified in GROUP_FUNCTIONS:
                position = GROUP_FUNCTIONS[qualified]
                value = argument(call, position, "backend") if position is not None else None
                if position is None:
                    value = next((k.value for k in call.keywords if k.arg == "backend"), None)
            elif qualified in LAUNCHERS:
                value = next((k.value for k in call.keywords if k.arg == LAUNCHERS[qualified]), None)
            elif isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
                options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if any("backend" in option for option in options):
                    value = next((k.value for k in call.keywords if k.arg == "default"), None)
            elif qualified is not None:  # a library's backend keyword (process_group_backend=, ddp_backend=, ...)
                value = next((k.value for k in call.keywords if k.arg and k.arg.endswith("backend")), None)
                if qualified in ACCELERATE_KWARGS and isinstance(value, ast.Constant) and value.value == "nccl":
                    yield source.finding(self, value, ACCELERATE_DEFAULT, fix="manual", severity="info")
                    continue
            if value is None:
                continue
            branches = _branches(value)  # `"nccl" if multi_node else "gloo"`: each value it may take
            if isinstance(value, ast.Name) and not any(_nccl(branch) for branch in branches):
                assigned = single_value(source, value)  # `backend = "nccl" if ... else "gloo"`, then backend=backend
                if assigned is not None and any(_nccl(branch) for branch in _branches(assigned)):
                    branches = _branches(assigned)
            if any(_nccl(branch) for branch in branches):
                places = [(branch, "argument", "") for branch in branches]
            else:  # a parameter of the file's own function, passed on: its default and what the file's calls give
                places = [(node, kind, function) for node, kind, function in parameter_sources(source, value)]
            for node, kind, function in places:
                if not _nccl(node):
                    continue
                through = f" (passed on by `{function}` to the process group)" if function else ""
                default = kind == "default"
                yield guarded_finding(  # `"nccl" if torch.cuda.is_available() else "gloo"`: guarded by that test
                    source,
                    self,
                    node,
                    f"`nccl`{through} exists only on NVIDIA GPUs: use `npu_port.distributed.default_backend()` "
                    + ("in the function body (a default is evaluated at import; " if default else "(")
                    + "hccl on Ascend, gloo on CPU; npu-port run maps it)",
                    fix="manual" if default or node.value.lower() != "nccl" else None,  # type: ignore[attr-defined]
                )

    fix_imports = ("npu_port",)

    def rewrite(self, node: Any, finding: Finding) -> Optional[Any]:
        """``"nccl"`` -> ``npu_port.distributed.default_backend()`` (``"nccl"`` on CUDA, hccl on Ascend, gloo on a
        CPU)."""
        import libcst as cst

        from ..targets import expression

        if isinstance(node, cst.SimpleString) and node.evaluated_value.lower() == "nccl":
            return cst.parse_expression(expression("backend", self.target))
        return None


def _branches(value: ast.AST) -> List[ast.AST]:
    """The values a conditional expression may give (``a if c else b``: ``a`` and ``b``, nested ones too)."""
    if isinstance(value, ast.IfExp):
        return _branches(value.body) + _branches(value.orelse)
    return [value]
