"""The quiet console (npu_port.console): third-party warnings, library log warnings and loading bars are held back
while a command runs, npu-port's own warnings and every error still show, one summary line follows, and everything
the console changed is exactly as before afterwards."""

from __future__ import annotations

import io
import logging
import types
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npu_port.console import LIBRARIES, Hidden, QuietConsole, for_command, summary_line, wants_progress
from npu_port.upstream.adapter import UpstreamDeclinedWarning

diffusers_logging = pytest.importorskip("diffusers.utils.logging")
try:
    import transformers.utils.logging as transformers_logging
except ImportError:  # a version lane without transformers (diffusers 0.11): the console quiets diffusers alone
    transformers_logging = None

needs_transformers = pytest.mark.skipif(transformers_logging is None, reason="transformers is not installed")


def _module(name: str, source: str) -> types.ModuleType:
    """A module named ``name`` (a fake third-party package, or a fake part of npu-port) holding ``source``."""
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


FAKE_LIBRARY = """
import warnings

def load():
    warnings.warn("load_weights() is deprecated; use load()", FutureWarning)
"""


@pytest.fixture(autouse=True)
def _always_show():
    """Every warning is shown (no once-per-place registry between tests)."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        yield


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def transformers_records():
    if transformers_logging is None:
        pytest.skip("transformers is not installed")
    """What reaches transformers' own handlers (a collecting handler beside its default one)."""
    transformers_logging.get_logger()  # its default handler is set up first, as in a real run
    collect = _Collect()
    root = logging.getLogger("transformers")
    root.addHandler(collect)
    yield collect
    root.removeHandler(collect)


def _state():
    """Everything the console may change, as comparable values (handlers by identity)."""
    from huggingface_hub.utils import are_progress_bars_disabled

    loggers = {
        name: (tuple(map(id, logging.getLogger(name).handlers)), logging.getLogger(name).propagate,
               logging.getLogger(name).level)
        for name in LIBRARIES
    }  # fmt: skip
    return {
        "filters": list(warnings.filters),
        "showwarning": warnings.showwarning,
        "loggers": loggers,
        "diffusers_bars": diffusers_logging.is_progress_bar_enabled(),
        "transformers_bars": transformers_logging and transformers_logging.is_progress_bar_enabled(),
        "hub_bars_disabled": are_progress_bars_disabled(),
    }


def test_a_third_party_warning_is_held_back_and_counted():
    library = _module("fakelib.loading", FAKE_LIBRARY)
    out = io.StringIO()
    with warnings.catch_warnings(record=True) as shown:
        with QuietConsole(stream=out) as console:
            library.load()
    assert shown == []
    assert [item.source for item in console.hidden] == ["fakelib"]
    assert "FutureWarning: load_weights() is deprecated; use load()" in console.hidden[0].text
    assert out.getvalue() == "npu-port: 1 library warning hidden (fakelib); --verbose shows it\n"


def test_npu_ports_own_warnings_still_show():
    own = _module("npu_port.fake_part", FAKE_LIBRARY)
    library = _module("fakelib.adapter", "import warnings\ndef decline(cls):\n    warnings.warn('declined', cls)\n")
    out = io.StringIO()
    with warnings.catch_warnings(record=True) as shown:
        with QuietConsole(stream=out) as console:
            own.load()  # raised by npu-port's code
            library.decline(UpstreamDeclinedWarning)  # npu-port's category, wherever it is raised
    assert [(w.category, str(w.message)) for w in shown] == [
        (FutureWarning, "load_weights() is deprecated; use load()"),
        (UpstreamDeclinedWarning, "declined"),
    ]
    assert console.hidden == [] and out.getvalue() == ""


def test_warnings_as_errors_still_raise():
    library = _module("fakelib.strict", FAKE_LIBRARY)
    warnings.simplefilter("error")
    with pytest.raises(FutureWarning, match="load_weights"):
        with QuietConsole(stream=io.StringIO()):
            library.load()


def test_a_transformers_warning_is_held_back_and_an_error_still_shows(transformers_records):
    logger = transformers_logging.get_logger("transformers.models.clip")
    out = io.StringIO()
    with QuietConsole(stream=out) as console:
        logger.warning("`CLIPImageProcessor` requires torchvision")
        logger.error("the checkpoint is broken")
    assert console.hidden == [Hidden("transformers", "`CLIPImageProcessor` requires torchvision")]
    assert transformers_records.messages == ["the checkpoint is broken"]
    assert out.getvalue() == "npu-port: 1 library warning hidden (transformers); --verbose shows it\n"


def test_diffusers_loading_bars_are_hidden_and_come_back():
    def draw() -> str:
        bar = io.StringIO()
        for _ in diffusers_logging.tqdm(range(3), desc="Loading pipeline components...", file=bar):
            pass
        return bar.getvalue()

    with QuietConsole(stream=io.StringIO()):
        assert draw() == ""
        assert not diffusers_logging.is_progress_bar_enabled()
        assert transformers_logging is None or not transformers_logging.is_progress_bar_enabled()
    assert "Loading pipeline components...: 100%" in draw()


def test_huggingface_hub_download_bars_stay_on():
    from huggingface_hub.utils import are_progress_bars_disabled

    assert not are_progress_bars_disabled()
    with QuietConsole(stream=io.StringIO()):
        assert not are_progress_bars_disabled()  # transformers' switch turned them off too: put back


def test_a_diffusers_warning_is_held_back():
    out = io.StringIO()
    with QuietConsole(stream=out) as console:
        diffusers_logging.get_logger("diffusers.models.modeling_utils").warning("`accelerate` was not found")
    assert console.hidden == [Hidden("diffusers", "`accelerate` was not found")]
    assert out.getvalue() == "npu-port: 1 library warning hidden (diffusers); --verbose shows it\n"


def test_everything_is_restored_exactly():
    library = _module("fakelib.restore", FAKE_LIBRARY)
    before = _state()
    with QuietConsole(stream=io.StringIO()):
        library.load()
        diffusers_logging.get_logger("diffusers.x").warning("noise")
        assert _state() != before
    assert _state() == before


def test_switches_that_were_off_stay_off():
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    diffusers_logging.disable_progress_bar()
    disable_progress_bars()
    try:
        before = _state()
        with QuietConsole(stream=io.StringIO()):
            assert are_progress_bars_disabled()
        assert _state() == before
    finally:
        diffusers_logging.enable_progress_bar()
        enable_progress_bars()


def test_an_exception_propagates_with_its_message_and_everything_is_restored():
    library = _module("fakelib.failing", FAKE_LIBRARY)
    before = _state()
    out = io.StringIO()
    with pytest.raises(RuntimeError, match="^the model folder has no model_index.json$"):
        with QuietConsole(stream=out):
            library.load()
            raise RuntimeError("the model folder has no model_index.json")
    assert _state() == before
    assert out.getvalue() == "npu-port: 1 library warning hidden (fakelib); --verbose shows it\n"


def test_ctrl_c_adds_no_summary_line():
    """An interrupted command ends in its one line (``interrupted (Ctrl-C); ...``): no count of hidden warnings."""
    library = _module("fakelib.interrupted", FAKE_LIBRARY)
    before = _state()
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        with QuietConsole(stream=out):
            library.load()
            raise KeyboardInterrupt
    assert _state() == before
    assert out.getvalue() == ""


def test_verbose_lets_everything_through(transformers_records):
    library = _module("fakelib.verbose", FAKE_LIBRARY)
    before = _state()
    out = io.StringIO()
    with warnings.catch_warnings(record=True) as shown:
        with QuietConsole(verbose=True, stream=out) as console:
            assert _state() == before  # nothing taken over
            library.load()
            transformers_logging.get_logger("transformers.x").warning("noise")
    assert [str(w.message) for w in shown] == ["load_weights() is deprecated; use load()"]
    assert transformers_records.messages == ["noise"]
    assert console.hidden == [] and out.getvalue() == ""


def test_quiet_hides_without_a_summary():
    library = _module("fakelib.quiet", FAKE_LIBRARY)
    out = io.StringIO()
    with QuietConsole(quiet=True, stream=out) as console:
        library.load()
    assert len(console.hidden) == 1 and out.getvalue() == ""


def test_nothing_hidden_prints_nothing():
    out = io.StringIO()
    with QuietConsole(stream=out):
        pass
    assert out.getvalue() == ""


def test_a_command_without_libraries_leaves_their_loggers_alone():
    before = _state()
    with QuietConsole(libraries=(), stream=io.StringIO()):
        after = _state()
    assert after["loggers"] == before["loggers"] and after["diffusers_bars"] == before["diffusers_bars"]


def test_the_flags_are_read_from_any_command():
    bare = types.SimpleNamespace()
    assert wants_progress(bare) and not for_command(bare).verbose and not for_command(bare).quiet
    assert not wants_progress(types.SimpleNamespace(no_progress=True))
    assert not wants_progress(types.SimpleNamespace(quiet=True))
    assert for_command(types.SimpleNamespace(verbose=True)).verbose
    assert for_command(types.SimpleNamespace(quiet=True)).quiet


def test_summary_line_names_the_sources_most_first():
    hidden = [Hidden("torch", "a"), Hidden("transformers", "b"), Hidden("transformers", "c")]
    assert summary_line(hidden) == "npu-port: 3 library warnings hidden (transformers 2, torch 1); --verbose shows them"
    assert summary_line([]) is None


@given(st.lists(st.sampled_from(["diffusers", "transformers", "torch", "accelerate"]), min_size=1, max_size=30))
def test_summary_line_counts_every_hidden_warning(sources):
    line = summary_line([Hidden(source, "text") for source in sources])
    assert line.startswith(f"npu-port: {len(sources)} library warning")
    assert line.endswith("; --verbose shows it" if len(sources) == 1 else "; --verbose shows them")
    for source in set(sources):
        assert source in line
    if len(sources) > 1:
        counted = line.split("(", 1)[1].split(")", 1)[0].split(", ")
        assert sum(int(part.rsplit(" ", 1)[1]) for part in counted) == len(sources)
