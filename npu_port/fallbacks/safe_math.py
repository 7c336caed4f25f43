"""``force_safe_math()``: run float32 math at full precision, for code that hits cuBLAS errors in reduced precision.

Some CUDA-era code fails on a new device or library build only in its reduced-precision paths: TF32 matmuls and
convolutions, float16 / bfloat16 GEMMs under ``torch.autocast``, half-precision reductions — ``CUBLAS_STATUS_*``
errors, NaNs, or ops the backend does not implement. The safe path turns those off for the whole process:

- ``tf32=False`` (default): no TF32 — ``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``
  off and ``torch.set_float32_matmul_precision("highest")``; on a torch with the per-backend ``fp32_precision``
  settings, any of them that would still resolve to a reduced precision is set to ``"ieee"``;
- ``fp32=True`` (default): no autocast to half precision — every ``torch.autocast`` / ``torch.amp.autocast`` /
  ``torch.cuda.amp.autocast`` / ``torch.cpu.amp.autocast`` context created afterwards runs with ``enabled=False``
  (so an op inside stays float32), and cuBLAS's reduced-precision reductions for float16 / bfloat16 are off.

``tf32=True`` or ``fp32=False`` leave that part alone. :meth:`SafeMath.restore` puts every setting back as it was
(the legacy flags through their own setters, then the per-backend precisions) and the very ``autocast.__init__``
function object, through :mod:`npu_port._patching` (so handles may be restored in any order and still end exact, and an
``autocast.__init__`` someone replaced after us stays theirs). Settings are restored to what each handle saw, so
restore nested handles last-in first-out for the settings. Autocast contexts already entered are not changed.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .. import _patching

#: (backend, op) pairs of torch's per-backend float32 precision settings (torch >= 2.9), parents before children.
_PRECISION_PAIRS = (
    ("generic", "all"),
    ("cuda", "all"),
    ("mkldnn", "all"),
    ("cuda", "matmul"),
    ("cuda", "conv"),
    ("cuda", "rnn"),
    ("mkldnn", "matmul"),
    ("mkldnn", "conv"),
    ("mkldnn", "rnn"),
)
_REDUCED_PRECISIONS = ("tf32", "bf16")


def _setting(name: str, getter: Callable[[], Any], setter: Callable[[Any], None]):
    return name, getter, setter


def _attribute(owner: Any, attr: str):
    return lambda: getattr(owner, attr), lambda value: setattr(owner, attr, value)


_MATMUL = torch.backends.cuda.matmul
#: The legacy TF32 settings, in the order they are forced and restored.
_TF32_SETTINGS = (
    _setting("torch.backends.cudnn.allow_tf32", *_attribute(torch.backends.cudnn, "allow_tf32")),
    _setting("torch.backends.cuda.matmul.allow_tf32", *_attribute(_MATMUL, "allow_tf32")),
    _setting("float32_matmul_precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
)
_TF32_SAFE = {
    "torch.backends.cudnn.allow_tf32": False,
    "torch.backends.cuda.matmul.allow_tf32": False,
    "float32_matmul_precision": "highest",
}
_REDUCTION_SETTINGS = tuple(
    _setting(f"torch.backends.cuda.matmul.{attr}", *_attribute(_MATMUL, attr))
    for attr in ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction")
    if hasattr(_MATMUL, attr)
)

#: The key of the ``autocast.__init__`` patches in :mod:`npu_port._patching`.
KEY = "safe_math"

_UNREADABLE = object()  # torch refuses to read a legacy flag after the legacy and new APIs were mixed


def _read(getter: Callable[[], Any]) -> Any:
    try:
        return getter()
    except RuntimeError:
        return _UNREADABLE


def _precision_api() -> Optional[Tuple[Callable, Callable]]:
    getter = getattr(torch._C, "_get_fp32_precision_getter", None)
    setter = getattr(torch._C, "_set_fp32_precision_setter", None)
    return (getter, setter) if getter is not None and setter is not None else None


def _precisions() -> Dict[Tuple[str, str], str]:
    api = _precision_api()
    if api is None:
        return {}
    values = {}
    for pair in _PRECISION_PAIRS:
        try:
            values[pair] = api[0](*pair)
        except RuntimeError:  # a pair this torch does not have
            continue
    return values


def _effective(values: Dict[Tuple[str, str], str], backend: str, op: str) -> str:
    """What an op's precision resolves to: its own setting, else its backend's, else the generic one."""
    for pair in ((backend, op), (backend, "all"), ("generic", "all")):
        value = values.get(pair, "none")
        if value != "none":
            return value
    return "none"


@dataclass(eq=False)
class SafeMath:
    """What :func:`force_safe_math` changed (``changed``: setting -> (before, now)); ``restore()`` undoes it all."""

    fp32: bool
    tf32: bool
    changed: Dict[str, Tuple[Any, Any]] = field(default_factory=dict)
    _saved: List[Tuple[str, Any, Callable[[Any], None]]] = field(default_factory=list, repr=False)
    _saved_precisions: Dict[Tuple[str, str], str] = field(default_factory=dict, repr=False)
    _autocast_patch: Optional[_patching.Patch] = field(default=None, repr=False)
    _active: bool = field(default=False, repr=False)

    @property
    def active(self) -> bool:
        return self._active

    def restore(self) -> None:
        """Put every setting and ``autocast.__init__`` back; safe to call twice."""
        if not self._active:
            return
        self._active = False  # a patched autocast still reachable (patched again on top) passes through from now on
        if self._autocast_patch is not None:
            _patching.release(self._autocast_patch)
        for _name, value, setter in self._saved:
            if value is not _UNREADABLE:
                setter(value)
        api = _precision_api()
        if api is not None:
            for pair, value in self._saved_precisions.items():
                if api[0](*pair) != value:
                    api[1](*pair, value)

    def __enter__(self) -> "SafeMath":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def force_safe_math(*, fp32: bool = True, tf32: bool = False) -> SafeMath:
    """Turn off TF32 (unless ``tf32``) and autocast to half precision (if ``fp32``); returns the handle to restore.

    Also a context manager: ``with force_safe_math(): ...``.
    """
    handle = SafeMath(fp32=fp32, tf32=tf32)
    settings = list(_TF32_SETTINGS) if not tf32 else []
    targets = dict(_TF32_SAFE)
    if fp32:
        settings += list(_REDUCTION_SETTINGS)
        targets.update({name: False for name, _, _ in _REDUCTION_SETTINGS})
    handle._saved = [(name, _read(getter), setter) for name, getter, setter in settings]
    handle._saved_precisions = _precisions()
    handle._active = True
    try:
        for (name, before, setter), (_, getter, _) in zip(handle._saved, settings):
            setter(targets[name])
            after = _read(getter)
            if before is _UNREADABLE or before != after:
                handle.changed[name] = (None if before is _UNREADABLE else before, after)
        if not tf32:
            _force_ieee_precisions(handle)
        if fp32:
            _disable_autocast(handle)
    except BaseException:
        handle.restore()
        raise
    return handle


def _force_ieee_precisions(handle: SafeMath) -> None:
    """On torch >= 2.9 an op can still inherit TF32 from a backend-wide or generic ``fp32_precision`` setting that
    the legacy flags do not reach; pin those ops to ``"ieee"``."""
    api = _precision_api()
    if api is None:
        return
    values = _precisions()
    for backend, op in _PRECISION_PAIRS:
        if op == "all" or (backend, op) not in values:
            continue
        if _effective(values, backend, op) in _REDUCED_PRECISIONS:
            api[1](backend, op, "ieee")
            handle.changed[f"fp32_precision[{backend}.{op}]"] = (values[(backend, op)], "ieee")
            values[(backend, op)] = "ieee"


def _disable_autocast(handle: SafeMath) -> None:
    autocast = torch.amp.autocast_mode.autocast
    original = autocast.__dict__["__init__"]
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if handle._active:
            bound = signature.bind(self, *args, **kwargs)
            bound.arguments["enabled"] = False
            args, kwargs = bound.args[1:], bound.kwargs
        original(self, *args, **kwargs)

    __init__.__npu_port_safe_math__ = handle
    handle._autocast_patch = _patching.replace(autocast, "__init__", __init__, key=KEY)
    handle.changed["torch.autocast"] = ("enabled as asked", "enabled=False")
