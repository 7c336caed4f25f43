"""``npu_port.fuse_ops(model, ops=[...], strict=False)`` and the handle it returns.

What happens, in order, so that a bad request changes nothing:

1. ``ops`` is checked: unknown names, an empty list, ``geglu_exact`` with ``geglu_tanh`` -> :class:`FuseError`
   naming the valid ops (the same check a strategy file's ``fuse_ops:`` gets).
2. With ``adaln`` asked for, ``mindiesd`` is imported — before anything else, torch_npu included (see
   :mod:`.backend`: MindIE-SD's custom ops must reach CANN's registry first).
3. The target is read: a ``torch.nn.Module``, or a diffusers pipeline (its module components); anything else is a
   :class:`FuseError`.
4. Each op's planner finds its sites (:mod:`.norms`, :mod:`.rope`, :mod:`.geglu`, :mod:`.adaln`). An op that needs a
   package this machine lacks (torch_npu for rms_norm / rope / geglu_tanh, mindiesd for adaln) is *refused*, with the
   reason: never skipped silently. The UX: by default the handle lists the refusal (``handle.refused``,
   ``explain()``) and a :class:`~npu_port.fuse.check.FuseWarning` says it once — so a strategy with ``fuse_ops`` can be
   applied on a CPU for planning and still run; ``strict=True`` raises :class:`FuseError` instead, before anything is
   patched. A module an op cannot take (an RMSNorm without weight, LTX's RoPE) keeps its forward and is listed too.
   An op whose diffusers classes or functions the installed diffusers lacks (a release that moved them) *declines*
   (:mod:`npu_port.upstream.diffusers.ops`): those layers keep diffusers' own forward, one
   :class:`~npu_port.upstream.UpstreamDeclinedWarning` names the version and the piece, and the handle lists it
   (``handle.declines``, ``explain()``, ``report()["declines"]``); ``strict=True`` raises
   :class:`~npu_port.upstream.UpstreamMissingError` instead, before anything is patched.
5. Everything is installed (all or nothing) through :mod:`npu_port._patching`; each site is checked on its first call
   (:mod:`.check`); ``strict=True`` makes a failed check raise :class:`~npu_port.errors.FuseCheckError`.

``handle.restore()`` (or leaving ``with fuse_ops(...) as handle:``) puts back every patched forward and function —
the very objects that were there.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from torch import nn

from .. import _patching
from ..errors import FuseError
from ..reasons import Reason
from ..strategy.spec import FUSE_OPS, check_fuse_ops
from . import adaln, geglu, norms, rope
from .backend import import_mindiesd_first, torch_npu_module
from .check import FuseWarning, Site
from .plan import Context, FunctionSite, ModuleSite, OpPlan, Refusal

#: Each op's planner.
PLANNERS: Dict[str, Callable[[Context], OpPlan]] = {
    "rms_norm": norms.plan,
    "rope": rope.plan,
    "geglu_exact": functools.partial(geglu.plan, op="geglu_exact"),
    "geglu_tanh": functools.partial(geglu.plan, op="geglu_tanh"),
    "adaln": adaln.plan,
}
#: The ops that compute through torch_npu (probing it imports it, so only when one of these is asked for).
NEED_TORCH_NPU = ("rms_norm", "rope", "geglu_exact", "geglu_tanh")


def _requested(ops: Any) -> Tuple[str, ...]:
    try:
        names = check_fuse_ops(ops, "ops")
    except ValueError as exc:
        raise FuseError(str(exc)) from None
    if not names:
        raise FuseError(f"ops must name at least one op; valid ops: {', '.join(FUSE_OPS)}")
    return names


def _modules(target: Any) -> List[Tuple[str, nn.Module]]:
    """``(qualified name, module)`` for every module of a model or of a pipeline's module components, each once."""
    if isinstance(target, nn.Module):
        components: List[Tuple[str, nn.Module]] = [("", target)]
    elif isinstance(getattr(target, "components", None), dict):  # a DiffusionPipeline (no diffusers import needed)
        components = [(k, v) for k, v in target.components.items() if isinstance(v, nn.Module)]
    else:
        kind = type(target)
        raise FuseError(
            f"fuse_ops expects a torch.nn.Module or a diffusers pipeline; got {kind.__module__}.{kind.__qualname__}"
        )
    seen, found = set(), []
    for prefix, component in components:
        for name, module in component.named_modules(prefix=prefix):
            if id(module) not in seen:
                seen.add(id(module))
                found.append((name, module))
    return found


class FuseHandle:
    """The fused ops installed on one target: ``sites`` (each with its state and call counts), ``refused`` (what was
    asked and is not fused, with reasons — including sites that failed their first-call check), ``notes``;
    ``explain()``, ``report()``, ``restore()``; a context manager."""

    def __init__(self, ops: Tuple[str, ...], strict: bool) -> None:
        self.ops = ops
        self.strict = strict
        self.sites: List[Site] = []
        self.notes: List[str] = []
        #: diffusers pieces missing for an op (npu_port.upstream.Decline): those layers keep diffusers' own forward
        self.declines: List[Any] = []
        self._refusals: List[Refusal] = []
        self._held: List[_patching.Patch] = []
        self.restored = False

    @property
    def refused(self) -> List[Refusal]:
        """Refusals when applied, then sites refused by their first-call check (``scope="check"``)."""
        checked = [Refusal(s.op, s.where, s.reason, scope="check") for s in self.sites if s.state == "refused"]
        return list(self._refusals) + checked

    def counts(self) -> Dict[str, int]:
        """Sites per op that run (or will run, once checked) the fused form."""
        counts = {op: 0 for op in self.ops}
        for site in self.sites:
            if site.state != "refused":
                counts[site.op] += 1
        return counts

    def describe(self) -> str:
        """A header line, then one line per site, refusal and note (what a strategy handle's ``explain()`` shows)."""
        fused = sum(self.counts().values())
        lines = [f"fused ops ({', '.join(self.ops)}): {fused} sites fused, {len(self.refused)} refused"]
        lines += [f"  {site.describe()}" for site in self.sites]
        lines += [f"  refused: {refusal}" for refusal in self.refused]
        lines += [f"  not fused: {decline}" for decline in self.declines]
        lines += [f"  note: {note}" for note in self.notes]
        if self.restored:
            lines.append("  restored")
        return "\n".join(lines)

    def explain(self) -> str:
        return self.describe()

    def report(self) -> Dict[str, Any]:
        return {
            "ops": list(self.ops),
            "strict": self.strict,
            "fused": self.counts(),
            "sites": [site.report() for site in self.sites],
            "refused": [refusal.as_dict() for refusal in self.refused],
            "notes": list(self.notes),
            "declines": [decline.as_dict() for decline in self.declines],
            "restored": self.restored,
        }

    def restore(self) -> None:
        """Put back every patched forward and function (idempotent); the very objects that were there."""
        if self.restored:
            return
        with _patching.LOCK:
            for patch in reversed(self._held):
                if patch.users > 0:  # a site refused by its check already put its original back
                    _patching.release(patch)
            for site in self.sites:
                site.handles -= 1
        self._held.clear()
        self.restored = True

    def __enter__(self) -> "FuseHandle":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.restore()

    def __repr__(self) -> str:
        state = ", restored" if self.restored else ""
        return f"<FuseHandle {', '.join(self.ops)}: {sum(self.counts().values())} sites{state}>"

    # installing ---------------------------------------------------------------------------------------------------

    def _install_module(self, plan: ModuleSite) -> Optional[Refusal]:
        site = plan.site
        if _patching.find(plan.module, "forward", site.key) is not None:
            why = Reason("already-fused", f"already fused by another fuse_ops handle ({site.op})")
            return Refusal(site.op, site.where, why)
        site.strict = self.strict
        patch = _patching.replace(plan.module, "forward", plan.build(plan.module.forward), key=site.key)
        site.patches.append(patch)
        self._held.append(patch)
        return None

    def _install_function(self, plan: FunctionSite) -> Optional[Refusal]:
        site = plan.site
        for owner, name in plan.owners:
            patch = _patching.acquire(owner, name, plan.build, key=site.key)
            if patch is None:
                why = Reason("patched-by-others", f"{owner.__name__}.{name} was replaced by someone else since")
                return Refusal(site.op, site.where, why)
            if patch not in site.patches:
                site.patches.append(patch)
            self._held.append(patch)
        if site.handles == 0:
            site.strict = self.strict
        return None

    def _install(self, plans: Sequence[OpPlan]) -> None:
        with _patching.LOCK:
            for plan in plans:
                for item in plan.sites:
                    install = self._install_module if isinstance(item, ModuleSite) else self._install_function
                    refusal = install(item)
                    if refusal is not None:
                        self._refusals.append(refusal)
                    elif item.site not in self.sites:
                        item.site.handles += 1
                        self.sites.append(item.site)


def fuse_ops(model: Any, ops: Sequence[str], *, strict: bool = False) -> FuseHandle:
    """Install fused DiT ops on ``model`` (a ``torch.nn.Module`` or a diffusers pipeline); see the module docstring.

    ``ops``: a list of ``rms_norm``, ``rope``, ``geglu_exact``, ``geglu_tanh``, ``adaln``. Returns a
    :class:`FuseHandle`; ``handle.restore()`` undoes everything exactly.
    """
    requested = _requested(ops)
    mindiesd = mindiesd_reason = None
    if "adaln" in requested:  # first thing: before torch_npu is touched (MindIE-SD's import-order rule)
        mindiesd, mindiesd_reason = import_mindiesd_first()
    modules = _modules(model)
    torch_npu = torch_npu_reason = None
    if any(op in NEED_TORCH_NPU for op in requested):
        torch_npu, torch_npu_reason = torch_npu_module()
    ctx = Context(modules, torch_npu, torch_npu_reason, mindiesd, mindiesd_reason, strict)
    plans = [PLANNERS[op](ctx) for op in requested]
    op_refusals = [r for plan in plans for r in plan.refusals if r.scope == "op"]
    if strict and op_refusals:
        lines = "\n".join(f"  - {refusal}" for refusal in op_refusals)
        raise FuseError(f"fuse_ops refused (strict=True; nothing was changed):\n{lines}")
    handle = FuseHandle(requested, strict)
    handle.notes = [note for plan in plans for note in plan.notes]
    handle.declines = list({id(d): d for plan in plans for d in plan.declines}.values())
    handle._refusals = [r for plan in plans for r in plan.refusals]
    try:
        handle._install(plans)
    except BaseException:
        handle.restore()
        raise
    _warn_refused(handle)
    return handle


def _warn_refused(handle: FuseHandle) -> None:
    """One warning for the ops refused outright, or that found places to fuse but could fuse none of them."""
    fused = handle.counts()
    lines = []
    for op in handle.ops:
        refusals = [r for r in handle.refused if r.op == op]
        if any(r.scope == "op" for r in refusals) or (refusals and not fused[op]):
            lines += [f"  - {refusal}" for refusal in refusals]
    if lines:
        warnings.warn(
            "npu-port fuse_ops: not fused (handle.explain() has the rest):\n" + "\n".join(lines),
            FuseWarning,
            stacklevel=3,
        )
