"""The comparison as text: the culprit first, then how much diverged, then the worst calls.

    first divergence: blocks.1.attn (MaskedAttention), step 0, call 0: error 0.412 (tolerance 0.0001, float32),
      cosine 0.9125 -- origin: its inputs match (input error 0)

(one line in the output). A reader who reads one line learns which module, when, by how much and whether to look
there or earlier. What the error is: :mod:`.compare` (relative to the tensor's scale; NaN, inf and shape changes are
named instead of given a number).
"""

from __future__ import annotations

from typing import List, Optional

from .compare import AMPLIFY, CallResult, DiffReport, PairResult


def _number(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return "0" if value == 0 else f"{value:.3g}"


def _dtypes(pair: PairResult) -> str:
    a, b = pair.a.get("dtype"), pair.b.get("dtype")
    return str(a) if a == b else f"{a} vs {b}"


def _what(pair: PairResult) -> str:
    """How the worst output differs: its error, or the NaN / inf / shape change."""
    if pair.metric in ("nan", "inf"):
        counts = (pair.a.get(pair.metric, 0), pair.b.get(pair.metric, 0))
        if counts[0] == counts[1]:
            return f"{pair.metric.upper()} at different places ({_dtypes(pair)})"
        return f"{pair.metric.upper()} count {counts[0]} -> {counts[1]} ({_dtypes(pair)})"
    if pair.metric == "shape":
        return f"shape {pair.a.get('shape')} -> {pair.b.get('shape')}"
    return (
        f"error {_number(pair.error)} (tolerance {_number(pair.tolerance)}, {_dtypes(pair)}), cosine {pair.cosine:.6g}"
    )


def origin_text(call: CallResult) -> str:
    """Why the call is (or is not) where the difference starts."""
    inputs = f"input error {_number(call.input_error)}"
    if not call.origin:
        if call.origin_by == "rerun":
            return f"carried from its inputs: re-run on A's inputs it matches ({inputs})"
        return f"carried from its inputs ({inputs})"
    if call.origin_by == "rerun":
        return f"origin: re-run on A's inputs it still differs (error {_number(call.rerun_error)}; {inputs})"
    if all(p.metric == "match" and p.error * AMPLIFY <= p.tolerance for p in call.inputs):
        return f"origin: its inputs match ({inputs})"
    if any(p.metric in ("nan", "inf") for p in call.outputs):
        return f"origin: NaN/inf appear here, not in its inputs ({inputs})"
    return f"origin: its error is over {AMPLIFY:g}x its inputs' ({inputs})"


def call_line(call: CallResult) -> str:
    """``module (class), step S, call C: <how it differs> -- <origin>``."""
    worst = call.worst()
    what = _what(worst) if worst is not None else "no outputs"
    kind = "" if call.kind == "module" else f"{call.kind} in "
    return f"{kind}{call.module} ({call.cls}), step {call.step}, call {call.call}: {what} -- {origin_text(call)}"


def _severity(call: CallResult) -> float:
    worst = call.worst()
    return worst.error if worst is not None else 0.0


def report_text(report: DiffReport, top: int = 10) -> str:
    """The report as lines of text (see the module docstring); ``top``: how many of the worst divergent calls to
    list after the culprit."""
    lines: List[str] = []
    first = report.first_divergence
    if first is None:
        lines.append(f"no divergence beyond tolerance ({report.compared} tensors compared)")
    else:
        divergent = report.divergent
        origins = sum(1 for c in divergent if c.origin)
        lines.append(f"first divergence: {call_line(first)}")
        lines.append(
            f"{len(divergent)} of {len(report.calls)} calls diverge ({origins} as origin); "
            f"{report.compared} tensors compared"
        )
    for side, count in (("A", report.only_a), ("B", report.only_b)):
        if count:
            lines.append(f"only in {side}: {count} tensor{'s' if count != 1 else ''} (not compared)")
    if first is not None and top > 0:
        worst = sorted(report.divergent, key=_severity, reverse=True)[:top]
        lines.append(f"largest divergences ({len(worst)} of {len(report.divergent)}):")
        lines.extend(f"  {call_line(call)}" for call in worst)
    return "\n".join(lines)
