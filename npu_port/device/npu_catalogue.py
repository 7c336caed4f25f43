"""The catalogue of Ascend runtime options: every ACL option, NPU runtime setting and environment variable npu-port
knows, with the values the docs allow (torch_npu 2.13's ``npu_config.py`` and the Ascend Extension for PyTorch
environment-variable list), a doc line and what to warn about — a table, kept apart from the logic that checks and
applies them (:mod:`npu_port.device.npu_options`). Each entry is a :class:`~npu_port.settings.Setting`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Union

from ..settings import InvalidSetting, Setting

Value = Union[str, bool]
SECTIONS = ("acl_options", "npu", "env")


#: A value a rule refuses; the message says what is allowed (the caller adds section, key and value).
_Invalid = InvalidSetting


@dataclass(frozen=True)
class Rule(Setting):
    """How one known key is checked and normalised (``check``), what it does (``doc``), and what to warn about a valid
    value (``warning``). No default: a key that is not given is left as it is."""

    warning: Optional[Callable[[Value], Optional[str]]] = None


def rule(check: Callable[[Any], Value], doc: str, warning: Optional[Callable[[Value], Optional[str]]] = None) -> Rule:
    return Rule(None, check, doc, warning=warning)


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
    "ACL_PRECISION_MODE": rule(
        _one_of("allow_fp32_to_fp16", "must_keep_origin_dtype"),
        "operator precision mode (default allow_fp32_to_fp16 on Atlas training series, must_keep_origin_dtype on A2)",
    ),
    "ACL_OP_SELECT_IMPL_MODE": rule(
        _one_of("high_performance", "high_precision"),
        "high-performance or high-precision implementation of the operators that have both (deprecated)",
        _deprecated,
    ),
    "ACL_OPTYPELIST_FOR_IMPLMODE": rule(
        _text("comma-separated operator types"),
        "operators ACL_OP_SELECT_IMPL_MODE applies to (deprecated)",
        _deprecated,
    ),
    "ACL_AICORE_NUM": rule(
        _integer(1, 32),
        "AI cores to compile operators for (kept for compatibility)",
        lambda value: "has no effect in current CANN versions",
    ),
    "ACL_OP_DEBUG_LEVEL": rule(_one_of("0", "1", "2", "3", "4"), "operator compile debug level"),
    "ACL_DEBUG_DIR": rule(_text("a directory path", paths=True), "where operator debug files are written"),
    "ACL_OP_COMPILER_CACHE_MODE": rule(
        _one_of("disable", "enable", "force", bools=("enable", "disable")),
        "disk cache of compiled operators (enable is the default; force rebuilds it)",
    ),
    "ACL_OP_COMPILER_CACHE_DIR": rule(
        _text("a directory path", paths=True),
        "where the operator compile cache lives (only with ACL_OP_DEBUG_LEVEL 0 or 3)",
    ),
    "ACL_OP_DEBUG_OPTION": rule(_text("e.g. 'oom'"), "operator debug options, e.g. oom (global-memory bounds check)"),
    "MM_BMM_ND_ENABLE": rule(
        _one_of("enable", "disable", bools=("enable", "disable")), "mm and bmm compute in ND format instead of NZ"
    ),
}
#: ACL_OP_COMPILER_CACHE_DIR is only used with these debug levels (Ascend env list, ``Envir_026``).
CACHE_DEBUG_LEVELS = ("0", "3")

#: ``npu:`` settings: runtime switches of torch_npu, all true / false.
NPU_RULES: Dict[str, Rule] = {
    "jit_compile": rule(
        _flag, "torch_npu.npu.set_compile_mode(jit_compile=...): false = precompiled binary kernels (recommended)"
    ),
    "allow_internal_format": rule(_flag, "torch_npu.npu.config.allow_internal_format: private formats such as NZ"),
    "matmul_allow_hf32": rule(_flag, "torch_npu.npu.matmul.allow_hf32: float32 matmuls in HF32"),
    "conv_allow_hf32": rule(_flag, "torch_npu.npu.conv.allow_hf32: float32 convolutions in HF32"),
}
NPU_SETTINGS: Tuple[str, ...] = tuple(NPU_RULES)
#: The attribute each attribute setting writes: (object under torch_npu.npu, attribute name).
NPU_ATTRIBUTES: Dict[str, Tuple[str, str]] = {
    "allow_internal_format": ("config", "allow_internal_format"),
    "matmul_allow_hf32": ("matmul", "allow_hf32"),
    "conv_allow_hf32": ("conv", "allow_hf32"),
}
#: Attributes torch_npu 2.13 can read back (``config`` has no getter), so restore() can put them back.
READ_BACK = ("matmul_allow_hf32", "conv_allow_hf32")

#: Ascend environment variables (Ascend Extension for PyTorch env list); any other name is set unchecked.
ENV_VARIABLES: Dict[str, Rule] = {
    "TASK_QUEUE_ENABLE": rule(
        _one_of("0", "1", "2"), "operator launch pipeline: 0 off, 1 two-stage (default), 2 level 2 (recommended)"
    ),
    "ASCEND_LAUNCH_BLOCKING": rule(
        _FLAG_01,
        "1 = synchronous operators, for true stack traces (debugging only)",
        lambda value: (
            "is '1': every operator runs synchronously (slow) and the task queue is off; use it for debugging only"
            if value == "1"
            else None
        ),
    ),
    "PYTORCH_NPU_ALLOC_CONF": rule(_alloc_conf, "caching allocator: " + ", ".join(ALLOC_OPTIONS)),
    "HCCL_CONNECT_TIMEOUT": rule(_integer(120, 7200), "seconds to wait for HCCL links to be set up"),
    "HCCL_EXEC_TIMEOUT": rule(
        _integer(68, 17340),
        "seconds a collective may wait (rounded down to a multiple of 68)",
        _hccl_exec_timeout_warning,
    ),
    "HCCL_BUFFSIZE": rule(_integer(1), "MB of buffer per communicator (default 200)"),
    "ASCEND_RT_VISIBLE_DEVICES": rule(_device_ids, "the NPUs this process sees (like CUDA_VISIBLE_DEVICES)"),
    "INF_NAN_MODE_ENABLE": rule(_FLAG_01, "1 = Inf/NaN mode, 0 = saturation mode"),
    "COMBINED_ENABLE": rule(_FLAG_01, "1 = optimise non-contiguous combined operators"),
    "HCCL_WHITELIST_DISABLE": rule(_FLAG_01, "1 = no HCCL communication whitelist"),
    "HCCL_ASYNC_ERROR_HANDLING": rule(_FLAG_01, "1 = stop the process on an asynchronous HCCL error"),
    "HCCL_OP_EXPANSION_MODE": rule(
        _one_of("AI_CPU", "AIV", "HOST"), "where HCCL expands collectives (AIV: vector cores)"
    ),
    "TORCH_DEVICE_BACKEND_AUTOLOAD": rule(_FLAG_01, "0 = import torch without auto-loading torch_npu"),
}
#: Read once, when torch_npu initialises the device: set later, they only reach new processes.
READ_AT_NPU_INIT = (
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
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NEW_PROCESSES_ONLY = "torch_npu is already initialised: takes effect in new processes only"
AUTOLOAD_NOTE = "read when torch is imported: takes effect in new processes only"


def any_env_value(value: Any) -> str:
    """A variable npu-port does not know: a string, or an int written as text (a bool could mean '1' or 'true')."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or "\0" in value:
        raise _Invalid("valid values: a string without NUL characters (or an integer)")
    return value
