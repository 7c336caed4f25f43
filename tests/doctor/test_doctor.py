"""``npu-port doctor``: every diagnosis, the exit codes, both outputs, and the real broken-torch_npu machine.

The unit tests feed the checks captured import errors, fake CANN trees and environments (``Facts`` answers are plain
attributes, so a test assigns the ones it needs). The slow test builds a throwaway venv with the real torch-npu
2.13.0 wheel and no CANN -- the machine the doctor exists for -- and runs the command there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import npu_port
from npu_port.cli.main import main
from npu_port.doctor import cann as cann_module
from npu_port.doctor import checks_ascend, checks_devices, checks_diffusers, checks_python, checks_settings
from npu_port.doctor import run as run_module
from npu_port.doctor.cann import CannInstall, locate_cann
from npu_port.doctor.diagnosis import diagnose_torch_npu_error
from npu_port.doctor.diffusers_bugs import KNOWN_BUGS
from npu_port.doctor.facts import AUTOLOAD_VARIABLE, Facts
from npu_port.doctor.finding import Finding, exit_code
from npu_port.doctor.probes import ImportOutcome, major_minor
from npu_port.doctor.report import as_json, render_text
from npu_port.doctor.run import DoctorResult, run_doctor

ROOT = Path(__file__).resolve().parents[2]

LIBHCCL_ERROR = "ImportError: libhccl.so: cannot open shared object file: No such file or directory"
AUTOLOAD_ERROR = (
    "RuntimeError: Failed to load the backend extension: torch_npu. You can disable extension auto-loading with "
    "TORCH_DEVICE_BACKEND_AUTOLOAD=0."
)
# What `python -c "import torch_npu"` prints with torch_npu 2.13.0 and no CANN (observed).
TORCH_NPU_OUTPUT = f"""Traceback (most recent call last):
  File "<string>", line 1, in <module>
  File "/venv/lib/python3.11/site-packages/torch_npu/__init__.py", line 42, in <module>
    import torch_npu.npu
  File "/venv/lib/python3.11/site-packages/torch_npu/npu/utils.py", line 8, in <module>
    import torch_npu._C
{LIBHCCL_ERROR}
"""
# What `python -c "import torch"` prints in the same environment: the cause first, then torch's own error.
TORCH_OUTPUT = f"""{TORCH_NPU_OUTPUT}
The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "<string>", line 1, in <module>
  File "/venv/lib/python3.11/site-packages/torch/__init__.py", line 3034, in _import_device_backends
    raise RuntimeError(
{AUTOLOAD_ERROR}
"""
UNDEFINED_SYMBOL_OUTPUT = (
    "Traceback (most recent call last):\n"
    '  File "<string>", line 1, in <module>\n'
    "ImportError: /venv/lib/python3.11/site-packages/torch_npu/lib/libtorch_npu.so: undefined symbol: "
    "_ZN3c1017RegisterOperatorsD1Ev\n"
)
OK = ImportOutcome("torch", 0, "")


def failed(module: str, output: str) -> ImportOutcome:
    return ImportOutcome(module, 1, output)


@pytest.fixture
def autoload_restored():
    """The doctor may set TORCH_DEVICE_BACKEND_AUTOLOAD=0 in this process; put it back afterwards."""
    saved = os.environ.get(AUTOLOAD_VARIABLE)
    os.environ.pop(AUTOLOAD_VARIABLE, None)
    yield
    if saved is None:
        os.environ.pop(AUTOLOAD_VARIABLE, None)
    else:
        os.environ[AUTOLOAD_VARIABLE] = saved


@pytest.fixture
def no_system_cann(monkeypatch):
    """CANN libraries are looked up on LD_LIBRARY_PATH only, whatever this machine's linker cache holds."""
    monkeypatch.setattr(cann_module, "system_library_path", lambda name: None)


def fake_cann_tree(root: Path, version_line: str = "version=8.1.RC1") -> Path:
    """An installed toolkit as the CANN installer lays it out: latest/<arch>-linux/*.info, set_env.sh, lib64."""
    home = root / "Ascend" / "ascend-toolkit" / "latest"
    arch = home / "x86_64-linux"
    arch.mkdir(parents=True)
    (arch / "ascend_toolkit_install.info").write_text(
        f"package_name=Ascend-cann-toolkit\n{version_line}\ninnerversion=V100R001C21B800\narch=x86_64\nos=linux\n"
    )
    (home.parent / "set_env.sh").write_text("export ASCEND_HOME_PATH=...\n")
    lib64 = home / "lib64"
    lib64.mkdir()
    for library in ("libascendcl.so", "libhccl.so"):
        (lib64 / library).write_bytes(b"")
    return home


def cann_env(home: Path, sourced: bool) -> dict:
    env = {"ASCEND_HOME_PATH": str(home)}
    if sourced:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(["/nonexistent", str(home / "lib64")])
    return env


def broken_torch_npu_facts(tmp_path: Path, sourced: bool = False) -> Facts:
    """torch 2.13 + torch_npu 2.13.0 whose import fails on libhccl.so, with a CANN installed but not sourced."""
    home = fake_cann_tree(tmp_path)
    facts = Facts(environ=cann_env(home, sourced))
    facts.torch_version = "2.13.0+cpu"
    facts.torch_npu_version = "2.13.0"
    facts.torch_import = failed("torch", TORCH_OUTPUT)
    facts.torch_npu_import = failed("torch_npu", TORCH_NPU_OUTPUT)
    return facts


def importable_torch_facts() -> Facts:
    """This environment as it is, with the child-process ``import torch`` taken as done (it works here)."""
    facts = Facts()
    facts.torch_import = OK
    return facts


def by_check(findings):
    return {finding.check: finding for finding in findings}


# --- reading a failed import -----------------------------------------------------------------------------------------


def test_a_chained_import_error_gives_the_real_cause_and_the_final_error():
    outcome = failed("torch", TORCH_OUTPUT)
    assert outcome.cause == LIBHCCL_ERROR
    assert outcome.error == AUTOLOAD_ERROR
    noisy = failed("torch_npu", "Warning: ASCEND_HOME_PATH environment variable is not set.\n" + TORCH_NPU_OUTPUT)
    assert noisy.cause == noisy.error == LIBHCCL_ERROR
    assert ImportOutcome("torch", None, "").error == "import torch did not finish within 120 s"
    assert ImportOutcome("torch", -11, "").error == "import torch killed the Python process (signal 11)"


@pytest.mark.parametrize(
    "version, series",
    [("2.13.0+cpu", "2.13"), ("2.13.0", "2.13"), ("2.13.0.post1", "2.13"), ("2.8.0rc1", "2.8"), ("2", None)],
)
def test_major_minor(version, series):
    assert major_minor(version) == series


# --- diagnoses -----------------------------------------------------------------------------------------------------


def test_libhccl_missing_is_an_error_with_the_source_fix_and_the_autoload_workaround(tmp_path, autoload_restored):
    facts = broken_torch_npu_facts(tmp_path)
    set_env = str(tmp_path / "Ascend" / "ascend-toolkit" / "set_env.sh")

    torch_findings = by_check(checks_python.check_torch(facts))
    torch_import = torch_findings["torch-import"]
    assert torch_import.status == "error"
    assert "CANN's environment is not set: libhccl.so cannot be found" in torch_import.summary
    assert f"source {set_env}" in torch_import.fix and "export TORCH_DEVICE_BACKEND_AUTOLOAD=0" in torch_import.fix
    assert torch_import.details["cause"] == LIBHCCL_ERROR
    # ... and the doctor carried on with torch imported without torch_npu, and said so.
    assert os.environ[AUTOLOAD_VARIABLE] == "0" and facts.autoload_disabled_by_doctor
    assert torch_findings["doctor-autoload-override"].status == "info"
    assert torch_findings["torch"].summary.startswith(f"torch {facts.torch.__version__} imports with")

    (npu_import,) = checks_ascend.check_torch_npu(facts)
    assert (npu_import.check, npu_import.status) == ("torch-npu-import", "error")
    assert npu_import.fix.startswith(f"source {set_env}") and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in npu_import.fix
    assert npu_import.details["error"] == LIBHCCL_ERROR

    (autoload,) = checks_ascend.check_backend_autoload(facts)
    assert autoload.status == "warn" and "export TORCH_DEVICE_BACKEND_AUTOLOAD=0" in autoload.fix


def test_without_any_cann_the_fix_says_install_it(no_system_cann, monkeypatch):
    monkeypatch.setattr(cann_module, "DEFAULT_HOMES", ())
    diagnosis = diagnose_torch_npu_error(TORCH_NPU_OUTPUT, locate_cann({}), "2.13.0")
    assert diagnosis.kind == "cann-not-sourced" and "no CANN toolkit was found" in diagnosis.summary
    assert diagnosis.fix.startswith("install CANN, then source /usr/local/Ascend/ascend-toolkit/set_env.sh")


def test_an_undefined_symbol_means_torch_and_torch_npu_do_not_pair():
    diagnosis = diagnose_torch_npu_error(UNDEFINED_SYMBOL_OUTPUT, CannInstall(None, None, None, None), "2.13.0+cpu")
    assert (diagnosis.kind, diagnosis.status) == ("version-mismatch", "error")
    assert "_ZN3c1017RegisterOperatorsD1Ev" in diagnosis.summary
    assert 'pip install "torch-npu==2.13.*"' in diagnosis.fix


@pytest.mark.parametrize(
    "error, kind, status, fix",
    [
        ("ImportError: libatb.so: cannot open shared object file", "atb-not-sourced", "error", "nnal/atb/set_env.sh"),
        ("ImportError: libopapi.so: cannot open shared object file", "cann-not-sourced", "error", "set_env.sh"),
        ("ModuleNotFoundError: No module named 'decorator'", "missing-dependency", "error", "pip install decorator"),
        ("ModuleNotFoundError: No module named 'yaml'", "missing-dependency", "error", "pip install pyyaml"),
        ("ModuleNotFoundError: No module named 'torch_npu'", "not-installed", "info", "torch-npu==2.13.*"),
        ("line one\nOSError: something else entirely", "import-failed", "error", "torch-npu==2.13.*"),
    ],
)
def test_each_torch_npu_import_error_has_its_own_diagnosis(error, kind, status, fix):
    cann = CannInstall("/usr/local/Ascend/ascend-toolkit/latest", "$ASCEND_HOME_PATH", None, None)
    diagnosis = diagnose_torch_npu_error(error, cann, "2.13.0+cpu")
    assert (diagnosis.kind, diagnosis.status) == (kind, status)
    assert fix in diagnosis.fix
    if kind == "import-failed":
        assert diagnosis.summary.endswith("OSError: something else entirely")


def test_the_atb_fix_points_into_the_same_ascend_root(tmp_path, no_system_cann):
    located = locate_cann({"ASCEND_HOME_PATH": str(tmp_path / "Ascend" / "ascend-toolkit" / "latest")})
    assert located.atb_set_env_script == f"{tmp_path}/Ascend/nnal/atb/set_env.sh"


@pytest.mark.parametrize(
    "npu_version, status", [("2.13.0", "ok"), ("2.13.0.post1", "ok"), ("2.8.0.post2", "error"), ("2.12.0", "error")]
)
def test_torch_and_torch_npu_must_share_major_minor(npu_version, status):
    facts = Facts(environ={})
    facts.torch_version, facts.torch_npu_version = "2.13.0+cpu", npu_version
    (pairing,) = checks_ascend.check_torch_npu_pairing(facts)
    assert pairing.status == status
    if status == "error":
        assert 'pip install "torch-npu==2.13.*"' in pairing.fix
        assert f'"torch=={major_minor(npu_version)}.*"' in pairing.fix


def test_no_torch_npu_means_nothing_to_pair_and_no_error():
    facts = Facts(environ={})
    facts.torch_version, facts.torch_npu_version = "2.13.0+cpu", None
    assert checks_ascend.check_torch_npu_pairing(facts) == []
    (finding,) = checks_ascend.check_torch_npu(facts)
    assert finding.status == "info" and 'pip install "torch-npu==2.13.*"' in finding.fix


def test_autoload_zero_is_explained():
    facts = Facts(environ={AUTOLOAD_VARIABLE: "0"})
    facts.torch_npu_version = None
    (finding,) = checks_ascend.check_backend_autoload(facts)
    assert finding.status == "info" and "does not load torch_npu" in finding.summary


# --- CANN -----------------------------------------------------------------------------------------------------------


def test_cann_version_and_libraries_are_read_from_the_toolkit(tmp_path, no_system_cann):
    home = fake_cann_tree(tmp_path)
    cann = locate_cann(cann_env(home, sourced=True))
    assert (cann.home, cann.home_source, cann.version) == (str(home), "$ASCEND_HOME_PATH", "8.1.RC1")
    assert cann.version_file.endswith("x86_64-linux/ascend_toolkit_install.info")
    assert cann.missing_libraries == []
    assert cann.set_env_script == str(home.parent / "set_env.sh")


def test_cann_version_falls_back_to_the_component_version_file(tmp_path, no_system_cann):
    home = fake_cann_tree(tmp_path, version_line="innerversion=only")
    (home / "compiler").mkdir()
    (home / "compiler" / "version.info").write_text("Version=7.0.0\nversion_dir=7.0.0\n")
    assert locate_cann({"ASCEND_TOOLKIT_HOME": str(home)}).version == "7.0.0"


def test_cann_findings_sourced_unsourced_and_absent(tmp_path, no_system_cann, monkeypatch):
    facts = broken_torch_npu_facts(tmp_path, sourced=True)
    findings = by_check(checks_ascend.check_cann(facts))
    assert findings["cann-toolkit"].status == "ok" and "CANN 8.1.RC1" in findings["cann-toolkit"].summary
    assert findings["cann-libraries"].status == "ok"

    unsourced = broken_torch_npu_facts(tmp_path / "other")
    libraries = by_check(checks_ascend.check_cann(unsourced))["cann-libraries"]
    assert libraries.status == "error"
    assert libraries.summary.startswith("CANN environment not sourced") and "libhccl.so" in libraries.summary
    assert libraries.fix == f"source {tmp_path / 'other' / 'Ascend' / 'ascend-toolkit' / 'set_env.sh'}"

    monkeypatch.setattr(cann_module, "DEFAULT_HOMES", ())
    off_ascend = Facts(environ={})
    off_ascend.torch_npu_version = None
    statuses = {f.check: f.status for f in checks_ascend.check_cann(off_ascend)}
    assert statuses == {"cann-toolkit": "info", "cann-libraries": "info"}


# --- devices, settings, diffusers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value, message", [("tpu", "unknown device 'tpu'"), ("npu", "is not usable here")])
def test_an_invalid_npu_port_device_is_an_error_with_the_device_error_message(monkeypatch, value, message):
    monkeypatch.setenv("NPU_PORT_DEVICE", value)
    findings = by_check(checks_devices.check_devices(importable_torch_facts()))
    selected = findings["device-selected"]
    assert selected.status == "error" and message in selected.summary
    assert "NPU_PORT_DEVICE" in selected.fix and "cpu" in selected.fix
    assert findings["device-cpu"].status == "info" and "GiB" in findings["device-cpu"].summary


def test_an_invalid_allocator_config_is_an_error(monkeypatch):
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:128")
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "3")
    findings = by_check(checks_settings.check_npu_settings(importable_torch_facts()))
    alloc = findings["setting-PYTORCH_NPU_ALLOC_CONF"]
    assert alloc.status == "error" and "cannot be combined with max_split_size_mb" in alloc.summary
    assert findings["setting-TASK_QUEUE_ENABLE"].status == "error"


def test_recommended_settings_warn_on_an_npu_and_inform_elsewhere(monkeypatch):
    for name in checks_settings.RECOMMENDED_ENV:
        monkeypatch.delenv(name, raising=False)
    off_npu = by_check(checks_settings.check_npu_settings(importable_torch_facts()))
    assert {off_npu[f"setting-{name}"].status for name in checks_settings.RECOMMENDED_ENV} == {"info"}

    online_compile = type("npu", (), {"is_jit_compile_false": staticmethod(lambda: False)})
    monkeypatch.setitem(sys.modules, "torch_npu", type("torch_npu", (), {"npu": online_compile}))
    on_npu = importable_torch_facts()
    on_npu.npu_usable = True
    findings = by_check(checks_settings.check_npu_settings(on_npu))
    assert findings["setting-TASK_QUEUE_ENABLE"].status == "warn"
    assert findings["setting-TASK_QUEUE_ENABLE"].fix == "export TASK_QUEUE_ENABLE=2"
    assert findings["setting-jit-compile"].status == "warn"
    assert "jit_compile=False" in findings["setting-jit-compile"].fix

    monkeypatch.setenv("TASK_QUEUE_ENABLE", "2")
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")
    ready = importable_torch_facts()
    ready.npu_usable = False
    findings = by_check(checks_settings.check_npu_settings(ready))
    assert findings["setting-TASK_QUEUE_ENABLE"].status == findings["setting-PYTORCH_NPU_ALLOC_CONF"].status == "ok"


@pytest.mark.parametrize(
    "version, expected",
    [
        ("0.27.2", {"imports-torch-npu", "npu-rms-norm-and-singleton-masks"}),
        ("0.28.0", {"imports-torch-npu", "npu-rms-norm-and-singleton-masks", "geglu-tanh-on-npu"}),
        ("0.33.0", {"imports-torch-npu", "npu-rms-norm-and-singleton-masks", "geglu-tanh-on-npu"}),
        (
            "0.35.2",
            {
                "imports-torch-npu",
                "geglu-tanh-on-npu",
                "native-npu-drops-causal-and-inverts-float-masks",
                "npu-rms-norm-and-singleton-masks",
                "attn-backend-env-read-once",
                "set-use-npu-flash-attention-false",
                "npu-processor-deprecation-error",
            },
        ),
        (
            "0.42.1",
            {
                "imports-torch-npu",
                "geglu-tanh-on-npu",
                "native-npu-drops-causal-and-inverts-float-masks",
                "attn-backend-env-read-once",
                "set-use-npu-flash-attention-false",
            },
        ),
    ],
)
def test_known_diffusers_bugs_by_version(version, expected):
    assert {bug.id for bug in KNOWN_BUGS if bug.affects(version)} == expected


def test_diffusers_bugs_warn_only_when_they_break_this_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(checks_diffusers, "installed_version", lambda name: "0.35.2")
    broken = broken_torch_npu_facts(tmp_path)
    statuses = {f.check: f.status for f in checks_diffusers.check_diffusers(broken)}
    assert statuses["diffusers"] == "info"
    assert statuses["diffusers-imports-torch-npu"] == "warn"  # a broken torch_npu breaks import diffusers
    assert statuses["diffusers-npu-processor-deprecation-error"] == "warn"  # torch_npu installed + 0.35.2
    assert statuses["diffusers-native-npu-drops-causal-and-inverts-float-masks"] == "info"

    off_ascend = Facts(environ={})
    off_ascend.torch_npu_version = None
    statuses = {f.check: f.status for f in checks_diffusers.check_diffusers(off_ascend)}
    assert set(statuses.values()) == {"info"}

    monkeypatch.setattr(checks_diffusers, "installed_version", lambda name: None)
    (finding,) = checks_diffusers.check_diffusers(off_ascend)
    assert finding.status == "info" and "not installed" in finding.summary


# --- running, exit codes, output ----------------------------------------------------------------------------------


def test_a_check_that_raises_becomes_a_warning_and_the_others_still_run():
    def check_exploding(facts):
        raise ValueError("boom")

    def check_fine(facts):
        return [Finding("fine", "fine", "ok", "fine")]

    result = run_doctor(Facts(environ={}), groups=[("g", (check_exploding, check_fine))])
    exploded, fine = result.findings
    assert (exploded.check, exploded.status) == ("exploding", "warn")
    assert exploded.summary == "the exploding check failed: ValueError: boom"
    assert exploded.fix == "please report this"
    assert fine.status == "ok" and result.exit_code == 1


def test_torch_that_cannot_be_imported_skips_the_torch_checks():
    facts = Facts(environ={})
    facts.torch_version, facts.torch_npu_version = None, None
    facts.torch_import = failed("torch", "ModuleNotFoundError: No module named 'torch'\n")
    result = run_doctor(facts)
    findings = by_check(result.findings)
    assert findings["torch-import"].status == "error" and findings["torch-import"].summary == "torch is not installed"
    for check in ("devices", "sdpa-backends", "attention-kernels"):
        assert findings[check].status == "info" and findings[check].summary.startswith("skipped: torch cannot be")
    assert result.exit_code == 2


@pytest.mark.parametrize("statuses, code", [(("ok", "info"), 0), (("ok", "warn", "info"), 1), (("warn", "error"), 2)])
def test_exit_code_is_decided_by_the_worst_finding(statuses, code):
    assert exit_code(Finding("c", "t", status, "s") for status in statuses) == code


def test_findings_are_one_line_with_a_known_status():
    with pytest.raises(ValueError, match="status"):
        Finding("c", "t", "fatal", "s")
    with pytest.raises(ValueError, match="one line"):
        Finding("c", "t", "ok", "two\nlines")


def test_text_and_json_reports():
    result = DoctorResult(
        (
            ("First", (Finding("a", "A", "ok", "all good"),)),
            ("Second", (Finding("b", "B", "warn", "not great", "do this", {"k": 1}),)),
        )
    )
    text = render_text(result)
    assert text.splitlines()[0] == f"npu-port {npu_port.__version__} doctor: works, with warnings (1 warn); exit code 1"
    assert "\nFirst\n  [ok]    all good\n" in text
    assert "  [warn]  not great\n          fix: do this" in text
    report = as_json(result)
    assert report["npu_port_version"] == npu_port.__version__
    assert (report["exit_code"], report["verdict"]) == (1, "warnings")
    assert report["findings"][1] == {
        "check": "b",
        "title": "B",
        "status": "warn",
        "summary": "not great",
        "code": None,
        "fix": "do this",
        "details": {"k": 1},
        "group": "Second",
    }


def test_an_unexpected_error_prints_one_line_and_exits_2(monkeypatch, capsys):
    def broken_run_doctor():
        raise RuntimeError("the doctor itself broke")

    monkeypatch.setattr("npu_port.doctor.run_doctor", broken_run_doctor)
    assert main(["doctor"]) == 2
    captured = capsys.readouterr()
    assert (
        captured.err == "npu-port doctor: internal error (RuntimeError: the doctor itself broke); please report this\n"
    )
    assert "Traceback" not in captured.out + captured.err


def test_a_raising_check_through_the_cli(monkeypatch, capsys):
    def check_flaky(facts):
        raise KeyError("missing")

    monkeypatch.setattr(run_module, "CHECK_GROUPS", (("Flaky", (check_flaky,)),))
    assert main(["doctor", "--json"]) == 1
    (finding,) = json.loads(capsys.readouterr().out)["findings"]
    assert finding["summary"] == "the flaky check failed: KeyError: 'missing'" and finding["group"] == "Flaky"


def _run_cli(*args, env=None, python=sys.executable):
    return subprocess.run([str(python), "-m", "npu_port", *args], capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.e2e
@pytest.mark.slow
def test_doctor_on_this_machine():
    """The real report here: text and JSON agree, and the exit code follows from the findings.

    This machine has a CPU build of torch, no torch_npu, no CANN and no GPU, so every finding is ok or informational
    and the doctor exits 0; on a machine with torch_npu or an accelerator it may warn (exit 1), never error.
    """
    text = _run_cli("doctor")
    assert "Traceback" not in text.stdout + text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"npu-port {npu_port.__version__} doctor:")
    assert lines[0].endswith(f"exit code {text.returncode}")
    for section in (
        "Python and torch",
        "Ascend: torch_npu and CANN",
        "Devices",
        "Attention",
        "diffusers",
        "Versions and integrations",
    ):
        assert section in lines
    assert any(line.startswith("  [ok]    torch ") for line in lines)

    as_json_run = _run_cli("doctor", "--json")
    report = json.loads(as_json_run.stdout)
    assert set(report) == {"npu_port_version", "exit_code", "verdict", "findings", "torch_npu_pairings"}
    assert report["exit_code"] == as_json_run.returncode == text.returncode
    statuses = {finding["status"] for finding in report["findings"]}
    assert report["exit_code"] == exit_code(Finding("x", "x", status, "x") for status in statuses)
    for finding in report["findings"]:
        assert set(finding) == {"check", "title", "status", "summary", "code", "fix", "details", "group"}

    findings = {finding["check"]: finding for finding in report["findings"]}
    for library in ("transformers", "diffusers"):  # each integration applied to a tiny model, here: it routes
        assert findings[f"integration-{library}"]["status"] == "ok", findings[f"integration-{library}"]
    no_torch_npu = findings.get("torch-npu", {}).get("status") == "info"
    if no_torch_npu and findings["device-selected"]["details"]["device"] == "cpu":
        problems = [finding for finding in report["findings"] if finding["status"] in ("warn", "error")]
        assert (report["exit_code"], report["verdict"], problems) == (0, "ok", [])
    else:
        assert report["exit_code"] in (0, 1)


@pytest.mark.e2e
def test_doctor_runs_when_import_torch_fails(tmp_path):
    """The CLI's torch pre-check (exit 3) is for the other commands: the doctor diagnoses a broken torch itself."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"raise RuntimeError({AUTOLOAD_ERROR.split(': ', 1)[1]!r})\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    env.pop(AUTOLOAD_VARIABLE, None)
    result = _run_cli("doctor", env=env)
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    assert "[error] import torch fails: torch auto-loads torch_npu" in result.stdout
    assert "export TORCH_DEVICE_BACKEND_AUTOLOAD=0" in result.stdout
    assert "skipped: torch cannot be imported" in result.stdout


# --- the real thing: torch-npu 2.13.0 without CANN ------------------------------------------------------------------

#: Variables that would point a child process at a real CANN, or change how torch loads torch_npu.
_ASCEND_VARIABLES = ("LD_LIBRARY_PATH", AUTOLOAD_VARIABLE, "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "NPU_PORT_DEVICE")


def _without_cann(environ) -> dict:
    return {key: value for key, value in environ.items() if key not in _ASCEND_VARIABLES}


@pytest.fixture(scope="module")
def broken_torch_npu_venv(tmp_path_factory):
    """A venv that sees this environment's packages (torch, npu_port, diffusers) plus the real torch-npu 2.13.0 wheel
    and no CANN: ``import torch`` there fails with "Failed to load the backend extension: torch_npu" (libhccl.so).

    The wheel comes from PyPI (44 MB); PIP_FIND_LINKS, if set, lets pip take it from a local directory instead.
    """
    venv = tmp_path_factory.mktemp("broken-torch-npu") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    parent = sysconfig.get_paths()["purelib"]
    # addsitedir (not a bare path line) so the parent's own .pth files run too: that is how an editable npu_port
    # install is found.
    Path(purelib, "_parent_env.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "torch-npu==2.13.0"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, f"could not install torch-npu==2.13.0 from PyPI:\n{install.stderr}"
    env = _without_cann(os.environ)
    where = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('npu_port').origin)"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert where.stdout.strip() == npu_port.__file__, where.stdout + where.stderr
    torch_import = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True, env=env)
    if torch_import.returncode == 0:
        pytest.skip("torch_npu imports here: this machine has a real CANN, so the broken case cannot be built")
    assert "Failed to load the backend extension: torch_npu" in torch_import.stderr
    return python, env


@pytest.mark.e2e
@pytest.mark.slow
def test_doctor_diagnoses_torch_npu_without_cann(broken_torch_npu_venv):
    python, env = broken_torch_npu_venv
    text = _run_cli("doctor", env=env, python=python)
    assert text.returncode == 2, text.stdout + text.stderr
    assert "Traceback" not in text.stdout and "Traceback" not in text.stderr
    assert "doctor: problems found" in text.stdout.splitlines()[0]
    assert "libhccl.so cannot be found" in text.stdout
    assert "CANN environment not sourced" in text.stdout
    assert "export TORCH_DEVICE_BACKEND_AUTOLOAD=0" in text.stdout
    assert "the doctor set TORCH_DEVICE_BACKEND_AUTOLOAD=0 in its own process" in text.stdout

    as_json_run = _run_cli("doctor", "--json", env=env, python=python)
    assert as_json_run.returncode == 2
    assert "Traceback" not in as_json_run.stdout and "Traceback" not in as_json_run.stderr
    report = json.loads(as_json_run.stdout)
    assert (report["exit_code"], report["verdict"]) == (2, "errors")
    findings = {finding["check"]: finding for finding in report["findings"]}
    assert findings["torch-import"]["status"] == "error"
    assert findings["torch-import"]["details"]["cause"] == LIBHCCL_ERROR
    assert findings["torch-npu-import"]["details"]["diagnosis"] == "cann-not-sourced"
    assert findings["torch-npu-pairing"]["status"] == "ok"
    assert findings["cann-libraries"]["status"] == "error"
    assert findings["kernel-npu_fusion"]["status"] == "warn"  # installed but broken
    assert findings["device-selected"]["details"]["device"] == "cpu"


@pytest.mark.e2e
@pytest.mark.slow
def test_other_commands_in_the_broken_venv_exit_3_with_a_diagnosis(broken_torch_npu_venv):
    python, env = broken_torch_npu_venv
    result = _run_cli("kernels", env=env, python=python)
    assert result.returncode == 3
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.startswith(
        "npu-port: cannot import torch (RuntimeError: Failed to load the backend extension: torch_npu."
    )
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in result.stderr
