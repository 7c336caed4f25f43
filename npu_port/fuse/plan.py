"""What each op's planner finds in a model, before anything is patched: the sites to install, the refusals, notes.

Planning and installing are separate so that ``fuse_ops`` checks everything first (unknown ops, a wrong target,
with ``strict=True`` an op refused on this machine) and changes nothing when it stops; installation is then all or
nothing (:mod:`.api`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple

from torch import nn

from ..reasons import Reason
from .check import FusedCall, Site


@dataclass(frozen=True)
class Refusal:
    """Something asked for that is not fused: the whole ``op`` on this machine (``scope="op"``, ``where=""``), or one
    module or function that cannot take it (``scope="module"``: no weight, a RoPE form the op cannot compute...)."""

    op: str
    where: str
    reason: Reason
    scope: str = "module"

    def __str__(self) -> str:
        place = f" at {self.where}" if self.where else ""
        return f"{self.op}{place}: {self.reason}"

    def as_dict(self) -> Dict[str, Any]:
        return {"op": self.op, "where": self.where, "scope": self.scope, "reason": self.reason.as_dict()}


@dataclass
class ModuleSite:
    """Install ``build(original_forward)`` as ``module.forward`` (an instance attribute, deleted again on restore)."""

    site: Site
    module: nn.Module
    build: Callable[[Any], FusedCall]


@dataclass
class FunctionSite:
    """Install one shared replacement of a module-level function at every ``(module, name)`` that holds it; a
    replacement already installed by another handle (same key) is joined, not stacked."""

    site: Site
    owners: List[Tuple[ModuleType, str]]
    build: Callable[[Any], FusedCall]


@dataclass
class Context:
    """What every planner sees: the target's modules (qualified name, module; each once) and the packages."""

    modules: List[Tuple[str, nn.Module]]
    torch_npu: Optional[ModuleType]
    torch_npu_reason: Optional[Reason]
    mindiesd: Optional[ModuleType]
    mindiesd_reason: Optional[Reason]
    strict: bool = False


@dataclass
class OpPlan:
    """One op's findings: sites to install, refusals, and notes (said in ``explain()``; not refusals)."""

    op: str
    sites: List[Any] = field(default_factory=list)  # ModuleSite | FunctionSite
    refusals: List[Refusal] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    #: diffusers pieces this op could not find (npu_port.upstream.Decline): those layers keep diffusers' own forward.
    declines: List[Any] = field(default_factory=list)

    def decline(self, decline: Any) -> None:
        if decline is not None and decline not in self.declines:
            self.declines.append(decline)

    def refuse_op(self, reason: Reason) -> "OpPlan":
        self.refusals.append(Refusal(self.op, "", reason, scope="op"))
        return self


def overrides_nothing(module: nn.Module, cls: Optional[type]) -> bool:
    """``module`` is a ``cls`` whose ``forward`` is ``cls``'s own (a subclass that overrides it is someone else's
    layer: what the fused form assumes may not hold)."""
    return cls is not None and isinstance(module, cls) and type(module).forward is cls.forward
