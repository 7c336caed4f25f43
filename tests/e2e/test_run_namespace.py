"""``npu-port run -m`` and ``--override`` on a project whose entry points sit in namespace packages
(tests/fixtures/namespace_project): each runs as ``python -m`` runs it, with the same output; a module that is not
there is one line and exit 2 before anything runs, and the report says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npu_port.cli.main import main

FIXTURE = Path(__file__).parents[1] / "fixtures" / "namespace_project"


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    shutil.copytree(FIXTURE, root)
    env = {k: v for k, v in os.environ.items() if k not in ("NPU_PORT_DEVICE", "PYTHONPATH")}
    env.update(PYTHONWARNINGS="ignore", NPU_PORT_CACHE_DIR=str(tmp_path / "cache"))
    return root, env


def _run(command, cwd, env):
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _npu_port_run(*arguments):
    return [sys.executable, "-m", "npu_port", "run", "--device", "cpu", *arguments]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("module", ["pkg.sub.main", "app.tools.run", "nsroot.lib.run"])
def test_a_module_in_namespace_packages_runs_as_python_m_runs_it(project, module):
    root, env = project
    plain = _run([sys.executable, "-m", module, "3"], root, env)
    assert plain.returncode == 0, plain.stderr[-3000:]
    ours = _run(_npu_port_run("--report", "r.json", "-m", module, "3"), root, env)
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert ours.stdout == plain.stdout  # __name__, __spec__, __package__, argv, sys.path[0], a namespace __path__
    data = json.loads((root / "r.json").read_text())
    assert data["entry_point"] == {
        "kind": "module",
        "name": module,
        "path": str(root.joinpath(*module.split(".")).with_suffix(".py")),
    }
    assert str(root) in data["project"]["watched_roots"]


@pytest.mark.e2e
@pytest.mark.slow
def test_an_override_two_namespace_levels_down_is_applied(project):
    root, env = project
    plain = _run([sys.executable, "-m", "pkg.sub.main", "4"], root, env)
    ours = _run(_npu_port_run("--report", "r.json", "--override", "pkg.sub.util:scale=my_util:scale",
                              "-m", "pkg.sub.main", "4"), root, env)  # fmt: skip
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert ours.stdout == plain.stdout and "scaled: [0, 2, 4, 6]" in ours.stdout
    assert ours.stderr.count("my_util.scale ran") == 1
    data = json.loads((root / "r.json").read_text())
    assert data["overrides"] == [{"target": "pkg.sub.util:scale", "replacement": "my_util:scale", "applied": True}]
    assert {"pkg.sub.util", "my_util"} <= set(data["project"]["modules"])


# ---- refused before anything runs: in-process, one line each ---------------------------------------------------------


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["-m", "pkg.sub.nothere"],
         "no module named 'pkg.sub.nothere': the namespace package 'pkg.sub' ({root}/pkg/sub) has no module 'nothere'"),
        (["-m", "app.tools.run.x"],
         "no module named 'app.tools.run.x': 'app.tools.run' is a module ({root}/app/tools/run.py), not a package"),
        (["--override", "pkg.sub.nothere:scale=my_util:scale", "-m", "pkg.sub.main"],
         "--override pkg.sub.nothere:scale: no module named 'pkg.sub.nothere': the namespace package 'pkg.sub' "
         "({root}/pkg/sub) has no module 'nothere'"),
        (["--override", "pkg.sub.util:scale=nsroot.gone:scale", "-m", "pkg.sub.main"],
         "--override pkg.sub.util:scale=nsroot.gone:scale: no module named 'nsroot.gone': the namespace package "
         "'nsroot' ({root}/nsroot) has no module 'gone'"),
    ],
)  # fmt: skip
def test_a_missing_module_is_one_line_exit_2_and_a_report(project, monkeypatch, capsys, arguments, message):
    root, _ = project
    monkeypatch.chdir(root)
    modules = set(sys.modules)
    assert main(["run", "--device", "cpu", "--report", "r.json", *arguments, "3"]) == 2
    captured = capsys.readouterr()
    expected = message.format(root=root)
    assert captured.err == f"npu-port: {expected}\n" and captured.out == ""
    assert not {n for n in set(sys.modules) - modules if n.split(".")[0] in ("pkg", "app", "nsroot", "my_util")}
    module = arguments[arguments.index("-m") + 1]
    assert json.loads((root / "r.json").read_text()) == {
        "entry_point": {"kind": "module", "name": module, "path": None},
        "outcome": {"exit_code": 2, "status": "refused", "error": expected},
        "exit_code": 2,
        "rank": None,
    }
