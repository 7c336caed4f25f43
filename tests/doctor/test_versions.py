"""The doctor's versions and integrations checks: installed libraries against the support policy and the CI lanes'
record, and each integration's probe on a tiny model — so the doctor cannot be green while the main job is broken."""

from __future__ import annotations

import pytest

from npu_port import support
from npu_port.doctor import checks_versions, integration_probe
from npu_port.doctor.facts import Facts
from npu_port.doctor.probes import ProbeOutcome
from tests.versions import at_least

#: The oldest transformers whose CLIP text encoder npu-port routes (the probe's encoder is a CLIP).
CLIP_ROUTED = support.BY_PACKAGE["transformers"].features["text encoders routed (transformers AttentionInterface)"]

RECORD = {
    "lanes": [
        {"lane": "newest", "versions": {"diffusers": "0.42.1", "transformers": "5.24.0"}, "passed": True,
         "date": "2026-11-27"},
        {"lane": "oldest-0.14", "versions": {"diffusers": "0.14.0", "transformers": "4.30.2"}, "passed": True,
         "date": "2026-11-27"},
        {"lane": "broken", "versions": {"diffusers": "0.43.0"}, "passed": False, "date": "2026-11-27"},
    ]
}  # fmt: skip


def _finding(monkeypatch, package, version, record=RECORD):
    monkeypatch.setattr(support, "tested", lambda: record)
    monkeypatch.setattr(checks_versions, "installed_version", lambda name: version if name == package else None)
    facts = Facts({})
    facts.torch_version = None
    (found,) = checks_versions.check_versions(facts)
    return found


def test_older_than_supported_warns_with_the_bound_to_install(monkeypatch):
    found = _finding(monkeypatch, "transformers", "4.20.0")
    assert (found.check, found.status) == ("version-transformers", "warn")
    assert found.summary == (
        "transformers 4.20.0 is older than npu-port supports (4.25.1: the text encoders of the diffusers 0.11-0.14 "
        "era: their projects pin transformers 4.25-4.30)"
    )
    assert found.fix == 'pip install "transformers>=4.25.1"'


def test_a_tested_version_is_ok_and_names_its_lanes(monkeypatch):
    found = _finding(monkeypatch, "diffusers", "0.14.0")
    assert (found.status, found.summary) == ("ok", "diffusers 0.14.0: tested, passed (CI lanes: oldest-0.14)")


def test_newer_than_the_newest_tested_is_a_note_with_what_to_do(monkeypatch):
    found = _finding(monkeypatch, "diffusers", "0.43.0")  # a lane that failed on it does not count as tested
    assert found.status == "info"
    assert found.summary == (
        "diffusers 0.43.0 is newer than the newest tested (0.42.1, 2026-11-27); npu-port declines what it cannot "
        "use, so it should run"
    )
    assert found.fix == (
        'if something breaks, pip install "diffusers==0.42.1" or the whole tested set: '
        f"{checks_versions.TESTED_SET_HINT}, and report it"
    )


def test_between_tested_versions_and_without_a_record(monkeypatch):
    found = _finding(monkeypatch, "diffusers", "0.30.0")
    assert (found.status, found.summary) == (
        "info",
        "diffusers 0.30.0: within the supported range (from 0.11.1), not itself tested",
    )
    found = _finding(monkeypatch, "diffusers", "0.30.0", record=None)
    assert (found.status, found.summary) == ("info", "diffusers 0.30.0: no test record to compare with")


def _integrations(data):
    facts = Facts({})
    facts.integration_probe = ProbeOutcome(data)
    return {f.check: f for f in checks_versions.check_integrations(facts)}


def test_probe_outcomes_become_ok_warn_error_and_info():
    data = {
        "probes": {
            "transformers": {"status": "declines", "calls": 0, "detail": "no AttentionInterface"},
            "diffusers": {"status": "error", "detail": "AttributeError: x (at a.py:1)"},
            "gradio": {"status": "absent", "detail": "gradio is not installed"},
            "other": {"status": "routes", "calls": 3, "detail": "3 attention calls routed"},
        },
        "capabilities": {
            "transformers": {"version": "4.30.2", "features": {}},
            "diffusers": {"version": "0.42.1", "features": {}},
            "other": {"version": "1.0", "features": {}},
        },
    }
    found = _integrations(data)
    assert (found["integration-transformers"].status, found["integration-transformers"].summary) == (
        "warn",
        "transformers 4.30.2: declines (no AttentionInterface)",
    )
    assert found["integration-transformers"].code == "declined"
    assert (found["integration-diffusers"].status, found["integration-diffusers"].summary) == (
        "error",
        "diffusers 0.42.1: applying a strategy fails: AttributeError: x (at a.py:1)",
    )
    assert found["integration-gradio"].status == "info" and found["integration-other"].status == "ok"


def test_missing_pieces_warn_only_where_the_policy_claims_the_feature():
    feature = "text encoders routed (transformers AttentionInterface)"
    assert support.BY_PACKAGE["transformers"].features[feature] == "4.52.1"
    old = {"version": "4.30.2", "features": {feature: "no AttentionInterface"}}
    new = {"version": "5.30.0", "features": {feature: "no AttentionInterface"}}
    assert _integrations({"probes": {}, "capabilities": {"transformers": old}})["pieces-transformers"].status == "info"
    found = _integrations({"probes": {}, "capabilities": {"transformers": new}})["pieces-transformers"]
    assert found.status == "warn" and found.fix == "a change in transformers npu-port does not know yet: report it"


def test_a_probe_that_could_not_run_is_an_error():
    facts = Facts({})
    facts.integration_probe = ProbeOutcome(None, "the integration probe did not finish within 300 s")
    (found,) = checks_versions.check_integrations(facts)
    assert (found.status, found.summary) == (
        "error",
        "the integration probe failed: the integration probe did not finish within 300 s",
    )


@pytest.mark.transformers_min(CLIP_ROUTED)  # before it, the integration declines: nothing runs to break
def test_a_broken_integration_makes_the_probe_say_error(monkeypatch):
    """The doctor is never green while the main job is broken: an integration that raises in a forward is an error."""
    pytest.importorskip("transformers")
    from npu_port.integrations import transformers_attention

    def broken(*args, **kwargs):
        raise AttributeError("module 'transformers.integrations.sdpa_attention' has no attribute 'PagedAttentionCache'")

    monkeypatch.setattr(transformers_attention.SdpaToRoute, "__torch_function__", broken)
    result = integration_probe._guarded("transformers", integration_probe.probe_transformers)
    assert result["status"] == "error"
    assert result["detail"].startswith(
        "AttributeError: module 'transformers.integrations.sdpa_attention' has no attribute 'PagedAttentionCache' (at "
    )


def test_the_probe_routes_both_libraries_here_or_says_why_not():
    pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    from npu_port.upstream import transformers as upstream

    data = integration_probe.probe()
    routes = at_least("transformers", CLIP_ROUTED)  # the probe's encoder is a CLIP
    expected = {"transformers": "routes" if routes else "declines", "diffusers": "routes"}
    assert {name: r["status"] for name, r in data["probes"].items()} == expected
    text = data["capabilities"]["transformers"]["features"][upstream.TEXT_ENCODERS]
    assert (text is None) == upstream.ADAPTER.has("AttentionInterface")
    if text is not None:
        assert data["probes"]["transformers"]["detail"].startswith(
            f"CLIPTextModel: transformers {upstream.ADAPTER.version()} has no AttentionInterface"
        )
