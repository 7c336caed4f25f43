"""Compare two dumps record by record and say where they first part: which module, at which step, and whether it is
the origin of the difference or only carries one from before.

Records are matched by ``(kind, module, step, call, io, index)``. For each matched pair the error is the largest of the
sample's element differences and the differences of min, max, mean and std, over the tensor's scale (the largest
absolute value of side A), with both tensors whole when both sides kept them; the cosine similarity is taken over
the same elements. A pair diverges when that error is over the tolerance of the looser dtype of the two
(:data:`TOLERANCE`), when NaN or inf appear (or disappear), or when the shapes differ. NaN never passes.

A module call (its ``in`` and ``out`` records) diverges when an output does. It is the **origin** when its own error
exceeds what its inputs carried: its inputs match (error at most tolerance / :data:`AMPLIFY`: rounding that grew
to just under the tolerance upstream and just over it here is carried, not made here), or its output error is over
:data:`AMPLIFY` times its inputs' error, or its output gained NaN/inf its inputs did not have. With the live modules
of side B (``compare_dumps(..., modules_b=...)``) and side A's inputs and outputs kept whole (``capture(full=...)``),
a divergent call is decided by re-running it instead (:mod:`.rerun`): B's module on A's inputs, against A's output.
Module calls are ordered by when they finished (side A's ``seq`` of their first output record): a submodule finishes
before the module around it, so the first origin in that order is the innermost place where the difference starts —
``first_divergence``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .dump import Dump

#: Largest error (relative to the tensor's scale) accepted between two runs, by the looser dtype of the two.
#: Measured (tests/diff/test_tolerance.py, 2 denoising steps, every module of the tiny DiT and SD-style pipelines):
#: float32 sdpa vs vanilla attention at most 4.6e-6; a float16 run vs the float32 one at most 1.2e-2 (a GEGLU
#: projection in the UNet, its inputs already 3.2e-3 off), a bfloat16 run at most 9.8e-2 (the DiT's VAE
#: post_quant_conv, after two steps of accumulated rounding); a single module on matching inputs adds at most ~4x
#: to its inputs' error. Each tolerance is about twice the worst seen; bfloat16 rounds 8x coarser than float16.
TOLERANCE: Dict[str, float] = {"float64": 1e-7, "float32": 1e-4, "float16": 2.5e-2, "bfloat16": 0.2}
#: Tolerance for dtypes not above (integers compare exactly; others as float32).
DEFAULT_TOLERANCE = 1e-4
#: An output error this many times its inputs' error makes a module the origin of a difference.
AMPLIFY = 10.0

Key = Tuple[str, str, int, int, str, int]


def record_key(record: Dict[str, Any]) -> Key:
    return (record["kind"], record["module"], record["step"], record["call"], record["io"], record["index"])


def tolerance_for(*dtypes: str) -> float:
    """The looser of the dtypes' tolerances."""
    values = []
    for dtype in dtypes:
        if dtype in TOLERANCE:
            values.append(TOLERANCE[dtype])
        elif dtype.startswith(("int", "uint", "bool")):
            values.append(0.0)
        else:
            values.append(DEFAULT_TOLERANCE)
    return max(values) if values else DEFAULT_TOLERANCE


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


@dataclass
class PairResult:
    """One matched tensor: how far B is from A."""

    a: Dict[str, Any]
    b: Dict[str, Any]
    error: float
    cosine: float
    tolerance: float
    metric: str  # what decided: "error", "nan", "inf", "shape", or "match"
    divergent: bool

    def as_dict(self) -> Dict[str, Any]:
        return {
            "name": self.a.get("name"),
            "io": self.a["io"],
            "error": self.error,
            "cosine": self.cosine,
            "tolerance": self.tolerance,
            "metric": self.metric,
            "divergent": self.divergent,
            "nan": [self.a.get("nan", 0), self.b.get("nan", 0)],
            "inf": [self.a.get("inf", 0), self.b.get("inf", 0)],
            "dtype": [self.a.get("dtype"), self.b.get("dtype")],
        }


def compare_pair(
    a: Dict[str, Any], b: Dict[str, Any], full: Optional[Tuple[Any, Any]] = None, tolerance: Optional[float] = None
) -> PairResult:
    """Compare two records of the same tensor; ``full``: both whole tensors, when both sides kept them;
    ``tolerance``: instead of the dtypes' (:func:`tolerance_for`)."""
    if tolerance is None:
        tolerance = tolerance_for(str(a.get("dtype")), str(b.get("dtype")))
    if a.get("shape") != b.get("shape"):
        return PairResult(a, b, math.inf, math.nan, tolerance, "shape", True)
    for what in ("nan", "inf"):
        if a.get(what, 0) != b.get(what, 0):
            return PairResult(a, b, math.inf, math.nan, tolerance, what, True)
    if full is not None:
        xs, ys = _full_values(*full)
    else:
        xs, ys = a.get("sample") or [], b.get("sample") or []
    pairs = [(x, y) for x, y in zip(xs, ys) if _finite(x) and _finite(y)]
    if any(_finite(x) != _finite(y) for x, y in zip(xs, ys)):  # NaN at different places, counts equal
        return PairResult(a, b, math.inf, math.nan, tolerance, "nan", True)
    scale = max((abs(v) for v in (a.get("min"), a.get("max")) if _finite(v)), default=0.0)
    if scale == 0.0:
        scale = max((abs(v) for v in (b.get("min"), b.get("max")) if _finite(v)), default=0.0)
    differences = [abs(x - y) for x, y in pairs]
    for stat in ("min", "max", "mean", "std"):
        if _finite(a.get(stat)) and _finite(b.get(stat)):
            differences.append(abs(a[stat] - b[stat]))
        elif (a.get(stat) is None) != (b.get(stat) is None):
            return PairResult(a, b, math.inf, math.nan, tolerance, "nan", True)
    largest = max(differences, default=0.0)
    error = largest / scale if scale > 0 else (0.0 if largest == 0 else math.inf)
    dot = sum(x * y for x, y in pairs)
    norm = math.sqrt(sum(x * x for x, _ in pairs)) * math.sqrt(sum(y * y for _, y in pairs))
    cosine = dot / norm if norm > 0 else (1.0 if all(x == y for x, y in pairs) else 0.0)
    divergent = not (error <= tolerance)  # NaN error: divergent
    return PairResult(a, b, error, cosine, tolerance, "error" if divergent else "match", divergent)


def _full_values(a, b) -> Tuple[List[float], List[float]]:
    return a.detach().double().reshape(-1).tolist(), b.detach().double().reshape(-1).tolist()


@dataclass
class CallResult:
    """One module call (or routed attention call), both sides: its inputs' and outputs' pairs."""

    kind: str
    module: str
    cls: str
    step: int
    call: int
    order: int
    inputs: List[PairResult] = field(default_factory=list)
    outputs: List[PairResult] = field(default_factory=list)
    origin_by: str = "inputs"
    #: The re-run's verdict (:mod:`.rerun`): True = B's module on A's inputs still differs; None = not re-run.
    rerun: Optional[bool] = None
    rerun_error: Optional[float] = None

    @property
    def divergent(self) -> bool:
        return any(p.divergent for p in self.outputs)

    @property
    def output_error(self) -> float:
        return max((p.error for p in self.outputs), default=0.0)

    @property
    def input_error(self) -> float:
        return max((p.error for p in self.inputs), default=0.0)

    @property
    def origin(self) -> bool:
        if not self.divergent:
            return False
        if self.rerun is not None:
            return self.rerun
        if all(p.metric == "match" and p.error * AMPLIFY <= p.tolerance for p in self.inputs):
            return True
        new_nonfinite = any(p.metric in ("nan", "inf") for p in self.outputs) and not any(
            p.metric in ("nan", "inf") for p in self.inputs
        )
        if new_nonfinite:
            return True
        out, inp = self.output_error, self.input_error
        return math.isfinite(out) and math.isfinite(inp) and out > AMPLIFY * inp

    def worst(self) -> Optional[PairResult]:
        divergent = [p for p in self.outputs if p.divergent]
        pool = divergent or self.outputs
        return max(pool, key=lambda p: (p.metric != "match", p.error)) if pool else None

    def as_dict(self) -> Dict[str, Any]:
        worst = self.worst()
        return {
            "kind": self.kind,
            "module": self.module,
            "class": self.cls,
            "step": self.step,
            "call": self.call,
            "divergent": self.divergent,
            "origin": self.origin,
            "origin_by": self.origin_by,
            "metric": worst.metric if worst else None,
            "error": worst.error if worst else None,
            "cosine": worst.cosine if worst else None,
            "tolerance": worst.tolerance if worst else None,
            "input_error": self.input_error,
            "rerun_error": self.rerun_error,
            "outputs": [p.as_dict() for p in self.outputs],
            "inputs": [p.as_dict() for p in self.inputs],
        }


@dataclass
class DiffReport:
    """The comparison of two dumps (see the module docstring)."""

    a_meta: Dict[str, Any]
    b_meta: Dict[str, Any]
    calls: List[CallResult]
    only_a: int
    only_b: int
    compared: int

    @property
    def divergent(self) -> List[CallResult]:
        return [c for c in self.calls if c.divergent]

    @property
    def first_divergence(self) -> Optional[CallResult]:
        divergent = self.divergent
        origins = [c for c in divergent if c.origin]
        return (origins or divergent or [None])[0]

    def text(self, top: int = 10) -> str:
        """The report for a person: the culprit first (:func:`npu_port.diff.text.report_text`)."""
        from .text import report_text

        return report_text(self, top)

    def as_dict(self) -> Dict[str, Any]:
        first = self.first_divergence
        return {
            "a": self.a_meta,
            "b": self.b_meta,
            "records_compared": self.compared,
            "only_in_a": self.only_a,
            "only_in_b": self.only_b,
            "first_divergence": first.as_dict() if first else None,
            "divergent": [c.as_dict() for c in self.divergent],
            "calls": len(self.calls),
        }


class RecordMatcher:
    """Side B's records, matched to side A's keys as A's records arrive, reading B only as far as it must.

    Two runs of the same code write their records in the same order, so each of A's keys is B's next record and
    nothing is held: memory stays that of one record per side, however long the runs. Records B has out of that
    order wait in a dict until A asks for them (``held``; ``peak``: the most that waited at once); a key B lacks
    reads the rest of B into it. Matches are the same as indexing all of B first, in any order.
    """

    def __init__(self, b_records: Iterable[Dict[str, Any]]) -> None:
        self._rest = iter(b_records)
        self.held: Dict[Key, Dict[str, Any]] = {}
        self.peak = 0

    def take(self, key: Key) -> Optional[Dict[str, Any]]:
        """B's record with ``key``, or None when B has none."""
        found = self.held.pop(key, None)
        if found is not None:
            return found
        for record in self._rest:
            other = record_key(record)
            if other == key:
                return record
            self.held[other] = record
            self.peak = max(self.peak, len(self.held))
        return None

    def unmatched(self) -> int:
        """How many of B's records no key asked for (reads the rest of B)."""
        for record in self._rest:
            self.held[record_key(record)] = record
        return len(self.held)


def compare_records(a_records: Iterable[Dict[str, Any]], b_records: Iterable[Dict[str, Any]], *, a_dump=None,
                    b_dump=None, a_meta=None, b_meta=None, tolerance=None) -> DiffReport:  # fmt: skip
    """Compare two record streams (side A's order is the execution order reported); ``tolerance``: one tolerance
    for every tensor instead of the per-dtype ones."""
    b_by_key = RecordMatcher(b_records)  # streams B alongside A when both come in the same order
    calls: Dict[Tuple[str, str, int, int], CallResult] = {}
    matched = 0
    only_a = 0
    for record in a_records:
        key = record_key(record)
        other = b_by_key.take(key)
        if other is None:
            only_a += 1
            continue
        matched += 1
        full = None
        if a_dump is not None and b_dump is not None and record.get("tensor") and other.get("tensor"):
            full = (a_dump.tensor(record["tensor"]), b_dump.tensor(other["tensor"]))
        result = compare_pair(record, other, full, tolerance)
        call_key = key[:4]
        entry = calls.get(call_key)
        if entry is None:
            entry = calls[call_key] = CallResult(key[0], key[1], record.get("class", ""), key[2], key[3], -1)
        if record["io"] == "in":
            entry.inputs.append(result)
        else:
            if entry.order < 0:
                entry.order = record["seq"]
            entry.outputs.append(result)
    ordered = sorted((c for c in calls.values() if c.order >= 0), key=lambda c: c.order)
    return DiffReport(a_meta or {}, b_meta or {}, ordered, only_a, b_by_key.unmatched(), matched)


def compare_dumps(a: Dump, b: Dump, *, modules_b: Any = None, tolerance: Optional[float] = None) -> DiffReport:
    """Compare dump ``a`` (the reference) with dump ``b``.

    ``modules_b``: side B's live modules: its model or pipeline, or a mapping or a callable from module path (as in
    the dump) to ``torch.nn.Module`` (or None); each divergent module call whose inputs and outputs side A kept whole
    is then re-run on A's inputs to decide whether it is the origin (:func:`.rerun.rerun_calls`). ``tolerance``: one
    for every tensor (relative to its scale) instead of :data:`TOLERANCE`'s per dtype."""
    if modules_b is not None:
        from .rerun import check_modules

        check_modules(modules_b)
    report = compare_records(
        a.records(), b.records(), a_dump=a, b_dump=b, a_meta=a.meta, b_meta=b.meta, tolerance=tolerance
    )
    if modules_b is not None:
        from .rerun import rerun_calls

        rerun_calls(report, a, modules_b, tolerance=tolerance)
    return report
