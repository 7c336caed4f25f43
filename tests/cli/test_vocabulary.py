"""One CLI vocabulary: every parser of ``npu-port`` (walked from ``main._parser()``, nested ones included) spells the
shared options the same way (npu_port/cli/vocabulary.py), its help is plain text, and its Example lines parse."""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import io
import re
import shlex
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npu_port.cli import main as cli
from npu_port.cli.vocabulary import EXAMPLE_HEADING

#: Shared flag -> the dest every command stores it under (other code reads these names).
DESTS = {"--format": "format", "--json": "format", "-o": "output", "--output": "output", "-q": "quiet",
         "--quiet": "quiet", "-v": "verbose", "--verbose": "verbose", "--no-progress": "no_progress"}  # fmt: skip
#: Markup that reads as noise in a terminal: RST literals and roles, Markdown code.
MARKUP = re.compile(r"``|:[a-z]+:`|`")


def _walk(
    parser: argparse.ArgumentParser, path: Tuple[str, ...] = ()
) -> Iterator[Tuple[Tuple[str, ...], argparse.ArgumentParser]]:
    for name, child in cli.subparsers(parser).items():
        yield (*path, name), child
        yield from _walk(child, (*path, name))


PARSERS: Dict[Tuple[str, ...], argparse.ArgumentParser] = dict(_walk(cli._parser()))
IDS = [" ".join(path) for path in PARSERS]


def _options(parser: argparse.ArgumentParser) -> Dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def _module(path: Tuple[str, ...]):
    return importlib.import_module(f"npu_port.cli.{cli.COMMANDS[path[0]]}")


def _examples(parser: argparse.ArgumentParser) -> List[str]:
    epilog = parser.epilog or ""
    assert epilog.startswith(EXAMPLE_HEADING), f"no {EXAMPLE_HEADING!r} epilog"
    lines = [line.strip() for line in epilog.splitlines()[1:] if line.strip()]
    assert lines, "an Example: epilog with no command line"
    return lines


def _argv(line: str) -> List[str]:
    words = shlex.split(line)
    assert words[0] == "npu-port", line
    return words[1:]


def _with(path: Tuple[str, ...], extra: List[str]) -> List[str]:
    """The first example's argv with ``extra`` right after the command words (before a script of ``run``)."""
    argv = _argv(_examples(PARSERS[path])[0])
    return [*argv[: len(path)], *extra, *argv[len(path) :]]


def test_every_command_is_walked():
    assert set(IDS) >= set(cli.COMMANDS)


@pytest.mark.parametrize("path", PARSERS, ids=IDS)
def test_shared_options_have_the_shared_names(path):
    options = _options(PARSERS[path])
    for flag, dest in DESTS.items():
        if flag in options:
            assert options[flag].dest == dest, f"{flag} stores into {options[flag].dest!r}, not {dest!r}"
    assert "json" not in {action.dest for action in PARSERS[path]._actions}  # --json is --format json now
    for short, long in (("-o", "--output"), ("-q", "--quiet"), ("-v", "--verbose")):
        if short in options or long in options:
            assert options.get(short) is options.get(long), f"{short} and {long} must be one option"


@pytest.mark.parametrize("path", PARSERS, ids=IDS)
def test_format_and_its_json_alias(path):
    options = _options(PARSERS[path])
    assert {"text", "json"} <= set(options["--format"].choices)
    assert options["--format"].default == "text"
    assert PARSERS[path].parse_args(_with(path, [])[len(path) :]).format == "text"
    assert cli._parser().parse_args(_with(path, ["--json"])).format == "json"
    assert cli._parser().parse_args(_with(path, ["--format", "json"])).format == "json"


@pytest.mark.parametrize("path", PARSERS, ids=IDS)
def test_quiet_and_verbose_everywhere_and_not_both(path, capsys):
    parser = cli._parser()
    assert parser.parse_args(_with(path, ["-q"])).quiet is True
    assert parser.parse_args(_with(path, ["--verbose"])).verbose is True
    plain = parser.parse_args(_with(path, []))
    assert (plain.quiet, plain.verbose) == (False, False)
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(_with(path, ["-q", "-v"]))
    assert stopped.value.code == 2
    assert "argument -v/--verbose: not allowed with argument -q/--quiet" in capsys.readouterr().err


@pytest.mark.parametrize("path", PARSERS, ids=IDS)
def test_output_where_the_command_has_a_primary_output(path):
    declared = getattr(_module(path), "PRIMARY_OUTPUT", None)
    options = _options(PARSERS[path])
    assert ("--output" in options) == bool(declared), f"PRIMARY_OUTPUT {declared!r} and -o/--output disagree"
    if declared:
        assert "-o" in options


@pytest.mark.parametrize("path", PARSERS, ids=IDS)
def test_no_progress_where_a_bar_is_drawn(path):
    module = _module(path)
    draws = _draws_progress(Path(inspect.getsourcefile(module)).read_text())
    assert getattr(module, "DRAWS_PROGRESS", False) == draws, f"DRAWS_PROGRESS should be {draws}"
    options = _options(PARSERS[path])
    assert ("--no-progress" in options) == draws
    if draws:
        assert cli._parser().parse_args(_with(path, ["--no-progress"])).no_progress is True


def _draws_progress(source: str) -> bool:
    """Whether a command module draws a bar: it imports tqdm, passes ``progress=`` / ``progress_bar=`` anything but
    False to what it runs, or loads a pipeline without ``progress_bar=False`` (load_pipeline draws by default)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tqdm":
            return True
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "tqdm" for alias in node.names):
            return True
        if isinstance(node, ast.Call):
            keywords = {k.arg: k.value for k in node.keywords}
            for name in ("progress", "progress_bar"):
                value = keywords.get(name)
                if value is not None and not (isinstance(value, ast.Constant) and value.value is False):
                    return True
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called == "load_pipeline" and "progress_bar" not in keywords:
                return True
    return False


def test_the_progress_check_sees_each_way_of_drawing():
    assert _draws_progress("from tqdm import tqdm")
    assert _draws_progress("import tqdm.auto")
    assert _draws_progress("scan(paths, progress=not args.no_progress)")
    assert _draws_progress("load_pipeline(model, device)")
    assert not _draws_progress("load_pipeline(model, device, progress_bar=False)")
    assert not _draws_progress("run(progress=False)")


def test_library_bars_are_off_unless_asked():
    """What a command runs draws only when asked: each module outside the CLI that imports tqdm takes a
    ``progress`` switch that defaults to off (so the CLI's keyword check above sees every bar)."""
    root = Path(cli.__file__).resolve().parents[1]
    drawing = []
    for path in sorted(root.rglob("*.py")):
        if "cli" in path.relative_to(root).parts:
            continue
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        if any(isinstance(n, (ast.Import, ast.ImportFrom)) and "tqdm" in ast.dump(n) for n in ast.walk(tree)):
            drawing.append(path.relative_to(root).as_posix())
            assert re.search(r"\bprogress: bool = False", source), f"{path}: tqdm without a progress switch off"
    assert drawing  # the scan and the diff recorder draw bars: the walk found them


@pytest.mark.parametrize("path", [(), *PARSERS], ids=["npu-port", *IDS])
def test_help_is_plain_text(path):
    parser = PARSERS[path] if path else cli._parser()
    texts = [parser.description or "", parser.epilog or "", parser.format_help()]
    texts += [action.help or "" for action in parser._actions]
    texts += [f"{group.title} {group.description or ''}" for group in parser._action_groups]
    for text in texts:
        assert not MARKUP.search(text), f"markup in help: {MARKUP.search(text).group()!r} in {text[:200]!r}"


@pytest.mark.parametrize("path", PARSERS, ids=IDS)
def test_each_example_line_parses(path):
    lines = _examples(PARSERS[path])
    assert PARSERS[path].epilog in PARSERS[path].format_help()  # shown as written, one command a line
    for line in lines:
        argv = _argv(line)
        assert tuple(argv[: len(path)]) == path, line
        cli._parser().parse_args(argv)  # SystemExit (a failed test) if a line does not parse


def test_no_command_prints_the_usage_to_stderr_and_exits_2(capsys):
    assert cli.main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: npu-port ")
    assert "COMMAND" in err


def test_diff_with_nothing_after_it_prints_its_usage_and_exits_2(capsys):
    assert cli.main(["diff"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: npu-port diff ")
    assert "Example:\n  npu-port diff dump " in err


def test_bench_out_is_a_hidden_alias_of_output():
    args = cli._parser().parse_args(["bench", "--out", "results"])
    assert args.output == "results"
    assert "--out " not in PARSERS[("bench",)].format_help()


FORMATS = {path: _options(parser)["--format"].choices for path, parser in PARSERS.items()}


@settings(max_examples=40, deadline=None)
@given(
    path=st.sampled_from(sorted(FORMATS)),
    value=st.text(min_size=0, max_size=12).filter(lambda text: not text.startswith("-")),
)
def test_a_format_outside_the_choices_is_one_line_naming_them(path, value):
    choices = FORMATS[path]
    assume(value not in choices)
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as stopped, redirect_stdout(out), redirect_stderr(err):
        cli.main([*path, "--format", value])
    assert stopped.value.code == 2
    assert out.getvalue() == ""
    named = ", ".join(repr(choice) for choice in choices)
    prog = "npu-port " + " ".join(path)
    assert err.getvalue() == f"{prog}: error: argument --format: invalid choice: {value!r} (choose from {named})\n"
