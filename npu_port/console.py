"""The quiet console: while one of npu-port's own commands loads and runs a model, the console shows npu-port's
lines and one progress bar, not the libraries' loading chatter.

Why: ``npu-port infer`` used to print, before its first line, two transformers warnings about torchvision, and the
"Loading pipeline components" and "Loading weights" bars of diffusers and transformers drawn over each other. None of
it is something the user can act on, and it buried the lines that matter. :class:`QuietConsole` captures that noise
for the length of a command and restores everything it changed afterwards:

- Python warnings raised by other packages (those npu-port raises itself still show);
- warnings logged by diffusers, transformers, huggingface_hub and accelerate (errors still show);
- the loading bars of diffusers and transformers (their public ``disable_progress_bar`` switches); huggingface_hub's
  download bars stay, since a long download with nothing on screen looks like a hang.

After the command, one line says how many warnings were hidden and that ``--verbose`` shows them; with ``verbose``
nothing is captured at all. An exception is never swallowed: it leaves the block with its message.
The libraries are imported lazily (only those installed), and through the upstream adapters (the hub's too), so an
old diffusers or transformers without a switch is used as far as it goes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, TextIO

#: Libraries whose logging (and loading bars, where they have a switch) a command quiets by default.
LIBRARIES = ("diffusers", "transformers", "huggingface_hub", "accelerate")
#: The package whose own warnings always show.
OWN_PACKAGE = "npu_port"


@dataclass(frozen=True)
class Hidden:
    """One warning the console held back: the package it came from and its text."""

    source: str
    text: str


def summary_line(hidden: Sequence[Hidden]) -> Optional[str]:
    """The line printed after a command that hid something, or None: ``npu-port: 3 library warnings hidden
    (transformers 2, torch 1); --verbose shows them``."""
    if not hidden:
        return None
    counts = Counter(item.source for item in hidden)
    sources = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if len(hidden) == 1:
        return f"npu-port: 1 library warning hidden ({sources[0][0]}); --verbose shows it"
    where = ", ".join(f"{source} {count}" for source, count in sources)
    return f"npu-port: {len(hidden)} library warnings hidden ({where}); --verbose shows them"


def wants_progress(args: Any) -> bool:
    """Whether a command draws its progress bar: not with ``--no-progress``, not with ``--quiet``."""
    return not (getattr(args, "no_progress", False) or getattr(args, "quiet", False))


def for_command(args: Any, libraries: Sequence[str] = LIBRARIES) -> "QuietConsole":
    """The console for a command's parsed arguments (``--verbose``: everything shows; ``--quiet``: no summary)."""
    return QuietConsole(verbose=getattr(args, "verbose", False), quiet=getattr(args, "quiet", False),
                        libraries=libraries)  # fmt: skip


class QuietConsole:
    """A context manager that captures third-party warnings and loading bars (see the module's docstring).

    ``libraries``: the library loggers to take over (the default covers what npu-port loads models with; a command
    that loads no model passes fewer, so that it does not import diffusers only to quiet it). ``stream``: where the
    summary goes (``sys.stderr`` at exit when None). ``hidden`` lists what was held back, in order.
    """

    def __init__(
        self,
        verbose: bool = False,
        quiet: bool = False,
        libraries: Sequence[str] = LIBRARIES,
        stream: Optional[TextIO] = None,
    ) -> None:
        self.verbose = bool(verbose)
        self.quiet = bool(quiet)
        self.libraries = tuple(libraries)
        self.stream = stream
        self.hidden: List[Hidden] = []
        self._stack: Optional[contextlib.ExitStack] = None
        self._hub_bars_were_on = False

    def __enter__(self) -> "QuietConsole":
        self.hidden = []
        if self.verbose:
            return self
        stack = contextlib.ExitStack()
        try:
            self._take_warnings(stack)
            if "huggingface_hub" in self.libraries:
                self._keep_download_bars(stack)
            for name in self.libraries:
                self._take_logger(name, stack)
                self._take_loading_bars(name, stack)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, *exc_info: Any) -> bool:
        stack, self._stack = self._stack, None
        try:
            if stack is not None:
                stack.close()
        finally:
            line = summary_line(self.hidden)
            interrupted = exc_info[0] is not None and issubclass(exc_info[0], KeyboardInterrupt)
            if line and not self.quiet and not self.verbose and not interrupted:  # Ctrl-C ends in one line
                print(line, file=self.stream or sys.stderr, flush=True)
        return False  # an exception goes on with its message

    # ------------------------------------------------------------------------------------------------ warnings
    def _take_warnings(self, stack: contextlib.ExitStack) -> None:
        """Python warnings: the filters stay the user's (``-W error`` still raises); only the showing changes."""
        stack.enter_context(warnings.catch_warnings())  # restores showwarning and the filters on exit
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 - warnings' signature
            source = _raised_by()
            if source == OWN_PACKAGE or category.__module__.split(".")[0] == OWN_PACKAGE:
                shown(message, category, filename, lineno, file, line)
                return
            text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
            self.hidden.append(Hidden(source, text))

        warnings.showwarning = show

    # ------------------------------------------------------------------------------------------------- logging
    def _take_logger(self, name: str, stack: contextlib.ExitStack) -> None:
        """Route the library's warnings into :attr:`hidden`; errors reach the handlers they reached before."""
        if not _configure(name):
            return
        logger = logging.getLogger(name)
        handlers, propagate = list(logger.handlers), logger.propagate
        logger.handlers[:] = [_Capture(name, self.hidden, handlers, propagate, logger)]
        logger.propagate = False

        def restore() -> None:
            logger.handlers[:] = handlers
            logger.propagate = propagate

        stack.callback(restore)

    # -------------------------------------------------------------------------------------------- progress bars
    def _take_loading_bars(self, name: str, stack: contextlib.ExitStack) -> None:
        """Turn off the library's loading bars through its public switch (a version without one keeps its bars);
        the pipeline's step bar is drawn by tqdm directly and stays, as ``set_progress_bar_config`` set it."""
        module = _logging_module(name) if name in _BAR_SWITCHES else None
        switches = [getattr(module, switch, None) for switch in _BAR_SWITCHES.get(name, ())]
        if module is None or not all(callable(switch) for switch in switches):
            return
        is_enabled, enable, disable = switches
        if not is_enabled():
            return
        disable()
        stack.callback(enable)
        hub = _hub_bars() if "huggingface_hub" in self.libraries else None
        if hub is not None and self._hub_bars_were_on and hub[0]():
            hub[1]()  # transformers 5 switches the hub's bars with its own: downloads keep theirs

    def _keep_download_bars(self, stack: contextlib.ExitStack) -> None:
        """Note whether huggingface_hub's bars are on, and put them back so on exit (after the libraries' switches,
        which may have flipped them, are restored)."""
        self._hub_bars_were_on = False
        hub = _hub_bars()
        if hub is None:
            return
        are_disabled, enable, disable = hub
        self._hub_bars_were_on = not are_disabled()

        def restore() -> None:
            if are_disabled() != (not self._hub_bars_were_on):
                (enable if self._hub_bars_were_on else disable)()

        stack.callback(restore)


class _Capture(logging.Handler):
    """Holds a library logger's warnings; passes errors on to where they went before."""

    def __init__(self, library: str, hidden: List[Hidden], handlers, propagate: bool, logger: logging.Logger) -> None:
        super().__init__(logging.NOTSET)
        self.library = library.split(".")[0]
        self.hidden = hidden
        self.handlers = handlers
        self.propagate = propagate
        self.logger = logger

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            for handler in self.handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)
            if self.propagate and self.logger.parent is not None:
                self.logger.parent.handle(record)
            return
        self.hidden.append(Hidden(self.library, record.getMessage()))


def _raised_by() -> str:
    """The top-level package of the code that called ``warnings.warn`` (found from the stack, not from the warning's
    ``stacklevel``, which points at whoever the warning is about)."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        if module not in ("warnings", __name__):
            return module.split(".")[0] or "unknown"
        frame = frame.f_back
    return "unknown"


#: The library's logging functions that switch its loading bars: is-enabled, enable, disable.
_BAR_SWITCHES = {
    "diffusers": ("is_progress_bar_enabled", "enable_progress_bar", "disable_progress_bar"),
    "transformers": ("is_progress_bar_enabled", "enable_progress_bar", "disable_progress_bar"),
}


def _installed(name: str) -> bool:
    try:
        return name in sys.modules or importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _logging_module(name: str) -> Any:
    """diffusers' or transformers' logging module through npu-port's adapters (None: not installed or declined)."""
    if not _installed(name):
        return None
    if name == "diffusers":
        from .upstream.diffusers.pipelines import logging_module
    elif name == "transformers":
        from .upstream.transformers import logging_module
    else:
        return None
    return logging_module()


def _configure(name: str) -> bool:
    """Let the library set up its own logger first (diffusers and transformers add their handler on first use), so
    that what the console replaces is what the library would use. False when the library is not installed."""
    if name not in _BAR_SWITCHES:
        return _installed(name)
    module = _logging_module(name)
    get_logger: Optional[Callable[..., Any]] = getattr(module, "get_logger", None)
    if get_logger is None:
        return False
    get_logger()
    return True


def _hub_bars() -> Any:
    """huggingface_hub's (are_progress_bars_disabled, enable_progress_bars, disable_progress_bars), or None."""
    from .upstream.huggingface_hub import progress_bar_switches

    return progress_bar_switches()
