"""Measuring candidates for one shape bucket: refuse, check parity, time, pick — like Triton's autotuner, plus a
correctness gate and a decision rule that one timing spike cannot sway.

For the first call in a bucket ``auto`` asks each candidate for its reasons (cheap), refuses any whose score tensor
would not fit the memory budget, checks the rest against the math kernel on a slice of the real inputs (one batch
entry, at most two key/value heads, the first ``parity_rows`` query rows, every key; a kernel that errors, gives
NaN/inf or disagrees beyond the dtype's tolerance is rejected with the number recorded — a kernel can be fast and
wrong, see pytorch#193893), runs each survivor once on the real inputs (a NaN check, and a first time), then times
them in round-robin rounds (warm-up rounds first, order rotated so machine noise hits every candidate alike, device
synchronised) and keeps, per candidate, the median and the middle half (first to third quartile) of its timed runs.
Only the forward pass is timed, without autograd, and the random state is put back afterwards (the candidates run
with the call's dropout): measuring leaves nothing behind that the call, or its recompute under gradient
checkpointing, could see. The probe budget bounds it: no new candidate is started once it is spent, and a round
is started only if it is expected to fit. The first round is planned from the first runs, each capped at
:data:`FIRST_RUN_CAP` times the fastest one (so one spike in a first run inflates the plan at most that much instead
of cancelling every round); each later round from the elapsed time of the round before it. On calls of a second or
more, where not even one round fits, the first runs are the measurement. A lone survivor (the others refused or
rejected) is not run again at all (on a call that takes a minute, that halves the first call's cost).

The pick (:func:`pick`) prefers the strategy's order: a later candidate displaces an earlier one only when it is
clearly faster — median more than ``margin`` lower and middle halves apart — so a single slow run of the preferred
kernel, or a few percent of jitter, cannot hand a bucket to another kernel. When the timings cannot settle it (a
candidate looks faster by more than the margin but the spreads overlap, or a non-preferred winner had fewer than
:data:`MIN_CONFIDENT_RUNS` timed runs), the decision is *provisional*: used by this process, cached marked as such,
and measured more by the next process. It is provisional as well when a candidate was skipped because the budget
was spent before it could run (e.g. the preferred kernel's first run stalled for longer than ``probe_seconds``):
nothing was compared, so nothing is kept for good.

Measuring more is not starting over (:func:`pool`): the next process's runs join the stored ones, each run kept under
the measurement that made it, and the pick is made again on all of them (:func:`conclude`). Noise that a handful of
runs could not see through often settles with three times as many; where it does not, the pick made on the pooled
runs of :data:`MIN_CONFIDENT_RUNS` measurements is kept for good (the strategy's preference among candidates that
timing cannot tell apart), so that on a busy machine a bucket stops being measured, and the kernel mix stops
changing, after a few runs of a program.

A pick made on first runs alone (no round fitted the budget) can only err towards the preferred kernel: a
non-preferred winner has one timed run, fewer than :data:`MIN_CONFIDENT_RUNS`, so it is provisional and never holds
the bucket for good; what can be kept for good is the preferred kernel, when a challenger's first run was slower
than its later runs would have been. All timing goes through :func:`_time_once`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..attn.api import run_kernel
from ..attn.call import AttentionCall
from ..attn.contract import finish_output
from ..attn.kernels.base import Kernel
from ..attn.masks import CanonicalMask
from ..attn.registry import get_kernel
from ..device.rng import preserved_rng
from ..device.timing import Rounds, timed
from ..errors import NoKernelError
from ..reasons import Reason
from .decision import OK, PICKED, REFUSED, REJECTED, SKIPPED, CandidateResult, Decision, summarise
from .spec import DEFAULT_OPTIONS

#: A winner other than the preferred (first timed) candidate needs at least this many timed runs to be kept for good.
MIN_CONFIDENT_RUNS = 3

#: When planning the first round, each first run counts for at most this many times the fastest first run: one spike
#: in a first run (a busy moment, a lazy initialisation) inflates the plan at most this much.
FIRST_RUN_CAP = 10.0

#: Largest allowed ``max|out - reference|``, relative to ``max(1, max|reference|)``, per compute dtype.
#: The values of xformers' own tests (fp32 3e-4, fp16 4e-3, bf16 2e-2).
TOLERANCE: Dict[torch.dtype, float] = {
    torch.float64: 1e-6,
    torch.float32: 3e-4,
    torch.float16: 4e-3,
    torch.bfloat16: 2e-2,
}


def _slice_mask(mask: Optional[CanonicalMask], heads: int, rows: int) -> Optional[CanonicalMask]:
    if mask is None:
        return None

    def cut(t: Tensor) -> Tensor:
        return t[:1, : heads if t.shape[1] > 1 else 1, : rows if t.shape[2] > 1 else 1]

    return CanonicalMask(cut(mask.keep), cut(mask.bias) if mask.bias is not None else None)


def parity_slice(call: AttentionCall, rows: int) -> AttentionCall:
    """A small call with the same form: batch 1, up to 2 key/value heads (their query heads), the first rows; no
    dropout (each run drops other elements, so no kernel would agree with the reference on a dropped call: parity is
    checked on the attention itself, and the real-input run that follows keeps the call's dropout)."""
    kv_heads = min(call.kv_heads, 2)
    heads = kv_heads * call.group
    rows = min(call.q_len, rows)
    q = call.query[:1, :heads, :rows].detach()
    k = call.key[:1, :kv_heads].detach()
    v = call.value[:1, :kv_heads].detach()
    return replace(
        call,
        query=q,
        key=k,
        value=v,
        mask=_slice_mask(call.mask, heads, rows),
        dropout_p=0.0,
        output_shape=(1, heads, rows, call.value_dim),
    )


def reference_output(sliced: AttentionCall) -> Tensor:
    """The math kernel on the slice, in float32 (float64 for float64 inputs): the yardstick."""
    dtype = torch.float64 if sliced.dtype == torch.float64 else torch.float32
    mask = sliced.mask
    if mask is not None and mask.bias is not None:
        mask = CanonicalMask(mask.keep, mask.bias.to(dtype))
    ref_call = replace(
        sliced, query=sliced.query.to(dtype), key=sliced.key.to(dtype), value=sliced.value.to(dtype), mask=mask
    )
    return run_kernel(ref_call, get_kernel("math"))


def parity_error(kernel: Kernel, sliced: AttentionCall, reference: Tensor) -> Tuple[float, float]:
    """(max abs error relative to the reference's scale, the tolerance). Fails closed: NaN/inf in the output, or in
    the reference (then nothing can be shown to agree with it), give an infinite error."""
    out = run_kernel(sliced, kernel).to(reference.dtype)
    if not (bool(torch.isfinite(out).all()) and bool(torch.isfinite(reference).all())):
        return float("inf"), 0.0
    scale = max(1.0, float(reference.abs().max())) if reference.numel() else 1.0
    error = float((out - reference).abs().max()) / scale if reference.numel() else 0.0
    tolerance = max(TOLERANCE.get(sliced.dtype, 3e-4), TOLERANCE.get(getattr(kernel, "dtype", sliced.dtype), 0.0))
    return error, tolerance


def _failure(exc: Exception) -> Reason:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return Reason("failed", f"failed: {type(exc).__name__}: {message}")


#: Decision.source of a call that could not be measured (its inputs hold NaN or inf): used once, never kept.
UNMEASURED = "unmeasured"


def _unmeasured(
    call: AttentionCall,
    bucket: str,
    runnable: List[Kernel],
    results: List[CandidateResult],
    started: float,
    needs_grad: bool,
) -> Decision:
    """The first candidate that can run ``call``: with NaN or inf in its inputs the math kernel's answer is not
    finite, no output can be checked against it, and timings on it would say nothing. The output still holds the NaN
    where SDPA's formula puts it (npu_port.attn.contract).

    For this call only, and the next call of the bucket is measured — unless the call needs gradients: autograd may
    run it again (gradient checkpointing recomputes a forward in the backward, after later calls could have measured
    the bucket), and a recompute must run the kernel its forward ran. Then the pick is kept for the bucket, marked
    provisional: this process keeps it, the disk cache never gets it, and the next process measures the bucket.
    (``needs_grad`` is the call's, read before measuring turned autograd off.)"""
    if needs_grad:
        then = (
            "kept for this shape in this process, since autograd may recompute the call (gradient checkpointing) and "
            "a recompute must run the kernel its forward ran; the next process measures it"
        )
    else:
        then = "the next call of this shape is measured"
    why = Reason(
        "unmeasured",
        "not measured: NaN or inf in query, key, value or mask, so no output can be checked against the math kernel; "
        f"this call runs on the first candidate that can run it, and {then}",
    )
    picked = [CandidateResult(runnable[0].name, PICKED, [why])]
    rest = [CandidateResult(kernel.name, SKIPPED, [why]) for kernel in runnable[1:]]
    return Decision(
        bucket=bucket,
        kernel=runnable[0].name,
        select="measure",
        candidates=picked + rest + results,
        probe_seconds=time.perf_counter() - started,
        source=UNMEASURED,
        provisional=needs_grad,
        why=(
            "NaN or inf in the inputs left nothing to measure; kept, as autograd may recompute this call"
            if needs_grad
            else ""
        ),
    )


def _inputs_finite(call: AttentionCall) -> bool:
    """No NaN or inf in the query, key or value, and no NaN or +inf in the float mask (-inf there masks). The parity
    slice sees one batch entry and a few heads and rows; a NaN elsewhere would make every candidate's first run on
    the real inputs fail its NaN check, and the call would be refused instead of run."""
    if not all(bool(torch.isfinite(t).all()) for t in (call.query, call.key, call.value)):
        return False
    bias = call.mask.bias if call.mask is not None else None
    return bias is None or not bool((torch.isnan(bias) | torch.isposinf(bias)).any())


def _time_once(kernel: Kernel, call: AttentionCall) -> Tuple[Tensor, float]:
    """One run of ``kernel`` on ``call``: its raw output and its seconds, the device synchronised before and after.
    The only clock auto reads, for the first runs and the rounds alike (so both are timed the same way, and a test
    can script the timings by replacing this one function). A call that asks for the log-sum-exp times ``run_lse``
    (the op ring attention will run), and its output is what is checked."""
    if call.return_lse:
        out, seconds = timed(lambda: kernel.run_lse(call), call.device)
        return out[0], seconds
    return timed(lambda: kernel.run(call), call.device)


def _first_run(kernel: Kernel, call: AttentionCall) -> float:
    """One run on the real inputs, whose output must be free of NaN / inf; its synchronised seconds."""
    out, seconds = _time_once(kernel, call)
    if not bool(torch.isfinite(finish_output(out, call)).all()):
        raise FloatingPointError("the output has NaN or inf values on the real inputs")
    return seconds


def _record(result: CandidateResult, samples: List[float], measurement: str) -> None:
    """Keep ``samples`` as ``measurement``'s runs of the candidate and summarise all its runs: the median and their
    middle half (first and third quartiles, inclusive method: for 5 runs the 2nd and 4th fastest), which one outlier,
    however large, can shift only as far as a neighbouring run's time."""
    result.samples[measurement] = list(samples)
    _summarise(result)


def _summarise(result: CandidateResult) -> None:
    summary = summarise(result.samples)
    result.median_s, result.runs, result.low_s, result.high_s = summary.median, summary.runs, summary.low, summary.high


def _time_round_robin(
    survivors,
    call: AttentionCall,
    warmup: int,
    repeats: int,
    deadline: float,
    first: Dict[str, float],
    measurement: str,
) -> None:
    """Run the survivors in interleaved rounds (:class:`~npu_port.device.timing.Rounds`: one run each per round with
    the order rotated, so that a burst of load on a shared machine slows every candidate alike instead of skewing one
    candidate's median): ``warmup - 1`` untimed rounds (every survivor has had one run already), then up to
    ``repeats`` timed ones. A survivor whose run fails is rejected and takes no further part.

    A round starts only if it is expected to fit before ``deadline``, so a round of big calls (a second each on a
    CPU) does not overrun the probe budget. The first round is expected to take the sum of the first runs, each capped
    at :data:`FIRST_RUN_CAP` times the fastest (one spike in one first run must not cancel every round); each later
    round as long as the round before it took. A candidate that got no timed run is judged by its first run
    (``first``), which on such calls differs little from later ones.
    """
    fastest = min(first.values())
    first_round_s = sum(min(seconds, FIRST_RUN_CAP * fastest) for seconds in first.values())

    def reject(survivor, exc: Exception, round_index: int) -> None:
        result = survivor[1]
        result.status, result.reasons = REJECTED, [_failure(exc)]

    rounds = Rounds(survivors, lambda survivor: _time_once(survivor[0], call)[1], on_error=reject)
    rounds.run(repeats, untimed=max(warmup, 1) - 1, deadline=deadline, first_round_s=first_round_s)
    for (_, result), times in zip(survivors, rounds.samples):
        if result.status == OK:
            _record(result, times or [first[result.kernel]], measurement)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _clearly_faster(challenger: CandidateResult, incumbent: CandidateResult, margin: float) -> bool:
    """Median more than ``margin`` lower, and the middle halves apart (the challenger's third quartile below the
    incumbent's first): what it takes to displace a candidate that comes earlier in the strategy's order."""
    return challenger.median_s * (1 + margin) < incumbent.median_s and challenger.high_s < incumbent.low_s


def pick(timed: Sequence[CandidateResult], margin: float) -> Tuple[CandidateResult, bool, str]:
    """The winner among ``timed`` (in the strategy's order), whether the pick is provisional, and why, in one line.

    The first candidate is the incumbent; each later one displaces it only if :func:`_clearly_faster`. Being clearly
    faster carries over (a candidate clearly faster than the winner would have been clearly faster than the incumbent
    it met), so no candidate ends up clearly faster than the winner. The pick is provisional when the timings cannot
    settle it: some candidate's median is more than ``margin`` below the winner's but their middle halves overlap
    (noise hid the answer), or the winner is not the preferred (first) candidate and had fewer than
    :data:`MIN_CONFIDENT_RUNS` timed runs (a probe budget that let only the first runs happen, or ``repeats`` below
    that).
    """
    preferred = winner = timed[0]
    for challenger in timed[1:]:
        if _clearly_faster(challenger, winner, margin):
            winner = challenger
    doubts = []
    for other in timed:
        if other is not winner and other.median_s * (1 + margin) < winner.median_s:
            doubts.append(
                f"{other.kernel}'s median ({_ms(other.median_s)}) is more than {margin:.0%} below {winner.kernel}'s "
                f"({_ms(winner.median_s)}) but their middle halves overlap ({other.low_s * 1e3:.3g}-"
                f"{other.high_s * 1e3:.3g} ms against {winner.low_s * 1e3:.3g}-{winner.high_s * 1e3:.3g} ms)"
            )
    if winner is not preferred and winner.runs < MIN_CONFIDENT_RUNS:
        doubts.append(
            f"{winner.kernel} beat the preferred {preferred.kernel} on {winner.runs} timed "
            f"run{'s' if winner.runs != 1 else ''}, fewer than {MIN_CONFIDENT_RUNS}"
        )
    if doubts:
        return winner, True, "; ".join(doubts)
    if len(timed) == 1:
        why = "the only candidate timed"
    elif winner is preferred:
        why = f"first in strategy order, and no candidate is clearly faster (margin {margin:.0%})"
    else:
        why = (
            f"clearly faster than the preferred {preferred.kernel}: median {_ms(winner.median_s)} against "
            f"{_ms(preferred.median_s)}, middle halves apart (margin {margin:.0%})"
        )
    return winner, False, why


def measure(
    call: AttentionCall,
    bucket: str,
    candidates: Sequence[Kernel],
    *,
    budget_bytes: Optional[int],
    warmup: int,
    repeats: int,
    probe_seconds: float,
    parity_rows: int,
    margin: float = DEFAULT_OPTIONS["margin"],
) -> Decision:
    """Decide the kernel for ``call``'s bucket by measuring ``candidates`` (see the module docstring). The timed runs
    are kept under a new measurement name (the decision's ``measurements``), so that :func:`pool` can add them to
    an earlier measurement's."""
    started = time.perf_counter()
    measurement = new_measurement()
    deadline = started + probe_seconds
    needs_grad = call.needs_grad  # (measuring runs without autograd)
    results: List[CandidateResult] = []
    runnable: List[Kernel] = []
    for kernel in candidates:
        reasons = list(kernel.reasons(call))
        if not reasons and budget_bytes is not None:
            needed = kernel.score_bytes(call)
            if needed > budget_bytes:
                reasons.append(
                    Reason(
                        "budget",
                        f"would materialise {needed / 2**20:.0f} MiB of scores, over the {budget_bytes / 2**20:.0f} "
                        "MiB memory budget",
                    )
                )
        if reasons:
            results.append(CandidateResult(kernel.name, REFUSED, reasons))
        else:
            runnable.append(kernel)
    if not runnable:
        raise NoKernelError(call.describe(), {r.kernel: r.reasons for r in results})

    # Nothing of the measuring stays behind: no autograd graph, and no random numbers drawn (the candidates run with
    # the call's dropout; the call itself, run after this, must draw what it would have drawn without the measuring,
    # as its recompute under gradient checkpointing, which measures nothing, will)
    with preserved_rng(call.device), torch.no_grad():
        sliced = parity_slice(call, parity_rows)
        reference = reference_output(sliced)
        reference_finite = bool(torch.isfinite(reference).all())
        if not (reference_finite and _inputs_finite(call)):  # NaN / inf came in: nothing can be checked, so
            return _unmeasured(call, bucket, runnable, results, started, needs_grad)  # nothing decided on this call
        survivors: List[Tuple[Kernel, CandidateResult]] = []
        first: Dict[str, float] = {}  # each survivor's first run on the real inputs (seconds)
        for kernel in runnable:  # parity on the slice, then one run (NaN check, first time) on the real inputs
            if survivors and time.perf_counter() > deadline:
                results.append(
                    CandidateResult(
                        kernel.name, SKIPPED, [Reason("probe-time", f"probe time budget ({probe_seconds:g} s) spent")]
                    )
                )
                continue
            try:
                error, tolerance = parity_error(kernel, sliced, reference)
                if not error <= tolerance:  # written so that a NaN error is a rejection too
                    what = "NaN or inf in the output" if error == float("inf") else f"max error {error:.2e}"
                    why = Reason("parity", f"disagrees with the math kernel: {what} > {tolerance:.0e}")
                    results.append(
                        CandidateResult(
                            kernel.name,
                            REJECTED,
                            [why],
                            parity_error=error,
                            tolerance=tolerance,
                        )
                    )
                    continue
                first[kernel.name] = _first_run(kernel, call)
            except Exception as exc:  # a backend that accepts a call and then fails is exactly what auto must catch
                results.append(CandidateResult(kernel.name, REJECTED, [_failure(exc)]))
                continue
            result = CandidateResult(kernel.name, OK, parity_error=error, tolerance=tolerance)
            survivors.append((kernel, result))
            results.append(result)
        if len(survivors) == 1:  # nothing to compare: its first run's time is shown, and a huge call is not run again
            _record(survivors[0][1], [first[survivors[0][0].name]], measurement)
        elif survivors:  # (none: every candidate was rejected, which is said below)
            _time_round_robin(survivors, call, warmup, repeats, deadline, first, measurement)
    if not any(result.status == OK for _, result in survivors):
        raise NoKernelError(call.describe(), {r.kernel: r.reasons for r in results})
    decision = Decision(
        bucket=bucket,
        kernel="",
        select="measure",
        candidates=results,
        probe_seconds=time.perf_counter() - started,
        measurements=[measurement],
    )
    return conclude(decision, [kernel.name for kernel in candidates], margin, probe_seconds)


def new_measurement() -> str:
    """A name for one measurement of one bucket, unique across processes and machines sharing a cache folder."""
    return uuid.uuid4().hex[:12]


def conclude(decision: Decision, order: Sequence[str], margin: float, probe_seconds: float) -> Decision:
    """``decision`` with its winner, provisional flag and why set from its candidates' runs (all of them, pooled
    across its measurements): :func:`pick` among the timed candidates in the strategy's ``order``. The pick is
    provisional as well when a candidate was skipped (the probe budget was spent before it could run, and no earlier
    measurement timed it: nothing was compared with it). A provisional pick is measured more by later processes,
    each adding its runs; once the runs of :data:`MIN_CONFIDENT_RUNS` measurements are pooled it is settled even if
    they leave it open — more runs of the same noise would not separate the candidates, and the pick then is the
    strategy's preference among them (a later candidate only wins clearly), so it stops being measured and stops
    changing from run to run."""
    results = decision.candidates
    for result in results:
        if result.status == PICKED:
            result.status = OK
    rank = {name: index for index, name in enumerate(order)}
    timed = sorted(
        (r for r in results if r.status == OK and r.median_s is not None), key=lambda r: rank.get(r.kernel, len(rank))
    )
    best, provisional, why = pick(timed, margin)
    skipped = [r.kernel for r in results if r.status == SKIPPED]
    if skipped:  # nothing was compared with them: measured again by the next process
        unmeasured = (
            f"{', '.join(skipped)} {'was' if len(skipped) == 1 else 'were'} skipped: the probe time budget "
            f"({probe_seconds:g} s) was spent before {'it' if len(skipped) == 1 else 'they'} could run"
        )
        why = f"{why}; {unmeasured}" if provisional else unmeasured
        provisional = True
    pooled = len(decision.measurements)
    if provisional and pooled >= MIN_CONFIDENT_RUNS:
        provisional = False
        why = f"{why}; settled: the runs of {pooled} measurements are pooled, and more would not separate them"
    best.status = PICKED
    statuses = {PICKED: 0, OK: 1, REJECTED: 2, SKIPPED: 3, REFUSED: 4}
    results.sort(key=lambda r: (statuses.get(r.status, 5), r.median_s if r.median_s is not None else 0.0))
    return replace(decision, kernel=best.kernel, provisional=provisional, why=why, candidates=results)


def pool(earlier: Decision, later: Decision, order: Sequence[str], margin: float, probe_seconds: float) -> Decision:
    """One decision from two measurements of the same bucket: ``later``'s candidates (what this machine can run and
    what passed parity is its answer) with each timed candidate's runs joined to ``earlier``'s, by measurement, so
    that runs both already hold (two processes that pooled the same earlier entry) count once; a candidate ``later``
    skipped keeps ``earlier``'s runs. Then :func:`conclude` over all the runs. Pooling is a union, so the result
    does not depend on which process writes first: the disk cache merges concurrent writers with it."""
    before = {c.kernel: c for c in earlier.candidates if c.status in (PICKED, OK) and c.samples}
    candidates = []
    for result in later.candidates:
        result = replace(result, reasons=list(result.reasons), samples=dict(result.samples))
        old = before.get(result.kernel)
        if old is not None and result.status in (PICKED, OK, SKIPPED):
            for measurement, runs in old.samples.items():
                result.samples.setdefault(measurement, list(runs))
            if result.status == SKIPPED:
                result.status, result.reasons = OK, []
            _summarise(result)
        candidates.append(result)
    measurements = list(dict.fromkeys(earlier.measurements + later.measurements))
    joined = replace(later, candidates=candidates, measurements=measurements)
    return conclude(joined, order, margin, probe_seconds)
