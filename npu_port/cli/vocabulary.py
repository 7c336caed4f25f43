"""The options every npu-port command spells the same way, so that a user learns them once.

- ``--format text|json`` (``--json`` is short for ``--format json``): what a command prints on stdout;
- ``-o/--output PATH``: where the command's main result goes;
- ``-q/--quiet`` (errors and the result only) and ``-v/--verbose`` (details, third-party warnings and bars);
- ``--no-progress``: no progress bar, on each command that draws one (its module says ``DRAWS_PROGRESS = True``).

Other code reads the results under these names only: ``args.format``, ``args.output``, ``args.quiet``,
``args.verbose``, ``args.no_progress``. tests/cli/test_vocabulary.py walks every parser and checks them.
"""

from __future__ import annotations

import argparse
from typing import Any, Iterable, Optional, Sequence

TEXT = "text"
JSON = "json"
EXAMPLE_HEADING = "Example:"


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that the ``Example:`` epilog keeps its lines as written (one command a line)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(EXAMPLE_HEADING):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


def examples(*lines: str) -> str:
    """The epilog: ``Example:`` and one real command line per line (a test runs each through the parser)."""
    return "\n".join([EXAMPLE_HEADING, *(f"  {line}" for line in lines)])


def add_command(
    commands: "argparse._SubParsersAction",
    name: str,
    *,
    help: str,
    description: Optional[str] = None,
    example: Sequence[str],
) -> argparse.ArgumentParser:
    """A subcommand's parser with its one-line help, a plain description and the ``Example:`` epilog."""
    return commands.add_parser(
        name,
        help=help,
        description=description or help[:1].upper() + help[1:] + ".",
        epilog=examples(*example),
        formatter_class=HelpFormatter,
    )


def add_format(
    parser: Any, choices: Iterable[str] = (TEXT, JSON), default: str = TEXT, help: Optional[str] = None
) -> None:
    """``--format`` (dest ``format``) and ``--json``, the same as ``--format json``."""
    choices = tuple(choices)
    parser.add_argument(
        "--format",
        choices=choices,
        default=default,
        help=help or f"what to print: {' or '.join(choices)} (default {default})",
    )
    parser.add_argument("--json", dest="format", action="store_const", const=JSON, help="same as --format json")


def add_output(
    parser: Any, help: str, metavar: str = "FILE", default: Optional[str] = None, old: Sequence[str] = ()
) -> None:
    """``-o/--output`` (dest ``output``): where the main result goes. ``old`` spellings still work, unlisted."""
    parser.add_argument("-o", "--output", metavar=metavar, default=default, help=help)
    for flag in old:
        parser.add_argument(flag, dest="output", metavar=metavar, help=argparse.SUPPRESS)


#: What ``--verbose`` shows where a command has nothing more of its own.
VERBOSE_HELP = "details, and the warnings and loading bars of other libraries"


def add_verbosity(parser: Any, verbose_help: str = VERBOSE_HELP) -> None:
    """``-q/--quiet`` and ``-v/--verbose`` (dests ``quiet``, ``verbose``), one or the other."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true", help="print only errors and the result")
    group.add_argument("-v", "--verbose", action="store_true", help=verbose_help)


def add_no_progress(parser: Any) -> None:
    """``--no-progress`` (dest ``no_progress``), for a command that draws a progress bar."""
    parser.add_argument("--no-progress", action="store_true", help="draw no progress bar")


def wants_json(args: argparse.Namespace) -> bool:
    return getattr(args, "format", TEXT) == JSON


def note(args: argparse.Namespace, message: str) -> None:
    """A side remark on stderr (a file written, a model being built), left out under ``--quiet``."""
    import sys

    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr)
