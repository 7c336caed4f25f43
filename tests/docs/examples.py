"""The documentation's examples, run: every fenced block of docs/**/*.md and the top-level README*.md, with sybil.

Why: an example that does not run is worse than none — a newcomer copies it first. So each block is run as a reader
would run it, in a fresh workspace that holds ``project/`` (a copy of tests/fixtures/cuda_project, a small
CUDA-written project):

- ``python``: executed; the blocks of one page share one namespace, in page order.
- ``bash``: each command (comment lines dropped, ``\\`` continuations joined) run with bash in the workspace, the test
  venv's ``npu-port`` and ``python`` first on PATH, HOME and the caches in the workspace; a non-zero exit fails with
  the command and its output.
- ``yaml``: a strategy (or profile) file, loaded by npu-port's strategy loader, which must accept it.
- ``text``: output shown to the reader, never run.

Any other language (or none) fails :func:`unknown_languages`, so nothing is left unrun by accident. A block that
cannot run here is preceded by ``<!-- skip: next "needs an Ascend NPU" -->`` (sybil's skip directive: the reason is
a quoted string), and the reason is reported as a skipped test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from unittest import SkipTest

from sybil import Document, Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "tests" / "fixtures" / "cuda_project"
#: The fenced-block languages the harness knows: run (python, bash, yaml) or shown only (text).
LANGUAGES = ("python", "bash", "yaml", "text")
#: One bash command may take this long (the docs ask for < 20 s; this leaves room on a loaded machine).
COMMAND_TIMEOUT = 300


def pages() -> List[Path]:
    """Every page whose examples run: docs/**/*.md and the repository's top-level README*.md."""
    found = sorted((ROOT / "docs").rglob("*.md")) + sorted(ROOT.glob("README*.md"))
    return [path for path in found if "hooks" not in path.relative_to(ROOT).parts]


def page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@dataclass
class Workspace:
    """Where one page's examples run: ``project/``, a home, caches and strategy files of its own."""

    root: Path
    env: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def make(cls, root: Path) -> "Workspace":
        shutil.copytree(PROJECT, root / "project", ignore=shutil.ignore_patterns("__pycache__"))
        home = root / ".home"
        home.mkdir()
        env = dict(os.environ)
        for name in ("NPU_PORT_DEVICE", "NPU_PORT_STRATEGY_PATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER"):
            env.pop(name, None)
        env.update(
            HOME=str(home),
            XDG_CACHE_HOME=str(home / ".cache"),
            NPU_PORT_CACHE_DIR=str(home / ".cache" / "npu-port"),
            PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            HF_HUB_OFFLINE="1",
            HF_HUB_DISABLE_TELEMETRY="1",
            PYTHONDONTWRITEBYTECODE="1",
        )
        return cls(root, env)


def commands(source: str) -> List[str]:
    """A bash block's commands: continuation lines joined, comment and blank lines dropped."""
    found: List[str] = []
    pending = ""
    for line in source.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].rstrip() + " "
            continue
        found.append((pending + line.strip()).strip())
        pending = ""
    if pending.strip():
        found.append(pending.strip())
    return found


class BlockFailed(AssertionError):
    """An example failed: the message says which page, line and command, and what it printed."""


def _run_bash(example: Example) -> None:
    workspace: Workspace = example.namespace["__workspace__"]
    for command in commands(str(example.parsed)):
        try:
            done = subprocess.run(
                ["bash", "-o", "pipefail", "-c", command],
                cwd=workspace.root,
                env=workspace.env,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise BlockFailed(f"{example.path}:{example.line}: `{command}` ran over {COMMAND_TIMEOUT} s") from None
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip()
            raise BlockFailed(f"{example.path}:{example.line}: `{command}` exited {done.returncode}:\n{output[-4000:]}")


def _load_yaml(example: Example) -> None:
    from npu_port.strategy.registry import load_strategy_file

    workspace: Workspace = example.namespace["__workspace__"]
    target = workspace.root / ".strategies" / f"example-{example.line}.yaml"
    target.parent.mkdir(exist_ok=True)
    target.write_text(str(example.parsed), encoding="utf-8")
    try:
        load_strategy_file(target)
    except Exception as exc:  # noqa: BLE001 - any refusal is the failure this reports
        raise BlockFailed(f"{example.path}:{example.line}: the strategy file does not load: {exc}") from None


def _ignore(example: Example) -> None:
    """``text`` blocks are output samples: shown, never run."""


SYBIL = Sybil(
    parsers=[
        PythonCodeBlockParser(),
        CodeBlockParser(language="bash", evaluator=_run_bash),
        CodeBlockParser(language="yaml", evaluator=_load_yaml),
        CodeBlockParser(language="text", evaluator=_ignore),
        SkipParser(),
    ],
    path=str(ROOT),
)


def parse(path: Path) -> Document:
    return SYBIL.parse(path)


def has_language(document: Document, language: str) -> bool:
    return any(example.region.lexemes.get("arguments") == language for example in document)


@dataclass
class PageRun:
    ran: int = 0
    skipped: List[Tuple[int, str]] = field(default_factory=list)


def run_page(path: Path, workspace_root: Path, own_process: bool = False) -> PageRun:
    """Run one page's examples in order in a fresh workspace (the cwd, while they run). In a process of its own
    (``own_process``) the python examples get the workspace's environment too: its home and caches."""
    workspace = Workspace.make(workspace_root)
    if own_process:
        os.environ.clear()
        os.environ.update(workspace.env)
    document = parse(path)
    document.namespace["__workspace__"] = workspace
    result = PageRun()
    before = os.getcwd()
    os.chdir(workspace.root)
    try:
        for example in document:
            try:
                example.evaluate()
            except SkipTest as skip:
                result.skipped.append((example.line, str(skip)))
                continue
            result.ran += 1
    finally:
        os.chdir(before)
    return result


FENCE_INFO = RawFencedCodeBlockLexer(info_pattern=re.compile(r"(?P<info>[^\n]*)$\n", re.MULTILINE))


def unknown_languages(text: str, where: str) -> List[str]:
    """``where:line: language`` for each fenced block whose language the harness does not know."""
    document = Document(text, where)
    found = []
    for region in FENCE_INFO(document):
        info = region.lexemes["info"].strip()
        if info not in LANGUAGES:
            line = text.count("\n", 0, region.start) + 1
            found.append(f"{where}:{line}: {info or '(no language)'}")
    return found


#: The one skip form the pages use: ``<!-- skip: next "reason" -->`` alone on its line.
SKIP_LINE = re.compile(r"^<!-- skip: next (?P<reason>.*?) -->$")


def skip_reasons(path: Path) -> List[Tuple[int, Optional[str]]]:
    """Each ``<!-- skip: next "reason" -->`` of a page: its line and reason (None when it is not a quoted string)."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = SKIP_LINE.match(line)
        if match is not None:
            found.append((number, _reason(match.group("reason"))))
    return found


def _reason(argument: str) -> Optional[str]:
    argument = argument.strip()
    if len(argument) >= 2 and argument[0] == argument[-1] and argument[0] in "\"'":
        return argument[1:-1]
    return None


def main(argv: List[str]) -> int:
    """``python -m tests.docs.examples PAGE WORKSPACE``: run one page in this process and say how it went.

    The page tests run each page in a process of its own, so what an example changes process-wide (a strategy
    applied, ``redirect_cuda``, ``activate``) cannot leak into the tests that run after it in the same worker."""
    import json
    import traceback

    page, workspace = Path(argv[0]), Path(argv[1])
    try:
        result = run_page(page, workspace, own_process=True)
    except BlockFailed as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - a python example's own failure, shown with its traceback
        print(f"{page_id(page)}: a python example failed:\n{traceback.format_exc()[-6000:]}", file=sys.stderr)
        return 1
    print(json.dumps({"ran": result.ran, "skipped": result.skipped}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
