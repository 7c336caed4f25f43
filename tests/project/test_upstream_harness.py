"""benchmarks/upstream_tests: the plugin applies a strategy to every model a test builds (once, the outermost), records
what npu-port did and restores it; without its variable it changes nothing; outcomes and regressions are counted right.

The plugin runs in-process on toy test files (pytester), with a tiny CLIP text model built from a config: no network,
no upstream sources.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[2] / "benchmarks" / "upstream_tests"
pytest_plugins = ["pytester"]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"upstream_tests_{name}", HARNESS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


outcomes = _load("outcomes")

TOY = textwrap.dedent(
    """
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel

    KEEP = {}

    def _config():
        return CLIPTextConfig(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                              num_attention_heads=4, bos_token_id=0, eos_token_id=2, pad_token_id=1)

    def test_built_from_a_config():
        model = CLIPTextModel(_config()).eval()
        KEEP["model"] = model
        model(torch.randint(3, 99, (2, 7)))

    def test_loaded(tmp_path):
        KEEP["model"].save_pretrained(tmp_path)
        loaded = CLIPTextModel.from_pretrained(tmp_path).eval()
        loaded(torch.randint(3, 99, (1, 5)))

    def test_the_first_model_was_restored():
        assert KEEP["model"].config._attn_implementation == "sdpa"

    def test_fails():
        raise ValueError("boom\\nsecond line")
    """
)


def _records(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """Everything the toy tests import, imported before pytester's snapshot of ``sys.modules``: pytester drops the
    modules a test imported when it ends, and some (torch's functional collectives) cannot be imported twice."""
    transformers = pytest.importorskip("transformers")
    import torch
    from transformers.integrations import sdpa_attention

    import npu_port

    class PagedAttentionCache:  # what --compat-shim puts back, for the warm-up only
        pass

    model = transformers.CLIPTextModel(
        transformers.CLIPTextConfig(
            vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
            bos_token_id=0, eos_token_id=2, pad_token_id=1,
        )
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("warm")
    with pytest.MonkeyPatch.context() as patch:
        if not hasattr(sdpa_attention, "PagedAttentionCache"):
            patch.setattr(sdpa_attention, "PagedAttentionCache", PagedAttentionCache, raising=False)
        with npu_port.attention_strategy("sdpa", target=model):
            model(torch.randint(3, 99, (1, 4)))
        model.save_pretrained(folder)
        transformers.CLIPTextModel.from_pretrained(folder)
    return transformers


def _run(pytester, monkeypatch, transformers, **env):
    monkeypatch.syspath_prepend(str(HARNESS))
    for key in ("STRATEGY", "RECORD", "COMPAT_SHIM", "TARGETS"):
        monkeypatch.delenv(f"NPU_PORT_UPSTREAM_{key}", raising=False)
    record = pytester.path / "record.jsonl"
    monkeypatch.setenv("NPU_PORT_UPSTREAM_RECORD", str(record))
    for key, value in env.items():
        monkeypatch.setenv(f"NPU_PORT_UPSTREAM_{key.upper()}", value)
    pytester.makepyfile(test_toy=TOY)
    init_before = transformers.CLIPTextModel.__init__
    subclass_hook_before = transformers.PreTrainedModel.__dict__["__init_subclass__"]
    result = pytester.runpytest_inprocess("-p", "npu_port_plugin", "-p", "no:cacheprovider", "-n", "0")
    # the plugin leaves transformers exactly as it found it
    assert transformers.CLIPTextModel.__init__ is init_before
    assert transformers.PreTrainedModel.__dict__["__init_subclass__"] is subclass_hook_before
    from transformers.integrations import sdpa_attention

    assert getattr(getattr(sdpa_attention, "PagedAttentionCache", None), "__module__", "") != "npu_port_plugin"
    return result, outcomes.aggregate(_records(record)), _records(record)


def test_a_strategy_goes_on_every_built_model_once_and_comes_off_after_each_test(pytester, monkeypatch, warm):
    result, results, records = _run(
        pytester, monkeypatch, warm, strategy="sdpa", compat_shim="1", targets="transformers"
    )
    result.assert_outcomes(passed=3, failed=1)
    session = records[0]
    assert session["kind"] == "session" and session["strategy"] == "sdpa"
    assert session["compat_shim"].startswith(("installed", "not needed"))
    built = results["test_toy.py::test_built_from_a_config"]
    assert built["outcome"] == "passed"
    assert built["npu_port"]["models"] == [{"class": "CLIPTextModel", "how": "init", "calls": {"sdpa": 2}}]
    assert built["npu_port"]["routed"] == 2
    loaded = results["test_toy.py::test_loaded"]["npu_port"]["models"]
    assert [(m["class"], m["how"]) for m in loaded] == [("CLIPTextModel", "from_pretrained")]  # its __init__: no
    assert results["test_toy.py::test_the_first_model_was_restored"]["outcome"] == "passed"
    failed = results["test_toy.py::test_fails"]
    assert failed["outcome"] == "failed" and failed["message"] == "ValueError: boom"
    assert failed["where"].startswith("test_toy.py:") and failed["line"] == 'raise ValueError("boom\\nsecond line")'
    assert failed["npu_port"] == {"models": [], "routed": 0, "restore_errors": []}
    assert records[-1]["kind"] == "sessionfinish"


def test_without_a_strategy_nothing_is_applied(pytester, monkeypatch, warm):
    result, results, records = _run(pytester, monkeypatch, warm)
    result.assert_outcomes(passed=3, failed=1)
    assert records[0] == {"kind": "session", "strategy": None, "pid": records[0]["pid"]}
    assert not any("npu_port" in r for r in results.values())


def test_an_unknown_strategy_stops_the_run(pytester, monkeypatch, warm):
    result, _, _ = _run(pytester, monkeypatch, warm, strategy="no-such-strategy")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "NPU_PORT_UPSTREAM_STRATEGY='no-such-strategy'" in "\n".join(result.stderr.lines + result.stdout.lines)


def _report(test_id, when, outcome, **extra):
    return {"kind": "report", "id": test_id, "when": when, "outcome": outcome, "duration": 0.5, **extra}


def test_one_outcome_per_test_id_from_all_its_reports():
    records = [
        _report("a", "setup", "passed"),
        _report("a", "call", "passed"),
        _report("a", "call", "failed", subtest="case 3", message="AssertionError: 1 != 2"),
        _report("a", "teardown", "passed"),
        _report("b", "setup", "failed", message="RuntimeError: no fixture"),
        _report("c", "setup", "skipped", message="needs a GPU"),
        _report("d", "setup", "passed"),
        _report("d", "call", "skipped", xfail=True, message="known"),
        _report("e", "setup", "passed"),
        _report("e", "call", "passed", xfail=True),
        _report("f", "???", "failed", message="worker 'gw0' crashed while running 'f'"),
        _report("g", "setup", "passed"),
    ]
    results = outcomes.with_missing(outcomes.aggregate(records), ["a", "b", "h"])
    got = {test_id: r["outcome"] for test_id, r in results.items()}
    assert got == {
        "a": "failed",
        "b": "error",
        "c": "skipped",
        "d": "xfailed",
        "e": "xpassed",
        "f": "failed",
        "g": "missing",
        "h": "missing",
    }
    assert results["a"]["subtests_failed"] == 1 and results["a"]["message"] == "AssertionError: 1 != 2"
    assert outcomes.counts(results) == {
        "passed": 0,
        "failed": 2,
        "error": 1,
        "skipped": 1,
        "xfailed": 1,
        "xpassed": 1,
        "missing": 2,
        "total": 8,
    }


def test_regressions_fixed_and_other_changes():
    npu = {"models": [{"class": "M", "how": "init", "calls": {"sdpa": 3}}], "routed": 3, "restore_errors": []}
    baseline = {
        "r": {"outcome": "passed"},
        "x": {"outcome": "failed", "message": "AssertionError: old"},
        "s": {"outcome": "passed"},
        "same": {"outcome": "passed"},
    }
    strategy = {
        "r": {
            "outcome": "failed",
            "message": "npu_port.errors.NotRoutedError: CLIPAttention runs ...",
            "npu_port": npu,
        },
        "x": {"outcome": "passed", "npu_port": npu},
        "s": {"outcome": "skipped", "message": "needs eager"},
        "same": {"outcome": "passed", "npu_port": npu},
    }
    comparison = outcomes.compare(baseline, strategy)
    assert [(r["id"], r["cause"]) for r in comparison["regressions"]] == [("r", "NotRoutedError")]
    assert [f["id"] for f in comparison["fixed"]] == ["x"]
    assert [(c["id"], c["strategy"]) for c in comparison["changed"]] == [("s", "skipped")]
    routing = outcomes.routing(strategy)
    assert routing["routed_calls"] == 9 and routing["tests_with_routed_calls"] == 3
    assert outcomes.cause("Failed: Timeout (>600.0s) from pytest-timeout.") == "Timeout"
    assert outcomes.cause("assert 1 == 2") == "AssertionError"
    assert outcomes.confirm_status("passed", "failed") == "confirmed"
    assert outcomes.confirm_status("failed", "failed").startswith("flaky baseline")


def test_the_summary_lists_every_regression_with_where_the_tests_came_from(tmp_path):
    runner = _load("run")
    baseline = {"t::a": {"outcome": "passed"}, "t::b": {"outcome": "passed"}, "t::c": {"outcome": "skipped"}}
    strategy = {
        "t::a": {"outcome": "failed", "message": "torch.utils.checkpoint.CheckpointError: 3 tensors saved, 2 now"},
        "t::b": {"outcome": "passed", "npu_port": {"models": [{"class": "M", "how": "init", "calls": {"sdpa": 4}}]}},
        "t::c": {"outcome": "skipped"},
    }
    comparison = outcomes.compare(baseline, strategy)
    comparison["regressions"][0]["status"] = outcomes.confirm_status("passed", "failed")
    result = {
        "suite": "diffusers",
        "strategy": "sdpa",
        "date": "2026-11-27",
        "started": "s",
        "finished": "f",
        "machine": {"cpu": "toy CPU", "cpu_count": 2, "memory_gib": 1.0, "platform": "toy"},
        "versions": {"python": "3.11", "diffusers": "0.42.1"},
        "npu_port_checkout": {"commit": "0123456789abcdef", "branch": "b", "npu_port_tree": "fedcba9876543210"},
        "tests_from": {
            "installed_version": "0.42.1",
            "tests_are_the_installed_versions": False,
            "source": {"ref": "HEAD", "commit": "abcdef1234567890", "date": "d", "version_in_source": "0.40.0.dev0"},
            "overlay": {"sdist": None, "overlaid_files": []},
            "files": ["t"],
            "collection_errors": [],
        },
        "options": {"command": "python run.py", "jobs": 2, "timeout_per_test_s": 600, "env": {"OMP_NUM_THREADS": "1"}},
        "sessions": [],
        "wall_s": {"baseline": 60.0, "strategy": 90.0},
        "collected": 3,
        "counts": {"baseline": outcomes.counts(baseline), "strategy": outcomes.counts(strategy)},
        "routing": outcomes.routing(strategy),
        **comparison,
    }
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "diffusers-sdpa-2026-11-27.json").write_text(json.dumps(result))
    text = Path(runner.write_report(str(tmp_path / "results"), str(tmp_path / "summary.md"))).read_text()
    assert "**not the installed version's tag**" in text and "`abcdef123456`" in text
    assert "| `t::a` | failed | torch.utils.checkpoint.CheckpointError: 3 tensors saved, 2 now |  | confirmed |" in text
    assert "| confirmed |" in text and "1 x `torch.utils.checkpoint.CheckpointError: N tensors saved, N now`" in text
    assert "| diffusers | `sdpa` | 2026-11-27 | 3 | 2 / 0 / 1 | 1 / 1 / 1 | 1 (1) | 0 | 4 |" in text
