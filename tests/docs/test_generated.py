"""The site's generated tables (docs/hooks/generated.py): each placeholder renders the table the library itself
renders, the CLI reference lists every command and argument the parsers have, the API reference every public name,
the reference pages hold their placeholders, and a name the hook does not know fails with one clear line."""

from __future__ import annotations

import argparse
import json

import pytest

import npu_port
from npu_port.cli.main import _parser
from npu_port.doctor import error_codes, pairing
from npu_port.scan import report
from npu_port.strategy import schema

from . import site

hook = site.hook()


def test_every_placeholder_name_renders_a_table():
    assert list(hook.GENERATORS) == [
        "api",
        "cli",
        "scan-rules",
        "error-codes",
        "torch-npu-pairing",
        "strategy-keys",
        "coverage",
        "compat",
    ]
    for name in hook.GENERATORS:
        assert hook.render(name).strip(), name


def test_the_library_tables_are_rendered_as_the_library_renders_them():
    assert hook.render("scan-rules") == report.rules_table(markdown=True)
    assert hook.render("error-codes") == error_codes.markdown_table()
    assert hook.render("torch-npu-pairing") == pairing.markdown_table()
    assert hook.render("strategy-keys") == schema.markdown_table()


def test_the_reference_pages_hold_their_placeholders():
    assert site.pages_with("cli") == ["reference/cli.md"]
    assert site.pages_with("api") == ["reference/api.md"]
    assert site.pages_with("scan-rules") == ["reference/scan-rules.md"]
    assert site.pages_with("error-codes") == ["reference/error-codes.md"]
    assert site.pages_with("strategy-keys") == ["reference/strategy-files.md"]
    assert "reference/error-codes.md" in site.pages_with("torch-npu-pairing")


def _commands(parser, found):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.append(sub)
                _commands(sub, found)
    return found


def test_the_cli_reference_lists_every_command_and_every_visible_argument():
    text = hook.render("cli")
    commands = _commands(_parser(), [])
    assert len(commands) >= 10
    for command in commands:
        assert f"`{command.prog}`" in text, command.prog
        section = text.split(f"`{command.prog}`", 1)[1]
        for action in command._actions:
            if action.help == argparse.SUPPRESS:
                continue
            for option in action.option_strings:
                assert f"`{option}`" in section, (command.prog, option)
            if action.choices and not isinstance(action, argparse._SubParsersAction):
                assert ", ".join(f"`{c}`" for c in action.choices) in section, (command.prog, action.dest)
        if command.epilog:
            assert command.epilog.strip() in section


def test_a_hidden_option_is_left_out_of_the_cli_reference():
    parser = argparse.ArgumentParser(prog="tool")
    parser.add_argument("--shown", choices=["a", "b"], default="a", help="pick one")
    parser.add_argument("--old", help=argparse.SUPPRESS)
    lines = hook._command(parser, 2)
    assert "| `--shown` | pick one. Choices: `a`, `b`. Default: `a`. |" in lines
    assert not any("--old" in line for line in lines if line.startswith("|"))


def test_the_api_reference_documents_every_public_name():
    text = hook.render("api")
    for name, module in npu_port._PUBLIC.items():
        if not name.startswith("_"):
            assert f'::: {module}.{name}\n    options:\n      heading: "npu_port.{name}"' in text


def test_the_coverage_table_is_the_recorded_one():
    recorded = (site.ROOT / "benchmarks" / "coverage.md").read_text(encoding="utf-8")
    rows = [line for line in hook.render("coverage").splitlines() if line.startswith("| ")]
    assert rows and rows == [line for line in recorded.splitlines() if line.startswith("| ")]


def test_the_compat_table_is_readmes():
    record = hook._module(".ci/lanes/record.py")
    readme = (site.ROOT / "README.md").read_text(encoding="utf-8")
    assert hook.render("compat").strip("\n") == record.block_in(readme)
    assert json.loads(record.RECORD.read_text())["lanes"]


def test_placeholders_are_replaced_only_alone_on_their_line():
    text = "a\n<!-- generated: error-codes -->\nsay `<!-- generated: cli -->` inline\n"
    assert hook.expand(text, "p.md") == "a\n" + error_codes.markdown_table() + "say `<!-- generated: cli -->` inline\n"


def test_an_unknown_name_fails_naming_the_page_and_the_valid_names():
    with pytest.raises(hook.GeneratedError) as failed:
        hook.expand("# t\n\n<!-- generated: scan-rule -->\n", "how-to/x.md")
    assert str(failed.value) == (
        "how-to/x.md: unknown generated table 'scan-rule'; valid names: api, cli, scan-rules, error-codes, "
        "torch-npu-pairing, strategy-keys, coverage, compat"
    )
