"""Every subcommand, given bad input of every kind, answers with exit code 2 and one line on stderr — never a
traceback, never a hang, never a file written or changed, never work started.

Hypothesis draws an argv per subcommand: one bad value (numbers out of range or not numbers, unknown names, paths of
every kind: missing, folders, FIFOs, devices, links onto another kind of file, to folders and to themselves, folders
no file can be created in, files used as folders, unicode names) beside otherwise valid options. Only input that
must fail validation is drawn, so each example costs milliseconds; the steps that do real work (loading a model,
measuring, running the script, scanning) are replaced by a tripwire that fails the example if reached, and an alarm
ends any example that blocks (a FIFO read with no writer would). The CLI runs in this process through its ``main``.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import string
from pathlib import Path
from typing import Dict, Iterator, List, Optional
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_port.cli.main import COMMANDS, main

NOTES = "a user's notes\n"
#: The longest one example may take before it counts as hung.
ALARM_S = 30


class Hung(BaseException):
    """Raised by the alarm: a BaseException, so that no ``except Exception`` in the CLI can swallow it."""


class ReachedWork(BaseException):
    """A tripwire: the input got past validation into real work."""


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Dict[str, str]:
    """Paths of every kind, made once: name -> path."""
    root = tmp_path_factory.mktemp("paths-ünï✓")
    (root / "folder").mkdir()
    (root / "folder.yaml").mkdir()
    (root / "results" / "bench.json").mkdir(parents=True)
    (root / "a-file").write_text("a file, not a folder\n")
    (root / "notes.txt").write_text(NOTES)
    (root / "script.py").write_text("raise SystemExit(99)  # must never run\n")
    (root / "broken.yaml").write_text("description: x\ncandidates: sdpa\n")
    os.mkfifo(root / "fifo")
    os.mkfifo(root / "fifo.yaml")
    os.mkfifo(root / "fifo.py")
    links = {
        "link-to-notes.png": root / "notes.txt",
        "link-to-notes.json": root / "notes.txt",
        "link-to-folder.png": root / "folder",
        "link-to-folder.json": root / "folder",
        "loop.png": root / "loop.png",
        "loop.json": root / "loop.json",
        "loop.py": root / "loop.py",
        "loop.yaml": root / "loop.yaml",
        "dangling.txt.png": root / "gone.txt",
    }
    for name, target in links.items():
        (root / name).symlink_to(target)
    (root / "results-linked").mkdir()
    (root / "results-linked" / "bench.csv").symlink_to(root / "notes.txt")
    paths = {name: str(root / name) for name in os.listdir(root)}
    paths.update(
        root=str(root),
        missing=str(root / "missing-ünïcødé" / "nothing"),
        under_a_file=str(root / "a-file" / "sub" / "out"),
        devnull=os.devnull,
        # root cannot create files in /sys either; without /sys, a path under a file stands in
        unwritable=str(Path("/sys") / "npu-port-test") if os.path.isdir("/sys") else str(root / "a-file" / "x"),
    )
    return paths


def _tree(root: str) -> List[tuple]:
    """What is in the sandbox (names, kinds, sizes, link targets): an example must leave it as it was."""
    entries = []
    for folder, names, files in os.walk(root):
        for name in sorted(names + files):
            path = os.path.join(folder, name)
            info = os.lstat(path)
            link = os.readlink(path) if os.path.islink(path) else None
            entries.append((path, info.st_mode, info.st_size if not os.path.isdir(path) else 0, link))
    return sorted(entries)


@contextlib.contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    def ring(signum, frame):
        raise Hung(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _tripwires() -> Iterator[None]:
    """Every entry into real work raises :class:`ReachedWork`."""

    def tripped(*args, **kwargs):
        raise ReachedWork("validation let bad input through to real work")

    targets = [
        "npu_port.infer.load_pipeline",
        "npu_port.infer.models.tiny_model_dir",
        "npu_port.integrations.diffusers.tiny.tiny_model",
        "npu_port.bench.runner.run_bench",
        "npu_port.runtime.activate",
        "npu_port.runtime.launch.run_entry",
        "npu_port.plan.models.record_model",
        "npu_port.scan.engine.scan_file",
        "npu_port.scan.engine._scan_many",
        "npu_port.diff.sides.run_side",
    ]
    with contextlib.ExitStack() as stack:
        for target in targets:
            stack.enter_context(mock.patch(target, tripped))
        yield


def run_cli(argv: List[str]):
    """``npu-port argv`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with _alarm(ALARM_S), _tripwires(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
    return code, out.getvalue(), err.getvalue()


# ----------------------------------------------------------------------------------------- what is drawn

NOT_INTEGERS = ["x", "1.5", "", "1e3", "0x10", "one", "½", "--", "-"]
NAMES = st.text(alphabet=string.ascii_lowercase + string.digits + "-_", min_size=1, max_size=12)
UNICODE = st.text(alphabet="ünïcødé✓漢字 ", min_size=1, max_size=8)


def _integer_outside(low: int, high: Optional[int] = None):
    """Integers below ``low`` or above ``high`` (None: no upper bound), and words that are not integers."""
    above = st.integers(min_value=high + 1).map(str) if high is not None else st.nothing()
    return st.one_of(st.integers(max_value=low - 1).map(str), above, st.sampled_from(NOT_INTEGERS))


def _path(p: Dict[str, str], *names: str):
    return st.sampled_from([p[name] for name in names])


def _unknown(known, pool=NAMES):
    return pool.filter(lambda name: name not in known)


def _option(flag: str, values):
    return values.map(lambda value: [flag, value])


def _unknown_option():
    return st.one_of(
        NAMES.map(lambda name: [f"--no-such-option-{name}"]),
        st.just(["--json=yes"]),
    )


def bad_arguments(command: str, p: Dict[str, str]):
    """(argv before the bad part, a strategy drawing the bad part) for ``command``."""
    from npu_port.strategy.registry import survey

    strategies = set(survey()[0])
    bad_strategy = st.one_of(
        _unknown(strategies),
        st.sampled_from(["bad name", "../nothing.yaml"]),
        _path(p, "missing", "folder.yaml", "fifo.yaml", "devnull", "loop.yaml", "broken.yaml"),
        UNICODE.map(lambda text: text + ".yaml"),
    )
    unwritable_file = ("folder", "under_a_file", "unwritable", "link-to-notes.json", "link-to-folder.json", "loop.json")
    if command == "kernels":
        return ["kernels"], _unknown_option()
    if command == "strategies":
        return ["strategies"], st.one_of(
            _option("--show", bad_strategy),
            _option("--explain", bad_strategy),
            _option("--model", _unknown(("unet", "dit", "sd3", "flux", "vae"))),
            _unknown_option(),
        )
    if command == "bench":
        return ["bench", "--shapes", "custom:1,1,8,8", "--no-plot"], st.one_of(
            _option("--warmup", _integer_outside(0)),
            _option("--repeats", _integer_outside(1)),
            _option(
                "--memory-budget",
                st.one_of(
                    st.integers(max_value=0).map(str),
                    st.integers(min_value=1).map(lambda n: f"-{n}GiB"),
                    st.sampled_from(["lots", "1 PB", "GiB", "1e3", "nan", "-"]),
                ),
            ),
            _option(
                "--shapes",
                st.one_of(
                    _unknown(("seq256", "seq512", "seq1024", "sd-64x64", "video-15x4096", "default", "all")),
                    st.tuples(*[st.integers(min_value=0, max_value=10**30)] * 4)
                    .filter(lambda dims: 0 in dims or dims[0] * dims[1] * dims[2] * dims[3] > 2**40)
                    .map(lambda dims: "custom:" + ",".join(map(str, dims))),
                    st.sampled_from(["custom:1,2,3", "custom:a,b,c,d", ",", "custom:-1,1,1,1"]),
                ),
            ),
            _option("--strategies", _unknown(strategies | {"all"})),
            _option("--dtype", _unknown(("float32", "float16", "bfloat16"))),
            _option("--device", _unknown(("cpu", "auto"))),
            _option("--output", _path(p, "a-file", "under_a_file", "unwritable", "fifo", "devnull", "results")),
            _option("--output", _path(p, "results-linked")),
            _unknown_option(),
        )
    if command == "doctor":
        return ["doctor"], st.one_of(
            st.sampled_from(["zzz", "not-a-code", "12", "ERR"]).map(lambda code: ["--explain", code]),
            _unknown_option(),
        )
    if command == "infer":
        base = ["infer", "--no-progress", "--output", os.path.join(p["root"], "out.png")]
        return base, st.one_of(
            _option("--steps", _integer_outside(1, 200)),
            _option("--seed", _integer_outside(0, 2**63 - 1)),
            _option("--height", st.one_of(st.integers(max_value=1), st.integers(min_value=129)).map(str)),
            _option("--width", st.integers(min_value=0, max_value=63).map(lambda n: str(2 * n + 1))),
            _option("--guidance-scale", st.sampled_from(["nan", "inf", "-inf", "1e999", "-0.5", "-3", "x"])),
            _option("--class", st.integers(min_value=0, max_value=999).map(str)),  # the default model takes a prompt
            _option("--frames", st.integers(min_value=1, max_value=33).map(str)),  # an image model
            _option("--nproc", st.integers(max_value=0).map(str)),
            _option("--strategy", bad_strategy),
            _option("--compare", st.sampled_from(["vanilla", "vanilla,nope", ",", "vanilla,vanilla"])),
            _option("--dtype", _unknown(("auto", "float32", "float16", "bfloat16"))),
            _option("--device", _unknown(("cpu", "auto"))),
            _option("--model", _path(p, "missing", "folder", "a-file", "fifo", "devnull")),
            _option(
                "--output",
                st.one_of(
                    _path(p, "folder", "link-to-notes.png", "link-to-folder.png", "loop.png", "dangling.txt.png"),
                    _path(p, "fifo", "devnull", "notes.txt", "a-file"),  # no image extension
                    st.just(os.path.join(p["under_a_file"], "o.png")),
                    st.just(p["unwritable"] + ".png"),
                    UNICODE.map(lambda text: os.path.join(p["root"], text + ".txt")),
                ),
            ),
            _option("--report", _path(p, *unwritable_file)),
            _unknown_option(),
        )
    if command == "run":
        script = p["script.py"]
        return ["run"], st.one_of(
            _path(p, "missing", "folder", "fifo.py", "devnull", "loop.py").map(lambda path: [path]),
            UNICODE.map(lambda text: [os.path.join(p["root"], text + ".py")]),
            st.sampled_from(["1bad", "no.such.module", "a..b"]).map(lambda name: ["-m", name]),
            _option("--report", _path(p, *unwritable_file)).map(lambda bad: [*bad, script]),
            _option("--watch", _path(p, "missing", "a-file")).map(lambda bad: [*bad, script]),
            _option("--override", st.sampled_from(["nocolon", "a:b", "a.b:c=", "=x:y"])).map(
                lambda bad: [*bad, script]
            ),
            st.sampled_from([["--chip", "910B"], ["--json"], ["--require-fused"]]).map(lambda bad: [*bad, script]),
            _unknown_option(),
        )
    if command == "plan":
        return ["plan", "--model", "tiny"], st.one_of(
            _option("--model", _path(p, "missing", "folder", "a-file")),
            _option("--steps", _integer_outside(1, 200)),
            _option("--chip", _unknown(("910a", "910b", "910c", "950", "310p"), NAMES)),
            _option("--device", _unknown(("npu", "cuda", "cpu", "auto"))),
            _option("--dtype", _unknown(("auto", "float32", "float16", "bfloat16"))),
            _option("--output", _path(p, *unwritable_file)),
            _unknown_option(),
        )
    if command == "scan":
        return ["scan", p["script.py"]], st.one_of(
            _option("--jobs", st.one_of(st.integers(max_value=0).map(str), st.sampled_from(NOT_INTEGERS))),
            _option("--format", _unknown(("text", "json", "csv", "sarif"))),
            _option(
                "--fail-on",
                _unknown(("import", "runtime", "handled", "perf", "deprecated", "guarded", "info", "never")),
            ),
            _option("--output", _path(p, *unwritable_file)),
            _unknown_option(),
        )
    if command == "fix":
        return ["fix"], st.one_of(
            _path(p, "missing").map(lambda path: [path]),
            UNICODE.map(lambda text: [os.path.join(p["missing"], text)]),
            _option("--target", _unknown(("torch", "npu-port"))),
            _unknown_option(),
        )
    if command == "diff":
        spec = st.sampled_from(["foo=1", "strategy", "dtype=float8", "fuse_ops=nope", "strategy=", ",", "=sdpa",
                                "strategy=sdpa,strategy=sdpa", "strategy=sdpa,profile=ascend-910b"])  # fmt: skip
        exists = ("folder", "a-file", "notes.txt", "link-to-folder.png", "loop.png", "under_a_file", "unwritable")

        def sides(bad):  # otherwise valid: two sides run now (the tripwire stops them if reached)
            return st.tuples(bad, st.sampled_from(["strategy=vanilla", "device=cpu,dtype=float32"])).map(
                lambda drawn: [*drawn[0], "--b" if drawn[0][0] == "--a" else "--a", drawn[1]]
            )

        return ["diff", "--no-progress"], st.one_of(
            sides(_option("--a", spec)),
            sides(_option("--b", spec)),
            sides(_option("--b", bad_strategy.map(lambda name: f"strategy={name}"))),
            sides(_option("--steps", _integer_outside(1, 50))),
            sides(_option("--seed", _integer_outside(0, 2**63 - 1))),
            sides(_option("--sample", _integer_outside(1))),
            sides(_option("--top", st.one_of(st.integers(max_value=-1).map(str), st.sampled_from(NOT_INTEGERS)))),
            sides(_option("--tolerance", st.sampled_from(["nan", "inf", "-1", "0", "x", "-inf"]))),
            sides(_option("--device", _unknown(("cpu", "auto")))),
            sides(_option("--dtype", _unknown(("auto", "float32", "float16", "bfloat16")))),
            sides(_option("--model", _path(p, "missing", "folder", "a-file", "fifo", "devnull"))),
            sides(_option("--full", st.sampled_from([",", "a,,b", " ", "x, ,y"]))),
            sides(_option("--fuse-ops", _unknown(("rms_norm", "rope", "geglu_exact", "geglu_tanh", "adaln")))),
            sides(
                _option(
                    "--plot",
                    _path(
                        p,
                        "folder",
                        "notes.txt",
                        "link-to-notes.png",
                        "link-to-folder.png",
                        "loop.png",
                        "fifo",
                        "devnull",
                        "dangling.txt.png",
                    ),
                )
            ),  # fmt: skip
            sides(_option("--keep", _path(p, "a-file", "under_a_file", "unwritable"))),
            sides(_option("-o", _path(p, "missing"))),  # -o is for diff dump
            _path(p, "missing", "folder", "a-file", "fifo", "devnull").map(lambda path: [path, path]),
            _path(p, "missing", "folder", "a-file", "fifo").map(lambda path: [path, "--b", "strategy=sdpa"]),
            _path(p, *exists).map(lambda path: ["dump", "-o", path]),
            _option("--full", st.sampled_from([",", "a,,b"])).map(lambda bad: ["dump", *bad, "-o", p["missing"]]),
            st.just(["dump", "-o", p["missing"], "--a", "strategy=sdpa"]),
            _unknown_option(),
        )
    raise AssertionError(f"no bad input drawn for {command!r}: add it here")


@pytest.mark.parametrize("command", list(COMMANDS))
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_bad_input_is_one_line_and_exit_2(command, sandbox, data):
    base, bad = bad_arguments(command, sandbox)
    argv = [*base, *data.draw(bad, label="bad")]
    before = _tree(sandbox["root"])
    code, out, err = run_cli(argv)
    assert code == 2, (argv, code, out, err)
    assert err.endswith("\n") and err.count("\n") == 1, (argv, err)
    assert err.startswith(("npu-port: ", f"npu-port {command}: ", f"npu-port {command} --explain: ")), (argv, err)
    assert "Traceback" not in err and out == "", (argv, out, err)
    assert _tree(sandbox["root"]) == before, argv
    assert Path(sandbox["notes.txt"]).read_text() == NOTES
