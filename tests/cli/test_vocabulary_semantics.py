"""What the shared options do, not only that they parse: ``--format json`` prints one JSON document on stdout (the
same data a command writes to its files), ``-q`` leaves out the side remarks, ``--out`` still works for bench."""

from __future__ import annotations

import json

from npu_port.cli.main import main

TINY = ["--shapes", "custom:1,2,64,16", "--strategies", "vanilla,sdpa", "--repeats", "1", "--warmup", "0"]

SOURCE = "import torch\nx = torch.zeros(2).cuda()\n"


def test_bench_json_is_the_results_file_and_the_written_line_moves_to_stderr(tmp_path, capsys):
    assert main(["bench", *TINY, "--no-plot", "--format", "json", "-o", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert printed == json.loads((tmp_path / "bench.json").read_text())
    assert [cell["strategy"] for cell in printed["cells"]] == ["vanilla", "sdpa"]
    assert f"npu-port: wrote {tmp_path / 'bench.csv'}, {tmp_path / 'bench.json'}\n" in err


def test_bench_quiet_prints_the_table_only_and_out_still_writes(tmp_path, capsys):
    assert main(["bench", *TINY, "--no-plot", "-q", "--out", str(tmp_path)]) == 0
    out, _ = capsys.readouterr()
    assert "wrote" not in out and "vanilla" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.csv", "bench.json"]


def test_fix_json_lists_the_planned_edits_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(SOURCE, encoding="utf-8")
    assert main(["fix", "--target", "npu-port", str(path)]) == 1
    diff = capsys.readouterr().out
    assert main(["fix", "--target", "npu-port", "--format", "json", str(path)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert path.read_text(encoding="utf-8") == SOURCE
    assert data["written"] is False
    [entry] = data["files"]
    assert entry["path"] == str(path) and entry["changed"] is True and entry["diff"] == diff
    assert [(f["code"], f["line"]) for f in entry["fixed"]] == [("NPU301", 2)]


def test_fix_quiet_says_nothing_but_the_diff(tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(SOURCE, encoding="utf-8")
    assert main(["fix", "--target", "npu-port", "-q", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("--- ") and err == ""


def test_scan_quiet_with_output_prints_nothing(tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(SOURCE, encoding="utf-8")
    report = tmp_path / "scan.json"
    assert main(["scan", "--json", "-q", "-o", str(report), str(path)]) == 0
    assert capsys.readouterr() == ("", "")
    assert json.loads(report.read_text())["findings"][0]["code"] == "NPU301"


def test_run_format_json_belongs_to_plan(tmp_path, capsys):
    script = tmp_path / "script.py"
    script.write_text("print('ran')\n", encoding="utf-8")
    assert main(["run", "--json", str(script)]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "npu-port: --format json applies to --plan only (npu-port run --plan --format json ... "
                              "script.py)\n")  # fmt: skip


def test_infer_json_is_the_report(tmp_path, capsys):
    image = tmp_path / "out.png"
    assert main(["infer", "--model", "tiny", "--steps", "2", "--no-progress", "-q", "--json", "-o", str(image)]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert printed == json.loads(image.with_suffix(".json").read_text())
    assert printed["image"] == str(image) and image.is_file()
    assert "random weights" not in err  # a side remark: left out under -q
