"""Reason codes reach the user: router and auto keep :class:`~npu_port.reasons.Reason` objects in their decisions, the
decision JSON (handle.report(), the disk cache) carries ``reason_codes`` beside the messages, old cache entries still
load, the errors expose ``codes``, and ``doctor --json`` has a ``code`` next to each kernel's message. The text that
people read is unchanged."""

from __future__ import annotations

import pytest
import torch

import npu_port
from npu_port.doctor.checks_attention import check_attention_kernels
from npu_port.doctor.facts import Facts
from npu_port.errors import KernelUnavailableError, NoKernelError
from npu_port.reasons import Reason
from npu_port.strategy.decision import REFUSED, Decision
from npu_port.strategy.registry import get_strategy
from npu_port.strategy.router import StrategyRouter

#: On a CPU the efficient SDPA backend does not exist, so sdpa pinned to it refuses every call, with code "backend".
PINNED = {"sdpa_backends": ["efficient"]}


def _router(name, **overrides):
    return StrategyRouter(get_strategy(name).with_overrides(**overrides))


def _qkv():
    torch.manual_seed(0)
    return [torch.randn(1, 2, 8, 16) for _ in range(3)]


def test_first_keeps_the_refusals_codes_and_the_json_carries_them():
    router = _router("sdpa", candidates=["sdpa", "chunked", "math"], **PINNED)
    router(*_qkv())
    (decision,) = router.decisions.values()
    refused, picked, not_tried = decision.candidates
    assert (refused.status, picked.kernel, not_tried.status) == (REFUSED, "chunked", "not tried")
    assert [type(r) for r in refused.reasons] == [Reason] and refused.reasons[0].code == "backend"
    assert not_tried.reasons == ["an earlier candidate runs this call"] and not_tried.reasons[0].code == "not-tried"
    data = decision.to_dict()
    assert data["candidates"][0]["reasons"] == [str(refused.reasons[0])]  # messages as before, codes beside them
    assert data["candidates"][0]["reason_codes"] == ["backend"]
    again = Decision.from_dict(data)
    assert [(r.code, str(r)) for r in again.candidates[0].reasons] == [("backend", str(refused.reasons[0]))]
    assert again.explain_lines() == decision.explain_lines()  # the text people read is unchanged


def test_auto_refusal_for_the_memory_budget_has_its_code():
    router = _router("auto", candidates=["math", "chunked"], memory_budget="1KiB", cache=False)
    router(*(torch.randn(1, 2, 64, 16) for _ in range(3)))  # math's scores: 64 KiB
    (decision,) = router.decisions.values()
    math = next(c for c in decision.candidates if c.kernel == "math")
    assert (math.status, [r.code for r in math.reasons]) == (REFUSED, ["budget"])
    assert math.reasons[0].startswith("would materialise 0 MiB of scores, over the 0 MiB memory budget")


def test_a_cache_entry_written_before_codes_loads_with_code_unknown():
    old = {
        "bucket": "b",
        "kernel": "math",
        "select": "measure",
        "candidates": [
            {"kernel": "math", "status": "picked", "median_s": 0.001, "runs": 1},
            {"kernel": "npu_fusion", "status": "refused", "reasons": ["torch_npu is not installed"]},
        ],
    }
    decision = Decision.from_dict(old, "b")
    (reason,) = decision.candidates[1].reasons
    assert (type(reason), reason.code, str(reason)) == (Reason, "unknown", "torch_npu is not installed")
    assert decision.to_dict()["candidates"][1]["reason_codes"] == ["unknown"]


@pytest.mark.parametrize(
    "codes, problem",
    [
        (["backend", "dtype"], "candidate 0: reason_codes must be a list of one code per reason"),
        ("backend", "candidate 0: reason_codes must be a list of one code per reason"),
        (["Not A Code"], "candidate 0: a reason code is lower-case words joined by dashes, got 'Not A Code'"),
    ],
)
def test_malformed_reason_codes_make_the_entry_a_cache_miss(codes, problem):
    entry = {"kernel": "sdpa", "status": "refused", "reasons": ["pinned"], "reason_codes": codes}
    with pytest.raises(ValueError) as info:
        Decision.from_dict({"bucket": "b", "kernel": "math", "candidates": [entry]})
    assert str(info.value) == problem


def test_errors_carry_the_codes():
    with pytest.raises(NoKernelError) as info:
        _router("sdpa", candidates=["sdpa"], select="first", **PINNED)(*_qkv())
    assert info.value.codes == {"sdpa": ["backend"]}
    with pytest.raises(KernelUnavailableError) as unavailable:
        _router("sdpa", **PINNED)(*_qkv())
    assert unavailable.value.codes == ["backend"]
    assert all(type(reason) is Reason for reason in unavailable.value.reasons)
    plain = KernelUnavailableError("k", "call", ["a plain string from a third-party kernel"], [])
    assert plain.codes == ["unknown"] and str(plain.reasons[0]) == "a plain string from a third-party kernel"


def test_strategy_availability_keeps_reasons():
    availability = _router("auto").availability()
    for kernel in npu_port.kernels():
        assert [(r.code, str(r)) for r in availability[kernel.name]] == [
            (r.code, str(r)) for r in kernel.availability()
        ]


def test_doctor_kernel_findings_have_the_code_next_to_the_message():
    findings = {finding.check: finding for finding in check_attention_kernels(Facts())}
    for kernel in npu_port.kernels():
        finding = findings[f"kernel-{kernel.name}"]
        reasons = kernel.availability()
        expected = (
            None
            if not reasons
            else ("package-broken" if "package-broken" in [r.code for r in reasons] else reasons[0].code)
        )
        assert finding.code == expected
        assert finding.as_dict()["code"] == expected
    assert any(finding.code is not None for finding in findings.values())  # this machine lacks torch_npu at least
