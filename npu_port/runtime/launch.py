"""Run a project's entry point as ``__main__`` — a script as ``python script.py`` would, a module as ``python -m``
would — and say truthfully how it ended.

The script path is compiled here rather than by ``runpy.run_path`` so that the entry script's own device-type checks
are rewritten like its modules' (:mod:`npu_port.runtime.device_checks`); a module runs through
``runpy.run_module``, whose code comes from the import watcher's loader (rewritten there). Either way ``sys.argv``
and ``sys.path[0]`` are what Python would set, and both are put back afterwards.

How it ended is an :class:`Outcome`: the exit status Python would give (0; a ``SystemExit`` code; 1 for an uncaught
exception, whose traceback is printed without npu-port's own frames; 130 for Ctrl-C), so ``npu-port run``'s report
never says 0 for a run that died.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import runpy
import sys
import traceback
import types
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence

from ..errors import EXIT_ON_CTRL_C
from .locate import EntryPoint
from .watch_imports import Transform

#: Frames of npu-port and runpy, left out of the traceback of the project's own error.
_OURS = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.abspath(runpy.__file__),
    "<frozen runpy>",
)


@dataclass
class Outcome:
    """How the entry point ended: ``status`` is ``completed``, ``exited`` (SystemExit), ``exception`` or
    ``interrupted``; ``error`` is one line (``"AssertionError: ..."``); ``line`` the source line it was raised at."""

    exit_code: int
    status: str
    error: Optional[str] = None
    line: Optional[str] = None
    exception: Optional[BaseException] = field(default=None, repr=False)

    def as_dict(self) -> Dict[str, Any]:
        return {"exit_code": self.exit_code, "status": self.status, "error": self.error}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # as Python does with sys.exit("message")
    return 1


def _print_traceback(exc: BaseException) -> Optional[str]:
    """The traceback Python would print, starting at the project's first frame; returns the raising line."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_OURS):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
    frames = traceback.extract_tb(exc.__traceback__)
    return frames[-1].line if frames else None


def _run_script(path: str, transform: Optional[Transform], init_globals: Dict[str, Any]) -> None:
    with open(path, "rb") as fh:
        raw = fh.read()
    transformed = transform(importlib.util.decode_source(raw), path, "__main__") if transform is not None else None
    code, extra = transformed if transformed is not None else (compile(raw, path, "exec", dont_inherit=True), {})
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=path,
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __package__=None,
        __spec__=None,
        **{**init_globals, **extra},  # both may name the device-checks helper (the same object)
    )
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _put_first_on_path(folder: str) -> None:
    """``folder`` first on ``sys.path``, as Python puts the script's folder (or, for ``-m``, the working directory)
    there. Where the launcher's own first entry is that folder already (``python -m npu_port`` from the project's
    root) it is replaced, not doubled: a namespace package's ``__path__`` would list the folder twice."""
    first = sys.path[0] if sys.path else None
    if first is not None and os.path.abspath(first or os.curdir) == os.path.abspath(folder):
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)


def run_entry(
    entry: EntryPoint,
    arguments: Sequence[str],
    *,
    transform: Optional[Transform] = None,
    init_globals: Optional[Dict[str, Any]] = None,
) -> Outcome:
    """Run ``entry`` with ``arguments`` as ``__main__``; never raises (KeyboardInterrupt included)."""
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    sys.argv = [entry.path, *arguments]
    _put_first_on_path(entry.sys_path0)
    try:
        if entry.kind == "script":
            _run_script(entry.path, transform, dict(init_globals or {}))
        else:
            runpy.run_module(entry.name, init_globals=dict(init_globals or {}), run_name="__main__", alter_sys=True)
        return Outcome(0, "completed")
    except SystemExit as exc:
        code = _exit_code(exc)
        message = None if exc.code is None or isinstance(exc.code, int) else str(exc.code).strip()
        return Outcome(code, "exited", message, None, exc)
    except KeyboardInterrupt as exc:
        line = _print_traceback(exc)
        return Outcome(EXIT_ON_CTRL_C, "interrupted", "KeyboardInterrupt", line, exc)
    except BaseException as exc:  # noqa: BLE001 - the project's own error: shown as Python would, then reported
        line = _print_traceback(exc)
        return Outcome(1, "exception", _one_line(exc), line, exc)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


_CUDA_WORDS = re.compile(r"cuda|gpu|nvidia|is_available|device_count", re.IGNORECASE)


def cuda_refusal_hint(outcome: Outcome, unavailable_answers: int, cuda_available: bool) -> Optional[str]:
    """A line for the summary when the run most likely stopped because ``torch.cuda.is_available()`` said False:
    it failed, is_available() answered False at least once, and the error or the line that raised it speaks of
    CUDA / a GPU. None otherwise (and always with ``--cuda-available``: then it answered True)."""
    if cuda_available or outcome.exit_code == 0 or outcome.status == "interrupted" or unavailable_answers == 0:
        return None
    evidence = " ".join(text for text in (outcome.error, outcome.line) if text)
    if not _CUDA_WORDS.search(evidence):
        return None
    return (
        f"the script stopped after torch.cuda.is_available() answered False ({unavailable_answers} "
        f"call{'s' if unavailable_answers != 1 else ''}): it looks like it refuses to run without CUDA. "
        "Run it again with --cuda-available (is_available() then answers True; the work still goes to the target)"
    )
