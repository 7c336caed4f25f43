"""``npu-port infer`` on a fresh machine (empty home and caches: the tiny model is built on first use) prints
npu-port's lines and its one step bar, nothing from the libraries; ``--verbose`` shows what was hidden."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.diffusers_min("0.27")]

#: Settings that would change what the libraries print (or where they cache): none of them is set on a fresh machine.
UNSET = (
    "NPU_PORT_CACHE_DIR", "NPU_PORT_DEVICE", "NPU_PORT_STRATEGY_PATH", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE",
    "TRANSFORMERS_CACHE", "HUGGINGFACE_HUB_CACHE", "DIFFUSERS_CACHE", "HF_HUB_DISABLE_PROGRESS_BARS",
    "TRANSFORMERS_VERBOSITY", "DIFFUSERS_VERBOSITY", "TQDM_DISABLE", "PYTHONWARNINGS", "CI", "PYTHONPATH",
)  # fmt: skip

#: npu-port's stdout for one image: the device line, the timing line, the files line — nothing else.
STDOUT = (
    re.compile(r"cpu \(.*\), float32, strategy auto -> \w+"),
    re.compile(r"first step \d+\.\d+ s \(with set-up\), .* peak memory \d+ MiB .*"),
    re.compile(r"image: .*\.png; report: .*\.json"),
)
#: A frame of the denoising bar: tqdm without a description, counting the 2 steps.
STEP_BAR = re.compile(r"\s*\d+%\|[^|]*\| [0-2]/2 \[.*\]")
SUMMARY = re.compile(r"npu-port: \d+ library warnings? hidden \(.+\); --verbose shows (it|them)")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _segments(text: str):
    """Every piece of a console stream a reader could see: lines, and each frame a bar redraws with a carriage
    return, without cursor moves."""
    return [piece for piece in re.split(r"[\r\n]", ANSI.sub("", text)) if piece.strip()]


def _foreign(text: str):
    """The stderr segments that are neither npu-port's lines (they start with "npu-port") nor its step bar."""
    return [piece for piece in _segments(text) if not piece.startswith("npu-port") and not STEP_BAR.fullmatch(piece)]


@pytest.fixture(scope="module")
def fresh_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("fresh-home")
    env = {name: value for name, value in os.environ.items() if name not in UNSET}
    env["HOME"] = str(home)
    return home, env


def _infer(home, env, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "npu_port", "infer", "--model", "tiny", "--steps", "2", "--device", "cpu",
               "--output", str(home / "out" / "x.png"), *flags]  # fmt: skip
    return subprocess.run(command, cwd=home, env=env, capture_output=True, text=True, timeout=300)


def test_only_npu_ports_lines_then_verbose_shows_what_was_hidden(fresh_home):
    home, env = fresh_home
    quiet = _infer(home, env)
    assert quiet.returncode == 0, quiet.stderr
    lines = quiet.stdout.splitlines()
    assert len(lines) == len(STDOUT) and all(p.fullmatch(line) for p, line in zip(STDOUT, lines)), quiet.stdout
    assert _foreign(quiet.stderr) == [], quiet.stderr
    assert "npu-port: building the tiny model" in quiet.stderr  # the fresh cache: the model was built in this run
    assert any(STEP_BAR.fullmatch(piece) for piece in _segments(quiet.stderr))  # the one bar npu-port keeps
    summaries = [piece for piece in _segments(quiet.stderr) if SUMMARY.fullmatch(piece)]
    assert len(summaries) <= 1

    verbose = _infer(home, env, "--verbose")
    assert verbose.returncode == 0, verbose.stderr
    shown = _foreign(verbose.stderr)
    assert any(piece.startswith("Loading pipeline components") for piece in shown), verbose.stderr
    assert not any(SUMMARY.fullmatch(piece) for piece in _segments(verbose.stderr))
    if summaries:  # what the summary counted is now on the console (e.g. transformers' torchvision notices)
        library = summaries[0].split("(", 1)[1].split(" ", 1)[0].rstrip(");,")
        assert any(library in piece for piece in shown), verbose.stderr


def test_no_progress_hides_the_step_bar_too(fresh_home):
    home, env = fresh_home
    result = _infer(home, env, "--no-progress")
    assert result.returncode == 0, result.stderr
    assert [piece for piece in _segments(result.stderr) if not piece.startswith("npu-port")] == [], result.stderr
