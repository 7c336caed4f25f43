"""The site's generated tables: a line ``<!-- generated: NAME -->`` in a page becomes the table NAME at build time.

Why generated: a table typed by hand (every flag, every scan rule, every error code) goes stale the day a flag
changes. Each table here is rendered from the one place the program itself reads — the argparse parsers, the rule
registry, the error-code table, the pairing table, the strategy-file schema, the recorded benchmark and CI results —
so the site can only say what the code does. An unknown NAME fails the build, naming the page and the valid names.

mkdocs loads this module through ``hooks:`` in mkdocs.yml; the tests (tests/docs) import it by path and call
:func:`render` and :func:`expand` directly.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, List

ROOT = Path(__file__).resolve().parents[2]
PLACEHOLDER = re.compile(r"^<!-- generated: (?P<name>[^ ]*) -->$", re.MULTILINE)


class GeneratedError(Exception):
    """A placeholder this module cannot fill (the message is the one line the build prints)."""


def _module(relative: str) -> ModuleType:
    """A script of the repository that is not a package (benchmarks/, .ci/), loaded from its file."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(f"_docs_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- the CLI ---------------------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _option_row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.option_strings and action.nargs != 0:
        names += f" `{action.metavar or action.dest.upper()}`" if not action.choices else ""
    help_text = parser._get_formatter()._expand_help(action) if action.help else ""
    parts = [_cell(help_text).rstrip(".") + "."] if help_text else []
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        parts.append("Choices: " + ", ".join(f"`{choice}`" for choice in action.choices) + ".")
    default = action.default
    if (
        action.option_strings
        and action.nargs != 0
        and default not in (None, argparse.SUPPRESS, [], "")
        and "default" not in help_text.lower()  # the help says it already
    ):
        parts.append(f"Default: `{default}`.")
    return f"| {names} | {' '.join(parts)} |"


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=100)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _subcommands(parser: argparse.ArgumentParser) -> Dict[str, argparse.ArgumentParser]:
    found: Dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            hidden = {choice.dest for choice in action._choices_actions if choice.help == argparse.SUPPRESS}
            for name, sub in action.choices.items():
                if name not in hidden and sub not in found.values():  # aliases share the parser: list it once
                    found[name] = sub
    return found


def _command(parser: argparse.ArgumentParser, depth: int) -> List[str]:
    lines = [f"{'#' * depth} `{parser.prog}`", ""]
    if parser.description:
        lines += [parser.description.strip(), ""]
    lines += ["```text", _usage(parser), "```", ""]
    rows = [
        _option_row(parser, action)
        for action in parser._actions
        if action.help != argparse.SUPPRESS and not isinstance(action, argparse._SubParsersAction)
    ]
    if rows:
        lines += ["| argument | what it does |", "|---|---|", *rows, ""]
    if parser.epilog:
        lines += ["```text", parser.epilog.strip(), "```", ""]
    for sub in _subcommands(parser).values():
        lines += _command(sub, min(depth + 1, 6))
    return lines


def cli() -> str:
    """Every command and sub-command of ``npu-port``, walked from the parser the program itself runs."""
    from npu_port.cli.main import _parser

    top = _parser()
    lines = ["```text", _usage(top), "```", ""]
    for sub in _subcommands(top).values():
        lines += _command(sub, 2)
    return "\n".join(lines).rstrip() + "\n"


# ---- the tables the library renders -----------------------------------------------------------------------------


def scan_rules() -> str:
    from npu_port.scan import report

    return report.rules_table(markdown=True)


def error_codes() -> str:
    from npu_port.doctor import error_codes as codes

    return codes.markdown_table()


def torch_npu_pairing() -> str:
    from npu_port.doctor import pairing

    return pairing.markdown_table()


def strategy_keys() -> str:
    from npu_port.strategy import schema

    return schema.markdown_table()


def coverage() -> str:
    """benchmarks/coverage.md's table, rendered from the recorded JSON as the benchmark renders it."""
    results = ROOT / "benchmarks" / "results" / "coverage_npu_910b.json"
    return _module("benchmarks/coverage.py").markdown(json.loads(results.read_text(encoding="utf-8")))


def compat() -> str:
    """README's compatibility table, from npu_port/support_tested.json as .ci/lanes/record.py renders it."""
    record = _module(".ci/lanes/record.py")
    return record.render_table(json.loads(record.RECORD.read_text(encoding="utf-8"))) + "\n"


def api() -> str:
    """mkdocstrings' directive for each public name of ``npu_port`` (``npu_port._PUBLIC``: the list the package itself
    exports), rendered from the docstrings of the module that defines it."""
    import npu_port

    lines = []
    for name, module in npu_port._PUBLIC.items():
        if name.startswith("_"):
            continue
        lines += [f"::: {module}.{name}", "    options:", f'      heading: "npu_port.{name}"', ""]
    return "\n".join(lines)


GENERATORS: Dict[str, Callable[[], str]] = {
    "api": api,
    "cli": cli,
    "scan-rules": scan_rules,
    "error-codes": error_codes,
    "torch-npu-pairing": torch_npu_pairing,
    "strategy-keys": strategy_keys,
    "coverage": coverage,
    "compat": compat,
}


def render(name: str) -> str:
    """The Markdown that replaces ``<!-- generated: name -->``."""
    generator = GENERATORS.get(name)
    if generator is None:
        raise GeneratedError(f"unknown generated table {name!r}; valid names: {', '.join(GENERATORS)}")
    return generator()


def expand(markdown: str, where: str) -> str:
    """``markdown`` with every placeholder line replaced by its table (``where`` names the page in errors)."""

    def replace(match: re.Match) -> str:
        try:
            return render(match.group("name")).rstrip("\n")
        except GeneratedError as exc:
            raise GeneratedError(f"{where}: {exc}") from None

    return PLACEHOLDER.sub(replace, markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - mkdocs' hook signature
    from mkdocs.exceptions import PluginError

    try:
        return expand(markdown, page.file.src_uri)
    except GeneratedError as exc:
        raise PluginError(str(exc)) from None
