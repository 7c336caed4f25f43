"""Name the setting that makes run B part from run A, then the modules where it does: what ``npu-port diff --bisect``
runs.

Two runs differ in their settings (``strategy``, ``dtype``, ``fuse_ops``, a kernel or profile) and their dumps part
somewhere (``compare.py``). Knowing *where* is half the answer; *which setting* is the other half. The caller gives a
``run(settings, scope) -> Dump`` callable (it runs the model with those settings and captures it) and both sides'
settings; :func:`bisect` then:

1. runs B and compares it with A (the reference): no divergence, nothing to bisect (one run);
2. when several settings differ, runs B with each one set back to A's value: a setting whose reversal removes the
   divergence (or moves the first divergence later) is a cause; with one differing setting, it is the cause;
3. when the cause can be applied module by module (:data:`SCOPED`: ``strategy``, ``fuse_ops``), runs A with B's
   value on half of the candidate modules (in execution order), keeping the half that still diverges, until one
   group is left: the modules that alone reproduce the divergence. A ``dtype`` cannot be changed for part of a model
   (the modules around would see the other dtype), so it is named for the whole model only.

Runs are bounded and said: at most ``1 (reference, when not given) + 1 (B) + settings (when more than one) +
ceil(log2(modules)) + 1 (a last check of an untested half)``. Each run is a full pipeline run, so the bound is the
cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .compare import DiffReport, compare_dumps
from .dump import Dump

#: Settings that can be applied to some modules only (``run(settings, Scope(...))``).
SCOPED = ("strategy", "fuse_ops")


@dataclass(frozen=True)
class Scope:
    """Apply ``value`` of setting ``key`` to ``modules`` only (qualified module paths); the rest of the model keeps
    the run's own value of ``key``."""

    key: str
    value: Any
    modules: Tuple[str, ...]


RunFn = Callable[[Dict[str, Any], Optional[Scope]], Dump]


@dataclass
class Trial:
    """One run: what it was, and where (if at all) it parted from A."""

    what: str
    settings: Dict[str, Any]
    scope: Optional[Scope]
    first: Optional[Dict[str, Any]]  # the first divergence's kind, module, step, call, error (None: matches A)
    order: Optional[int]  # when it happened in A's run (larger: later)

    @property
    def diverged(self) -> bool:
        return self.first is not None

    def as_dict(self) -> Dict[str, Any]:
        scope = None if self.scope is None else {"key": self.scope.key, "modules": list(self.scope.modules)}
        return {"what": self.what, "settings": _plain(self.settings), "scope": scope, "first_divergence": self.first}


@dataclass
class BisectResult:
    """What :func:`bisect` found. ``cause``: ``(setting, A's value, B's value)`` or None; ``modules``: the module
    paths that alone reproduce the divergence (empty when not narrowed); ``runs`` and the bound ``max_runs``;
    ``trials``: every run; ``notes``: what could not be done and why."""

    diverged: bool
    cause: Optional[Tuple[str, Any, Any]] = None
    modules: List[str] = field(default_factory=list)
    runs: int = 0
    max_runs: int = 0
    trials: List[Trial] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    first_divergence: Optional[Dict[str, Any]] = None

    def as_dict(self) -> Dict[str, Any]:
        cause = None
        if self.cause is not None:
            cause = {"setting": self.cause[0], "a": _plain(self.cause[1]), "b": _plain(self.cause[2])}
        return {
            "diverged": self.diverged,
            "cause": cause,
            "modules": list(self.modules),
            "runs": self.runs,
            "max_runs": self.max_runs,
            "first_divergence": self.first_divergence,
            "notes": list(self.notes),
            "trials": [t.as_dict() for t in self.trials],
        }

    def text(self) -> str:
        runs = f"({self.runs} run{'s' if self.runs != 1 else ''}, at most {self.max_runs})"
        if not self.diverged:
            lines = [f"no divergence: B matches A {runs}"]
        else:
            first = self.first_divergence or {}
            lines = [f"B parts from A at {first.get('module')} (step {first.get('step')}, call {first.get('call')})"]
            if self.cause is None:
                lines.append(f"no single setting causes it {runs}")
            else:
                name, a, b = self.cause
                lines.append(f"cause: {name} ({_show(a)} in A, {_show(b)} in B) {runs}")
            if self.modules:
                lines.append(f"modules: {', '.join(self.modules)}")
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def differing(a_settings: Mapping[str, Any], b_settings: Mapping[str, Any]) -> List[str]:
    """The settings whose values differ, in A's order; both sides must name the same settings."""
    if set(a_settings) != set(b_settings):
        only = sorted(set(a_settings) ^ set(b_settings))
        raise ValueError(
            f"bisect needs the same settings on both sides; only one side has: {', '.join(only)} "
            f"(A: {', '.join(a_settings) or 'none'}; B: {', '.join(b_settings) or 'none'})"
        )
    return [key for key in a_settings if a_settings[key] != b_settings[key]]


def max_runs(settings: int, modules: int, reference: bool = True) -> int:
    """The most runs :func:`bisect` makes for ``settings`` differing settings and ``modules`` candidate modules."""
    total = (1 if reference else 0) + 1 + (settings if settings > 1 else 0)
    if modules > 1:
        total += math.ceil(math.log2(modules)) + 1
    return total


def _first(report: DiffReport) -> Tuple[Optional[Dict[str, Any]], Optional[int]]:
    call = report.first_divergence
    if call is None:
        return None, None
    worst = call.worst()
    first = {"kind": call.kind, "module": call.module, "class": call.cls, "step": call.step, "call": call.call,
             "origin": call.origin, "error": worst.error if worst else None}  # fmt: skip
    return first, call.order


def candidate_modules(run: Any, key: str, value: Any, reference: Dump) -> List[str]:
    """The modules to narrow ``key`` over, in execution order: ``run.groups(key, value)`` when the runner has it,
    else (for ``strategy``) the modules whose attention calls A's run routed through npu-port."""
    groups = getattr(run, "groups", None)
    if callable(groups):
        return list(groups(key, value))
    if key != "strategy":
        return []
    seen: Dict[str, None] = {}
    for record in reference.records():
        if record.get("kind") == "attention" and record.get("module") != "(no module)":
            seen.setdefault(record["module"], None)
    return list(seen)


def bisect(
    run: RunFn,
    a_settings: Mapping[str, Any],
    b_settings: Mapping[str, Any],
    *,
    reference: Optional[Dump] = None,
    groups: Optional[Sequence[str]] = None,
    compare: Callable[[Dump, Dump], DiffReport] = compare_dumps,
) -> BisectResult:
    """Find the setting (and modules) that make B part from A; see the module docstring.

    ``run(settings, scope)``: runs the model with ``settings`` (every key of A and B) and returns its dump; ``scope``
    (a :class:`Scope` or None) says to apply one setting's other value to some modules only. ``reference``: A's dump
    when the caller already has it (else it is the first run). ``groups``: the candidate modules for narrowing, in
    execution order (default: :func:`candidate_modules`). ``compare``: how two dumps are compared.
    """
    a_settings, b_settings = dict(a_settings), dict(b_settings)
    keys = differing(a_settings, b_settings)
    result = BisectResult(diverged=False)
    if not keys:
        result.notes.append("A and B have the same settings: nothing to bisect")
        return result
    ran_reference = reference is None
    result.max_runs = max_runs(len(keys), 1, ran_reference)

    def trial(what: str, settings: Dict[str, Any], scope: Optional[Scope] = None) -> Trial:
        result.runs += 1
        first, order = _first(compare(reference, run(settings, scope)))
        done = Trial(what, settings, scope, first, order)
        result.trials.append(done)
        return done

    if reference is None:
        result.runs += 1
        reference = run(dict(a_settings), None)
    full = trial("B", b_settings)
    if not full.diverged:
        return result
    result.diverged, result.first_divergence = True, full.first

    if len(keys) == 1:
        cause = keys[0]
    else:
        cause = None
        later = full.order
        for key in keys:
            reverted = dict(b_settings, **{key: a_settings[key]})
            done = trial(f"B with {key} from A", reverted)
            if not done.diverged:
                cause = key
                break
            if done.order is not None and full.order is not None and done.order > later:
                cause, later = key, done.order  # moves the first divergence later: a cause, unless one removes it
        if cause is None:
            result.notes.append("setting any one of them back to A's value leaves the divergence where it is")
            return result
    result.cause = (cause, a_settings[cause], b_settings[cause])

    if cause not in SCOPED:
        result.notes.append(f"{cause} applies to the whole model: not narrowed to modules")
        return result
    candidates = list(groups) if groups is not None else candidate_modules(run, cause, b_settings[cause], reference)
    result.max_runs = max_runs(len(keys), len(candidates), ran_reference)
    if not candidates:
        result.notes.append(f"no modules to narrow {cause} over (give groups=)")
        return result
    result.modules = _narrow(trial, a_settings, cause, b_settings[cause], candidates, result)
    return result


def _narrow(trial, a_settings, key, value, candidates, result) -> List[str]:
    """Halve ``candidates`` while a half alone (A with B's ``value`` of ``key`` on it) still diverges. Only the first
    half is run; when it matches, the second half is taken untried and checked once at the end."""
    if len(candidates) == 1:
        return candidates
    verified = list(candidates)  # the whole set reproduces it: B's full run did
    untried = False
    while len(candidates) > 1:
        half = candidates[: len(candidates) // 2]
        done = trial(f"A with {key} from B on {len(half)} of {len(candidates)} modules", dict(a_settings),
                     Scope(key, value, tuple(half)))  # fmt: skip
        if done.diverged:
            candidates, verified, untried = half, half, False
        else:
            candidates, untried = candidates[len(half) :], True
    if untried:
        done = trial(f"A with {key} from B on {candidates[0]}", dict(a_settings), Scope(key, value, tuple(candidates)))
        if done.diverged:
            return candidates
        result.notes.append(f"no group of modules alone reproduces it: {key} parts the runs only in several at once")
        return verified
    return candidates
