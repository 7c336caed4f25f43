"""The scan engine and its reports: which files, how they are read, suppressions, selection, formats, exit status."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import threading

import pytest

from npu_port.cli.main import main
from npu_port.scan import report
from npu_port.scan.engine import ScanError, scan, select_rules
from npu_port.scan.rule import SEVERITIES, rules

CUDA_LINE = "import torch\ndef f():\n    x = torch.zeros(1).cuda()\n"  # in a function: no import-time finding


def _tree(tmp_path, files):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return tmp_path


def test_findings_carry_position_severity_fix_and_snippet(tmp_path):
    _tree(tmp_path, {"a.py": CUDA_LINE})
    (finding,) = scan([str(tmp_path)]).findings
    assert (finding.code, finding.line, finding.column, finding.end_line) == ("NPU301", 3, 9, 3)
    assert (finding.severity, finding.fix, finding.snippet) == ("handled", "safe", "x = torch.zeros(1).cuda()")
    assert finding.handled_by == "npu-port run (the CUDA redirect)"


def test_gitignore_hidden_and_build_folders_are_skipped_and_vendored_code_is_reported_apart(tmp_path):
    _tree(
        tmp_path,
        {
            ".gitignore": "generated/\n*_tmp.py\n",
            "src/model.py": CUDA_LINE,
            "src/scratch_tmp.py": CUDA_LINE,
            "generated/out.py": CUDA_LINE,
            ".hidden/x.py": CUDA_LINE,
            "build/lib/x.py": CUDA_LINE,
            "third_party/lib/ext.py": CUDA_LINE,
        },
    )
    result = scan([str(tmp_path)])
    assert sorted(os.path.relpath(f.path, tmp_path) for f in result.findings) == [os.path.join("src", "model.py")]
    assert [os.path.relpath(f.path, tmp_path) for f in result.vendored_findings] == [
        os.path.join("third_party", "lib", "ext.py")
    ]
    assert "1 more in vendored code" in "\n".join(report.summary_lines(result)).replace("    ", " ").replace("  ", " ")


def test_a_deeper_gitignore_overrides_the_ones_above_as_git_decides(tmp_path):
    _tree(
        tmp_path,
        {
            ".gitignore": "*.py\n!top.py\nlogs/\n/gen_*.py\n",
            "sub/deep/.gitignore": "!keep_me.py\n",  # re-includes what *.py above ignores (git keeps it)
            "sub/.gitignore": "\ufeff!bom.py\n",  # a byte-order mark, which git skips
            "top.py": CUDA_LINE,
            "gen_1.py": CUDA_LINE,
            "sub/gen_2.py": CUDA_LINE,
            "sub/bom.py": CUDA_LINE,
            "sub/deep/w.py": CUDA_LINE,
            "sub/deep/keep_me.py": CUDA_LINE,
            "logs/z.py": CUDA_LINE,
        },
    )
    found = sorted(os.path.relpath(f.path, tmp_path) for f in scan([str(tmp_path)]).findings)
    assert found == [os.path.join("sub", "bom.py"), os.path.join("sub", "deep", "keep_me.py"), "top.py"]


def test_encodings_a_bom_and_a_declared_latin1_file_are_read(tmp_path):
    _tree(
        tmp_path,
        {
            "bom.py": b"\xef\xbb\xbf" + CUDA_LINE.encode(),
            "latin.py": ("# -*- coding: latin-1 -*-\n# caf\xe9\n" + CUDA_LINE).encode("latin-1"),
        },
    )
    found = sorted((os.path.basename(f.path), f.line) for f in scan([str(tmp_path)]).findings)
    assert found == [("bom.py", 3), ("latin.py", 5)]


def test_a_file_that_does_not_parse_or_decode_is_a_finding_not_a_crash(tmp_path):
    _tree(tmp_path, {"py2.py": 'print "x".cuda()\n', "bad.py": b"x = '\xff\xfe'\n", "ok.py": CUDA_LINE})
    found = {os.path.basename(f.path): f for f in scan([str(tmp_path)]).findings}
    assert found["py2.py"].code == "NPU001" and "cannot be parsed as Python" in found["py2.py"].message
    assert found["bad.py"].code == "NPU001" and "cannot be read" in found["bad.py"].message
    assert found["ok.py"].code == "NPU301"


def test_suppressions_name_codes_or_everything(tmp_path):
    _tree(
        tmp_path,
        {
            "a.py": "import torch\n"
            "def f():\n"
            "    a = torch.zeros(1).cuda()  # npu-port: ignore[NPU301]\n"
            "    b = torch.zeros(1).cuda()  # npu-port: ignore[NPU999]\n"
            "    c = torch.zeros(1).cuda()  # npu-port: ignore\n"
        },
    )
    assert [f.line for f in scan([str(tmp_path)]).findings] == [4]


def test_select_and_ignore_take_prefixes_and_refuse_unknown_ones():
    codes = [r.code for r in rules()]
    assert [r.code for r in select_rules(["NPU3"])] == [c for c in codes if c.startswith("NPU3")]
    assert "NPU301" not in [r.code for r in select_rules((), ["NPU301"])]
    with pytest.raises(ScanError, match=r"^unknown rule code or prefix 'NPU9'; the codes are NPU001, "):
        select_rules(["NPU9"])


def test_a_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(ScanError, match="^no such file or folder: "):
        scan([str(tmp_path / "nope")])


def test_parallel_and_serial_scans_find_the_same(tmp_path):
    files = {f"pkg{i // 20}/m{i}.py": CUDA_LINE * (1 + i % 3) for i in range(80)}
    _tree(tmp_path, files)
    serial = scan([str(tmp_path)], jobs=1).findings
    parallel = scan([str(tmp_path)], jobs=2).findings
    assert sorted(serial, key=str) == sorted(parallel, key=str)
    assert len(serial) == sum(1 + i % 3 for i in range(80)) * 1  # one .cuda() per repetition


def test_csv_has_ascends_columns_then_ours(tmp_path):
    _tree(tmp_path, {"a.py": CUDA_LINE})
    rows = list(csv.reader(io.StringIO(report.csv_report(scan([str(tmp_path)])))))
    assert rows[0] == ["File", "Start Line", "End Line", "OP", "Tips", "Code", "Severity", "Fix", "Vendored"]
    assert rows[1][1:] == ["3", "3", "x = torch.zeros(1).cuda()", "`.cuda()` needs a CUDA device", "NPU301"] + [
        "handled",
        "safe",
        "False",
    ]


def test_sarif_is_2_1_0_with_every_rule_and_located_results(tmp_path):
    _tree(tmp_path, {"a.py": CUDA_LINE})
    sarif = json.loads(report.sarif_report(scan([str(tmp_path)])))
    assert sarif["version"] == "2.1.0" and sarif["$schema"].endswith("sarif-2.1.0.json")
    run = sarif["runs"][0]
    ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert ids == [r.code for r in rules()]
    (result,) = run["results"]
    assert ids[result["ruleIndex"]] == result["ruleId"] == "NPU301"
    assert result["level"] in ("error", "warning", "note")
    region = result["locations"][0]["physicalLocation"]["region"]
    assert region["startLine"] == 3 and region["startColumn"] >= 1 and region["endColumn"] >= region["startColumn"]


def test_sarif_locations_are_uris_relative_to_the_folder_it_ran_in(tmp_path, monkeypatch):
    """GitHub code scanning reads ``uri`` against the checkout's root: relative and percent-encoded under the
    working folder (spaces, ``#``, bytes that are not UTF-8), an absolute ``file://`` URI outside it."""
    _tree(tmp_path, {"src/sp ace#1.py": CUDA_LINE})
    (tmp_path / os.fsdecode(b"src/\xffbad.py")).write_text(CUDA_LINE)
    outside = tmp_path / "elsewhere"
    _tree(outside, {"b.py": CUDA_LINE})
    monkeypatch.chdir(tmp_path / "src")
    run = json.loads(report.sarif_report(scan([".", str(outside)])))["runs"][0]
    uris = sorted(json.dumps(r["locations"][0]["physicalLocation"]["artifactLocation"]) for r in run["results"])
    assert uris == sorted(
        [
            json.dumps({"uri": "%FFbad.py", "uriBaseId": "%SRCROOT%"}),
            json.dumps({"uri": "sp%20ace%231.py", "uriBaseId": "%SRCROOT%"}),
            json.dumps({"uri": (outside / "b.py").as_uri()}),
        ]
    )
    assert run["originalUriBaseIds"] == {"%SRCROOT%": {"uri": (tmp_path / "src").as_uri() + "/"}}


def test_json_counts_every_severity(tmp_path):
    _tree(tmp_path, {"a.py": CUDA_LINE})
    payload = json.loads(report.json_report(scan([str(tmp_path)])))
    assert list(payload["counts"]) == list(SEVERITIES) and payload["counts"]["handled"] == 1
    assert payload["findings"][0]["code"] == "NPU301" and payload["files_scanned"] == 1


def test_cli_fail_on_sets_the_exit_status(tmp_path, capsys):
    _tree(tmp_path, {"a.py": CUDA_LINE})
    assert main(["scan", str(tmp_path), "--fail-on", "handled"]) == 1
    assert main(["scan", str(tmp_path), "--fail-on", "runtime"]) == 0  # handled is less serious than runtime
    assert main(["scan", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "NPU301 handled: `.cuda()` needs a CUDA device" in out and "1 handled" in " ".join(out.split())


def test_cli_writes_the_report_atomically_and_lists_rules(tmp_path, capsys):
    _tree(tmp_path, {"a.py": CUDA_LINE})
    target = tmp_path / "out" / "scan.sarif"
    target.parent.mkdir()
    assert main(["scan", str(tmp_path / "a.py"), "--format", "sarif", "-o", str(target)]) == 0
    assert json.loads(target.read_text())["version"] == "2.1.0"
    assert main(["scan", "--rules"]) == 0
    listed = capsys.readouterr().out
    assert all(r.code in listed for r in rules())


def test_cli_bad_select_exits_2_with_one_line(tmp_path, capsys):
    assert main(["scan", str(tmp_path), "--select", "XYZ"]) == 2
    assert capsys.readouterr().err.startswith("npu-port: unknown rule code or prefix 'XYZ'")


@pytest.mark.e2e
def test_scan_needs_no_working_torch(tmp_path):
    """A scan only reads code: it works where ``import torch`` is broken (torch_npu without CANN)."""
    _tree(tmp_path, {"a.py": CUDA_LINE, "torch/__init__.py": "raise ImportError('libhccl.so: cannot open')\n"})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "npu_port", "scan", str(tmp_path / "a.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "NPU301" in done.stdout


def test_the_sites_rule_table_is_the_registrys():
    """The site's scan-rules reference is ``npu-port scan --rules --markdown``, generated when the site is built."""
    from ..docs import site

    assert site.pages_with("scan-rules") == ["reference/scan-rules.md"]
    assert site.hook().render("scan-rules") == report.rules_table(markdown=True)


@pytest.mark.e2e
def test_in_a_git_checkout_committed_files_count_even_where_gitignore_matches(tmp_path):
    """Git ignores only untracked files: CogVideo's .gitignore names ``**/sat``, whose 67 files are committed."""
    _tree(tmp_path, {".gitignore": "sat/\nscratch/\n", "sat/model.py": CUDA_LINE, "scratch/tmp.py": CUDA_LINE})
    _tree(tmp_path, {"src/ok.py": CUDA_LINE})

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("add", "-f", "sat/model.py", "src/ok.py", ".gitignore")
    found = sorted(os.path.relpath(f.path, tmp_path) for f in scan([str(tmp_path)]).findings)
    assert found == [os.path.join("sat", "model.py"), os.path.join("src", "ok.py")]  # scratch/ is untracked: ignored


@pytest.mark.e2e
def test_a_submodule_or_nested_checkout_is_scanned_and_reported_as_vendored(tmp_path):
    """``git ls-files`` lists a submodule as one entry, its folder: its files are someone else's code."""
    _tree(tmp_path, {"src/ok.py": CUDA_LINE, "deps/flash/setup.py": CUDA_LINE, "deps/empty/.keep": ""})

    def git(where, *args):
        subprocess.run(["git", "-C", str(where), *args], check=True, capture_output=True)

    git(tmp_path / "deps" / "flash", "init", "-q")
    git(tmp_path / "deps" / "flash", "add", "setup.py")
    git(tmp_path / "deps" / "flash", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "one")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "src/ok.py", "deps/flash")  # an embedded checkout: a gitlink entry, as a submodule is
    result = scan([str(tmp_path)])
    assert [os.path.relpath(f.path, tmp_path) for f in result.findings] == [os.path.join("src", "ok.py")]
    assert [os.path.relpath(f.path, tmp_path) for f in result.vendored_findings] == [
        os.path.join("deps", "flash", "setup.py")
    ]


def test_lines_are_counted_as_python_counts_them_form_feeds_included(tmp_path):
    _tree(tmp_path, {"ff.py": "import torch\n\x0c\ndef f(x):\n    return x.cuda()  # npu-port: ignore\n"})
    assert scan([str(tmp_path)]).findings == []  # the suppression is on the finding's own line
    _tree(tmp_path, {"ff.py": "import torch\n\x0c\ndef f(x):\n    return x.cuda()\n"})
    (finding,) = scan([str(tmp_path)]).findings
    assert (finding.line, finding.column, finding.snippet) == (4, 12, "return x.cuda()")


def test_a_file_given_twice_or_inside_a_given_folder_is_scanned_once_and_fifos_are_skipped(tmp_path):
    _tree(tmp_path, {"a.py": CUDA_LINE})
    os.mkfifo(tmp_path / "pipe.py")
    result = scan([str(tmp_path), str(tmp_path / "a.py"), str(tmp_path / "." / "a.py")])
    assert len(result.files) == 1 and len(result.findings) == 1


def test_a_fifo_or_a_device_given_by_name_is_a_finding_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "pipe.py")  # reading a FIFO nobody writes to blocks forever
    done = []
    worker = threading.Thread(target=lambda: done.append(scan([str(tmp_path / "pipe.py"), "/dev/null"])), daemon=True)
    worker.start()
    worker.join(30)
    assert done, "the scan blocked reading a FIFO"
    pipe = tmp_path / "pipe.py"
    assert [(f.code, f.path, f.message) for f in done[0].findings] == [
        ("NPU001", str(pipe), f"cannot be read ({pipe} is not a regular file); not scanned"),
        ("NPU001", "/dev/null", "cannot be read (/dev/null is not a regular file); not scanned"),
    ]


def test_the_report_goes_through_a_symlink_and_a_folder_is_a_clear_error(tmp_path, capsys):
    _tree(tmp_path, {"a.py": CUDA_LINE})
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "report.json"
    link.symlink_to(real)
    assert main(["scan", str(tmp_path / "a.py"), "--format", "json", "-o", str(link)]) == 0
    assert link.is_symlink() and json.loads(real.read_text())["counts"]["handled"] == 1
    assert main(["scan", str(tmp_path / "a.py"), "-o", str(tmp_path)]) == 2
    assert "cannot write the report to" in capsys.readouterr().err


def test_a_rule_looks_at_a_file_only_with_a_trigger_of_each_group():
    """``triggers`` then ``also_triggers``: NPU410 (float64 in RoPE code) reads a file only when it names both."""
    from npu_port.scan.engine import _interested

    (rope,) = [r for r in rules() if r.code == "NPU410"]
    assert rope.also_triggers
    assert rope in _interested([rope], "def apply_RoPE(x):\n    return x.double()\n", True)
    assert rope not in _interested([rope], "def scale(x):\n    return x.double()\n", True)  # float64, no RoPE
    assert rope not in _interested([rope], "def rope(x):\n    return x\n", True)  # RoPE, no float64
    assert rope not in _interested([rope], "def apply_RoPE(x):\n    return x.double()\n", False)  # not Python


def test_selecting_npu001_alone_parses_every_file_and_a_selection_of_no_rule_is_an_error(tmp_path):
    _tree(tmp_path, {"broken.py": "def f(:\n    pass\n", "fine.py": "x = 1\n"})
    assert scan([str(tmp_path)]).findings == []  # no rule looks at either file: neither is parsed
    (finding,) = scan([str(tmp_path)], select=["NPU001"]).findings
    assert (os.path.basename(finding.path), finding.code, finding.line) == ("broken.py", "NPU001", 1)
    with pytest.raises(ScanError) as error:
        scan([str(tmp_path)], select=["NPU3"], ignore=["NPU3"])
    assert str(error.value) == "--select NPU3 --ignore NPU3 leaves no rule to run; npu-port scan --rules lists them"


def test_a_link_is_followed_to_its_file_and_reported_there_once(tmp_path):
    _tree(tmp_path, {"project/src/real.py": CUDA_LINE, "elsewhere/other.py": CUDA_LINE})
    project = tmp_path / "project"
    (project / "a_link.py").symlink_to(project / "src" / "real.py")  # sorts before the file it points to
    (project / "src" / "z_link.py").symlink_to("real.py")  # relative
    (project / "out.py").symlink_to(tmp_path / "elsewhere" / "other.py")  # out of the folder scanned
    found = sorted((f.path, f.code) for f in scan([str(project)]).findings)
    assert found == [(str(project / "out.py"), "NPU301"), (str(project / "src" / "real.py"), "NPU301")]
    # the real file given too, by another spelling: still once
    both = scan([str(project), str(project / "src" / "real.py")]).findings
    assert sorted(f.path for f in both) == [str(project / "out.py"), str(project / "src" / "real.py")]


def test_fix_writes_a_linked_file_at_its_real_path_and_never_through_a_link_out_of_the_paths_given(tmp_path):
    from npu_port.scan.fix import fix

    _tree(tmp_path, {"project/src/real.py": CUDA_LINE, "elsewhere/other.py": CUDA_LINE})
    project = tmp_path / "project"
    (project / "a_link.py").symlink_to(project / "src" / "real.py")
    (project / "out.py").symlink_to(tmp_path / "elsewhere" / "other.py")
    fixes = {f.path: f for f in fix([str(project)], write=True, target="torch")}
    assert sorted(fixes) == [str(project / "out.py"), str(project / "src" / "real.py")]
    assert "torch.accelerator" in (project / "src" / "real.py").read_text(encoding="utf-8")
    assert (project / "a_link.py").is_symlink()
    assert (
        fixes[str(project / "out.py")].problem
        == f"not written: it links to {tmp_path}/elsewhere/other.py, outside the paths given"
    )
    assert (tmp_path / "elsewhere" / "other.py").read_text(encoding="utf-8") == CUDA_LINE
