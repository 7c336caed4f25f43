"""Ascend runtime options — ACL options, NPU runtime settings, environment variables — checked, then set.

torch_npu's ``set_option`` stores any key it does not know (a typo such as ``ACL_PRECISON_MODE`` is silently
ignored by the runtime) and the environment variables are read by C++ code that fails late or not at all. So every
known key is checked here against the documented values (torch_npu 2.13's ``npu_config.py`` and the Ascend
Extension for PyTorch environment-variable list) with one error naming the section, key, value and valid choices,
and nothing is set unless everything is valid. Off an NPU nothing is set at all: the report says what would be.

What is set can be undone only where it can be read back: environment variables and the ``matmul`` / ``conv``
``allow_hf32`` attributes. torch_npu has no getter for ACL options, the compile mode or ``allow_internal_format``,
so :meth:`NpuOptionsReport.restore` leaves those as they are.

Section, key and value choices mirror the strategy YAML schema (``acl_options:``, ``npu:``, ``env:``), so a whole
profile dict or :class:`~npu_port.strategy.spec.Strategy` can be passed as is; this module knows nothing else of
strategies.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from .._optional import probe
from ..errors import NpuOptionError
from .detect import backend_status

Value = Union[str, bool]
SECTIONS = ("acl_options", "npu", "env")


class _Invalid(Exception):
    """A value a rule refuses; the message says what is allowed (the caller adds section, key and value)."""


@dataclass(frozen=True)
class Rule:
    """How one known key is checked and normalised, what it does, and what to warn about a valid value."""

    normalise: Callable[[Any], Value]
    doc: str
    warning: Optional[Callable[[Value], Optional[str]]] = None


# --- value checks: each returns the text torch_npu / the runtime wants, or raises _Invalid -------------------------


def _as_int(value: Any) -> Optional[int]:
    """An int from an int or a string of digits (as torch_npu's ``str(value).isdigit()``); bools are not ints."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        try:
            return int(value)
        except ValueError:  # digits int() cannot read, such as superscripts
            return None
    return None


def _one_of(*choices: str, bools: Optional[Tuple[str, str]] = None) -> Callable[[Any], str]:
    """One of ``choices`` (an int counts by its text); a bool only where ``bools`` says which text it means."""

    def normalise(value: Any) -> str:
        if isinstance(value, bool):
            if bools is not None:
                return bools[0] if value else bools[1]
        elif isinstance(value, (int, str)) and str(value) in choices:
            return str(value)
        raise _Invalid(f"valid values: {', '.join(choices)}")

    return normalise


def _integer(low: int, high: Optional[int] = None) -> Callable[[Any], str]:
    allowed = f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"

    def normalise(value: Any) -> str:
        number = _as_int(value)
        if number is None or number < low or (high is not None and number > high):
            raise _Invalid(f"valid values: {allowed}")
        return str(number)

    return normalise


def _text(what: str, paths: bool = False) -> Callable[[Any], str]:
    """Any string (torch_npu does not check these); a path-like object too where the value is a path."""

    def normalise(value: Any) -> str:
        if paths and isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            raise _Invalid(f"valid values: a string ({what})")
        return value

    return normalise


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid("valid values: true, false")
    return value


_FLAG_01 = _one_of("0", "1", bools=("1", "0"))
_FLOAT_TEXT = re.compile(r"^(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _fraction(value: str) -> str:
    """A float strictly between 0 and 1, written back by ``repr`` (which reads back to the same float)."""
    if _FLOAT_TEXT.match(value) and 0 < float(value) < 1:
        return repr(float(value))
    raise _Invalid(f"garbage_collection_threshold must be a number strictly between 0 and 1, got {value!r}")


def _alloc_option(name: str, check: Callable[[Any], str]) -> Callable[[str], str]:
    def normalise(value: str) -> str:
        try:
            return check(value)
        except _Invalid as exc:
            raise _Invalid(f"{name}: {value!r} is not allowed; {exc}") from None

    return normalise


#: PYTORCH_NPU_ALLOC_CONF options (Ascend env list, ``Envir_009``) and their values.
ALLOC_OPTIONS: Dict[str, Callable[[str], str]] = {
    "max_split_size_mb": _alloc_option("max_split_size_mb", _integer(21)),
    "garbage_collection_threshold": _fraction,
    "expandable_segments": _alloc_option("expandable_segments", _one_of("True", "False")),
    "base_addr_aligned_kb": _alloc_option("base_addr_aligned_kb", _integer(0, 16)),
}
#: Options the docs call incompatible with ``expandable_segments:True``.
_NOT_WITH_EXPANDABLE = ("max_split_size_mb", "garbage_collection_threshold")


def _parse_alloc_conf(text: str) -> Dict[str, str]:
    """``key:value,key:value`` as {option: normalised value}, in the order written."""
    options: Dict[str, str] = {}
    for entry in text.split(","):
        key, colon, value = (part.strip() for part in entry.partition(":"))
        if not colon or not key or not value:
            raise _Invalid(f"{entry.strip()!r} is not key:value; write options as key:value separated by commas")
        if key not in ALLOC_OPTIONS:
            raise _Invalid(f"unknown allocator option {key!r}; valid options: {', '.join(ALLOC_OPTIONS)}")
        if key in options:
            raise _Invalid(f"{key} is given twice")
        options[key] = ALLOC_OPTIONS[key](value)
    return options


def _alloc_conf(value: Any) -> str:
    if not isinstance(value, str):
        raise _Invalid(
            "valid values: a string of option:value pairs separated by commas, e.g. 'expandable_segments:True'"
        )
    options = _parse_alloc_conf(value) if value.strip() else {}
    if options.get("expandable_segments") == "True":
        for other in _NOT_WITH_EXPANDABLE:
            if other in options:
                raise _Invalid(
                    f"expandable_segments:True cannot be combined with {other} (the docs say they are incompatible)"
                )
    return ",".join(f"{key}:{text}" for key, text in options.items())


def _device_ids(value: Any) -> str:
    number = _as_int(value)
    if number is not None and number >= 0:
        return str(number)
    if isinstance(value, str):
        parts = [part.strip() for part in value.split(",")]
        ids = [_as_int(part) for part in parts]
        if all(i is not None for i in ids) and len(set(ids)) == len(ids):
            return ",".join(str(i) for i in ids)
    raise _Invalid("valid values: comma-separated device ids (integers >= 0, each once), e.g. '0,1'")


def _hccl_exec_timeout_warning(value: Value) -> Optional[str]:
    seconds = int(value)
    if seconds % 68:
        return f"is {value!r}, not a multiple of 68: HCCL rounds it down to {seconds // 68 * 68}"
    return None


def _deprecated(value: Value) -> str:
    return "is deprecated: torch_npu 2.13 does not recommend setting it (accuracy or performance may not be optimal)"


# --- the catalogue ------------------------------------------------------------------------------------------------

#: ``torch_npu.npu.set_option`` keys (torch_npu 2.13 ``npu_config.py``), checked as torch_npu does, plus typos refused.
ACL_OPTIONS: Dict[str, Rule] = {
    "ACL_PRECISION_MODE": Rule(
        _one_of("allow_fp32_to_fp16", "must_keep_origin_dtype"),
        "operator precision mode (default allow_fp32_to_fp16 on Atlas training series, must_keep_origin_dtype on A2)",
    ),
    "ACL_OP_SELECT_IMPL_MODE": Rule(
        _one_of("high_performance", "high_precision"),
        "high-performance or high-precision implementation of the operators that have both (deprecated)",
        _deprecated,
    ),
    "ACL_OPTYPELIST_FOR_IMPLMODE": Rule(
        _text("comma-separated operator types"),
        "operators ACL_OP_SELECT_IMPL_MODE applies to (deprecated)",
        _deprecated,
    ),
    "ACL_AICORE_NUM": Rule(
        _integer(1, 32),
        "AI cores to compile operators for (kept for compatibility)",
        lambda value: "has no effect in current CANN versions",
    ),
    "ACL_OP_DEBUG_LEVEL": Rule(_one_of("0", "1", "2", "3", "4"), "operator compile debug level"),
    "ACL_DEBUG_DIR": Rule(_text("a directory path", paths=True), "where operator debug files are written"),
    "ACL_OP_COMPILER_CACHE_MODE": Rule(
        _one_of("disable", "enable", "force", bools=("enable", "disable")),
        "disk cache of compiled operators (enable is the default; force rebuilds it)",
    ),
    "ACL_OP_COMPILER_CACHE_DIR": Rule(
        _text("a directory path", paths=True),
        "where the operator compile cache lives (only with ACL_OP_DEBUG_LEVEL 0 or 3)",
    ),
    "ACL_OP_DEBUG_OPTION": Rule(_text("e.g. 'oom'"), "operator debug options, e.g. oom (global-memory bounds check)"),
    "MM_BMM_ND_ENABLE": Rule(
        _one_of("enable", "disable", bools=("enable", "disable")), "mm and bmm compute in ND format instead of NZ"
    ),
}
#: ACL_OP_COMPILER_CACHE_DIR is only used with these debug levels (Ascend env list, ``Envir_026``).
_CACHE_DEBUG_LEVELS = ("0", "3")

#: ``npu:`` settings: runtime switches of torch_npu, all true / false.
NPU_RULES: Dict[str, Rule] = {
    "jit_compile": Rule(
        _flag, "torch_npu.npu.set_compile_mode(jit_compile=...): false = precompiled binary kernels (recommended)"
    ),
    "allow_internal_format": Rule(_flag, "torch_npu.npu.config.allow_internal_format: private formats such as NZ"),
    "matmul_allow_hf32": Rule(_flag, "torch_npu.npu.matmul.allow_hf32: float32 matmuls in HF32"),
    "conv_allow_hf32": Rule(_flag, "torch_npu.npu.conv.allow_hf32: float32 convolutions in HF32"),
}
NPU_SETTINGS: Tuple[str, ...] = tuple(NPU_RULES)
#: The attribute each attribute setting writes: (object under torch_npu.npu, attribute name).
_NPU_ATTRIBUTES: Dict[str, Tuple[str, str]] = {
    "allow_internal_format": ("config", "allow_internal_format"),
    "matmul_allow_hf32": ("matmul", "allow_hf32"),
    "conv_allow_hf32": ("conv", "allow_hf32"),
}
#: Attributes torch_npu 2.13 can read back (``config`` has no getter), so restore() can put them back.
_READ_BACK = ("matmul_allow_hf32", "conv_allow_hf32")

#: Ascend environment variables (Ascend Extension for PyTorch env list); any other name is set unchecked.
ENV_VARIABLES: Dict[str, Rule] = {
    "TASK_QUEUE_ENABLE": Rule(
        _one_of("0", "1", "2"), "operator launch pipeline: 0 off, 1 two-stage (default), 2 level 2 (recommended)"
    ),
    "ASCEND_LAUNCH_BLOCKING": Rule(
        _FLAG_01,
        "1 = synchronous operators, for true stack traces (debugging only)",
        lambda value: (
            "is '1': every operator runs synchronously (slow) and the task queue is off; use it for debugging only"
            if value == "1"
            else None
        ),
    ),
    "PYTORCH_NPU_ALLOC_CONF": Rule(_alloc_conf, "caching allocator: " + ", ".join(ALLOC_OPTIONS)),
    "HCCL_CONNECT_TIMEOUT": Rule(_integer(120, 7200), "seconds to wait for HCCL links to be set up"),
    "HCCL_EXEC_TIMEOUT": Rule(
        _integer(68, 17340),
        "seconds a collective may wait (rounded down to a multiple of 68)",
        _hccl_exec_timeout_warning,
    ),
    "HCCL_BUFFSIZE": Rule(_integer(1), "MB of buffer per communicator (default 200)"),
    "ASCEND_RT_VISIBLE_DEVICES": Rule(_device_ids, "the NPUs this process sees (like CUDA_VISIBLE_DEVICES)"),
    "INF_NAN_MODE_ENABLE": Rule(_FLAG_01, "1 = Inf/NaN mode, 0 = saturation mode"),
    "COMBINED_ENABLE": Rule(_FLAG_01, "1 = optimise non-contiguous combined operators"),
    "HCCL_WHITELIST_DISABLE": Rule(_FLAG_01, "1 = no HCCL communication whitelist"),
    "HCCL_ASYNC_ERROR_HANDLING": Rule(_FLAG_01, "1 = stop the process on an asynchronous HCCL error"),
    "HCCL_OP_EXPANSION_MODE": Rule(
        _one_of("AI_CPU", "AIV", "HOST"), "where HCCL expands collectives (AIV: vector cores)"
    ),
    "TORCH_DEVICE_BACKEND_AUTOLOAD": Rule(_FLAG_01, "0 = import torch without auto-loading torch_npu"),
}
#: Read once, when torch_npu initialises the device: set later, they only reach new processes.
_READ_AT_NPU_INIT = (
    "TASK_QUEUE_ENABLE",
    "PYTORCH_NPU_ALLOC_CONF",
    "ASCEND_RT_VISIBLE_DEVICES",
    "HCCL_CONNECT_TIMEOUT",
    "HCCL_EXEC_TIMEOUT",
    "HCCL_BUFFSIZE",
    "HCCL_WHITELIST_DISABLE",
    "HCCL_ASYNC_ERROR_HANDLING",
    "HCCL_OP_EXPANSION_MODE",
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NEW_PROCESSES_ONLY = "torch_npu is already initialised: takes effect in new processes only"
_AUTOLOAD_NOTE = "read when torch is imported: takes effect in new processes only"


def _any_env_value(value: Any) -> str:
    """A variable npu-port does not know: a string, or an int written as text (a bool could mean '1' or 'true')."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or "\0" in value:
        raise _Invalid("valid values: a string without NUL characters (or an integer)")
    return value


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


def _checked(section: str, key: Any, value: Any, rule: Rule, found: List[str]) -> _Entry:
    try:
        normalised = rule.normalise(value)
    except _Invalid as exc:
        raise NpuOptionError(f"{section}.{key}: {value!r} is not allowed; {exc}") from None
    text = rule.warning(normalised) if rule.warning is not None else None
    if text:
        found.append(f"{section}.{key} {text}")
    return _Entry(section, key, normalised)


def _known(section: str, key: Any, rules: Mapping[str, Rule]) -> Rule:
    if key not in rules:
        raise NpuOptionError(f"{section}: unknown key {key!r}; valid keys: {', '.join(rules)}")
    return rules[key]


def _env_rule(key: Any) -> Rule:
    if not isinstance(key, str) or not _ENV_NAME.match(key):
        raise NpuOptionError(
            f"env: {key!r} is not a valid environment variable name; use letters, digits and '_', not starting with "
            "a digit"
        )
    return ENV_VARIABLES.get(key) or Rule(_any_env_value, "not an Ascend variable: set as given")


def _check_compiler_cache(acl: Mapping[str, Value]) -> None:
    level = acl.get("ACL_OP_DEBUG_LEVEL")
    if "ACL_OP_COMPILER_CACHE_DIR" in acl and level is not None and level not in _CACHE_DEBUG_LEVELS:
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
        note = _AUTOLOAD_NOTE if key == "TORCH_DEVICE_BACKEND_AUTOLOAD" else None
        if initialised and key in _READ_AT_NPU_INIT:
            note = NEW_PROCESSES_ONLY
        call = f"os.environ[{key!r}] = {value!r}"
        return Action("env", key, value, call, previous=os.environ.get(key), restorable=True, note=note)
    if entry.section == "acl_options":
        return Action("acl_options", key, value, f"torch_npu.npu.set_option({{{key!r}: {value!r}}})")
    if key == "jit_compile":
        return Action("npu", key, value, f"torch_npu.npu.set_compile_mode(jit_compile={value})")
    owner, attribute = _NPU_ATTRIBUTES[key]
    restorable = key in _READ_BACK
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
        owner_name, attribute = _NPU_ATTRIBUTES[action.key]
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
