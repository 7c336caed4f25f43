"""Shape buckets and the record of a decision: which kernel runs a bucket, and why the others do not.

A bucket is everything that can change which kernel is fastest or whether it can run at all: device, dtype,
batch, heads (query/key-value), sequence lengths, head dims, mask form (kind and which dimensions broadcast),
causal, dropout, gradients. Calls in one bucket reuse one decision; a decision is plain data so that it can be
cached on disk and shown by ``explain()``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..attn.call import AttentionCall
from ..attn.masks import dtype_name

#: Candidate outcomes, in the order explain() sorts them.
PICKED, OK, REJECTED, REFUSED, SKIPPED = "picked", "ok", "rejected", "refused", "skipped"


def mask_form(call: AttentionCall) -> str:
    """``none``, or the mask kind and its broadcast pattern over (B, H, Sq, Skv): ``bool[B1QK]``, ``float[11QK]``."""
    if call.mask is None:
        return "none"
    letters = "BHQK"
    pattern = "".join("1" if size == 1 else letters[i] for i, size in enumerate(call.mask.shape))
    return f"{call.mask.kind}[{pattern}]"


def bucket_signature(call: AttentionCall) -> Tuple[Any, ...]:
    """What the router looks its choice up by, on every call: a tuple that determines :func:`bucket_key` (the exact
    shapes fix the mask's broadcast pattern), built from a few attribute reads. The readable string is made only
    when a bucket is first seen."""
    mask = call.mask
    return (
        call.query.shape,
        call.key.shape,
        call.value.shape,
        call.query.dtype,
        call.query.device,
        None if mask is None else (mask.bias is None, mask.keep.shape),
        call.is_causal,
        call.dropout_p > 0,
        call.needs_grad,
    )


def bucket_key(call: AttentionCall) -> str:
    """The bucket of a call, as a stable string (also the on-disk cache key and what ``explain()`` shows)."""
    return (
        f"{call.device} {dtype_name(call.dtype)} B={call.batch} H={call.heads}/{call.kv_heads} "
        f"Sq={call.q_len} Skv={call.key_len} D={call.head_dim}/{call.value_dim} mask={mask_form(call)} "
        f"causal={'yes' if call.is_causal else 'no'} dropout={'yes' if call.dropout_p > 0 else 'no'} "
        f"grad={'yes' if call.needs_grad else 'no'}"
    )


@dataclass
class CandidateResult:
    """One candidate in one bucket: refused (with reasons), rejected (parity/NaN/error), timed, or skipped."""

    kernel: str
    status: str
    reasons: List[str] = field(default_factory=list)
    median_s: Optional[float] = None
    runs: int = 0
    parity_error: Optional[float] = None
    tolerance: Optional[float] = None

    def describe(self) -> str:
        if self.status in (PICKED, OK) and self.median_s is None:
            return "picked: the first candidate that can run this call"
        if self.status in (PICKED, OK):
            text = f"{self.median_s * 1e3:10.3f} ms  (median of {self.runs})"
            if self.parity_error is not None:
                text += f"  parity {self.parity_error:.1e} <= {self.tolerance:.0e}"
            return text
        return f"{self.status}: " + "; ".join(self.reasons)


@dataclass
class Decision:
    """What a bucket runs: the winning kernel and every candidate's outcome."""

    bucket: str
    kernel: str
    select: str
    candidates: List[CandidateResult] = field(default_factory=list)
    probe_seconds: float = 0.0
    source: str = "measured"  # measured | disk cache | rule

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "Decision":
        candidates = [CandidateResult(**c) for c in data.get("candidates", [])]
        return cls(
            bucket=data["bucket"],
            kernel=data["kernel"],
            select=data.get("select", "measure"),
            candidates=candidates,
            probe_seconds=float(data.get("probe_seconds", 0.0)),
            source=data.get("source", "measured"),
        )

    def explain_lines(self) -> List[str]:
        how = {"measured": f"measured in {self.probe_seconds:.2f} s", "disk cache": "from the disk cache"}
        lines = [f"bucket {self.bucket}  [{how.get(self.source, self.source)}]"]
        width = max([len(c.kernel) for c in self.candidates] + [6])
        for candidate in self.candidates:
            marker = "*" if candidate.status == PICKED else " "
            lines.append(f"  {marker} {candidate.kernel:<{width}}  {candidate.describe()}")
        lines.append(f"    -> {self.kernel}")
        return lines
