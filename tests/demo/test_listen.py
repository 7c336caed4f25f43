"""The demo's command line refuses a host, a port or queue limits it cannot use in one line, exit code 2, before the
model loads (``npu_port.demo.address`` and the parser of ``npu_port.demo.__main__``)."""

from __future__ import annotations

import errno
import os
import re
import socket
from pathlib import Path

import pytest

from npu_port.demo import address

NOT_RESOLVED = (
    r"--host 'nosuch\.invalid' does not resolve \(.+\); give an address or name of this machine \(127\.0\.0\.1 for "
    r"this machine only, 0\.0\.0\.0 for every interface\)"
)
#: TEST-NET-1 (RFC 5737): a well-formed address that is never one of this machine's.
FOREIGN = "192.0.2.1"


def _run(arguments):
    """``main(arguments)``'s exit code (argparse's errors exit through SystemExit)."""
    from npu_port.demo.__main__ import main

    try:
        return main(arguments)
    except SystemExit as stopped:
        return stopped.code


def _refused(arguments, capsys) -> str:
    """Run the demo with ``arguments``: it must exit 2 with one line on stderr, having started no model; the line."""
    pytest.importorskip("gradio")
    code = _run(arguments)
    out = capsys.readouterr()
    assert code == 2, out
    assert out.err.count("\n") == 1 and out.err.endswith("\n"), out.err
    assert "loading" not in out.out and "Traceback" not in out.err  # the line printed just before the load
    assert not (Path(os.environ["NPU_PORT_CACHE_DIR"]) / "models").exists()  # no model built
    return out.err[:-1]


@pytest.fixture
def occupied():
    """A port another program listens on (127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.fixture(autouse=True)
def _no_analytics(monkeypatch):
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")  # main sets it when unset; keep this process clean


def test_listen_problem_names_each_cause(occupied):
    assert address.listen_problem("127.0.0.1", 0) == ""
    in_use = address.listen_problem("127.0.0.1", occupied)
    assert in_use == (
        f"--port {occupied} is in use on 127.0.0.1 ({os.strerror(errno.EADDRINUSE)}); pick another, or --port 0 for "
        "any free port"
    )
    assert address.listen_problem(FOREIGN, 0) == (
        f"--host '{FOREIGN}' is not an address of this machine ({os.strerror(errno.EADDRNOTAVAIL)}); give one of its "
        "addresses (127.0.0.1 for this machine only, 0.0.0.0 for every interface)"
    )
    assert re.fullmatch(NOT_RESOLVED, address.listen_problem("nosuch.invalid", 0))


def test_the_probe_leaves_the_port_free():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert address.listen_problem("127.0.0.1", port) == ""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as after:  # no SO_REUSEADDR: the probe closed its socket
        after.bind(("127.0.0.1", port))
        after.listen()


def test_an_occupied_port_is_refused_before_the_model_loads(occupied, capsys):
    line = _refused(["--port", str(occupied)], capsys)
    assert line == (
        f"gradio_demo_npu: --port {occupied} is in use on 127.0.0.1 ({os.strerror(errno.EADDRINUSE)}); pick another, "
        "or --port 0 for any free port"
    )


def test_a_host_that_does_not_resolve_or_is_not_this_machines_is_refused_before_the_model_loads(capsys):
    assert re.fullmatch("gradio_demo_npu: " + NOT_RESOLVED, _refused(["--host", "nosuch.invalid"], capsys))
    assert _refused(["--host", FOREIGN, "--port", "0"], capsys) == (
        f"gradio_demo_npu: --host '{FOREIGN}' is not an address of this machine "
        f"({os.strerror(errno.EADDRNOTAVAIL)}); give one of its addresses (127.0.0.1 for this machine only, 0.0.0.0 "
        "for every interface)"
    )


@pytest.mark.parametrize("port", ["70000", "65536", "-1", "abc", "80.5", ""])
def test_a_port_that_is_not_one_is_refused_by_the_parser(port, capsys):
    assert _refused(["--port", port], capsys) == (
        f"gradio_demo_npu: error: argument --port: must be a whole number from 1 to 65535 (or 0: any free port), got "
        f"{port!r}"
    )


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--max-queue", "0"], "--max-queue must be a whole number >= 1, got 0"),
        (["--per-client", "-1"], "--per-client must be a whole number >= 1, got -1"),
        (["--max-queue", "many"], "error: argument --max-queue: must be a whole number >= 1, got 'many'"),
        (["--per-client", "1.5"], "error: argument --per-client: must be a whole number >= 1, got '1.5'"),
        (
            ["--max-queue", "2", "--per-client", "3"],
            "--per-client 3 is more than --max-queue 2: one client could fill the queue; lower --per-client or raise "
            "--max-queue",
        ),
    ],
)
def test_queue_limits_are_checked_before_the_model_loads(arguments, message, capsys):
    assert _refused(arguments, capsys) == f"gradio_demo_npu: {message}"
