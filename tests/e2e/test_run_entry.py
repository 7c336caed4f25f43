"""``npu-port run`` on projects laid out as public ones are: ``-m`` entry points, attention classes in a sibling
package, ``assert q.device.type == "cuda"`` before flash_attn, a CUDA-only op only an override can replace — and a
report that tells the truth about how the run ended, one file per rank."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from npu_port.cli.main import main
from npu_port.cli.run_cmd import rank_report_path

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parents[1] / "fixtures" / "module_project"
OVERRIDE = "motionlib.fused:fused_gelu=cpu_ops:fused_gelu"


@pytest.fixture
def project(tmp_path):
    """A fresh copy of the fixture project (bytecode caches allowed: the test checks which files get one)."""
    root = tmp_path / "project"
    shutil.copytree(FIXTURE, root)
    env = {k: v for k, v in os.environ.items() if k not in ("NPU_PORT_DEVICE", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env.update(PYTHONWARNINGS="ignore", NPU_PORT_CACHE_DIR=str(tmp_path / "cache"))
    return root, env


def _run(command, cwd, env, timeout=300):
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _npu_port_run(*arguments):
    return [sys.executable, "-m", "npu_port", "run", "--device", "cpu", *arguments]


@pytest.mark.e2e
@pytest.mark.slow
def test_the_module_project_fails_as_it_is(project):
    root, env = project
    result = _run([sys.executable, "-m", "scripts.animate", "--out", "plain.pt"], root, env)
    assert result.returncode == 1 and "ModuleNotFoundError: No module named 'flash_attn'" in result.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_run_dash_m_routes_the_sibling_package_and_matches_the_hand_port(project):
    root, env = project
    report = root / "report.json"
    ours = _run(_npu_port_run("--report", str(report), "--override", OVERRIDE, "-m", "scripts.animate",
                              "--out", "ours.pt", "--seed", "3"), root, env)  # fmt: skip
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert "animate: wrote ours.pt (__main__, spec scripts.animate)" in ours.stdout
    # Rewritten modules are compiled in memory only; an untouched one gets its usual bytecode cache.
    assert not list((root / "motionlib").glob("__pycache__/attention.*.pyc"))
    assert list(root.glob("__pycache__/cpu_ops.*.pyc"))
    reference = _run([sys.executable, "reference_cpu.py", "--out", "reference.pt", "--seed", "3"], root, env)
    assert reference.returncode == 0, reference.stderr[-3000:]
    got, expected = torch.load(root / "ours.pt"), torch.load(root / "reference.pt")
    assert got["argv"] == ["--out", "ours.pt", "--seed", "3"]
    for name, tolerance in (("motion", 1e-6), ("gated", 1e-6), ("flash", 2e-3)):  # flash: float16 output
        assert (got[name].double() - expected[name].double()).abs().max().item() <= tolerance, name

    data = json.loads(report.read_text())
    assert data["exit_code"] == 0 and data["outcome"] == {"exit_code": 0, "status": "completed", "error": None}
    assert data["entry_point"] == {
        "kind": "module",
        "name": "scripts.animate",
        "path": str(root / "scripts" / "animate.py"),
    }
    assert data["legacy_attention_classes"] == ["motionlib.attention.MotionAttention"]
    assert data["overrides"] == [
        {"target": "motionlib.fused:fused_gelu", "replacement": "cpu_ops:fused_gelu", "applied": True}
    ]
    assert data["drop_ins"]["served"] == {"flash_attn": ["flash_attn"]}  # never xformers: the project did not import it
    assert data["drop_ins"]["imported_by"] == {"flash_attn": {"flash_attn": "motionlib.attention"}}
    assert str(root) in data["project"]["watched_roots"]
    assert {"scripts", "motionlib.attention", "motionlib.fused", "cpu_ops"} <= set(data["project"]["modules"])
    checks = [(c["module"], c["line"], c["code"], c["hits"]) for c in data["device_checks"]]
    assert ("scripts.animate", 19, 'frames.device.type != "cuda"', 1) in checks
    assert ("motionlib.attention", 54, 'q.device.type == "cuda"', 1) in checks
    assert ("motionlib.attention", 55, "q.is_cuda", 1) in checks
    assert ("motionlib.fused", 7, "x.is_cuda", 0) in checks  # rewritten, never reached: the override replaced it
    plain = _run([sys.executable, "-c", "import sys, torch; sys.modules['flash_attn'] = type(sys)('f'); "
                  "sys.modules['flash_attn'].flash_attn_func = None; from motionlib.attention import flash_attention;"
                  "flash_attention(*[torch.zeros(1, 2, 1, 4)] * 3)"], root, env)  # fmt: skip
    assert "AssertionError: flash attention needs CUDA tensors" in plain.stderr  # the file on disk is as written


@pytest.mark.e2e
@pytest.mark.slow
def test_without_the_override_the_report_has_the_scripts_error_and_exit_code(project):
    root, env = project
    report = root / "report.json"
    result = _run(_npu_port_run("--report", str(report), "-m", "scripts.animate", "--out", "x.pt"), root, env)
    assert result.returncode == 1
    data = json.loads(report.read_text())
    assert data["exit_code"] == 1
    assert data["outcome"] == {
        "exit_code": 1,
        "status": "exception",
        "error": "RuntimeError: fused_gelu: the fused_ops extension is not built",
    }
    assert data["hint"] is None  # is_available() never answered False here: no --cuda-available advice
    traceback_text = result.stderr[result.stderr.index("Traceback") :]
    first_frame = re.search(r'File "([^"]+)"', traceback_text).group(1)
    assert first_frame == str(root / "scripts" / "animate.py")  # npu-port's and runpy's frames are left out
    assert "npu_port" not in traceback_text


@pytest.mark.e2e
@pytest.mark.slow
def test_keep_device_checks_leaves_the_assertion_as_written(project):
    root, env = project
    result = _run(_npu_port_run("--keep-device-checks", "--override", OVERRIDE, "-m", "scripts.animate", "--out",
                                "x.pt"), root, env)  # fmt: skip
    assert result.returncode == 1
    assert "SystemExit" not in result.stderr and "animate: CUDA tensors expected" in result.stderr


ELSEWHERE_ENTRY = """import os, sys
sys.path.insert(0, os.environ["MOTIONLIB_HOME"])  # the project finds its library itself (RAFT: sys.path.append)
import torch
from motionlib.attention import MotionAttention, flash_attention
q = torch.randn(1, 8, 2, 8, device="cuda")
flash_attention(q, q, q)
MotionAttention(32).cuda()(torch.randn(1, 4, 32, device="cuda"))
"""


@pytest.mark.e2e
@pytest.mark.slow
def test_modules_outside_the_project_folders_are_routed_only_when_watched(project, tmp_path):
    root, env = project
    library = tmp_path / "lib"
    library.mkdir()
    shutil.move(str(root / "motionlib"), str(library / "motionlib"))
    (root / "elsewhere.py").write_text(ELSEWHERE_ENTRY)
    env = {**env, "MOTIONLIB_HOME": str(library)}
    unwatched = _run(_npu_port_run("--report", "unwatched.json", "elsewhere.py"), root, env)
    assert unwatched.returncode == 1
    data = json.loads((root / "unwatched.json").read_text())
    assert data["outcome"]["error"] == "AssertionError: flash attention needs CUDA tensors"
    assert data["legacy_attention_classes"] == []
    watched = _run(_npu_port_run("--report", "watched.json", "--watch", str(library), "elsewhere.py"), root, env)
    assert watched.returncode == 0, watched.stderr[-3000:]
    data = json.loads((root / "watched.json").read_text())
    assert data["legacy_attention_classes"] == ["motionlib.attention.MotionAttention"]
    assert str(library) in data["project"]["watched_roots"]


@pytest.mark.e2e
@pytest.mark.slow
def test_folders_on_pythonpath_are_the_projects(project, tmp_path):
    root, env = project
    library = tmp_path / "lib"
    library.mkdir()
    shutil.move(str(root / "motionlib"), str(library / "motionlib"))
    env = {**env, "PYTHONPATH": str(library)}
    result = _run(_npu_port_run("--report", "r.json", "--override", OVERRIDE, "-m", "scripts.animate", "--out", "x.pt"),
                  root, env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((root / "r.json").read_text())
    assert data["legacy_attention_classes"] == ["motionlib.attention.MotionAttention"]
    assert str(library) in data["project"]["watched_roots"]


# ---- how the run ended: in-process, one small script each ------------------------------------------------------------


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(body)
    return str(path)


@pytest.mark.parametrize(
    "body, code, status, error",
    [
        ("print('fine')\n", 0, "completed", None),
        ("raise SystemExit(3)\n", 3, "exited", None),
        ("import sys\nsys.exit('stopping: no data')\n", 1, "exited", "stopping: no data"),
        ("raise ValueError('bad input')\n", 1, "exception", "ValueError: bad input"),
        ("raise KeyboardInterrupt\n", 130, "interrupted", "KeyboardInterrupt"),
        ("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n", 130, "interrupted",
         "KeyboardInterrupt"),
    ],
)  # fmt: skip
def test_the_report_records_how_the_script_really_ended(tmp_path, capsys, body, code, status, error):
    report = tmp_path / "report.json"
    assert main(["run", "--device", "cpu", "--report", str(report), _script(tmp_path, body)]) == code
    data = json.loads(report.read_text())
    assert data["exit_code"] == code and data["outcome"] == {"exit_code": code, "status": status, "error": error}


def test_a_script_that_refuses_to_run_without_cuda_gets_the_hint(tmp_path, capsys):
    script = _script(
        tmp_path, "import torch\nassert torch.cuda.is_available(), 'this demo needs a GPU'\nprint('ran')\n"
    )
    assert main(["run", "--device", "cpu", script]) == 1
    err = capsys.readouterr().err
    assert "AssertionError: this demo needs a GPU" in err
    assert (
        "  hint: the script stopped after torch.cuda.is_available() answered False (1 call): it looks like it refuses "
        "to run without CUDA. Run it again with --cuda-available"
    ) in err
    assert main(["run", "--device", "cpu", "--cuda-available", script]) == 0
    captured = capsys.readouterr()
    assert "ran" in captured.out and "hint" not in captured.err


def test_no_hint_when_the_failure_has_nothing_to_do_with_cuda(tmp_path, capsys):
    script = _script(tmp_path, "import torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
                               "raise FileNotFoundError('data/train.csv')\n")  # fmt: skip
    report = tmp_path / "r.json"
    assert main(["run", "--device", "cpu", "--report", str(report), script]) == 1
    data = json.loads(report.read_text())
    assert data["hint"] is None and data["redirect"]["hits"]["torch.cuda.is_available() -> False"] == 1


def test_stand_ins_are_listed_only_when_the_project_imports_them(tmp_path, capsys):
    report = tmp_path / "r.json"
    script = _script(tmp_path, "import npu_port, torch\nq = torch.randn(1, 2, 4, 8)\nnpu_port.attention(q, q, q)\n")
    assert main(["run", "--device", "cpu", "--strategy", "auto", "--report", str(report), script]) == 0
    data = json.loads(report.read_text())
    assert data["drop_ins"]["installed"] == ["flash_attn", "xformers"] and data["drop_ins"]["served"] == {}
    assert "flash_attn" not in sys.modules and "xformers" not in sys.modules


@pytest.mark.parametrize(
    "path, env, expected",
    [
        ("run.json", {}, "run.json"),
        ("run.json", {"RANK": "0", "WORLD_SIZE": "1"}, "run.json"),
        ("out/run.json", {"RANK": "1", "WORLD_SIZE": "2"}, "out/run.rank1.json"),
        ("run", {"RANK": "3", "WORLD_SIZE": "4"}, "run.rank3"),
        ("out/{rank}/run.json", {"RANK": "2", "WORLD_SIZE": "4"}, "out/2/run.json"),
        ("run-{rank}.json", {}, "run-0.json"),
    ],
)
def test_report_paths_per_rank(path, env, expected):
    assert rank_report_path(path, env) == expected


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["nothere.py"], "npu-port: no such script: 'nothere.py'\n"),
        (["-m", "nothere_module"], "npu-port: no module named 'nothere_module' on the module search path"),
        (["--watch", "/nonexistent-folder", "script.py"], "npu-port: --watch '/nonexistent-folder': no such folder"),
        (["--override", "a.b:c", "script.py"], "npu-port: --override 'a.b:c' has no '='"),
        (["--override", "nothere_mod:f=x:f", "script.py"], "npu-port: --override nothere_mod:f: no module named"),
        (["--report", ".", "script.py"], "npu-port: --report '.' is a folder; give a file path such as run.json\n"),
    ],
)
def test_bad_arguments_are_one_line_and_nothing_runs(tmp_path, monkeypatch, capsys, arguments, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "script.py").write_text("open('ran', 'w').close()\n")
    assert main(["run", "--device", "cpu", *arguments]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert not (tmp_path / "ran").exists()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.e2e
@pytest.mark.slow
def test_under_torchrun_each_rank_writes_its_own_report(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NPU_PORT_DEVICE",)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    script = REPO / "tests" / "fixtures" / "redirect" / "allreduce_nccl.py"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), "-m", "npu_port", "run", "--device", "cpu",
        "--report", str(tmp_path / "run.json"), str(script),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("run*.json")) == ["run.rank0.json", "run.rank1.json"]
    for rank in (0, 1):
        data = json.loads((tmp_path / f"run.rank{rank}.json").read_text())
        assert data["rank"] == str(rank) and data["exit_code"] == 0
        assert data["redirect"]["hits"]["init_process_group"] == 1


@pytest.mark.e2e
@pytest.mark.slow
def test_a_dit_sample_ddp_style_script_runs_unchanged_under_torchrun(tmp_path):
    """DiT's sample_ddp.py pattern: assert CUDA, nccl, ``rank % torch.cuda.device_count()``, ``set_device``, an int
    device for ``.to`` and ``torch.randn(device=...)``; each rank's samples are gathered to rank 0 and saved."""
    env = {k: v for k, v in os.environ.items() if k not in ("NPU_PORT_DEVICE",)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    script = REPO / "tests" / "fixtures" / "redirect" / "sample_ddp_dit.py"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), "-m", "npu_port", "run", "--device", "cpu", "--cuda-available",
        str(script), "--out", str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    samples = torch.load(tmp_path / "samples.pt")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    expected = []
    for rank in (0, 1):
        torch.manual_seed(rank)
        expected.append(model(torch.randn(2, 4)).detach())
    torch.testing.assert_close(samples, torch.cat(expected), rtol=0, atol=0)


def test_a_report_path_that_cannot_be_written_is_refused_before_the_script_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "script.py").write_text("open('ran', 'w').close()\n")
    (tmp_path / "a-file").write_text("")
    assert main(["run", "--device", "cpu", "--report", "a-file/run.json", "script.py"]) == 2
    assert (
        capsys.readouterr().err
        == f"npu-port: --report 'a-file/run.json': cannot write there ({tmp_path / 'a-file'} is not a folder)\n"
    )
    assert main(["run", "--device", "cpu", "--report", "/sys/run.json", "script.py"]) == 2  # read-only, even as root
    assert capsys.readouterr().err.startswith("npu-port: --report '/sys/run.json': cannot write there (")
    assert not (tmp_path / "ran").exists()
