"""Every fenced example of docs/ and the top-level READMEs runs (tests/docs/examples.py says how each language runs),
and the harness itself does what it promises: python blocks share a page's namespace, bash blocks fail loudly with
the command and its output, yaml blocks go through the strategy loader, text blocks are not run, a skip directive
skips exactly the next block with its reason, and a block in a language the harness does not know fails."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from npu_port.strategy.schema import KEYS

from . import examples

PAGES = examples.pages()
SKIPS = [(page, line, reason) for page in PAGES for line, reason in examples.skip_reasons(page)]


def _run_page(page, workspace, timeout):
    """The harness on one page, in a process of its own (examples.main): what its examples change cannot leak."""
    return subprocess.run(
        [sys.executable, "-m", "tests.docs.examples", str(page), str(workspace)],
        cwd=examples.ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.e2e
@pytest.mark.parametrize("page", PAGES, ids=examples.page_id)
def test_the_examples_of_each_page_run(page, tmp_path):
    """Each page in a process of its own (examples.main), so what its examples change cannot leak."""
    done = _run_page(page, tmp_path, timeout=1800)
    assert done.returncode == 0, done.stderr[-8000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["ran"] + len(result["skipped"]) == len(list(examples.parse(page)))


if SKIPS:  # one skipped test per skipped block, its reason in the report (none while no page skips a block)

    @pytest.mark.parametrize("page, line, reason", SKIPS, ids=[f"{examples.page_id(p)}:{n}" for p, n, _ in SKIPS])
    def test_a_skipped_example_is_reported_with_its_reason(page, line, reason):
        where = f"{examples.page_id(page)}:{line}"
        assert reason, f'{where}: give the reason as a quoted string: <!-- skip: next "why" -->'
        pytest.skip(f"{where}: {reason}")


def test_every_fenced_block_is_in_a_language_the_harness_runs_or_shows():
    unknown = []
    for page in PAGES:
        unknown += examples.unknown_languages(page.read_text(encoding="utf-8"), examples.page_id(page))
    assert unknown == [], f"use one of {', '.join(examples.LANGUAGES)}"


def test_every_skip_directive_skips_the_next_block_with_a_quoted_reason():
    bad = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("<!-- skip") and examples.SKIP_LINE.match(line) is None:
                bad.append(f"{examples.page_id(page)}:{number}: {line.strip()}")
    assert bad == [], 'write <!-- skip: next "the reason" --> alone on its line'


# ---- the harness on pages written for it ------------------------------------------------------------------------


def _page(tmp_path: Path, body: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent(body).lstrip(), encoding="utf-8")
    return page


def test_unknown_or_missing_languages_are_named_with_their_line():
    text = "# t\n\n```python\nx = 1\n```\n\n```console\n$ ls\n```\n\n```\nplain\n```\n\n````text\n```sh\n```\n````\n"
    # sybil lexes a block nested in a longer fence too (and would run it), so the check sees it as well
    assert examples.unknown_languages(text, "p.md") == ["p.md:7: console", "p.md:11: (no language)", "p.md:16: sh"]


def test_bash_commands_join_continuations_and_drop_comments():
    source = "# set up\nnpu-port scan project \\\n  --format json\n\n  # indented comment\necho 'a # b'\n"
    assert examples.commands(source) == ["npu-port scan project --format json", "echo 'a # b'"]


@pytest.mark.e2e
def test_a_page_runs_in_order_in_a_workspace_with_the_project(tmp_path):
    page = _page(
        tmp_path,
        """
        # A page

        ```python
        from pathlib import Path
        value = 41
        Path("made.txt").write_text("from python")
        ```

        ```python
        value += 1
        assert value == 42 and Path("project/main.py").is_file()
        ```

        ```bash
        # a comment line
        test "$(cat made.txt)" = "from python"
        echo one \\
          two > joined.txt
        grep -qx "one two" joined.txt
        npu-port --version
        test "$HOME" = "$PWD/.home"
        ```

        ```yaml
        name: docs-example
        description: an example strategy
        kernel: math
        ```

        ```text
        this is output, never run: exit 1
        ```

        <!-- skip: next "needs an Ascend NPU" -->
        ```bash
        exit 1
        ```

        ```python
        assert Path(".home").is_dir()
        ```
        """,
    )
    work = tmp_path / "work"
    work.mkdir()
    result = examples.run_page(page, work)
    directive = page.read_text().splitlines().index('<!-- skip: next "needs an Ascend NPU" -->') + 1
    assert examples.skip_reasons(page) == [(directive, "needs an Ascend NPU")]
    assert result.skipped == [(directive + 1, "needs an Ascend NPU")]  # the block after it, and only that one
    assert result.ran == 7  # python, python, bash, yaml, text, the skip directive itself, python
    assert (work / "joined.txt").read_text() == "one two\n"


@pytest.mark.e2e
def test_a_failing_command_fails_with_the_command_and_its_output(tmp_path):
    page = _page(tmp_path, "```bash\necho fine\nnpu-port scan no-such-dir\necho never\n```\n")
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(examples.BlockFailed) as failed:
        examples.run_page(page, work)
    message = str(failed.value)
    assert message.startswith(f"{page}:1: `npu-port scan no-such-dir` exited 2:\n")
    assert "no-such-dir" in message.splitlines()[1]


def test_a_strategy_block_the_loader_refuses_fails_with_the_loaders_line(tmp_path):
    page = _page(tmp_path, "```yaml\ndescription: typo\nkernal: math\n```\n")
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(examples.BlockFailed) as failed:
        examples.run_page(page, work)
    assert str(failed.value) == (
        f"{page}:1: the strategy file does not load: {work}/.strategies/example-1.yaml:2: unknown key 'kernal'; "
        "valid keys: " + ", ".join(KEYS)
    )


def test_a_failing_python_block_fails_the_page(tmp_path):
    page = _page(tmp_path, "```python\nx = 1\n```\n\n```python\nassert x == 2, 'x is not 2'\n```\n")
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(AssertionError, match="x is not 2"):
        examples.run_page(page, work)


@pytest.mark.e2e
def test_a_page_in_its_own_process_has_the_workspaces_home_and_caches(tmp_path):
    page = _page(
        tmp_path,
        """
        ```python
        import os
        from pathlib import Path
        assert os.environ["HOME"] == str(Path(".home").resolve()), os.environ["HOME"]
        assert os.environ["NPU_PORT_CACHE_DIR"].startswith(os.environ["HOME"])
        ```
        """,
    )
    work = tmp_path / "work"
    work.mkdir()
    done = _run_page(page, work, timeout=300)
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == {"ran": 1, "skipped": []}
