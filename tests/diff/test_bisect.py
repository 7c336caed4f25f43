"""bisect: names the setting that parts two runs, then the modules where it does, within its bound of runs — on the
tiny DiT pipeline with a strategy that is wrong for one attention module only."""

from __future__ import annotations

import pytest

from npu_port.diff import compare
from npu_port.diff.bisect import Scope, bisect, differing, max_runs
from npu_port.diff.dump import Dump
from npu_port.diff.runner import PipelineRunner
from npu_port.integrations.diffusers.tiny import run_tiny_pipeline, tiny_dit_pipeline

from .wrong_processor import MARK

ATTENTION = ["transformer.transformer_blocks.0.attn1", "transformer.transformer_blocks.1.attn1"]
#: Every attention module a strategy replaces (the VAE's encoder is not run by the pipeline, its decoder is).
GROUPS = ATTENTION + ["vae.encoder.mid_block.attentions.0", "vae.decoder.mid_block.attentions.0"]


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    return tiny_dit_pipeline(save_dir=str(tmp_path_factory.mktemp("dit") / "dit"))


def request(pipe):
    run_tiny_pipeline(pipe, steps=1)  # one step: the wrong module parts the runs in its first call


@pytest.fixture
def wrong_strategy(tmp_path):
    path = tmp_path / "one-wrong.yaml"
    path.write_text(
        "extends: custom-processor\ndescription: right but for one module (test)\n"
        "processor: tests.diff.wrong_processor:OneWrongProcessor\n",
        encoding="utf-8",
    )
    return str(path)


@pytest.fixture
def marked(pipe):
    """Mark one attention module as the one the wrong processor gets wrong; unmarked afterwards."""
    marks = []

    def mark(name):
        module = dict(pipe.transformer.named_modules())[name.split(".", 1)[1]]
        setattr(module, MARK, True)
        marks.append(module)

    yield mark
    for module in marks:
        delattr(module, MARK)


class Counting:
    """Wraps a runner: counts its calls and keeps each call's arguments (bisect's own count is checked against it)."""

    def __init__(self, runner):
        self.runner = runner
        self.calls = []

    def groups(self, key, value):
        return self.runner.groups(key, value)

    def __call__(self, settings, scope):
        self.calls.append((dict(settings), scope))
        return self.runner(settings, scope)


@pytest.mark.parametrize("wrong", [1, 0])
def test_bisect_names_the_strategy_and_the_one_wrong_module(pipe, tmp_path, wrong_strategy, marked, wrong):
    marked(ATTENTION[wrong])
    run = Counting(PipelineRunner(pipe, request, tmp_path))
    a = {"strategy": "vanilla", "fuse_ops": [], "dtype": "float32"}
    b = {"strategy": wrong_strategy, "fuse_ops": ["rms_norm"], "dtype": "float32"}  # rms_norm: nothing to fuse
    result = bisect(run, a, b)
    assert result.diverged
    assert result.first_divergence["module"].startswith(ATTENTION[wrong])
    assert result.cause == ("strategy", "vanilla", wrong_strategy)
    assert result.modules == [ATTENTION[wrong]]
    assert result.runs == len(run.calls) <= result.max_runs == max_runs(2, 4) == 1 + 1 + 2 + 2 + 1
    # reference, B, B with strategy back to A's (that removes it: fuse_ops is not tried), then halves of the 4
    # attention modules (A with B's strategy on them)
    assert [s for s, _ in run.calls[:3]] == [a, b, dict(b, strategy="vanilla")]
    assert run.calls[3] == (a, Scope("strategy", wrong_strategy, tuple(ATTENTION)))
    assert run.calls[4] == (a, Scope("strategy", wrong_strategy, (ATTENTION[0],)))
    assert len(run.calls) == (5 if wrong == 0 else 6)  # the second module, taken untried, is checked once
    text = result.text()
    assert f"cause: strategy ('vanilla' in A, '{wrong_strategy}' in B) ({result.runs} runs, at most 7)" in text
    assert f"modules: {ATTENTION[wrong]}" in text
    as_dict = result.as_dict()
    assert as_dict["cause"] == {"setting": "strategy", "a": "vanilla", "b": wrong_strategy}
    assert as_dict["modules"] == [ATTENTION[wrong]] and len(as_dict["trials"]) == result.runs - 1
    assert not any(hasattr(m, "processor") and type(m.processor).__name__ == "OneWrongProcessor"
                   for m in pipe.transformer.modules())  # fmt: skip


def test_the_scoped_run_changes_only_the_named_module(pipe, tmp_path, wrong_strategy, marked):
    marked(ATTENTION[1])
    runner = PipelineRunner(pipe, request, tmp_path)
    assert runner.groups("strategy", "vanilla") == GROUPS
    a = {"strategy": "vanilla"}
    plain = runner(a, None)
    scoped = runner(a, Scope("strategy", wrong_strategy, (ATTENTION[0],)))  # the right module: same numbers
    wrong = runner(a, Scope("strategy", wrong_strategy, (ATTENTION[1],)))
    key = ("module", ATTENTION[1], 0, 0, "out", 0)
    by_key = [{(r["kind"], r["module"], r["step"], r["call"], r["io"], r["index"]): r for r in d.records()}
              for d in (plain, scoped, wrong)]  # fmt: skip
    assert by_key[1][key]["sample"] == pytest.approx(by_key[0][key]["sample"], rel=1e-5, abs=1e-6)
    ratios = [y / x for x, y in zip(by_key[0][key]["sample"], by_key[2][key]["sample"]) if abs(x) > 1e-3]
    assert ratios and ratios == pytest.approx([1.01] * len(ratios), rel=1e-4)
    assert isinstance(plain, Dump) and plain.meta["settings"] == a and "scope" not in plain.meta
    assert wrong.meta["scope"] == {"key": "strategy", "value": wrong_strategy, "modules": [ATTENTION[1]]}


def test_nothing_diverges_in_one_run(pipe, tmp_path):
    run = Counting(PipelineRunner(pipe, request, tmp_path))
    a = {"strategy": "vanilla", "fuse_ops": []}
    reference = run(a, None)
    result = bisect(run, a, {"strategy": "sdpa", "fuse_ops": []}, reference=reference)
    assert not result.diverged and result.cause is None and result.modules == []
    assert result.runs == 1 and len(run.calls) == 2
    assert result.text() == "no divergence: B matches A (1 run, at most 1)"


def test_a_whole_model_setting_is_named_without_narrowing(pipe, tmp_path, monkeypatch):
    # bfloat16's rounding is within its tolerance (0.2: compare.py says what was measured); held to 5e-2 here it
    # diverges after two steps, which makes dtype the setting to name
    monkeypatch.setitem(compare.TOLERANCE, "bfloat16", 5e-2)
    run = Counting(PipelineRunner(pipe, lambda p: run_tiny_pipeline(p, steps=2), tmp_path))
    a, b = {"strategy": "vanilla", "dtype": "float32"}, {"strategy": "vanilla", "dtype": "bfloat16"}
    result = bisect(run, a, b)
    assert result.cause == ("dtype", "float32", "bfloat16") and result.modules == []
    assert result.runs == 2 and result.notes == ["dtype applies to the whole model: not narrowed to modules"]
    assert next(pipe.transformer.parameters()).dtype.is_floating_point  # the loaded pipeline stays float32
    assert str(next(pipe.transformer.parameters()).dtype) == "torch.float32"


def fake_run(bad, log):
    """A run whose dump is what a settings/scope pair produces: bisect on a synthetic model of ``n`` modules."""

    def run(settings, scope):
        log.append((dict(settings), scope))
        wrong = set()
        if settings["strategy"] == "B":
            wrong |= set(bad)
        if scope is not None and scope.value == "B":
            wrong |= set(bad) & set(scope.modules)
        return frozenset(wrong)

    return run


class FakeCall:
    def __init__(self, module, order):
        self.kind, self.module, self.cls, self.step, self.call, self.order, self.origin = (
            "module", module, "X", 0, 0, order, True)  # fmt: skip

    def worst(self):
        return None


class FakeReport:
    def __init__(self, first):
        self.first_divergence = first


def fake_compare(names):
    def compare(a, b):
        wrong = sorted(b - a, key=names.index)
        return FakeReport(FakeCall(wrong[0], names.index(wrong[0])) if wrong else None)

    return compare


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
def test_binary_search_finds_each_module_within_the_bound(n):
    names = [f"m{i}" for i in range(n)]
    for bad in range(n):
        log = []
        result = bisect(fake_run([names[bad]], log), {"strategy": "A", "x": 1}, {"strategy": "B", "x": 2},
                        groups=names, compare=fake_compare(names))  # fmt: skip
        assert result.cause == ("strategy", "A", "B") and result.modules == [names[bad]], (n, bad)
        assert result.runs == len(log) <= result.max_runs == max_runs(2, n), (n, bad, result.runs)


def test_modules_that_only_diverge_together_are_reported_as_the_smallest_group_that_does():
    names = ["m0", "m1", "m2", "m3"]

    def run(settings, scope):
        chosen = set(names) if settings["strategy"] == "B" else set(scope.modules if scope else ())
        return frozenset({"m3"}) if {"m1", "m2"} <= chosen else frozenset()

    result = bisect(run, {"strategy": "A"}, {"strategy": "B"}, groups=names, compare=fake_compare(names))
    # reference, B, [m0, m1] (matches), then [m2] (matches) and [m3] taken untried and checked: the bound, 5
    assert result.modules == names and result.runs == 5 == result.max_runs
    assert result.notes == ["no group of modules alone reproduces it: strategy parts the runs only in several at once"]


def test_bad_settings_are_refused_before_any_run(pipe, tmp_path):
    with pytest.raises(ValueError) as info:
        bisect(lambda s, c: pytest.fail("ran"), {"strategy": "a"}, {"strategy": "b", "dtype": "float16"})
    assert str(info.value) == (
        "bisect needs the same settings on both sides; only one side has: dtype (A: strategy; B: strategy, dtype)"
    )
    assert differing({"a": 1, "b": [1]}, {"a": 1, "b": [2]}) == ["b"]
    runner = PipelineRunner(pipe, request, tmp_path)
    for settings, message in [
        ({"kernel": "x"}, "unknown setting 'kernel' for a pipeline run; valid settings: strategy, fuse_ops, dtype"),
        ({"dtype": "float8"}, "unknown dtype 'float8'; valid dtypes: float32, float16, bfloat16"),
        ({"fuse_ops": "rms_norm"}, "fuse_ops must be a list of op names, not 'rms_norm'"),
    ]:
        with pytest.raises(ValueError) as info:
            runner(settings, None)
        assert str(info.value) == message
    with pytest.raises(ValueError, match="^dtype cannot be applied to some modules only"):
        runner({}, Scope("dtype", "float16", ("transformer",)))
    assert not list(tmp_path.iterdir())
