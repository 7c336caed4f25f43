"""Ascend runtime options — ACL options, NPU runtime settings, environment variables — checked, then set.

torch_npu's ``set_option`` stores any key it does not know (a typo such as ``ACL_PRECISON_MODE`` is silently
ignored by the runtime) and the environment variables are read by C++ code that fails late or not at all. So every
known key is checked here against the documented values (torch_npu 2.13's ``npu_config.py`` and the Ascend
Extension for PyTorch environment-variable list) with one error naming the section, key, value and valid choices,
and nothing is set unless everything is valid. Off an NPU nothing is set at all: the report says what would be.

What is set can be undone only where it can be read back: environment variables and the ``matmul`` / ``conv``
``allow_hf32`` attributes. torch_npu has no getter for ACL options, the compile mode or ``allow_internal_format``,
so :meth:`NpuOptionsReport.restore` leaves those as they are.

The catalogue of keys and values is a table in :mod:`npu_port.device.npu_catalogue`; this module checks a whole set of
settings against it (with the settings helper, :mod:`npu_port.settings`), then sets them. Section, key and value
choices mirror the strategy YAML schema (``acl_options:``, ``npu:``, ``env:``), so a whole
profile dict or :class:`~npu_port.strategy.spec.Strategy` can be passed as is; this module knows nothing else of
strategies.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from .._optional import probe
from ..errors import NpuOptionError
from ..settings import check_name, check_value
from .detect import backend_status
from .npu_catalogue import (  # the tables; ACL_OPTIONS, NPU_SETTINGS, ENV_VARIABLES are also read from here
    ACL_OPTIONS,
    AUTOLOAD_NOTE,
    CACHE_DEBUG_LEVELS,
    ENV_NAME,
    ENV_VARIABLES,
    NEW_PROCESSES_ONLY,  # noqa: F401  (re-exported: tests and callers read it here)
    NPU_ATTRIBUTES,
    NPU_RULES,
    NPU_SETTINGS,  # noqa: F401  (re-exported for the strategy schema)
    READ_AT_NPU_INIT,
    READ_BACK,
    SECTIONS,
    Rule,
    Value,
    any_env_value,
)

# --- reading and checking settings ----------------------------------------------------------------------------------


def read_sections(settings: Any) -> Dict[str, Dict[Any, Any]]:
    """The three sections of a mapping (other keys ignored) or of an object with those attributes (a Strategy)."""
    if isinstance(settings, Mapping):
        get = settings.get
    elif any(hasattr(settings, name) for name in SECTIONS):
        get = partial(getattr, settings)
    else:
        raise NpuOptionError(
            "settings must be a mapping with acl_options / npu / env sections, or an object with those attributes "
            f"(such as a Strategy); got {type(settings).__name__}"
        )
    sections: Dict[str, Dict[Any, Any]] = {}
    for name in SECTIONS:
        section = get(name, None)
        if section is not None and not isinstance(section, Mapping):
            raise NpuOptionError(f"{name} must be a mapping of name: value, got {type(section).__name__} {section!r}")
        sections[name] = dict(section or {})
    return sections


@dataclass(frozen=True)
class _Entry:
    section: str
    key: str
    value: Value


#: How a bad value and an unknown key are reported (through the settings helper, npu_port.settings).
_INVALID = "{section}.{name}: {value!r} is not allowed; {problem}"
_UNKNOWN = "{section}: unknown key {name!r}; valid keys: {valid}"


def _checked(section: str, key: Any, value: Any, rule: Rule, found: List[str]) -> _Entry:
    normalised = check_value(key, value, rule, error=NpuOptionError, invalid=_INVALID, section=section)
    text = rule.warning(normalised) if rule.warning is not None else None
    if text:
        found.append(f"{section}.{key} {text}")
    return _Entry(section, key, normalised)


def _known(section: str, key: Any, rules: Mapping[str, Rule]) -> Rule:
    return check_name(key, rules, error=NpuOptionError, unknown=_UNKNOWN, section=section)


_ANY_ENV = Rule(None, any_env_value, "not an Ascend variable: set as given")


def _env_rule(key: Any) -> Rule:
    if not isinstance(key, str) or not ENV_NAME.match(key):
        raise NpuOptionError(
            f"env: {key!r} is not a valid environment variable name; use letters, digits and '_', not starting with "
            "a digit"
        )
    return ENV_VARIABLES.get(key) or _ANY_ENV


def _check_compiler_cache(acl: Mapping[str, Value]) -> None:
    level = acl.get("ACL_OP_DEBUG_LEVEL")
    if "ACL_OP_COMPILER_CACHE_DIR" in acl and level is not None and level not in CACHE_DEBUG_LEVELS:
        raise NpuOptionError(
            f"acl_options.ACL_OP_COMPILER_CACHE_DIR: the operator compile cache is only used with ACL_OP_DEBUG_LEVEL "
            f"0 or 3, but ACL_OP_DEBUG_LEVEL is {level!r}; drop one of them"
        )


def _validate(sections: Mapping[str, Mapping[Any, Any]]) -> Tuple[List[_Entry], List[str]]:
    """Every entry checked and normalised, in the order they are applied, and the warnings; nothing is set here."""
    found: List[str] = []
    env = [_checked("env", k, v, _env_rule(k), found) for k, v in sections["env"].items()]
    acl = [
        _checked("acl_options", k, v, _known("acl_options", k, ACL_OPTIONS), found)
        for k, v in sections["acl_options"].items()
    ]
    _check_compiler_cache({entry.key: entry.value for entry in acl})
    npu = {k: _checked("npu", k, v, _known("npu", k, NPU_RULES), found) for k, v in sections["npu"].items()}
    ordered_npu = [npu[name] for name in NPU_SETTINGS if name in npu]  # set_compile_mode first, then attributes
    return env + acl + ordered_npu, list(dict.fromkeys(found))


# --- the report -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """One setting: what is (or would be) set, as the call that does it, and what was there before.

    ``previous`` is the value before (env: ``None`` = unset; readable attributes: their value; otherwise ``None``);
    ``restorable`` says whether :meth:`NpuOptionsReport.restore` puts it back.
    """

    section: str
    key: str
    value: Value
    call: str
    previous: Optional[Value] = None
    restorable: bool = False
    note: Optional[str] = None


@dataclass
class NpuOptionsReport:
    """What :func:`apply_npu_options` set (or, on a dry run, would set), the warnings, and how to undo it."""

    dry_run: bool
    reason: Optional[str]
    actions: List[Action] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    _undo: List[Callable[[], None]] = field(default_factory=list, init=False, repr=False, compare=False)

    def restore(self) -> None:
        """Undo what can be undone: env vars back to exactly their old value (or unset), ``matmul`` / ``conv``
        ``allow_hf32`` back to their old value.

        ACL options, the compile mode (``jit_compile``) and ``allow_internal_format`` stay: torch_npu cannot read
        them back, so there is no old value to restore. A dry run set nothing, so this does nothing; a second call
        does nothing either.
        """
        while self._undo:
            self._undo.pop()()

    def as_dict(self) -> Dict[str, Any]:
        """Plain data for JSON."""
        return {
            "dry_run": self.dry_run,
            "reason": self.reason,
            "actions": [asdict(action) for action in self.actions],
            "warnings": list(self.warnings),
        }

    def format(self) -> str:
        """The report as lines of text: each call, the value it replaces, notes, warnings, what restore() keeps."""
        lines = [f"dry run ({self.reason}) — would set:" if self.dry_run else "applied:"]
        lines += [f"  {action.call}{self._before(action)}" for action in self.actions] or ["  nothing"]
        for action in self.actions:
            if action.note:
                lines.append(f"note: {action.section}.{action.key}: {action.note}")
        lines += [f"warning: {text}" for text in self.warnings]
        kept = [f"{a.section}.{a.key}" for a in self.actions if not a.restorable]
        if kept:
            lines.append(f"restore() cannot undo (torch_npu cannot read them back): {', '.join(kept)}")
        return "\n".join(lines)

    def _before(self, action: Action) -> str:
        when = "currently" if self.dry_run else "was"
        if action.section == "env" and action.previous is None:
            return f"  ({when} unset)"
        return "" if action.previous is None else f"  ({when} {action.previous!r})"


# --- applying -------------------------------------------------------------------------------------------------------


def _describe(entry: _Entry, npu: Any, initialised: bool) -> Action:
    """The Action for one entry, with the value it replaces where that can be read; reads, sets nothing."""
    key, value = entry.key, entry.value
    if entry.section == "env":
        note = AUTOLOAD_NOTE if key == "TORCH_DEVICE_BACKEND_AUTOLOAD" else None
        if initialised and key in READ_AT_NPU_INIT:
            note = NEW_PROCESSES_ONLY
        call = f"os.environ[{key!r}] = {value!r}"
        return Action("env", key, value, call, previous=os.environ.get(key), restorable=True, note=note)
    if entry.section == "acl_options":
        return Action("acl_options", key, value, f"torch_npu.npu.set_option({{{key!r}: {value!r}}})")
    if key == "jit_compile":
        return Action("npu", key, value, f"torch_npu.npu.set_compile_mode(jit_compile={value})")
    owner, attribute = NPU_ATTRIBUTES[key]
    restorable = key in READ_BACK
    previous = getattr(getattr(npu, owner), attribute) if restorable and npu is not None else None
    call = f"torch_npu.npu.{owner}.{attribute} = {value}"
    return Action("npu", key, value, call, previous=previous, restorable=restorable)


def _set_env(name: str, value: Optional[str]) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _apply(actions: List[Action], npu: Any, undo: List[Callable[[], None]]) -> None:
    """Set everything in order — env, one set_option call, set_compile_mode, attributes — recording how to undo."""
    for action in actions:
        if action.section == "env":
            _set_env(action.key, action.value)
            undo.append(partial(_set_env, action.key, action.previous))
    acl = {action.key: action.value for action in actions if action.section == "acl_options"}
    if acl:
        npu.set_option(acl)
    for action in actions:
        if action.section != "npu":
            continue
        if action.key == "jit_compile":
            npu.set_compile_mode(jit_compile=action.value)
            continue
        owner_name, attribute = NPU_ATTRIBUTES[action.key]
        owner = getattr(npu, owner_name)
        setattr(owner, attribute, action.value)
        if action.restorable:
            undo.append(partial(setattr, owner, attribute, action.previous))


def _why_dry(dry_run: Optional[bool], available: bool, reason: Any) -> Optional[str]:
    if dry_run not in (None, True, False):
        raise NpuOptionError(f"dry_run must be None, True or False, got {dry_run!r}")
    if not available:
        if dry_run is False:
            raise NpuOptionError(f"cannot apply NPU options: no usable NPU: {reason}")
        return f"no usable NPU: {reason}"
    return "dry_run=True" if dry_run else None


def _is_initialised(npu: Any) -> bool:
    try:
        return bool(npu is not None and npu.is_initialized())
    except Exception:  # a runtime that cannot answer has not initialised anything we could miss
        return False


def apply_npu_options(settings: Any, *, dry_run: Optional[bool] = None) -> NpuOptionsReport:
    """Check every setting, then — on a usable NPU — set them all; off an NPU, report what would be set.

    ``settings``: a mapping with optional ``acl_options``, ``npu`` and ``env`` sections (other keys are ignored, so
    a whole profile works), or an object with those attributes. ``dry_run``: None = dry iff there is no usable NPU;
    True = never set anything; False = set, and an error if there is no usable NPU. Invalid settings raise
    :class:`~npu_port.errors.NpuOptionError` before anything is set. Warnings go both into the report and through
    :mod:`warnings`.
    """
    entries, found = _validate(read_sections(settings))
    status = backend_status("npu")
    reason = _why_dry(dry_run, status.available, status.reason)
    module = probe("torch_npu").module if status.available else None
    npu = getattr(module, "npu", None)
    initialised = _is_initialised(npu)
    actions = [_describe(entry, npu, initialised) for entry in entries]
    report = NpuOptionsReport(dry_run=reason is not None, reason=reason, actions=actions, warnings=found)
    for text in found:
        warnings.warn(text, UserWarning, stacklevel=2)
    if reason is None:
        try:
            _apply(actions, npu, report._undo)
        except Exception as exc:
            report.restore()
            raise NpuOptionError(
                f"setting NPU options failed ({type(exc).__name__}: {exc}); the environment variables and attributes "
                "set before the failure were put back"
            ) from exc
    return report
