"""What a strategy is, as data: the same object whether it came from a YAML file or from code.

A strategy names the kernels that may run attention and how to choose between them (``fixed``: one kernel, and a
call it cannot run is an error; ``first``: the first candidate that can run the call; ``measure``: time the
candidates that can, check them against the math kernel, keep the fastest correct one). It also carries the
environment variables that other tools read (diffusers' ``DIFFUSERS_ATTN_BACKEND``, older NPU scripts'
``DIFFUSERS_ATTENTION_TYPE``), options, and — for profiles — device options that the device layer reads.

Every value check lives here, once, and raises ``ValueError`` with the valid choices (options: through the settings
helper, :mod:`npu_port.settings`, as :class:`~npu_port.errors.StrategyOptionError`); the YAML schema adds the
file and line. Nothing here imports torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from ..errors import StrategyOptionError
from ..settings import InvalidSetting, Setting, check_masked_value, check_value, defaults_of
from ..settings import check_name as check_setting_name

SELECT_MODES = ("fixed", "first", "measure")
KINDS = ("strategy", "profile")
DTYPE_POLICIES = ("fp32-softmax", "native")
COMPUTE_DTYPES = ("float16", "bfloat16")
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math", "overrideable")
DEVICES = ("auto", "npu", "cuda", "xpu", "mps", "cpu")
#: The fused ops ``npu_port.fuse_ops`` (and a strategy's ``fuse_ops:``) can install, with what each replaces. The
#: names live here, below the fuse package, so that a strategy file is checked when it is read (layer 3 never imports
#: npu_port.fuse, layer 4); :mod:`npu_port.fuse` implements each one.
FUSE_OPS: Dict[str, str] = {
    "rms_norm": "diffusers RMSNorm and torch.nn.RMSNorm -> torch_npu.npu_rms_norm",
    "rope": "rotary embeddings (Flux, HunyuanVideo, CogVideoX, Wan) -> torch_npu.npu_rotary_mul, interleave or half",
    "geglu_exact": "diffusers GEGLU keeps exact (erf) GELU on NPU: npu_geglu(approximate=0) instead of tanh",
    "geglu_tanh": "diffusers GEGLU -> npu_geglu(approximate=1), tanh GELU: changes numbers, only when asked",
    "adaln": "diffusers AdaLayerNormZero/ZeroSingle/Continuous -> MindIE-SD layernorm_scale_shift (needs mindiesd)",
}
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?\s*$")
_UNITS = {
    None: 1,
    "B": 1,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}


def parse_size(value: Any, name: str = "memory_budget") -> int:
    """A byte count from an int or a string such as ``"512MiB"`` or ``"2GiB"`` (:class:`InvalidSetting`, a
    ``ValueError``, otherwise). ``name`` is what the message calls the value (``--memory-budget`` on the CLI)."""
    if isinstance(value, bool):
        raise InvalidSetting(f"{name} must be a byte count or a size such as '512MiB', got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and _SIZE.match(value):
        number, unit = _SIZE.match(value).groups()
        size = int(Fraction(number) * _UNITS[unit])  # exact: a float would overflow on a long string of digits
    elif isinstance(value, str) and value.strip().startswith("-") and _SIZE.match(value.strip()[1:]):
        raise InvalidSetting(f"{name} must be a positive size such as '4GiB' or '512MiB', got {value!r}")
    else:
        raise InvalidSetting(
            f"{name} must be a byte count or a size such as '512MiB' (units: B, KiB, MiB, GiB, TiB, KB, MB, "
            f"GB, TB), got {value!r}"
        )
    if size < 1:
        raise InvalidSetting(f"{name} must be at least 1 byte, got {value!r}")
    return size


def _choice(name: str, choices: Tuple[Optional[str], ...]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value not in choices:
            shown = ", ".join("null" if c is None else c for c in choices)
            raise InvalidSetting(f"{name} must be one of {shown}; got {value!r}")
        return value

    return check


def _int_at_least(name: str, minimum: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise InvalidSetting(f"{name} must be an integer >= {minimum}, got {value!r}")
        return value

    return check


def _positive_number(name: str) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise InvalidSetting(f"{name} must be a number > 0, got {value!r}")
        return float(value)

    return check


def _fraction(name: str) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise InvalidSetting(f"{name} must be a number >= 0 and < 1, got {value!r}")
        return float(value)

    return check


def _bool(name: str) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise InvalidSetting(f"{name} must be true or false, got {value!r}")
        return value

    return check


def _sdpa_backends(value: Any) -> Tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise InvalidSetting(f"sdpa_backends must be a non-empty list of {', '.join(SDPA_BACKENDS)}; got {value!r}")
    for item in value:
        if item not in SDPA_BACKENDS:
            raise InvalidSetting(
                f"unknown SDPA backend {item!r} in sdpa_backends; valid backends: {', '.join(SDPA_BACKENDS)}"
            )
    return tuple(dict.fromkeys(value))


#: The ``options:`` a strategy may set (and ``set_attention_strategy(**options)`` may override), with their defaults,
#: used when neither the strategy nor the caller sets one. A kernel takes a strategy option through its
#: ``STRATEGY_OPTIONS``; one that none maps is read by the router or auto themselves.
OPTIONS: Dict[str, Setting] = {
    "memory_budget": Setting(
        None,
        parse_size,
        "bytes an attention call may use for scores (int or '512MiB'); sizes the chunked kernel, and auto refuses "
        "candidates estimated to need more",
    ),
    "sdpa_backends": Setting(
        None, _sdpa_backends, "pin the sdpa kernel to these backends: " + ", ".join(SDPA_BACKENDS), SDPA_BACKENDS
    ),
    "dtype_policy": Setting(
        "fp32-softmax",
        _choice("dtype_policy", DTYPE_POLICIES),
        "fp32-softmax (default: math/chunked take softmax in float32) or native (legacy half-precision products)",
        DTYPE_POLICIES,
    ),
    "compute_dtype": Setting(
        None,
        _choice("compute_dtype", (None,) + COMPUTE_DTYPES),
        "cast float32 inputs to this dtype for the kernel and the output back (lets fp16/bf16-only kernels such as "
        "the Ascend ops run float32 models; changes precision, so auto's parity check applies)",
        COMPUTE_DTYPES,
    ),
    "masked_value": Setting(
        None,
        check_masked_value,
        "an additive mask value that counts as masked, exactly, like -inf (e.g. -10000.0 for diffusers' masks): the "
        "Ascend kernels and sdpa then treat float masks of 0 and that value as masks (bool on an NPU); a row whose "
        "every key holds it gives zeros instead of an average",
    ),
    "repeats": Setting(
        5, _int_at_least("repeats", 1), "auto: timed rounds per candidate (their median and middle half are kept)"
    ),
    "warmup": Setting(2, _int_at_least("warmup", 0), "auto: untimed runs per candidate before timing (min 1)"),
    "probe_seconds": Setting(
        2.0, _positive_number("probe_seconds"), "auto: time budget for measuring one shape bucket (seconds)"
    ),
    "parity_rows": Setting(
        64, _int_at_least("parity_rows", 1), "auto: query rows of the slice checked against the math kernel"
    ),
    "margin": Setting(
        0.10,
        _fraction("margin"),
        "auto: a candidate replaces an earlier one (strategy order) only if it is clearly faster: the earlier one's "
        "median time is more than 1 + margin times its own, and their timings' middle halves do not overlap "
        "(default 0.10)",
    ),
    "cache": Setting(
        True, _bool("cache"), "auto: keep decisions in the on-disk cache (true by default)", (True, False)
    ),
}

#: Defaults used when neither the strategy nor the caller sets an option.
DEFAULT_OPTIONS: Dict[str, Any] = defaults_of(OPTIONS)

#: How an option that does not exist is reported.
UNKNOWN_OPTION = "unknown strategy option {name!r}; valid options: {valid}"


def check_option(name: str, value: Any) -> Any:
    """The normalised value of one strategy option, or :class:`StrategyOptionError` (a ``ValueError``) naming the
    valid options and values. None sets an option whose default is None back to it."""
    setting = check_setting_name(name, OPTIONS, error=StrategyOptionError, unknown=UNKNOWN_OPTION)
    if value is None and setting.default is None:
        return None
    return check_value(name, value, setting, error=StrategyOptionError)


def check_fuse_ops(value: Any, what: str = "fuse_ops") -> Tuple[str, ...]:
    """The fused op names in ``value`` (a list; duplicates dropped, order kept), or ``ValueError`` naming the valid
    ops. An empty list is valid (it turns off the ``fuse_ops`` a strategy inherits)."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of op names ({', '.join(FUSE_OPS)}); got {value!r}")
    unknown = [v for v in value if v not in FUSE_OPS]
    if unknown:
        shown = ", ".join(repr(v) for v in unknown)
        raise ValueError(f"unknown fused op{'s' if len(unknown) > 1 else ''} {shown}; valid ops: {', '.join(FUSE_OPS)}")
    if "geglu_exact" in value and "geglu_tanh" in value:
        raise ValueError(
            "geglu_exact and geglu_tanh exclude each other (exact erf GELU, or the tanh approximation); pick one"
        )
    return tuple(dict.fromkeys(value))


def check_name(name: Any, what: str = "strategy name") -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ValueError(
            f"{what} must be lower-case letters, digits, '-', '_' or '.', starting with a letter or digit; got {name!r}"
        )
    return name


def check_import_path(value: Any) -> str:
    if not isinstance(value, str) or not IMPORT_PATH.match(value):
        raise ValueError(f"processor must be an import path 'package.module:Class', got {value!r}")
    return value


def check_env(env: Mapping[str, Any]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise ValueError(f"environment variable names are letters, digits and '_'; got {key!r}")
        if not isinstance(value, str):
            raise ValueError(f"environment variable {key} must be a string (quote it in YAML), got {value!r}")
        out[key] = value
    return out


@dataclass(frozen=True)
class Strategy:
    """One attention strategy (or profile), fully resolved: ``extends`` has already been merged in."""

    name: str
    description: str
    candidates: Tuple[str, ...] = ()
    select: str = "fixed"
    env: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    kernel_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    processor: Any = None  # "module:attr" string or a processor class (custom-processor)
    kind: str = "strategy"
    extends: Optional[str] = None
    base: Optional[str] = None  # the built-in strategy at the root of the extends chain
    device: Optional[str] = None
    acl_options: Mapping[str, Any] = field(default_factory=dict)
    npu: Mapping[str, Any] = field(default_factory=dict)
    safe_math: Mapping[str, bool] = field(default_factory=dict)  # profiles: force_safe_math(**safe_math) under run
    fuse_ops: Tuple[str, ...] = ()  # fused DiT ops installed on the target model (npu_port.fuse_ops)
    source: Optional[str] = None  # file it came from, or None for code-defined strategies
    processor_origin: Optional[str] = None  # "file:line" of the processor key, for import errors

    @property
    def kernel(self) -> Optional[str]:
        """The single kernel of a fixed strategy (None for first/measure and custom-processor)."""
        return self.candidates[0] if self.select == "fixed" and self.candidates else None

    @property
    def is_custom_processor(self) -> bool:
        return self.processor is not None or (self.base or self.name) == "custom-processor"

    def option(self, name: str) -> Any:
        """An option's value, the strategy's or the default."""
        setting = check_setting_name(name, OPTIONS, error=StrategyOptionError, unknown=UNKNOWN_OPTION)
        return self.options.get(name, setting.default)

    def with_overrides(self, **overrides: Any) -> "Strategy":
        """A copy with ``set_attention_strategy(**options)`` applied (validated like the YAML)."""
        options = dict(self.options)
        changes: Dict[str, Any] = {}
        for key, value in overrides.items():
            if key == "candidates":
                changes["candidates"] = check_candidates(value)
                if self.select == "fixed":
                    changes["select"] = "first" if len(changes["candidates"]) > 1 else "fixed"
            elif key == "select":
                changes["select"] = _choice("select", SELECT_MODES)(value)
            elif key == "processor":
                if not self.is_custom_processor:
                    raise ValueError(
                        f"processor= is for the custom-processor strategy, not {self.name!r}: "
                        "set_attention_strategy('custom-processor', target=model, processor='package.module:Class')"
                    )
                changes["processor"] = value if isinstance(value, type) else check_import_path(value)
            elif key == "kernel_options":
                changes["kernel_options"] = {**self.kernel_options, **dict(value)}
            elif key == "env":
                changes["env"] = {**self.env, **check_env(value)}
            elif key == "fuse_ops":
                changes["fuse_ops"] = check_fuse_ops(value)
            elif key in OPTIONS:
                options[key] = check_option(key, value)
            else:
                named = {"candidates", "select", "processor", "kernel_options", "env", "fuse_ops"}
                valid = ", ".join(sorted(set(OPTIONS) | named))
                raise ValueError(f"unknown option {key!r} for strategy {self.name!r}; valid options: {valid}")
        return replace(self, options=options, **changes)


def check_candidates(value: Any) -> Tuple[str, ...]:
    """The kernel names of ``candidates=`` in order, duplicates dropped. A string is refused, not taken as one name:
    ``candidates="sdpa"`` reads like a list of one, but everywhere else in Python a string is a sequence of letters,
    and guessing here would hide the mistake in the next call that passes a string of several names."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            f"candidates must be a list of kernel names such as ['sdpa', 'math'], got {type(value).__name__} {value!r}"
        )
    wrong = [item for item in value if not isinstance(item, str)]
    if wrong:
        first = wrong[0]
        raise TypeError(f"candidates must be a list of kernel names (strings), got {type(first).__name__} {first!r}")
    if not value:
        raise ValueError("candidates must be a non-empty list of kernel names, got []")
    return tuple(dict.fromkeys(value))
