"""The commands that load models run them inside the quiet console: a library's warning while the model loads is
held back and counted in one line, ``--verbose`` lets it through, and bad input is
still refused before the console (and its imports) start. The model work itself is replaced by a stand-in that
warns like a library, so that these tests check the wiring, fast."""

from __future__ import annotations

import logging
import types
import warnings

import pytest

from npu_port.cli.main import main

SUMMARY = "npu-port: 2 library warnings hidden (fakelib 1, transformers 1); --verbose shows them\n"


@pytest.fixture(autouse=True)
def _always_show():
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        yield


def _noisy(result):
    """A stand-in for loading a model: a fake library warns, transformers logs a warning."""
    library = types.ModuleType("fakelib.loading")
    exec("import warnings\ndef load():\n    warnings.warn('old checkpoint format', FutureWarning)\n", library.__dict__)

    def stand_in(*_, **__):
        library.load()
        logging.getLogger("transformers.modeling_utils").warning("some weights were not used")
        return result

    return stand_in


def test_infer_hides_the_libraries_and_says_so(tmp_path, monkeypatch, capsys, recwarn):
    from npu_port.cli import infer_cmd

    monkeypatch.setattr(infer_cmd, "_execute", _noisy(0))
    assert main(["infer", "--output", str(tmp_path / "x.png")]) == 0
    assert capsys.readouterr().err == SUMMARY
    assert [str(w.message) for w in recwarn] == []


def test_infer_verbose_shows_them(tmp_path, monkeypatch, capsys, recwarn):
    from npu_port.cli import infer_cmd

    monkeypatch.setattr(infer_cmd, "_execute", _noisy(0))
    assert main(["infer", "--verbose", "--output", str(tmp_path / "x.png")]) == 0
    assert "library warnings hidden" not in capsys.readouterr().err
    assert [str(w.message) for w in recwarn] == ["old checkpoint format"]


def test_infer_bad_input_is_one_line_before_the_console(tmp_path, monkeypatch, capsys):
    from npu_port.cli import infer_cmd

    monkeypatch.setattr(infer_cmd, "_execute", _noisy(0))
    assert main(["infer", "--steps", "0", "--output", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("npu-port: ") and err.count("\n") == 1 and "steps" in err


def test_an_error_after_loading_keeps_its_line(tmp_path, monkeypatch, capsys):
    from npu_port.cli import infer_cmd
    from npu_port.errors import InferenceError

    def failing(*arguments):
        _noisy(None)(*arguments)
        raise InferenceError("--output 'x.mp4': 'some/model' makes images, not a video")

    monkeypatch.setattr(infer_cmd, "_execute", failing)
    assert main(["infer", "--output", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err == SUMMARY + "npu-port: --output 'x.mp4': 'some/model' makes images, not a video\n"


class _Stop(Exception):
    """Ends a command once the model work ran (not Ctrl-C, which prints no summary: its one line is the whole story)."""


def test_plan_hides_the_libraries_and_verbose_shows_them(monkeypatch, capsys):
    import npu_port.plan.models as plan_models

    seen = []

    def record(*arguments, **options):
        _noisy(None)()
        seen.append(True)
        raise _Stop  # stop before the plan is judged: the wiring is what is tested here

    monkeypatch.setattr(plan_models, "record_model", record)
    with pytest.raises(_Stop):
        main(["plan", "--model", "tiny"])
    assert capsys.readouterr().err == SUMMARY
    with pytest.warns(FutureWarning, match="old checkpoint format"), pytest.raises(_Stop):
        main(["plan", "--model", "tiny", "--verbose"])
    assert "library warnings hidden" not in capsys.readouterr().err
    assert len(seen) == 2


def test_strategies_explain_hides_the_libraries(monkeypatch, capsys):
    from npu_port.cli import strategies_cmd

    monkeypatch.setattr(strategies_cmd, "explain", _noisy("explained"))
    assert main(["strategies", "--explain", "sdpa"]) == 0
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("explained\n", SUMMARY)
