"""From the plugin's report records to one outcome per test id, and the comparison of two runs.

Pure functions over JSON records (no pytest, no torch): ``run.py`` uses them, and tests/project tests them.

One outcome per test id, from all its reports (setup, call, teardown, each subtest, an xdist crash report):

* ``failed``  - the call, a subtest, or the worker running it failed (a timeout kills the worker: failed);
* ``error``   - only setup or teardown failed;
* ``xfailed`` / ``skipped`` - skipped (as an expected failure, or not), nothing failed;
* ``xpassed`` / ``passed``;
* ``missing`` - collected, but no outcome came back (the run died before it).

A regression is a test that passes without npu-port (``passed``, ``xpassed``) and fails with it (``failed``,
``error``, ``missing``); ``fixed`` is the reverse; every other change (passed -> skipped, ...) is listed too.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Tuple

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "missing")
GOOD = frozenset({"passed", "xpassed"})
BAD = frozenset({"failed", "error", "missing"})


def read_records(paths: Iterable[str]) -> List[Dict[str, Any]]:
    """Every JSON line of the given record files, in order; a truncated last line (a killed run) is skipped."""
    records: List[Dict[str, Any]] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as stream:
                for line in stream:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue
        except FileNotFoundError:
            continue
    return records


def complete(path: str) -> bool:
    """The record file of a run that reached its end (its ``sessionfinish`` line is there)."""
    return any(r.get("kind") == "sessionfinish" for r in read_records([path]))


def aggregate(records: Iterable[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """test id -> {outcome, message, duration, npu_port (what the plugin saw, with a strategy), subtests_failed}."""
    by_id: Dict[str, List[Dict[str, Any]]] = {}
    for record in records:
        if record.get("kind") == "report":
            by_id.setdefault(record["id"], []).append(record)
    return {test_id: _one(reports) for test_id, reports in by_id.items()}


def _one(reports: List[Dict[str, Any]]) -> Dict[str, Any]:
    main = [r for r in reports if "subtest" not in r]
    subtests = [r for r in reports if "subtest" in r]
    failed_call = [
        r for r in reports if r["outcome"] == "failed" and (r["when"] not in ("setup", "teardown") or "subtest" in r)
    ]
    failed_other = [r for r in main if r["outcome"] == "failed" and r["when"] in ("setup", "teardown")]
    skipped = [r for r in main if r["outcome"] == "skipped"]
    call = [r for r in main if r["when"] == "call"]
    message = ""
    failure: Optional[Dict[str, Any]] = None
    if failed_call:
        outcome, failure = "failed", failed_call[0]
    elif failed_other:
        outcome, failure = "error", failed_other[0]
    elif skipped:
        outcome = "xfailed" if skipped[0].get("xfail") else "skipped"
        message = skipped[0].get("message", "")
    elif call and call[-1]["outcome"] == "passed":
        outcome = "xpassed" if call[-1].get("xfail") else "passed"
    else:
        outcome, message = "missing", "no call report (the run ended before this test finished)"
    result: Dict[str, Any] = {
        "outcome": outcome,
        "duration": round(sum(r.get("duration", 0.0) for r in main), 3),
    }
    if failure is not None:
        message = failure.get("message", "")
        for key in ("where", "line"):
            if failure.get(key):
                result[key] = failure[key]
    if message:
        result["message"] = message
    if subtests:
        result["subtests_failed"] = sum(1 for r in subtests if r["outcome"] == "failed")
    npu = [r["npu_port"] for r in reports if "npu_port" in r]
    if npu:
        result["npu_port"] = npu[-1]
    return result


def with_missing(results: Dict[str, Dict[str, Any]], expected: Iterable[str]) -> Dict[str, Dict[str, Any]]:
    """``results`` plus a ``missing`` entry for every expected (collected) id that has none."""
    merged = dict(results)
    for test_id in expected:
        if test_id not in merged:
            merged[test_id] = {"outcome": "missing", "message": "collected, but no report came back", "duration": 0.0}
    return merged


def counts(results: Dict[str, Dict[str, Any]]) -> Dict[str, int]:
    tally = Counter(r["outcome"] for r in results.values())
    return {outcome: tally.get(outcome, 0) for outcome in OUTCOMES} | {"total": len(results)}


_TYPE = re.compile(r"^((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Timeout|Failed|Interrupt|Warning))\b")


def cause(message: str) -> str:
    """The exception type a one-line failure message starts with (``AssertionError``, ``...NotRoutedError``), else
    the message's first words: the key the regressions are grouped by."""
    message = (message or "").strip()
    if not message:
        return "(no message)"
    if message.startswith("Timeout") or "Timeout (>" in message:
        return "Timeout"
    if "crashed" in message and "worker" in message:
        return "worker crashed"
    match = _TYPE.match(message)
    if match:
        return match.group(1).rsplit(".", 1)[-1]
    if message.startswith("assert ") or message.startswith("AssertionError"):
        return "AssertionError"
    return " ".join(message.split()[:6])


def compare(
    baseline: Dict[str, Dict[str, Any]], strategy: Dict[str, Dict[str, Any]]
) -> Dict[str, List[Dict[str, Any]]]:
    """Regressions (good without npu-port, bad with it), fixed (the reverse) and every other change, by test id."""
    regressions, fixed, changed = [], [], []
    for test_id in sorted(set(baseline) | set(strategy)):
        before = baseline.get(test_id, {"outcome": "missing"})
        after = strategy.get(test_id, {"outcome": "missing"})
        if before["outcome"] == after["outcome"]:
            continue
        entry = {"id": test_id, "baseline": before["outcome"], "strategy": after["outcome"]}
        if before["outcome"] in GOOD and after["outcome"] in BAD:
            message = after.get("message", "")
            entry.update(cause=cause(message), message=message)
            entry.update({key: after[key] for key in ("where", "line") if after.get(key)})
            npu = after.get("npu_port") or {}
            errors = [m["error"] for m in npu.get("models", []) if m.get("error")]
            if errors:
                entry["apply_errors"] = errors
            if npu.get("restore_errors"):
                entry["restore_errors"] = npu["restore_errors"]
            regressions.append(entry)
        elif before["outcome"] in BAD and after["outcome"] in GOOD:
            entry["baseline_message"] = before.get("message", "")
            fixed.append(entry)
        else:
            for side, data in (("baseline_message", before), ("strategy_message", after)):
                if data.get("message"):
                    entry[side] = data["message"]
            changed.append(entry)
    return {"regressions": regressions, "fixed": fixed, "changed": changed}


def routing(results: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """What npu-port did over a whole run: routed calls (total, per kernel), models applied, errors."""
    kernels: Counter = Counter()
    classes: Counter = Counter()
    apply_errors: Counter = Counter()
    restore_errors: Counter = Counter()
    tests_with_models = tests_routed = models = 0
    for result in results.values():
        npu = result.get("npu_port")
        if not npu:
            continue
        if npu.get("models"):
            tests_with_models += 1
        if npu.get("routed"):
            tests_routed += 1
        for model in npu.get("models", []):
            models += 1
            classes[model["class"]] += 1
            kernels.update(model.get("calls", {}))
            if model.get("error"):
                apply_errors[model["error"]] += 1
        restore_errors.update(npu.get("restore_errors", []))
    return {
        "routed_calls": sum(kernels.values()),
        "routed_calls_by_kernel": dict(kernels.most_common()),
        "models_applied": models,
        "models_by_class": dict(classes.most_common()),
        "tests_with_a_model": tests_with_models,
        "tests_with_routed_calls": tests_routed,
        "apply_errors": [{"error": e, "models": n} for e, n in apply_errors.most_common()],
        "restore_errors": [{"error": e, "tests": n} for e, n in restore_errors.most_common()],
    }


def confirm_status(baseline_again: Optional[str], strategy_again: Optional[str]) -> str:
    """A regression rerun alone, both ways: ``confirmed``, ``flaky baseline`` or ``not reproduced alone``."""
    if baseline_again is None or strategy_again is None:
        return "not rerun"
    if baseline_again not in GOOD:
        return f"flaky baseline (baseline rerun: {baseline_again})"
    if strategy_again in BAD:
        return "confirmed"
    return f"not reproduced alone (strategy rerun: {strategy_again}; order-dependent or flaky)"


def group_by_cause(regressions: List[Dict[str, Any]]) -> List[Tuple[str, int]]:
    return Counter(r["cause"] for r in regressions).most_common()


_NUMBERS = re.compile(r"0x[0-9a-f]+|\d+(?:\.\d+)?(?:e-?\d+)?", re.IGNORECASE)


def signature(message: str, words: int = 12) -> str:
    """A failure message with its numbers blanked and cut to its first words: failures that differ only in values
    (shapes, tolerances, addresses) share one."""
    text = _NUMBERS.sub("N", (message or "").strip())
    parts = text.split()
    return " ".join(parts[:words]) + (" ..." if len(parts) > words else "")


def group_by_signature(regressions: List[Dict[str, Any]]) -> List[Tuple[str, List[str]]]:
    """(signature, test ids) for the regressions, the most common first."""
    groups: Dict[str, List[str]] = {}
    for regression in regressions:
        key = signature(regression.get("message", ""))
        if regression.get("line"):
            key += f" | at: {regression['line']}"
        groups.setdefault(key, []).append(regression["id"])
    return sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
