"""The kernel registry: names to kernel classes, nothing more.

It imports no optional package and knows no strategy. Built-in kernels register themselves when
``npu_port.attn.kernels`` is imported; third parties can register their own class with
:func:`register_kernel`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Type, Union

from ..errors import UnknownKernelError

if TYPE_CHECKING:  # imported lazily below: kernel modules import this registry while the kernels package loads
    from .kernels.base import Kernel

_KERNELS: Dict[str, Type[Kernel]] = {}
_DEFAULTS: "Dict[str, Kernel]" = {}  # default-configured instances; kernels are immutable, so they are shared


def register_kernel(cls: "Type[Kernel]") -> "Type[Kernel]":
    """Class decorator: make ``cls`` available by its ``name``."""
    from .kernels.base import Kernel

    if not (isinstance(cls, type) and issubclass(cls, Kernel)):
        raise TypeError(f"register_kernel expects a Kernel subclass, got {cls!r}")
    if not cls.name or not cls.name.replace("_", "").isalnum():
        raise ValueError(f"kernel class {cls.__name__} needs a name of letters, digits and '_', got {cls.name!r}")
    existing = _KERNELS.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"an attention kernel named {cls.name!r} is already registered ({existing.__name__})")
    _KERNELS[cls.name] = cls
    _DEFAULTS.pop(cls.name, None)
    return cls


def _load_builtins() -> List[str]:
    from .kernels import BUILTIN_ORDER  # importing the package registers the built-in kernels

    return list(BUILTIN_ORDER)


def kernel_names() -> List[str]:
    """Registered kernel names, built-ins first in their documented order, then others as registered."""
    builtins = _load_builtins()
    return [n for n in builtins if n in _KERNELS] + [n for n in _KERNELS if n not in builtins]


def get_kernel(kernel: "Union[str, Kernel]", **options: Any) -> "Kernel":
    """A kernel instance from a name (configured with ``options``) or the instance itself."""
    from .kernels.base import Kernel

    if isinstance(kernel, Kernel):
        if options:
            return type(kernel)(**{**kernel.options, **options})
        return kernel
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a kernel name or a Kernel instance, got {type(kernel).__name__}")
    _load_builtins()
    cls = _KERNELS.get(kernel)
    if cls is None:
        raise UnknownKernelError(kernel, kernel_names())
    if options:
        return cls(**options)
    instance = _DEFAULTS.get(kernel)
    if instance is None:
        instance = _DEFAULTS[kernel] = cls()
    return instance


def kernels() -> "List[Kernel]":
    """One default-configured instance of every registered kernel, in registry order."""
    return [get_kernel(name) for name in kernel_names()]
