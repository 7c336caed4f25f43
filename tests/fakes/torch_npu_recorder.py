"""A recorder standing in for torch_npu's runtime-option API (torch_npu 2.13.0), for tests only.

This is not torch_npu and emulates no device: it has the entry points npu-port's option code calls, as torch_npu
2.13 documents them, and appends each call to ``module.calls`` as ``(name, args)`` so a test can check exactly
what was called, in which order, with which values:

* ``npu.set_option(dict)`` -> ``("npu.set_option", (copy_of_dict,))``. It refuses what torch_npu's own check
  refuses (``_option_map`` of ``torch_npu/npu/npu_config.py``, copied below), so every test that applies options also
  shows that the normalised values would pass torch_npu.
* ``npu.set_compile_mode(jit_compile=...)`` -> ``("npu.set_compile_mode", (jit_compile,))``.
* assigning ``npu.config.allow_internal_format``, ``npu.matmul.allow_hf32`` or ``npu.conv.allow_hf32`` ->
  ``("npu.config.allow_internal_format", (value,))`` etc. As in torch_npu 2.13, ``config`` is write-only (reading
  raises AttributeError), ``matmul.allow_hf32`` reads back (default False) and ``conv.allow_hf32`` too (default
  True).
* ``npu.is_available()`` True, ``npu.device_count()`` 1, ``npu.is_initialized()`` as built (not recorded).
"""

from __future__ import annotations

import types
from typing import Any, Dict, List, Tuple

Call = Tuple[str, Tuple[Any, ...]]

# torch_npu 2.13.0 npu_config.py, _option_map: None = any value; a list = these texts; a function = its check.
_OPTION_MAP = {
    "ACL_PRECISION_MODE": ["allow_fp32_to_fp16", "must_keep_origin_dtype"],
    "ACL_OP_SELECT_IMPL_MODE": ["high_performance", "high_precision"],
    "ACL_AICORE_NUM": lambda value: value.isdigit() and 1 <= int(value) <= 32,
    "ACL_OPTYPELIST_FOR_IMPLMODE": None,
    "ACL_OP_DEBUG_LEVEL": ["0", "1", "2", "3", "4"],
    "ACL_DEBUG_DIR": None,
    "ACL_OP_COMPILER_CACHE_MODE": ["disable", "enable", "force"],
    "ACL_OP_COMPILER_CACHE_DIR": None,
    "ACL_OP_DEBUG_OPTION": None,
}


def torch_npu_accepts(name: str, value: Any) -> bool:
    """torch_npu 2.13's ``_check_compile_option``: unknown names pass, known ones are checked on ``str(value)``."""
    check = _OPTION_MAP.get(name)
    if check is None:
        return True
    if not callable(check):
        return str(value) in check
    try:
        return check(str(value))
    except ValueError:  # digits int() cannot read (e.g. superscripts): torch_npu fails on them too
        return False


class _Options:
    """One of torch_npu's option objects: an assignment becomes a recorded call; only ``readable`` names read back."""

    def __init__(self, calls: List[Call], owner: str, readable: Dict[str, Any]):
        object.__setattr__(self, "_calls", calls)
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_values", dict(readable))

    def __setattr__(self, name: str, value: Any) -> None:
        self._calls.append((f"npu.{self._owner}.{name}", (value,)))
        if name in self._values:
            self._values[name] = value

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(f"torch_npu.npu.{object.__getattribute__(self, '_owner')} has no readable {name!r}")


def build_module(initialized: bool = False) -> types.ModuleType:
    """A fresh ``torch_npu`` stand-in; ``module.calls`` lists the recorded calls in order."""
    calls: List[Call] = []

    def set_option(option: dict) -> None:
        if not isinstance(option, dict):
            raise TypeError("npu option must be a dict.")
        for name, value in option.items():
            if not torch_npu_accepts(name, value):
                raise ValueError(f"value of {name} should be in {_OPTION_MAP[name]} but got {value}")
        calls.append(("npu.set_option", (dict(option),)))

    def set_compile_mode(jit_compile: bool = False) -> None:
        calls.append(("npu.set_compile_mode", (jit_compile,)))

    npu = types.ModuleType("torch_npu.npu")
    npu.set_option = set_option
    npu.set_compile_mode = set_compile_mode
    npu.is_available = lambda: True
    npu.device_count = lambda: 1
    npu.is_initialized = lambda: initialized
    npu.config = _Options(calls, "config", {})
    npu.matmul = _Options(calls, "matmul", {"allow_hf32": False})
    npu.conv = _Options(calls, "conv", {"allow_hf32": True})

    module = types.ModuleType("torch_npu")
    module.__version__ = "2.13.0"
    module.npu = npu
    module.calls = calls
    return module
