"""``npu-port diff`` and ``npu-port run --dump`` given bad input: one line naming the problem (and the valid choices)
on stderr, exit code 2, before anything is loaded or written."""

from __future__ import annotations

import pytest

from npu_port.cli.main import main
from npu_port.diff.dump import DumpWriter

KEYS = "device, dtype, strategy, profile, fuse_ops"


@pytest.fixture
def dump(tmp_path):
    """A small, finished dump folder."""
    writer = DumpWriter(tmp_path / "a.d", {"model": "tiny", "request": {"steps": 1}})
    writer.close()
    return str(tmp_path / "a.d")


def _refused(argv, capsys) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err and captured.out == "", captured
    return captured.err


def test_a_dump_destination_that_exists_is_refused(dump, capsys):
    assert _refused(["diff", "dump", "-o", dump], capsys) == (
        f"npu-port: {dump} already exists: give a new folder for the dump (or remove that one)\n"
    )


@pytest.mark.parametrize(
    "spec, message",
    [
        ("foo=1", f"unknown key 'foo'; valid keys: {KEYS}"),
        ("strategy", f"give key=value pairs separated by commas (keys: {KEYS}), e.g. --b strategy=sdpa,dtype=bfloat16"),
        ("dtype=float8", "unknown dtype 'float8'; valid dtypes: auto, float32, float16, bfloat16"),
        ("fuse_ops=nope", "unknown fused op 'nope'; valid ops: rms_norm, rope, geglu_exact, geglu_tanh, adaln"),
        ("strategy=sdpa,strategy=vanilla", "strategy is given twice"),
        ("strategy=", "strategy has no value"),
        ("strategy=sdpa,profile=ascend-910b", "give strategy or profile, not both (a profile names its own strategy)"),
    ],
)
def test_a_bad_spec_is_named(dump, spec, message, capsys):
    assert _refused(["diff", dump, "--b", spec], capsys) == f"npu-port: --b {spec!r}: {message}\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["diff", "--steps", "2"], "nothing to compare: give two dump folders, or specs with --a / --b (e.g. npu-port diff --model "
                   "tiny --a strategy=vanilla --b strategy=sdpa)"),
        (["diff", "dump"], "diff dump needs -o DIR: the dump folder to write (it must not exist)"),
        (["diff", "dump", "--b", "strategy=sdpa", "-o", "x.d"],
         "--b is for comparing; npu-port diff dump records one run into -o DIR"),
        (["diff", "dump", "--full", "a,,b", "-o", "x.d"],
         "--full 'a,,b': an empty pattern; give module paths (shell patterns) separated by commas, e.g. "
         "'transformer.transformer_blocks.1.*', or 'all'"),
        (["diff", "dump", "--sample", "0", "-o", "x.d"], "--sample 0: give a positive number of elements (default 256)"),
        (["diff", "dump", "--fuse-ops", "nope", "-o", "x.d"],
         "unknown fused op 'nope'; valid ops: rms_norm, rope, geglu_exact, geglu_tanh, adaln"),
        (["diff", "--a", "strategy=sdpa", "--device", "nope"],
         "unknown device 'nope' (argument); valid devices: auto, npu, cuda, xpu, mps, cpu"),
        (["diff", "--model", "tiny", "--class", "3", "--a", "strategy=sdpa"],
         "--class is for class-conditional models such as tiny-dit; 'tiny' is text-to-image: describe what to make "
         "with --prompt"),
    ],
)  # fmt: skip
def test_bad_options_are_named_before_any_run(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _refused(argv, capsys) == f"npu-port: {message}\n"
    assert list(tmp_path.iterdir()) == []


def test_sides_that_cannot_pair_are_refused(dump, tmp_path, capsys):
    missing = str(tmp_path / "missing.d")
    assert _refused(["diff", dump, missing], capsys) == f"npu-port: {missing} is not a dump folder (no such folder)\n"
    assert _refused(["diff", dump, str(tmp_path)], capsys) == (
        f"npu-port: {tmp_path} is not a dump: it has no index.json (was it written by npu-port diff dump?)\n"
    )
    assert _refused(["diff", dump, dump, "--a", "strategy=sdpa"], capsys) == (
        "npu-port: both sides are dumps already; leave out --a / --b (or give one dump and one spec)\n"
    )
    assert _refused(["diff", dump, dump, dump], capsys) == (
        f"npu-port: give two sides (dump folders or --a / --b specs), not 3: {dump} {dump} {dump}\n"
    )
    assert _refused(["diff", dump, dump], capsys) == (
        f"npu-port: {dump} and {dump} share no record (different models or scripts?): nothing to compare\n"
    )
    assert _refused(["diff", dump, dump, "--plot", str(tmp_path / "x.txt")], capsys) == (
        f"npu-port: --plot: plot file {str(tmp_path / 'x.txt')!r}: give a .png or an .html path\n"
    )
    assert _refused(["diff", dump, dump, "--tolerance", "nan"], capsys) == (
        "npu-port: --tolerance nan: give a positive finite number (e.g. 1e-3)\n"
    )
    assert _refused(["diff", dump, "-o", "x.d"], capsys) == (
        "npu-port: -o is for npu-port diff dump; to keep the dumps of sides run now give --keep DIR\n"
    )
    assert _refused(["diff", "--a", "strategy=sdpa", "--b", "strategy=vanilla", "--keep", dump], capsys) == (
        f"npu-port: --keep {dump!r} is a dump; give a folder for the dumps of the sides run now\n"
    )


def test_a_script_dump_cannot_be_run_again(tmp_path, capsys):
    writer = DumpWriter(tmp_path / "script.d", {"script": "train.py"})
    writer.close()
    assert _refused(["diff", str(tmp_path / "script.d"), "--b", "strategy=sdpa"], capsys) == (
        "npu-port: the dump side was recorded from a script (npu-port run --dump): nothing to run again; compare it "
        "with another dump\n"
    )


def test_run_dump_refuses_an_existing_folder_and_plan(dump, tmp_path, capsys):
    script = tmp_path / "script.py"
    script.write_text("raise SystemExit('must not run')\n")
    assert _refused(["run", "--dump", dump, str(script)], capsys) == (
        f"npu-port: {dump} already exists: give a new folder for the dump (or remove that one)\n"
    )
    assert _refused(["run", "--plan", "--dump", str(tmp_path / "new.d"), str(script)], capsys) == (
        "npu-port: --dump records the run on the device; leave out --plan (it runs on the cpu)\n"
    )
    assert not (tmp_path / "new.d").exists()


def test_bisect_needs_both_sides_run_now(dump, capsys):
    assert _refused(["diff", dump, "--b", "strategy=sdpa", "--bisect"], capsys) == (
        "npu-port: --bisect runs both sides now: give --a and --b specs, not dump folders (a dump cannot be run "
        "again with other settings)\n"
    )


def test_bisect_takes_strategies_not_profiles(capsys):
    argv = ["diff", "--model", "tiny-dit", "--device", "cpu", "--a", "strategy=vanilla", "--b", "profile=cpu-fallback",
            "--bisect"]  # fmt: skip
    assert _refused(argv, capsys) == (
        "npu-port: --bisect takes strategies, not profiles (a profile also sets process options): give strategy=NAME "
        "on both sides\n"
    )


def test_bisect_is_for_comparing_not_for_dump(tmp_path, capsys):
    argv = ["diff", "dump", "-o", str(tmp_path / "x.d"), "--bisect"]
    assert _refused(argv, capsys) == (
        "npu-port: --bisect is for comparing; npu-port diff dump records one run into -o DIR\n"
    )
