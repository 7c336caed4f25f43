"""Broken strategy files fail closed and alone: a file that is not UTF-8 (or not valid YAML, or against the schema)
is a StrategyFileError naming the file; listings (list_strategies, ``npu-port strategies``, ``--json``, bench's
defaults and ``all``) name it with its error and skip it while every other strategy still works; asking for it by
name gives its exact error."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import npu_port
from npu_port.bench.runner import select_strategies
from npu_port.cli.main import main
from npu_port.errors import StrategyFileError
from npu_port.strategy.registry import StrategyFileWarning, get_strategy, load_strategy_file, survey

LATIN1 = "description: caf\u00e9 strategy\nkernel: math\n".encode("latin-1")  # 0xe9 at byte offset 16, line 1
UTF8_ERROR = (
    "not UTF-8 text: byte 0xe9 at byte offset 16 cannot be decoded (strategy files must be UTF-8; re-save the file "
    "as UTF-8)"
)
GOOD = "description: a good user strategy\nextends: auto\ncandidates: [sdpa, math]\n"


@pytest.fixture
def search_path(tmp_path, monkeypatch):
    """A strategy directory on NPU_PORT_STRATEGY_PATH with one good file and one file that is not UTF-8."""
    (tmp_path / "good-one.yaml").write_text(GOOD, encoding="utf-8")
    (tmp_path / "latin.yaml").write_bytes(LATIN1)
    monkeypatch.setenv("NPU_PORT_STRATEGY_PATH", str(tmp_path))
    return tmp_path


def test_a_non_utf8_file_is_a_strategy_file_error_with_line_and_byte_offset(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_bytes(b"# first line\n" + LATIN1)
    with pytest.raises(StrategyFileError) as info:
        load_strategy_file(path)
    assert str(info.value) == f"{path}:2: {UTF8_ERROR.replace('offset 16', 'offset 29')}"
    assert (info.value.path, info.value.line) == (str(path), 2)


def test_yaml_the_safe_loader_cannot_build_is_a_strategy_file_error(tmp_path):
    path = tmp_path / "odd.yaml"
    path.write_bytes(b"description: x\nkernel: math\nwhen: 2024-13-45\n")
    with pytest.raises(StrategyFileError) as info:
        load_strategy_file(path)
    assert str(info.value) == f"{path}:1: not valid YAML: ValueError: month must be in 1..12"


def test_listing_skips_the_broken_file_with_a_warning_and_the_rest_work(search_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = npu_port.list_strategies()
    assert "latin" not in names and names[-1] == "good-one"
    assert {"auto", "sdpa", "vanilla", "chunked"} <= set(names)
    assert [(w.category, str(w.message)) for w in caught] == [
        (StrategyFileWarning, f"strategy 'latin' skipped: {search_path / 'latin.yaml'}:1: {UTF8_ERROR}")
    ]
    assert get_strategy("good-one").candidates == ("sdpa", "math")
    with npu_port.attention_strategy("good-one"):
        pass
    with pytest.raises(StrategyFileError) as info:  # by name: its exact error
        get_strategy("latin")
    assert str(info.value) == f"{search_path / 'latin.yaml'}:1: {UTF8_ERROR}"
    with pytest.warns(StrategyFileWarning, match="strategy 'latin' skipped: "):
        assert npu_port.list_strategies(kind="profile")  # kind filtering loads every file: still no crash


def test_a_user_file_taking_a_builtin_name_is_reported_not_fatal(tmp_path, monkeypatch):
    (tmp_path / "sdpa.yaml").write_text("description: mine\nkernel: math\n")
    monkeypatch.setenv("NPU_PORT_STRATEGY_PATH", str(tmp_path))
    names, broken = survey()
    assert "sdpa" in names and get_strategy("sdpa").candidates == ("sdpa",)  # the built-in keeps its name
    assert [(b.name, b.path, str(b.error)) for b in broken] == [
        (
            "sdpa",
            str(tmp_path / "sdpa.yaml"),
            f"{tmp_path / 'sdpa.yaml'}:1: 'sdpa' is a built-in strategy name; rename the file and use 'extends: sdpa'",
        )
    ]


def test_npu_port_strategies_names_the_broken_file_on_stderr_and_lists_the_rest(search_path, capsys):
    assert main(["strategies"]) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        f"npu-port: warning: strategy 'latin' skipped: {search_path / 'latin.yaml'}:1: {UTF8_ERROR}\n"
    )
    assert "  good-one " in captured.out and "  auto " in captured.out and "latin" not in captured.out


def test_npu_port_strategies_json_has_a_broken_list(search_path, capsys):
    assert main(["strategies", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["broken"] == [
        {
            "name": "latin",
            "path": str(search_path / "latin.yaml"),
            "error": f"{search_path / 'latin.yaml'}:1: {UTF8_ERROR}",
        }
    ]
    assert "good-one" in [e["name"] for e in data["strategies"]]


def test_npu_port_strategies_show_of_the_broken_one_gives_its_error(search_path, capsys):
    assert main(["strategies", "--show", "latin"]) == 2
    assert capsys.readouterr().err == f"npu-port: {search_path / 'latin.yaml'}:1: {UTF8_ERROR}\n"


@pytest.mark.parametrize("request_text", [None, "all"])
def test_bench_selection_skips_the_broken_file_with_its_error(search_path, request_text):
    chosen, skipped = select_strategies(request_text)
    assert "good-one" in [s.name for s in chosen] and "auto" in [s.name for s in chosen]
    assert ("latin", f"broken strategy file: {search_path / 'latin.yaml'}:1: {UTF8_ERROR}") in skipped


@pytest.mark.slow
def test_npu_port_bench_runs_the_others_and_refuses_the_broken_one_by_name(search_path, tmp_path, capsys):
    argv = ["bench", "--shapes", "custom:1,1,16,8", "--repeats", "1", "--warmup", "0"]
    assert main([*argv, "--strategies", "good-one,sdpa"]) == 0
    capsys.readouterr()
    assert main([*argv, "--strategies", "sdpa,latin"]) == 2
    assert capsys.readouterr().err == f"npu-port: {search_path / 'latin.yaml'}:1: {UTF8_ERROR}\n"
    out_dir: Path = tmp_path / "out"
    assert main([*argv, "--output", str(out_dir), "--no-plot"]) == 0  # defaults: every loadable strategy
    captured = capsys.readouterr()
    assert f"npu-port: warning: strategy 'latin' skipped: {search_path / 'latin.yaml'}:1: {UTF8_ERROR}\n" in (
        captured.err
    )
    data = json.loads((out_dir / "bench.json").read_text())
    assert {"strategy": "latin", "reason": f"broken strategy file: {search_path / 'latin.yaml'}:1: {UTF8_ERROR}"} in (
        data["skipped_strategies"]
    )
    assert "good-one" in {cell["strategy"] for cell in data["cells"]}
