"""A pytest plugin that runs transformers' and diffusers' own model tests with an npu-port strategy on every model.

Load it with ``-p npu_port_plugin`` (its folder on ``PYTHONPATH``; ``run.py`` does both). Environment:

``NPU_PORT_UPSTREAM_STRATEGY``
    A strategy for :func:`npu_port.set_attention_strategy` (``sdpa``, ``auto``, a YAML path, ...). Unset or empty:
    the plugin changes nothing at all (no class is patched, npu-port is not imported), so the same command with and
    without it gives the two runs to compare.
``NPU_PORT_UPSTREAM_RECORD``
    A file to append one JSON line per test report to (outcome, one-line error, and, with a strategy, what npu-port
    did during the test). Written by the process that reports (the xdist controller, or the only process).
``NPU_PORT_UPSTREAM_COMPAT_SHIM``
    ``1``: if ``transformers.integrations.sdpa_attention`` has no ``PagedAttentionCache`` (removed in transformers 5.2x,
    still read by npu-port's transformers integration as of 2026-11-27), put an empty class of that name back, so a
    measurement can proceed past that crash. Only with a strategy; the session record says whether it was installed.
``NPU_PORT_UPSTREAM_TARGETS``
    Which libraries' models get the strategy: ``transformers,diffusers`` (default: both; a missing library is skipped).

Which models, and when (the hook). The strategy goes on at the moment a user would apply it: once a model is
completely built. That is the end of the outermost ``__init__`` of a ``PreTrainedModel`` / ``ModelMixin`` subclass
(``Model(config)``, ``from_config``), or the return of the outermost ``from_pretrained``; a model built inside another
model's ``__init__`` or inside ``from_pretrained`` is covered by the one around it (npu-port's appliers walk the
sub-models), never applied twice. Why not the first ``forward``: a test that builds a model and then changes it
(``set_attn_implementation("eager")``, ``gradient_checkpointing_enable()``, ``save_pretrained``, ``Model(a.config)``)
must meet npu-port as a user's code meets it, applied before those changes; applied at the first call, npu-port would
override what the test chose just before. Why not ``post_init`` / ``register_to_config``: they run at the end of
every nested model's construction too, and some models call ``register_to_config`` in the middle of ``__init__``.

To see the end of the outermost ``__init__``, every subclass's own ``__init__`` (and ``from_pretrained``) is wrapped:
the classes that exist when the plugin starts, and every class defined later (transformers and diffusers import their
model modules lazily), through a wrapped ``__init_subclass__`` on the two base classes. The wrappers keep
``functools.wraps`` metadata (both libraries read ``__init__``'s signature). Everything is put back at the end of the
session.

Per test: the models the strategy was applied to (class, how, routed calls per kernel, or the error
``set_attention_strategy`` raised: such a model then runs on its library's own path and the test goes on), and the
handles; at the end of the test's teardown each handle is restored, and what it did is attached to the teardown report
(``user_properties``), which pytest-xdist carries to the controller that writes the record. A model built at import or
collection time belongs to the session and is restored when it ends.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

ENV_STRATEGY = "NPU_PORT_UPSTREAM_STRATEGY"
ENV_RECORD = "NPU_PORT_UPSTREAM_RECORD"
ENV_SHIM = "NPU_PORT_UPSTREAM_COMPAT_SHIM"
ENV_TARGETS = "NPU_PORT_UPSTREAM_TARGETS"

#: library -> (module, base class of its models)
BASES = {
    "transformers": ("transformers.modeling_utils", "PreTrainedModel"),
    "diffusers": ("diffusers.models.modeling_utils", "ModelMixin"),
}
#: The key under which a test's npu-port summary travels in ``report.user_properties``.
PROPERTY = "npu_port"
MESSAGE_CHARS = 400
SHIM_INSTALLED = "installed: dummy transformers.integrations.sdpa_attention.PagedAttentionCache"


def first_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def describe_error(exc: BaseException) -> str:
    return first_line(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")


class Settings:
    """What the environment asks for; ``strategy`` None = do nothing."""

    def __init__(self, environ: Optional[Dict[str, str]] = None) -> None:
        env = os.environ if environ is None else environ
        self.strategy = (env.get(ENV_STRATEGY) or "").strip() or None
        self.record = (env.get(ENV_RECORD) or "").strip() or None
        self.compat_shim = (env.get(ENV_SHIM) or "").strip().lower() in ("1", "true", "yes")
        targets = (env.get(ENV_TARGETS) or "transformers,diffusers").split(",")
        self.targets = [t.strip() for t in targets if t.strip()]
        unknown = [t for t in self.targets if t not in BASES]
        if unknown:
            raise pytest.UsageError(f"{ENV_TARGETS}: unknown {unknown}; known: {sorted(BASES)}")


def install_compat_shim() -> str:
    """Put an empty ``PagedAttentionCache`` back into transformers' sdpa module if it is missing (see module doc)."""
    try:
        module = importlib.import_module("transformers.integrations.sdpa_attention")
    except ImportError as exc:
        return f"not installed: {describe_error(exc)}"
    if hasattr(module, "PagedAttentionCache"):
        return "not needed: transformers.integrations.sdpa_attention.PagedAttentionCache exists"

    class PagedAttentionCache:  # noqa: D401 - a stand-in nothing is an instance of
        """Dummy put back by npu-port's upstream-test harness (--compat-shim); no cache is ever one."""

    module.PagedAttentionCache = PagedAttentionCache
    return SHIM_INSTALLED


def remove_compat_shim() -> None:
    """Take the dummy back out (the plugin leaves transformers as it found it)."""
    import sys

    module = sys.modules.get("transformers.integrations.sdpa_attention")
    shim = getattr(module, "PagedAttentionCache", None)
    if shim is not None and getattr(shim, "__module__", None) == __name__:
        del module.PagedAttentionCache


class _Thread(threading.local):
    def __init__(self) -> None:
        self.building: List[Any] = []  # models whose outermost __init__ is running, outermost first
        self.loading = 0  # depth of from_pretrained calls


class ModelHook:
    """Applies ``strategy`` to every model of the chosen libraries once it is built; :meth:`finish_test` restores."""

    def __init__(self, strategy: str, targets: List[str], apply: Optional[Callable[..., Any]] = None) -> None:
        self.strategy = strategy
        self.targets = targets
        self._apply_fn = apply
        self._thread = _Thread()
        self._patched: List[Tuple[type, str, Any]] = []  # (class, attribute, what was in its __dict__ or _ABSENT)
        self._wrapped: "weakref.WeakSet[type]" = weakref.WeakSet()
        self._applied: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._lock = threading.RLock()
        self.bases: Dict[str, type] = {}
        self.skipped_targets: Dict[str, str] = {}
        self.session: List[Dict[str, Any]] = []  # models built outside a test (import, collection)
        self._session_handles: List[Any] = []
        self.current: Optional[List[Dict[str, Any]]] = None
        self._handles: List[Any] = []

    # ---- install / uninstall ----------------------------------------------------------------------------------

    def install(self) -> None:
        for target in self.targets:
            module_name, class_name = BASES[target]
            try:
                base = getattr(importlib.import_module(module_name), class_name)
            except Exception as exc:  # noqa: BLE001 - a library that cannot be imported has no models to hook
                self.skipped_targets[target] = describe_error(exc)
                continue
            self.bases[target] = base
            self._hook_subclasses(base)
            for cls in [base, *_all_subclasses(base)]:
                self._wrap_class(cls)

    def uninstall(self) -> None:
        with self._lock:
            for cls, name, old in reversed(self._patched):
                if old is _ABSENT:
                    try:
                        delattr(cls, name)
                    except AttributeError:
                        pass
                else:
                    setattr(cls, name, old)
            self._patched.clear()
            self._wrapped = weakref.WeakSet()
        for handle in self._session_handles:
            _restore(handle, [])
        self._session_handles.clear()

    def _set(self, cls: type, name: str, value: Any) -> None:
        self._patched.append((cls, name, cls.__dict__.get(name, _ABSENT)))
        setattr(cls, name, value)

    def _hook_subclasses(self, base: type) -> None:
        hook = self
        old = base.__dict__.get("__init_subclass__", _ABSENT)
        parent_func = old.__func__ if isinstance(old, classmethod) else None

        def __init_subclass__(cls: type, **kwargs: Any) -> None:
            if parent_func is not None:
                parent_func(cls, **kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)
            hook._wrap_class(cls)

        self._set(base, "__init_subclass__", classmethod(__init_subclass__))

    def _wrap_class(self, cls: type) -> None:
        with self._lock:
            if cls in self._wrapped:
                return
            self._wrapped.add(cls)
            init = cls.__dict__.get("__init__")
            if callable(init):
                self._set(cls, "__init__", self._wrap_init(init))
            loader = cls.__dict__.get("from_pretrained")
            if isinstance(loader, classmethod):
                self._set(cls, "from_pretrained", classmethod(self._wrap_from_pretrained(loader.__func__)))

    def _wrap_init(self, func: Callable[..., None]) -> Callable[..., None]:
        hook, state = self, self._thread

        @functools.wraps(func)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            stack = state.building
            if any(model is self for model in stack):  # super().__init__ of the same model
                return func(self, *args, **kwargs)
            stack.append(self)
            built = False
            try:
                func(self, *args, **kwargs)
                built = True
            finally:
                while stack and stack.pop() is not self:  # models above it whose __init__ failed
                    pass
            if built and not stack and not state.loading:
                hook.apply(self, "init")

        __init__._npu_port_upstream_wrapped = True  # type: ignore[attr-defined]
        return __init__

    def _wrap_from_pretrained(self, func: Callable[..., Any]) -> Callable[..., Any]:
        hook, state = self, self._thread

        @functools.wraps(func)
        def from_pretrained(cls: type, *args: Any, **kwargs: Any) -> Any:
            state.loading += 1
            try:
                result = func(cls, *args, **kwargs)
            finally:
                state.loading -= 1
            if not state.loading and not state.building:
                model = result[0] if isinstance(result, tuple) and result else result
                if hook.is_model(model):
                    hook.apply(model, "from_pretrained")
            return result

        return from_pretrained

    def is_model(self, obj: Any) -> bool:
        return any(isinstance(obj, base) for base in self.bases.values())

    # ---- applying, per test -----------------------------------------------------------------------------------

    def apply(self, model: Any, how: str) -> None:
        with self._lock:
            if model in self._applied:
                return
            self._applied.add(model)
        entry: Dict[str, Any] = {"class": type(model).__name__, "how": how}
        try:
            if self._apply_fn is not None:
                handle = self._apply_fn(self.strategy, target=model)
            else:
                import npu_port

                handle = npu_port.set_attention_strategy(self.strategy, target=model)
        except Exception as exc:  # noqa: BLE001 - recorded; the model runs on its library's own path
            entry["error"] = describe_error(exc)
            handle = None
        entry["_handle"] = handle
        if self.current is not None:
            self.current.append(entry)
            if handle is not None:
                self._handles.append(handle)
        else:
            self.session.append(entry)
            if handle is not None:
                self._session_handles.append(handle)

    def start_test(self) -> None:
        self.current = []
        self._handles = []

    def finish_test(self) -> Dict[str, Any]:
        """Restore this test's handles; what npu-port did, JSON-ready."""
        entries, self.current = self.current or [], None
        restore_errors: List[str] = []
        models = []
        routed = 0
        for entry in entries:
            handle = entry.pop("_handle", None)
            if handle is not None:
                calls = dict(getattr(handle, "calls", {}) or {})
                entry["calls"] = calls
                routed += sum(calls.values())
                _restore(handle, restore_errors)
            models.append(entry)
        self._handles = []
        return {"models": models, "routed": routed, "restore_errors": restore_errors}


_ABSENT = object()


def _restore(handle: Any, errors: List[str]) -> None:
    try:
        handle.restore()
    except Exception as exc:  # noqa: BLE001 - a restore that fails is a finding, recorded with the test
        errors.append(describe_error(exc))


def _all_subclasses(base: type) -> List[type]:
    seen: List[type] = []
    queue = list(base.__subclasses__())
    while queue:
        cls = queue.pop()
        if cls in seen:
            continue
        seen.append(cls)
        queue.extend(cls.__subclasses__())
    return seen


# ---- recording (the reporting process) -------------------------------------------------------------------------


def report_message(report: Any) -> str:
    """One line: the crash message of a failure, the reason of a skip."""
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return first_line(crash.message)
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        return first_line(longrepr[2])
    return first_line(str(longrepr))


def failure_site(report: Any) -> Optional[Dict[str, str]]:
    """Where a failure happened in the upstream tests themselves: the innermost traceback entry under the test
    tree's root (pytest writes those paths relative, library paths absolute), with its ``>`` source line, e.g.
    ``self.assertTrue(model_sdpa.config._attn_implementation == "sdpa")`` behind ``AssertionError: False is not
    true``."""
    entries = getattr(getattr(report.longrepr, "reprtraceback", None), "reprentries", None) or []
    for entry in reversed(entries):
        location = getattr(entry, "reprfileloc", None)
        if location is None or os.path.isabs(str(location.path)):
            continue
        lines = list(getattr(entry, "lines", []))
        marked = [line[1:].strip() for line in lines if line.startswith(">")]
        if not marked:  # a "short" entry: the source line, then the E lines
            marked = [line.strip() for line in lines if line.strip() and not line.startswith("E ")]
        return {"where": f"{location.path}:{location.lineno}", "line": first_line(marked[-1] if marked else "")}
    return None


def report_record(report: Any) -> Dict[str, Any]:
    record: Dict[str, Any] = {
        "kind": "report",
        "id": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "duration": round(float(getattr(report, "duration", 0.0) or 0.0), 3),
    }
    if hasattr(report, "wasxfail"):
        record["xfail"] = True
    context = getattr(report, "context", None)  # pytest's subtests (SubtestReport)
    if context is not None:
        record["subtest"] = first_line(str(getattr(context, "msg", None) or getattr(context, "kwargs", "") or "?"))
    if report.outcome != "passed":
        record["message"] = report_message(report)
    if report.outcome == "failed":
        site = failure_site(report)
        if site:
            record.update(site)
    for key, value in getattr(report, "user_properties", ()) or ():
        if key == PROPERTY:
            record[PROPERTY] = value
    return record


class Recorder:
    def __init__(self, path: str) -> None:
        self.path = path
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)

    def write(self, record: Dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as stream:
            stream.write(json.dumps(record, sort_keys=True) + "\n")


# ---- the pytest hooks ------------------------------------------------------------------------------------------

_STATE: Dict[str, Any] = {}


def _runs_tests(config: pytest.Config) -> bool:
    """False in the pytest-xdist controller (its workers run the tests and load this plugin too)."""
    if hasattr(config, "workerinput"):
        return True
    return not getattr(config.option, "numprocesses", None)


def _reports(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def _check_strategy(name: str) -> None:
    """A strategy that cannot be resolved stops the run at once, with npu-port's own message."""
    from npu_port.strategy.registry import resolve

    try:
        resolve(name)
    except Exception as exc:  # noqa: BLE001
        raise pytest.UsageError(f"{ENV_STRATEGY}={name!r}: {describe_error(exc)}") from exc


def pytest_configure(config: pytest.Config) -> None:
    settings = Settings()
    _STATE.clear()
    _STATE["settings"] = settings
    if settings.record and _reports(config):
        _STATE["recorder"] = Recorder(settings.record)
    if settings.strategy is None:
        if "recorder" in _STATE:
            _STATE["recorder"].write({"kind": "session", "strategy": None, "pid": os.getpid()})
        return
    _check_strategy(settings.strategy)
    shim = install_compat_shim() if settings.compat_shim else "off"
    _STATE["shim"] = shim
    hook = None
    if _runs_tests(config):
        hook = ModelHook(settings.strategy, settings.targets)
        hook.install()
        _STATE["hook"] = hook
    if "recorder" in _STATE:
        import npu_port

        _STATE["recorder"].write(
            {
                "kind": "session",
                "strategy": settings.strategy,
                "targets": settings.targets,
                "compat_shim": shim,
                "npu_port": getattr(npu_port, "__version__", "?"),
                "pid": os.getpid(),
                "skipped_targets": hook.skipped_targets if hook else {},
            }
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    hook = _STATE.pop("hook", None)
    if hook is not None:
        hook.uninstall()
    if _STATE.get("shim") == SHIM_INSTALLED:
        remove_compat_shim()
    _STATE.clear()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    hook = _STATE.get("hook")
    if hook is not None:
        hook.start_test()
    return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Any:
    try:
        return (yield)
    finally:
        hook = _STATE.get("hook")
        if hook is not None:
            item.user_properties.append((PROPERTY, hook.finish_test()))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    recorder = _STATE.get("recorder")
    if recorder is not None:
        recorder.write(report_record(report))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    recorder = _STATE.get("recorder")
    if recorder is not None:
        hook = _STATE.get("hook")
        recorder.write(
            {
                "kind": "sessionfinish",
                "exitstatus": int(exitstatus),
                "session_models": [{k: v for k, v in e.items() if k != "_handle"} for e in hook.session]
                if hook
                else [],
            }
        )
