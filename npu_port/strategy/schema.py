"""The strategy-file schema: every key, its type and valid values, checked with the file and line in the error.

Files are read with ``yaml.SafeLoader`` only (no tags, no Python objects: nothing in a YAML file is evaluated, and
a processor path is checked for its form here but imported only when a strategy is applied). The node tree from
``yaml.compose`` gives each key's line, so an error reads ``strategies/mine.yaml:7: unknown key 'kernal' ...;
valid keys: ...``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import yaml

from ..device.npu_options import ACL_OPTIONS, NPU_SETTINGS
from ..errors import StrategyFileError
from .spec import (
    DEVICES,
    FUSE_OPS,
    KINDS,
    OPTIONS,
    SELECT_MODES,
    check_candidates,
    check_env,
    check_fuse_ops,
    check_import_path,
    check_name,
    check_option,
)

#: ``safe_math:`` settings: ``fp32`` keeps autocast from running in half precision, ``tf32`` allows TF32 matmuls
#: (false turns it off) — for code that hits cuBLAS errors or precision problems on a new GPU.
SAFE_MATH_KEYS = ("fp32", "tf32")


class Key(NamedTuple):
    """One top-level key of a strategy file: its YAML type, what applies when it is absent, and what it does."""

    type: str
    default: str
    meaning: str


#: Every top-level key of a strategy or profile file: the one source the checks below, ``npu-port strategies
#: --schema`` and the documentation's strategy-files reference (:func:`markdown_table`) read.
FIELDS: Dict[str, Key] = {
    "name": Key(
        "string", "the file name without .yaml", "the strategy's name (defaults to the file name without .yaml)"
    ),
    "kind": Key("string", "strategy", "strategy (default) or profile"),
    "description": Key("string", "required (unless extends)", "one line shown by npu-port strategies (required)"),
    "extends": Key("string", "none", "a strategy this one starts from; its keys are merged, mappings key by key"),
    "kernel": Key("string", "none", "the one kernel this strategy runs (see npu-port kernels)"),
    "candidates": Key(
        "list of strings",
        "every registered kernel",
        "ordered kernel names to choose from (with select); omitted with select first or measure: every "
        "registered kernel, most preferred first",
    ),
    "select": Key(
        "string", "fixed", "fixed (one kernel), first (first candidate that can run a call) or measure (auto)"
    ),
    "processor": Key("string or null", "none", "custom-processor: 'package.module:Class', imported when applied"),
    "env": Key("mapping of strings", "none", "environment variables to set (strings), e.g. DIFFUSERS_ATTN_BACKEND"),
    "options": Key("mapping", "the defaults below", "strategy options: " + ", ".join(OPTIONS)),
    "kernel_options": Key("mapping of mappings", "none", "per-kernel options, e.g. {chunked: {query_block: 512}}"),
    "device": Key("string", "auto", "profiles: the device to use: " + ", ".join(DEVICES)),
    "acl_options": Key(
        "mapping", "none", "profiles: torch_npu.npu.set_option keys (ACL_...), applied by the device layer"
    ),
    "npu": Key("mapping of booleans", "none", "profiles: NPU runtime settings: " + ", ".join(NPU_SETTINGS)),
    "safe_math": Key(
        "mapping of booleans",
        "none",
        "profiles: force a safe math path under npu-port run: " + ", ".join(SAFE_MATH_KEYS),
    ),
    "fuse_ops": Key(
        "list of strings",
        "none",
        "fused DiT ops installed on the model the strategy is applied to (npu_port.fuse_ops): " + ", ".join(FUSE_OPS),
    ),
}

#: Top-level keys of a strategy or profile file, with the doc line ``npu-port strategies --schema`` prints.
KEYS: Dict[str, str] = {name: key.meaning for name, key in FIELDS.items()}

#: Keys whose value must be a YAML string.
_STRING_KEYS = tuple(name for name, key in FIELDS.items() if key.type == "string")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """The strategy-file keys and the ``options:`` settings as Markdown tables (the documentation's reference)."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [
        f"| `{name}` | {key.type} | {_cell(key.default)} | {_cell(key.meaning)} |" for name, key in FIELDS.items()
    ]
    lines += ["", "Settings under `options:`:", "", "| option | default | meaning |", "|---|---|---|"]
    for name, setting in OPTIONS.items():
        default = "none" if setting.default is None else f"`{yaml.safe_dump(setting.default).split(chr(10))[0]}`"
        lines.append(f"| `{name}` | {default} | {_cell(setting.doc)} |")
    return "\n".join(lines) + "\n"


@dataclass
class RawStrategy:
    """A validated file before ``extends`` is resolved: its values and the line of each key."""

    path: str
    data: Dict[str, Any]
    lines: Dict[str, int]

    def line(self, *keys: str) -> int:
        return self.lines.get(".".join(keys), self.lines.get(keys[0], 1))


def _lines(node: yaml.Node, prefix: str, out: Dict[str, int], path: str) -> None:
    if not isinstance(node, yaml.MappingNode):
        return
    seen = set()
    for key_node, value_node in node.value:
        key = str(key_node.value)
        full = f"{prefix}{key}"
        if full in seen:
            raise StrategyFileError(path, key_node.start_mark.line + 1, f"duplicate key {key!r}")
        seen.add(full)
        out[full] = key_node.start_mark.line + 1
        if prefix.count(".") < 1:  # two levels are enough for every key the schema knows
            _lines(value_node, full + ".", out, path)


def parse(text: str, path: str) -> RawStrategy:
    """Parse and check one file's text (``path`` is only used in messages)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise StrategyFileError(path, line, f"not valid YAML: {problem}") from None
    except (ValueError, TypeError, RecursionError) as exc:  # a value the safe loader cannot build (2024-13-45)
        raise StrategyFileError(path, 1, f"not valid YAML: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, dict):
        raise StrategyFileError(path, 1, "a strategy file must be a mapping of keys (name, description, kernel, ...)")
    lines: Dict[str, int] = {}
    _lines(root, "", lines, path)
    raw = RawStrategy(path, data, lines)
    _check(raw)
    return raw


def _fail(raw: RawStrategy, keys: Tuple[str, ...], message: str) -> None:
    raise StrategyFileError(raw.path, raw.line(*keys), message)


def _mapping(raw: RawStrategy, key: str) -> Dict[str, Any]:
    value = raw.data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        _fail(raw, (key,), f"{key} must be a mapping, got {type(value).__name__} {value!r}")
    for sub in value:
        if not isinstance(sub, str):
            _fail(raw, (key,), f"keys under {key} must be strings, got {sub!r}")
    return value


def _check(raw: RawStrategy) -> None:
    data = raw.data
    for key in data:
        if key not in KEYS:
            _fail(raw, (str(key),), f"unknown key {key!r}; valid keys: {', '.join(KEYS)}")
    for key in _STRING_KEYS:
        if key in data and not isinstance(data[key], str):
            _fail(raw, (key,), f"{key} must be a string, got {type(data[key]).__name__} {data[key]!r}")
    try:
        if "name" in data:
            check_name(data["name"])
        if "extends" in data:
            check_name(data["extends"], "extends")
    except ValueError as exc:
        _fail(raw, ("name" if "name" in data else "extends",), str(exc))
    if "description" not in data and "extends" not in data:
        _fail(raw, ("name",), "description is required (one line shown by npu-port strategies)")
    if data.get("kind", "strategy") not in KINDS:
        _fail(raw, ("kind",), f"kind must be one of {', '.join(KINDS)}; got {data['kind']!r}")
    if "select" in data and data["select"] not in SELECT_MODES:
        _fail(raw, ("select",), f"select must be one of {', '.join(SELECT_MODES)}; got {data['select']!r}")
    if "device" in data and data["device"] not in DEVICES:
        _fail(raw, ("device",), f"device must be one of {', '.join(DEVICES)}; got {data['device']!r}")
    if "kernel" in data and "candidates" in data:
        _fail(raw, ("candidates",), "give either kernel (one) or candidates (several), not both")
    if "candidates" in data:
        try:
            if not isinstance(data["candidates"], list):  # in a file the list form is required: no guessing
                raise ValueError(f"candidates must be a non-empty list of kernel names, got {data['candidates']!r}")
            check_candidates(data["candidates"])
        except (TypeError, ValueError) as exc:
            _fail(raw, ("candidates",), str(exc))
    _check_kernel_names(raw)
    if data.get("processor") is not None:
        try:
            check_import_path(data["processor"])
        except ValueError as exc:
            _fail(raw, ("processor",), str(exc))
    if "fuse_ops" in data:
        try:
            check_fuse_ops(data["fuse_ops"])
        except ValueError as exc:
            _fail(raw, ("fuse_ops",), str(exc))
    try:
        check_env(_mapping(raw, "env"))
    except ValueError as exc:
        _fail(raw, ("env",), str(exc))
    for key, value in _mapping(raw, "options").items():
        try:
            check_option(key, value)
        except ValueError as exc:
            _fail(raw, ("options", key), str(exc))
    for kernel, opts in _mapping(raw, "kernel_options").items():
        if not isinstance(opts, dict):
            _fail(raw, ("kernel_options", kernel), f"kernel_options.{kernel} must be a mapping of option: value")
    for key, value in _mapping(raw, "acl_options").items():
        if key not in ACL_OPTIONS:  # torch_npu ignores unknown names silently; a typo here would do nothing
            _fail(raw, ("acl_options", key), f"unknown ACL option {key!r}; valid options: {', '.join(ACL_OPTIONS)}")
        if not isinstance(value, (str, int, float, bool)):
            _fail(raw, ("acl_options", key), f"acl_options.{key} must be a string or number, got {value!r}")
    for key, value in _mapping(raw, "safe_math").items():
        if key not in SAFE_MATH_KEYS:
            _fail(
                raw,
                ("safe_math", key),
                f"unknown safe_math setting {key!r}; valid settings: {', '.join(SAFE_MATH_KEYS)}",
            )
        if not isinstance(value, bool):
            _fail(raw, ("safe_math", key), f"safe_math.{key} must be true or false, got {value!r}")
    for key, value in _mapping(raw, "npu").items():
        if key not in NPU_SETTINGS:
            _fail(raw, ("npu", key), f"unknown npu setting {key!r}; valid settings: {', '.join(NPU_SETTINGS)}")
        if not isinstance(value, bool):
            _fail(raw, ("npu", key), f"npu.{key} must be true or false, got {value!r}")


def _check_kernel_names(raw: RawStrategy) -> None:
    """Kernel names and kernel options are checked against the kernel registry (this imports torch)."""
    named: List[Tuple[Tuple[str, ...], str]] = []
    if "kernel" in raw.data:
        named.append((("kernel",), raw.data["kernel"]))
    for name in raw.data.get("candidates") or []:
        named.append((("candidates",), name))
    kernel_options = raw.data.get("kernel_options")
    if isinstance(kernel_options, dict):
        named += [(("kernel_options", k), k) for k in kernel_options]
    if not named:
        return
    from ..attn.registry import get_kernel, kernel_names
    from ..errors import KernelOptionError

    valid = kernel_names()
    for keys, name in named:
        if name not in valid:
            _fail(raw, keys, f"unknown kernel {name!r}; valid kernels: {', '.join(valid)}")
    if isinstance(kernel_options, dict):
        for name, opts in kernel_options.items():
            if isinstance(opts, dict):
                try:
                    get_kernel(name, **opts)
                except KernelOptionError as exc:
                    _fail(raw, ("kernel_options", name), str(exc))


def optional_line(raw: Optional[RawStrategy], key: str) -> str:
    """``path:line`` of a key for messages raised after loading (e.g. a processor that fails to import)."""
    if raw is None:
        return ""
    return f"{raw.path}:{raw.line(key)}"
