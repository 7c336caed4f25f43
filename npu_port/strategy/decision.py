"""Shape buckets and the record of a decision: which kernel runs a bucket, and why the others do not.

A bucket is everything that can change which kernel is fastest or whether it can run at all: device, dtype,
batch, heads (query/key-value), sequence lengths, head dims, mask form (kind and which dimensions broadcast),
causal, dropout, gradients. Calls in one bucket reuse one decision; a decision is plain data so that it can be
cached on disk and shown by ``explain()``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from ..attn.call import AttentionCall
from ..attn.masks import dtype_name
from ..device.timing import Spread, spread
from ..reasons import Reason, as_reason

#: Candidate outcomes, in the order explain() sorts them.
PICKED, OK, REJECTED, REFUSED, SKIPPED = "picked", "ok", "rejected", "refused", "skipped"


def mask_form(call: AttentionCall, pure: Union[None, bool, Tuple[bool, ...]] = None) -> str:
    """``none``, or the mask kind and its broadcast pattern over (B, H, Sq, Skv): ``bool[B1QK]``, ``float[11QK]``.
    Where a candidate kernel's choice depends on whether a float mask is a pure mask (``pure`` known: the Ascend
    kernels, sdpa on an NPU), the kind says which: ``float-pure[B11K]`` or ``float-bias[BHQK]``. A float mask that
    autograd wants a gradient for is marked ``+grad`` (``float-pure+grad[B11K]``): kernels that turn a pure mask into
    a bool one take it only when no gradient is wanted, so it is a bucket of its own."""
    if call.mask is None:
        return "none"
    letters = "BHQK"
    pattern = "".join("1" if size == 1 else letters[i] for i, size in enumerate(call.mask.shape))
    if pure is None:
        kind = call.mask.kind
    elif isinstance(pure, tuple):  # candidates judge with different masked values: one answer each
        kind = "float-" + "/".join("pure" if answer else "bias" for answer in pure)
    else:
        kind = "float-pure" if pure else "float-bias"
    return f"{kind}{'+grad' if mask_needs_grad(call) else ''}[{pattern}]"


def mask_needs_grad(call: AttentionCall) -> bool:
    """Whether autograd wants a gradient for ``call``'s float mask (a bool mask never has one)."""
    mask = call.mask
    return mask is not None and mask.bias is not None and mask.bias.requires_grad and torch.is_grad_enabled()


def bucket_signature(call: AttentionCall, pure: Union[None, bool, Tuple[bool, ...]] = None) -> Tuple[Any, ...]:
    """What the router looks its choice up by, on every call: a tuple that determines :func:`bucket_key` (the exact
    shapes fix the mask's broadcast pattern), built from a few attribute reads. The readable string is made only
    when a bucket is first seen. ``pure``: whether the float mask is a pure mask, where that matters (see
    :func:`mask_form`)."""
    mask = call.mask
    return (
        call.query.shape,
        call.key.shape,
        call.value.shape,
        call.query.dtype,
        call.query.device,
        None if mask is None else (mask.bias is None, mask.keep.shape, mask_needs_grad(call)),
        call.is_causal,
        call.dropout_p > 0,
        call.needs_grad,
        call.return_lse,
        pure,
    )


def bucket_key(call: AttentionCall, pure: Union[None, bool, Tuple[bool, ...]] = None) -> str:
    """The bucket of a call, as a stable string (also the on-disk cache key and what ``explain()`` shows)."""
    return (
        f"{call.device} {dtype_name(call.dtype)} B={call.batch} H={call.heads}/{call.kv_heads} "
        f"Sq={call.q_len} Skv={call.key_len} D={call.head_dim}/{call.value_dim} mask={mask_form(call, pure)} "
        f"causal={'yes' if call.is_causal else 'no'} dropout={'yes' if call.dropout_p > 0 else 'no'} "
        f"grad={'yes' if call.needs_grad else 'no'}" + (" lse=yes" if call.return_lse else "")
    )


@dataclass
class CandidateResult:
    """One candidate in one bucket: refused (with reasons), rejected (parity/NaN/error), timed, or skipped.

    A timed candidate keeps the median of its timed runs and, as their spread, the first and third quartiles
    (``low_s``, ``high_s``: the middle half of the runs) — what auto's decision rule compares, and what explain()
    shows so that a pick made on noisy timings can be seen to be one. ``samples`` holds the timed runs themselves, by
    the measurement (one process's probe of the bucket) that made them: a later measurement of a provisional pick adds
    its runs to these instead of starting over, and two processes that measured at once pool theirs without counting
    a run twice. ``reasons`` are :class:`~npu_port.reasons.Reason` objects: their text is what explain() shows, their
    codes go into the JSON.
    """

    kernel: str
    status: str
    reasons: List[Reason] = field(default_factory=list)
    median_s: Optional[float] = None
    runs: int = 0
    parity_error: Optional[float] = None
    tolerance: Optional[float] = None
    low_s: Optional[float] = None
    high_s: Optional[float] = None
    samples: Dict[str, List[float]] = field(default_factory=dict)

    def describe(self) -> str:
        if self.status in (PICKED, OK) and self.median_s is None:
            return "picked: the first candidate that can run this call"
        if self.status in (PICKED, OK):
            if self.runs == 1:
                text = f"{self.median_s * 1e3:10.3f} ms  (1 run)"
            elif self.low_s is not None and self.high_s is not None:
                text = (
                    f"{self.median_s * 1e3:10.3f} ms  (median of {self.runs}, middle half "
                    f"{self.low_s * 1e3:.3f}-{self.high_s * 1e3:.3f} ms)"
                )
            else:  # an entry cached before the spread was recorded
                text = f"{self.median_s * 1e3:10.3f} ms  (median of {self.runs})"
            if self.parity_error is not None:
                text += f"  parity {self.parity_error:.1e} <= {self.tolerance:.0e}"
            return text
        return f"{self.status}: " + "; ".join(self.reasons)


@dataclass
class Decision:
    """What a bucket runs: the winning kernel and every candidate's outcome.

    ``why`` says in one line why the kernel won (for auto's measured decisions). ``provisional`` marks a decision that
    timing noise may have made (see :func:`npu_port.strategy.measure.pick`): this process uses it, the disk cache
    keeps it marked, and a later process measures the bucket more, pooling its runs with these, instead of trusting
    it. ``measurements`` names the measurements whose runs the candidates' ``samples`` pool (one per process that
    probed the bucket).
    """

    bucket: str
    kernel: str
    select: str
    candidates: List[CandidateResult] = field(default_factory=list)
    probe_seconds: float = 0.0
    source: str = "measured"  # measured | disk cache | rule
    provisional: bool = False
    why: str = ""
    measurements: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        """Plain data for JSON and the disk cache: each candidate's ``reasons`` as their messages (as before codes
        were kept) and ``reason_codes`` beside them, one code per message."""
        data = asdict(self)
        for entry, candidate in zip(data["candidates"], self.candidates):
            entry["reasons"] = [str(reason) for reason in candidate.reasons]
            entry["reason_codes"] = [as_reason(reason).code for reason in candidate.reasons]
        return data

    @classmethod
    def from_dict(cls, data: Any, bucket: Optional[str] = None) -> "Decision":
        """A decision read back from the disk cache, checked field by field: anything another version, a crash or a
        hand edit could have left (a string for a decision, a missing field, a status or number of the wrong kind)
        raises :class:`ValueError` saying what, so that the caller can treat the entry as a cache miss."""
        _expect(isinstance(data, dict), f"expected a JSON object, found {_kind(data)}")
        unknown = sorted(set(data) - _DECISION_FIELDS)
        _expect(not unknown, f"unknown field {unknown[0]!r}" if unknown else "")
        for name in ("bucket", "kernel", "select", "source", "why"):
            _expect(isinstance(data.get(name, ""), str), f"{name} must be a string, found {_kind(data.get(name))}")
        _expect(bool(data.get("kernel")), "no kernel named")
        _expect("bucket" in data, "no bucket named")
        if bucket is not None:
            _expect(data["bucket"] == bucket, f"recorded for bucket {data['bucket']!r}, not this one")
        entries = data.get("candidates", [])
        _expect(isinstance(entries, list), f"candidates must be a list, found {_kind(entries)}")
        probe_seconds = data.get("probe_seconds", 0.0)
        _expect(_is_number(probe_seconds), f"probe_seconds must be a number, found {_kind(probe_seconds)}")
        provisional = data.get("provisional", False)  # absent in entries written before it existed: not provisional
        _expect(isinstance(provisional, bool), f"provisional must be true or false, found {_kind(provisional)}")
        measurements = data.get("measurements", [])
        _expect(
            isinstance(measurements, list)
            and all(isinstance(m, str) and m for m in measurements)
            and len(set(measurements)) == len(measurements),
            "measurements must be a list of distinct names",
        )
        candidates = [_candidate(entry, i) for i, entry in enumerate(entries)]
        for i, candidate in enumerate(candidates):
            foreign = sorted(set(candidate.samples) - set(measurements))
            if foreign:
                raise ValueError(f"candidate {i}: runs of measurement {foreign[0]!r}, which is not listed")
        return cls(
            bucket=data["bucket"],
            kernel=data["kernel"],
            select=data.get("select", "measure"),
            candidates=candidates,
            probe_seconds=float(probe_seconds),
            source=data.get("source", "measured"),
            provisional=provisional,
            why=data.get("why", ""),
            measurements=list(measurements),
        )

    def explain_lines(self) -> List[str]:
        how = {"measured": f"measured in {self.probe_seconds:.2f} s", "disk cache": "from the disk cache"}
        state = how.get(self.source, self.source)
        if len(self.measurements) > 1:
            state += f"; runs of {len(self.measurements)} measurements pooled"
        state += "; provisional" if self.provisional else ""
        lines = [f"bucket {self.bucket}  [{state}]"]
        width = max([len(c.kernel) for c in self.candidates] + [6])
        for candidate in self.candidates:
            marker = "*" if candidate.status == PICKED else " "
            lines.append(f"  {marker} {candidate.kernel:<{width}}  {candidate.describe()}")
        if self.provisional:
            lines.append(f"    -> {self.kernel}, provisional: {self.why}")
            then = "measures this bucket again" if self.source == "unmeasured" else "adds its runs of this bucket"
            lines.append(f"       (used by this process; the next process {then})")
        else:
            lines.append(f"    -> {self.kernel}" + (f": {self.why}" if self.why else ""))
        return lines


STATUSES = (PICKED, OK, REJECTED, REFUSED, SKIPPED, "not tried")
_DECISION_FIELDS = {
    "bucket",
    "kernel",
    "select",
    "candidates",
    "probe_seconds",
    "source",
    "provisional",
    "why",
    "measurements",
}
_CANDIDATE_FIELDS = {
    "kernel",
    "status",
    "reasons",
    "reason_codes",
    "median_s",
    "runs",
    "parity_error",
    "tolerance",
    "low_s",
    "high_s",
    "samples",
}
#: A candidate's times (seconds): plausible only when finite and above zero.
_TIMES = ("median_s", "low_s", "high_s")


def _expect(condition: bool, problem: str) -> None:
    if not condition:
        raise ValueError(problem)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_real(value: Any) -> bool:
    """A JSON number (NaN and infinities included: Python's json reads them), not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _samples(data: Any, where: str) -> Dict[str, List[float]]:
    """A candidate's timed runs by measurement: each a non-empty list of plausible times."""
    _expect(isinstance(data, dict), f"{where}: samples must be an object of runs by measurement, found {_kind(data)}")
    for name, runs in data.items():
        _expect(isinstance(runs, list) and bool(runs), f"{where}: samples of {name!r} must be a non-empty list")
        for value in runs:
            _expect(_is_real(value), f"{where}: a run of {name!r} must be a number, found {_kind(value)}")
            _expect(math.isfinite(value) and value > 0, f"{where}: a run of {name!r} took {value!r} s, not a time")
    return {name: [float(value) for value in runs] for name, runs in data.items()}


def _candidate(data: Any, index: int) -> CandidateResult:
    where = f"candidate {index}"
    _expect(isinstance(data, dict), f"{where}: expected a JSON object, found {_kind(data)}")
    unknown = sorted(set(data) - _CANDIDATE_FIELDS)
    _expect(not unknown, f"{where}: unknown field {unknown[0]!r}" if unknown else "")
    _expect(isinstance(data.get("kernel"), str), f"{where}: kernel must be a string")
    _expect(data.get("status") in STATUSES, f"{where}: status {data.get('status')!r} is not one of {STATUSES}")
    reasons = data.get("reasons", [])
    _expect(isinstance(reasons, list) and all(isinstance(r, str) for r in reasons), f"{where}: bad reasons")
    codes = data.get("reason_codes")  # absent in entries written before codes were kept: those read as "unknown"
    if codes is not None:
        _expect(
            isinstance(codes, list) and len(codes) == len(reasons) and all(isinstance(c, str) for c in codes),
            f"{where}: reason_codes must be a list of one code per reason",
        )
    try:
        kept = [Reason(code, text) for code, text in zip(codes, reasons)] if codes is not None else None
    except ValueError as exc:  # a code that is not lower-case words joined by dashes
        raise ValueError(f"{where}: {exc}") from None
    for name in ("median_s", "parity_error", "tolerance", "low_s", "high_s"):
        value = data.get(name)
        _expect(value is None or _is_real(value), f"{where}: {name} must be a number or null, found {_kind(value)}")
        if value is None:
            continue
        if name in _TIMES:  # a time of NaN, inf, 0 or below is no measurement: a hand edit or a broken writer
            _expect(math.isfinite(value) and value > 0, f"{where}: {name} is {value!r}, not a time (finite, > 0)")
        else:
            _expect(math.isfinite(value) and value >= 0, f"{where}: {name} is {value!r}, not finite and >= 0")
    spread = [data.get(name) for name in ("low_s", "median_s", "high_s")]
    if None not in spread:
        _expect(spread == sorted(spread), f"{where}: low_s <= median_s <= high_s does not hold: {spread}")
    runs = data.get("runs", 0)
    _expect(isinstance(runs, int) and not isinstance(runs, bool) and runs >= 0, f"{where}: bad runs {runs!r}")
    if data.get("parity_error") is not None:
        _expect(data.get("tolerance") is not None, f"{where}: a parity error without its tolerance")
    samples = _samples(data.get("samples", {}), where)
    if samples:  # the summary must be the one of the runs recorded: a time edited by hand does not match them
        found = summarise(samples)
        recorded = (data.get("median_s"), data.get("low_s"), data.get("high_s"), runs)
        _expect(
            recorded == (found.median, found.low, found.high, found.runs),
            f"{where}: median_s, low_s, high_s and runs {list(recorded)} are not those of its recorded runs "
            f"{[found.median, found.low, found.high, found.runs]}",
        )
    fields = {name: value for name, value in data.items() if name != "reason_codes"}
    fields["reasons"] = kept if kept is not None else [as_reason(text) for text in reasons]
    fields["samples"] = samples
    return CandidateResult(**fields)


def all_runs(samples: Dict[str, List[float]]) -> List[float]:
    """Every timed run of a candidate, whichever measurement made it."""
    return [seconds for runs in samples.values() for seconds in runs]


def summarise(samples: Dict[str, List[float]]) -> Spread:
    """The median and middle half of all of a candidate's runs (:func:`npu_port.device.timing.spread`)."""
    return spread(all_runs(samples))
