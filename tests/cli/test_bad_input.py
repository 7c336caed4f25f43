"""Issue 26's bad input, each as a user reproduced it: one line on stderr and exit code 2 (a ``TypeError`` naming the
parameter for the Python API), found before any expensive work, never a traceback and never a user's file lost."""

from __future__ import annotations

import io
import os
import sys

import pytest

import npu_port
from npu_port import atomic
from npu_port.bench import shapes
from npu_port.cli import main as cli_main
from npu_port.cli.main import EXIT_BROKEN_PIPE, main

NOTES = "my notes, not an image\n"


def _refused(argv, capsys) -> str:
    """Run ``npu-port argv`` in this process; it must exit 2 with one line on stderr, which is returned."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _notes_behind_a_link(tmp_path, name: str):
    notes = tmp_path / "notes.txt"
    notes.write_text(NOTES)
    link = tmp_path / name
    link.symlink_to(notes)
    return notes, link


def _link_refusal(flag: str, link, notes, kind: str) -> str:
    return (
        f"npu-port: {flag} {str(link)!r} is a link to {notes}, not a {kind} file; npu-port will not write through it: "
        "remove the link or give another path\n"
    )


# ------------------------------------------------------------------------------ writes never follow a link astray


def test_an_infer_output_that_links_to_a_text_file_is_refused_and_the_file_kept(tmp_path, capsys):
    notes, link = _notes_behind_a_link(tmp_path, "out.png")
    err = _refused(["infer", "--no-progress", "--output", str(link)], capsys)
    assert err == _link_refusal("--output", link, notes, ".png")
    assert notes.read_text() == NOTES and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "out.png"]  # no lock, no report


def test_an_infer_report_that_links_to_a_text_file_is_refused(tmp_path, capsys):
    notes, link = _notes_behind_a_link(tmp_path, "out.json")
    err = _refused(["infer", "--no-progress", "--output", str(tmp_path / "out.png")], capsys)
    assert err == _link_refusal("--report", link, notes, ".json")
    assert notes.read_text() == NOTES


def test_an_earlier_frame_that_links_to_a_text_file_is_refused_before_a_video_is_made(tmp_path, capsys):
    notes, link = _notes_behind_a_link(tmp_path, "clip-001.png")
    output = str(tmp_path / "clip.png")
    err = _refused(["infer", "--no-progress", "--model", "tiny-wan", "--output", output], capsys)
    assert err == (
        f"npu-port: --output {output!r}: the frame file {str(link)!r} is a link to {notes}, not a .png file; npu-port "
        "will not write through it: remove the link or give another path\n"
    )
    assert notes.read_text() == NOTES


def test_run_plan_scan_and_bench_refuse_a_link_onto_another_kind_of_file(tmp_path, capsys):
    script = tmp_path / "script.py"
    script.write_text("raise SystemExit('must not run')\n")
    notes, link = _notes_behind_a_link(tmp_path, "report.json")
    assert _refused(["run", "--report", str(link), str(script)], capsys) == _link_refusal(
        "--report", link, notes, ".json"
    )
    assert _refused(["plan", "--model", "tiny", "--output", str(link)], capsys) == (
        _link_refusal("--output", link, notes, ".json")
    )
    assert _refused(["scan", str(script), "-o", str(link)], capsys) == _link_refusal("--output", link, notes, ".json")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "bench.csv").symlink_to(notes)
    err = _refused(["bench", "--shapes", "custom:1,1,8,8", "--output", str(tmp_path / "results"), "--no-plot"], capsys)
    assert err == (
        f"npu-port: --output {str(tmp_path / 'results')!r}: bench.csv in it is a link to {notes}, not a .csv file; "
        "npu-port will not write through it: remove the link or give another path\n"
    )
    assert notes.read_text() == NOTES


def test_the_atomic_writer_follows_a_link_onto_its_own_kind_only(tmp_path):
    """``latest.png -> runs/7.png`` is written through (the link stays); ``out.png -> notes.txt``, a link to a
    folder and a loop are refused before a byte is written; a device at the end of a link is written into."""
    (tmp_path / "runs").mkdir()
    earlier = tmp_path / "runs" / "7.PNG"
    earlier.write_bytes(b"old image")
    latest = tmp_path / "latest.png"
    latest.symlink_to(earlier)
    atomic.write_bytes(latest, b"new image")
    assert latest.is_symlink() and earlier.read_bytes() == b"new image"
    dangling = tmp_path / "next.png"
    dangling.symlink_to(tmp_path / "runs" / "8.png")
    atomic.write_bytes(dangling, b"first")
    assert dangling.is_symlink() and (tmp_path / "runs" / "8.png").read_bytes() == b"first"

    notes, link = _notes_behind_a_link(tmp_path, "out.png")
    with pytest.raises(atomic.LinkRefused) as refused:
        atomic.write_bytes(link, b"\x89PNG")
    assert str(refused.value) == (
        f"{link} is a link to {notes}, not a .png file; npu-port will not write through it: remove the link or give "
        "another path"
    )
    folder = tmp_path / "to-folder.json"
    folder.symlink_to(tmp_path / "runs")
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    bare = tmp_path / "bare"
    bare.symlink_to(notes)
    assert atomic.link_problem(folder) == f"is a link to the folder {tmp_path / 'runs'}; give a file path"
    assert atomic.link_problem(loop) == "is a link that cannot be followed (Too many levels of symbolic links)"
    assert atomic.link_problem(bare) == (
        f"is a link to {notes}, not a file without an extension; npu-port will not write through it: remove the link "
        "or give another path"
    )
    null = tmp_path / "null.json"
    null.symlink_to(os.devnull)
    atomic.write_text(null, "{}")
    assert null.is_symlink() and os.path.realpath(null) == os.devnull
    assert atomic.link_problem("/dev/stdout") is None  # redirected to a file of any name: still the caller's stream
    assert notes.read_text() == NOTES and sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["7.PNG", "8.png"]


# ------------------------------------------------------------------------------------------------------- bench


def test_an_unwritable_bench_out_is_found_before_measuring(tmp_path, monkeypatch, capsys):
    from npu_port.bench import runner

    def never(*args, **kwargs):
        raise AssertionError("measured before checking --output")

    monkeypatch.setattr(runner, "run_bench", never)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    argv = ["bench", "--shapes", "custom:1,1,8,8", "--no-plot", "--output"]
    assert _refused([*argv, str(a_file)], capsys) == (
        f"npu-port: --output {str(a_file)!r} is not a folder; give a folder for bench.csv, bench.json and bench.png\n"
    )
    assert _refused([*argv, str(a_file / "results")], capsys) == (
        f"npu-port: --output {str(a_file / 'results')!r}: cannot write there ({a_file} is not a folder)\n"
    )
    (tmp_path / "results" / "bench.json").mkdir(parents=True)
    assert _refused([*argv, str(tmp_path / "results")], capsys) == (
        f"npu-port: --output {str(tmp_path / 'results')!r}: bench.json in it is a folder; move it away\n"
    )
    if os.path.isdir("/sys"):  # a folder even root cannot create files in
        assert _refused([*argv, "/sys/npu-port-bench"], capsys) == (
            "npu-port: --output '/sys/npu-port-bench': cannot write there (Permission denied)\n"
        )


def test_a_custom_shape_too_large_to_allocate_names_the_limit(monkeypatch, capsys):
    monkeypatch.setattr(shapes, "host_memory", lambda: 16 * 2**30)
    err = _refused(["bench", "--shapes", "seq256,custom:100000,100000,100000,100000"], capsys)
    assert err == (
        "npu-port: custom shape 'custom:100000,100000,100000,100000': its query, key and value need "
        "1,117,587,089,538.6 GiB (float32, made in host memory first); this machine has 16.0 GiB of memory: make "
        "B*H*S*D smaller\n"
    )
    assert shapes.custom_shape("custom:1,8,4096,64").seq == 4096  # 48 MiB: fine
    monkeypatch.setattr(shapes, "host_memory", lambda: None)  # the system does not say: torch's own 64-bit limit
    with pytest.raises(npu_port.bench.BenchError, match=r"need .* GiB \(float32, .*\); more than one tensor can hold"):
        shapes.custom_shape("custom:99999999999999999999,1,1,1")


@pytest.mark.parametrize(
    "value, message",
    [
        ("-1GiB", "--memory-budget must be a positive size such as '4GiB' or '512MiB', got '-1GiB'"),
        ("-1", "--memory-budget must be a positive size such as '4GiB' or '512MiB', got '-1'"),
        (
            "-.5MiB",
            "--memory-budget must be a byte count or a size such as '512MiB' (units: B, KiB, MiB, GiB, TiB, "
            "KB, MB, GB, TB), got '-.5MiB'",
        ),  # fmt: skip
        ("0", "--memory-budget must be at least 1 byte, got '0'"),
    ],
)
def test_a_negative_memory_budget_gets_its_own_message(value, message, capsys):
    assert _refused(["bench", "--memory-budget", value], capsys) == f"npu-port: {message}\n"


def test_a_size_of_many_digits_is_exact_not_a_float_overflow():
    from npu_port.strategy.spec import parse_size

    assert parse_size("9" * 400 + "B") == int("9" * 400)


# -------------------------------------------------------------------------------------------- the whole CLI


class _ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("argv", [["kernels"], ["strategies"], ["scan", "--rules"], ["doctor", "--explain", "list"]])
def test_a_closed_stdout_ends_quietly_with_141(argv, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(argv) == EXIT_BROKEN_PIPE == 141
    assert capsys.readouterr().err == ""


@pytest.mark.e2e
@pytest.mark.slow
def test_a_reader_that_closed_the_pipe_gets_no_traceback_from_a_real_process():
    """``npu-port kernels | head -1`` with the reader gone before the first write: exit 141, nothing on stderr (no
    ``BrokenPipeError``, and no ``Exception ignored`` from Python's own flush at exit)."""
    import subprocess

    child = subprocess.Popen(
        [sys.executable, "-m", "npu_port", "kernels", "--verbose"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    child.stdout.close()  # before the child has imported torch, let alone written
    _, err = child.communicate(timeout=300)
    assert (child.returncode, err.decode()) == (EXIT_BROKEN_PIPE, "")


def test_the_closed_pipe_recipe_points_stdout_at_the_null_device(tmp_path, monkeypatch):
    """What a real process does (a file stands in for the pipe: the descriptor is redirected, the object kept)."""
    with open(tmp_path / "stdout", "w") as handle:
        monkeypatch.setattr(sys, "stdout", handle)
        cli_main._quiet_stdout()
        print("after the pipe closed", file=handle, flush=True)
    assert (tmp_path / "stdout").read_text() == ""


def test_an_argparse_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["bench", "--repeats", "0"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == "npu-port bench: error: argument --repeats: must be an integer >= 1, got '0'\n"


# ------------------------------------------------------------------------------------ strategies, infer, run


def test_strategies_show_takes_a_path_as_every_other_command_does(tmp_path, capsys):
    mine = tmp_path / "mine.yaml"
    mine.write_text("description: mine\nextends: auto\ncandidates: [sdpa, math]\n")
    assert main(["strategies", "--show", str(mine)]) == 0
    shown = capsys.readouterr().out
    assert '"name": "mine"' in shown and '"candidates": [\n    "sdpa",\n    "math"\n  ]' in shown
    assert main(["strategies", "--show", "sdpa"]) == 0 and '"name": "sdpa"' in capsys.readouterr().out
    os.mkfifo(tmp_path / "pipe.yaml")  # would block the read for ever
    assert _refused(["strategies", "--show", str(tmp_path / "pipe.yaml")], capsys) == (
        f"npu-port: {tmp_path / 'pipe.yaml'}:1: not a regular file; give the path of a YAML file\n"
    )
    (tmp_path / "loop.yaml").symlink_to(tmp_path / "loop.yaml")  # pathlib's resolve raised RuntimeError
    assert _refused(["strategies", "--show", str(tmp_path / "loop.yaml")], capsys) == (
        f"npu-port: {tmp_path / 'loop.yaml'}:1: cannot read the file: a link that loops\n"
    )


def test_strategies_explain_refuses_a_bad_strategy_before_building_a_model(tmp_path, monkeypatch, capsys):
    from npu_port.integrations.diffusers import tiny

    def never(*args, **kwargs):
        raise AssertionError("built the model before checking the strategy")

    monkeypatch.setattr(tiny, "tiny_model", never)
    assert _refused(["strategies", "--explain", str(tmp_path / "missing.yaml")], capsys) == (
        f"npu-port: {tmp_path / 'missing.yaml'}:1: no such strategy file\n"
    )


@pytest.mark.parametrize("model, kind", [("tiny", "text-to-image"), ("tiny-wan", "text-to-video")])
def test_infer_class_is_refused_for_a_model_that_takes_a_prompt(model, kind, tmp_path, capsys):
    err = _refused(["infer", "--model", model, "--class", "3", "--output", str(tmp_path / "o.png")], capsys)
    assert err == (
        f"npu-port: --class is for class-conditional models such as tiny-dit; {model!r} is {kind}: describe what to "
        "make with --prompt\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_run_names_what_a_path_that_is_not_a_script_really_is(tmp_path, capsys):
    assert _refused(["run", os.devnull], capsys) == (
        "npu-port: '/dev/null' is not a regular file (a character device); give the path of a Python script\n"
    )
    os.mkfifo(tmp_path / "pipe.py")
    assert _refused(["run", str(tmp_path / "pipe.py")], capsys) == (
        f"npu-port: {str(tmp_path / 'pipe.py')!r} is not a regular file (a FIFO); give the path of a Python script\n"
    )


# ------------------------------------------------------------------------------------------- the Python API


@pytest.mark.parametrize(
    "call",
    [
        lambda: npu_port.set_attention_strategy("auto", candidates="sdpa"),
        lambda: npu_port.register_strategy("i26-mine", candidates="sdpa"),
    ],
)
def test_candidates_as_a_string_is_refused_naming_the_parameter(call):
    with pytest.raises(TypeError) as refused:
        call()
    assert str(refused.value) == "candidates must be a list of kernel names such as ['sdpa', 'math'], got str 'sdpa'"
    assert "i26-mine" not in npu_port.list_strategies()


def test_candidates_of_other_wrong_types_are_refused():
    from npu_port.strategy.registry import get_strategy

    auto = get_strategy("auto")
    with pytest.raises(TypeError, match=r"^candidates must be a list of kernel names \(strings\), got int 3$"):
        auto.with_overrides(candidates=["sdpa", 3])
    with pytest.raises(TypeError, match=r"^candidates must be a list of .*, got set \{'sdpa'\}$"):
        auto.with_overrides(candidates={"sdpa"})
    with pytest.raises(ValueError, match=r"^candidates must be a non-empty list of kernel names, got \[\]$"):
        auto.with_overrides(candidates=[])
    assert auto.with_overrides(candidates=("sdpa", "math", "sdpa")).candidates == ("sdpa", "math")


@pytest.mark.parametrize("value", ["yes", "no", 1, None])
def test_redirect_cuda_refuses_a_cuda_available_that_is_not_a_bool(value):
    with pytest.raises(TypeError) as refused:
        npu_port.redirect_cuda("cpu", cuda_available=value)
    assert str(refused.value) == f"cuda_available must be True or False, got {type(value).__name__} {value!r}"
    assert npu_port.redirect_cuda("cpu", cuda_available=True).cuda_available is True
