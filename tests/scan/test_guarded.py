"""Guarded and deprecated findings: CUDA-only code behind an availability test is reported at severity ``guarded``
with the guard named (its fix kind kept), ``torch.cuda.amp`` imports at ``deprecated``; both reach every report
format and ``--select`` / ``--ignore`` / ``--fail-on``."""

from __future__ import annotations

import csv
import io
import json

import pytest

from npu_port.cli.main import main
from npu_port.scan import report
from npu_port.scan.engine import scan

GUARDED = (
    "import torch\n"
    "import torch.distributed as dist\n"
    "def run(x, args):\n"
    "    if torch.cuda.is_available():\n"
    "        torch.cuda.synchronize()\n"
    "        x = x.cuda()\n"
    "    if torch.cuda.device_count() > 1 and args.ddp:\n"
    "        dist.init_process_group('nccl')\n"
    "    device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
    "    return x, device\n"
    "def early(x):\n"
    "    if not torch.cuda.is_available():\n"
    "        return x\n"
    "    return x.to('cuda:0')\n"
)

#: The guarded findings of GUARDED: (line, code, fix, message).
EXPECTED = [
    (
        5,
        "NPU302",
        "safe",
        "`torch.cuda.synchronize()` raises without CUDA (guarded by `torch.cuda.is_available()` on line 4): use "
        "`npu_port.device.synchronize()` (npu-port run redirects it)",
    ),
    (6, "NPU301", "safe", "`.cuda()` needs a CUDA device (guarded by `torch.cuda.is_available()` on line 4)"),
    (
        8,
        "NPU311",
        "safe",
        "`nccl` exists only on NVIDIA GPUs (guarded by `torch.cuda.device_count() > 1 and args.ddp` on line 7): use "
        "`npu_port.distributed.default_backend()` (hccl on Ascend, gloo on CPU; npu-port run maps it)",
    ),
    (
        9,
        "NPU310",
        "manual",
        "a CUDA device literal raises without CUDA (guarded by `torch.cuda.is_available()` on line 9): use "
        "`npu_port.get_device().type` (npu-port run maps it to the target)",
    ),
    (
        14,
        "NPU310",
        "safe",
        "a CUDA device literal raises without CUDA (guarded by `not torch.cuda.is_available()` on line 12): use "
        "`npu_port.get_device().type` (npu-port run maps it to the target)",
    ),
]

DEPRECATED = "from torch.cuda.amp import autocast\n"


def _file(tmp_path, text, name="m.py"):
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def test_guarded_findings_name_their_guard_and_keep_their_fix(tmp_path):
    found = scan([_file(tmp_path, GUARDED)]).findings
    guarded = [(f.line, f.code, f.fix, f.message) for f in found if f.severity == "guarded"]
    assert guarded == EXPECTED
    # the tests themselves stay NPU306's, at their own severity
    assert sorted((f.line, f.severity) for f in found if f.code == "NPU306") == [
        (4, "perf"),
        (7, "perf"),
        (9, "perf"),
        (12, "perf"),
    ]


def test_the_same_calls_without_a_guard_keep_their_rules_severity(tmp_path):
    text = "import torch\ndef run(x):\n    torch.cuda.synchronize()\n    return x.cuda()\n"
    found = scan([_file(tmp_path, text)]).findings
    assert [(f.code, f.severity) for f in found] == [("NPU302", "handled"), ("NPU301", "handled")]
    assert all("guarded by" not in f.message for f in found)


def test_a_long_guard_is_shortened_in_the_message(tmp_path):
    test = "torch.cuda.is_available() and args.use_the_gpu_for_everything and not args.force_the_cpu_path"
    text = f"import torch\ndef run(x, args):\n    if {test}:\n        x = x.cuda()\n    return x\n"
    (finding,) = [f for f in scan([_file(tmp_path, text)]).findings if f.code == "NPU301"]
    shown = test[:57] + "..."
    assert finding.message == f"`.cuda()` needs a CUDA device (guarded by `{shown}` on line 3)"


def test_torch_cuda_amp_imports_are_deprecated(tmp_path):
    (finding,) = scan([_file(tmp_path, DEPRECATED)]).findings
    assert (finding.code, finding.severity, finding.line) == ("NPU317", "deprecated", 1)


@pytest.mark.parametrize(
    "flags, codes",
    [
        (["--select", "guarded"], ["NPU302", "NPU301", "NPU311", "NPU310", "NPU310"]),
        (["--select", "guarded", "--ignore", "NPU31"], ["NPU302", "NPU301"]),
        (["--ignore", "guarded"], ["NPU306", "NPU306", "NPU306", "NPU306"]),
        (["--select", "NPU306,guarded"], []),  # NPU306's findings are perf, none guarded
    ],
)
def test_select_and_ignore_take_the_guarded_severity(tmp_path, capsys, flags, codes):
    path = _file(tmp_path, GUARDED)
    assert main(["scan", path, "--format", "json", *flags]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in payload["findings"]] == codes


@pytest.mark.parametrize(
    "text, fail_on, status",
    [
        (GUARDED, "guarded", 1),
        (GUARDED, "deprecated", 0),  # only guarded is left after --ignore NPU306: less serious than deprecated
        (GUARDED, "info", 1),
        (DEPRECATED, "deprecated", 1),
        (DEPRECATED, "perf", 0),
        (DEPRECATED, "guarded", 1),  # deprecated is more serious than guarded
    ],
)
def test_fail_on_guarded_and_deprecated(tmp_path, capsys, text, fail_on, status):
    path = _file(tmp_path, text)
    assert main(["scan", path, "--ignore", "NPU306", "--fail-on", fail_on]) == status
    capsys.readouterr()


def test_every_report_format_carries_the_new_severities(tmp_path):
    _file(tmp_path, GUARDED, "a.py")
    _file(tmp_path, DEPRECATED, "b.py")
    result = scan([str(tmp_path)])
    payload = json.loads(report.json_report(result))
    assert payload["counts"]["guarded"] == 5 and payload["counts"]["deprecated"] == 1
    assert sorted({f["severity"] for f in payload["findings"]}) == ["deprecated", "guarded", "perf"]
    rows = list(csv.reader(io.StringIO(report.csv_report(result))))
    severity = rows[0].index("Severity")
    assert [r[severity] for r in rows[1:]].count("guarded") == 5
    assert [r[severity] for r in rows[1:]].count("deprecated") == 1
    sarif = json.loads(report.sarif_report(result))
    results = sarif["runs"][0]["results"]
    levels = {(r["ruleId"], r["properties"]["severity"], r["level"]) for r in results}
    assert ("NPU302", "guarded", "note") in levels and ("NPU317", "deprecated", "warning") in levels
    text = report.text_report(result)
    assert "NPU317 deprecated: `torch.cuda.amp` is deprecated" in text
    assert "NPU301 guarded: `.cuda()` needs a CUDA device (guarded by" in text


def test_the_cli_writes_out_the_severities_and_targets_the_scan_package_defines():
    from npu_port.cli import fix_cmd, scan_cmd
    from npu_port.scan.rule import SEVERITIES
    from npu_port.scan.targets import TARGETS

    assert scan_cmd.SEVERITIES == SEVERITIES and fix_cmd.TARGETS == TARGETS


def test_fix_lists_a_deprecated_import_it_leaves_among_the_manual_changes(tmp_path, capsys):
    from npu_port.cli.main import main

    path = tmp_path / "m.py"
    path.write_text("from torch.cuda.amp import autocast\n", encoding="utf-8")
    assert main(["fix", str(path)]) == 0  # nothing to rewrite: only the import, a manual change
    err = capsys.readouterr().err
    assert f"1 need a manual change:\n  {path}:1:1 NPU317 " in err
