"""Whether the demo's server can listen where it is asked to, found before the model loads.

Without this, a host that does not resolve or a port in use shows up as a socket traceback from the web server — and
only after the model has loaded, which for a real pipeline is minutes. The check resolves ``--host`` and binds a
socket to ``--host:--port`` the way the server will (``SO_REUSEADDR``, as uvicorn sets it), then closes it. Another
program can still take the port in between; the launch then fails with the same one line.
"""

from __future__ import annotations

import errno
import os
import socket

from ..errors import InferenceError

#: Ports a TCP server can listen on; 0 asks the OS for any free one.
MAX_PORT = 65535


def listen_problem(host: str, port: int) -> str:
    """What stops a server from listening on ``host:port`` now, in one line ("" when nothing does)."""
    try:
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        return (
            f"--host {host!r} does not resolve ({reason}); give an address or name of this machine "
            "(127.0.0.1 for this machine only, 0.0.0.0 for every interface)"
        )
    family, kind, protocol, _, address = found[0]
    with socket.socket(family, kind, protocol) as probe:
        if os.name != "nt":  # what uvicorn sets; on Windows the option means sharing a port that is in use
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if exc.errno == errno.EADDRINUSE:
                return f"--port {port} is in use on {host} ({reason}); pick another, or --port 0 for any free port"
            if exc.errno == errno.EADDRNOTAVAIL:
                return (
                    f"--host {host!r} is not an address of this machine ({reason}); give one of its addresses "
                    "(127.0.0.1 for this machine only, 0.0.0.0 for every interface)"
                )
            if exc.errno == errno.EACCES:
                return (
                    f"--port {port} on {host} is not allowed ({reason}); ports below 1024 need privileges: pick a "
                    "higher one, or --port 0 for any free port"
                )
            return f"cannot listen on {host}:{port} ({reason})"
    return ""


def check_listen(host: str, port: int) -> None:
    """Refuse, in one line, an address the server could not listen on (see :func:`listen_problem`)."""
    problem = listen_problem(host, port)
    if problem:
        raise InferenceError(problem)
