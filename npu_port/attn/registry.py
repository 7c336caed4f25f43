"""The kernel registry: names to kernel classes, and every ordered list of kernels, derived from what the classes
declare.

It imports no optional package and knows no strategy. Built-in kernels register themselves when
``npu_port.attn.kernels`` is imported; third parties can register their own class with :func:`register_kernel` (and
take it out again with :func:`unregister_kernel`). The orders — listings (:func:`kernel_names`), the preference order
of ``auto`` (:func:`priority_order`) and of ``kernel=None`` without a strategy (:func:`default_order`) — are computed
from each class's ``listing_order``, ``priority`` and ``default_selection``, so no list of names is kept by hand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Tuple, Type, Union

from ..errors import UnknownKernelError

if TYPE_CHECKING:  # imported lazily below: kernel modules import this registry while the kernels package loads
    from .kernels.base import Kernel

_KERNELS: Dict[str, Type[Kernel]] = {}
_DEFAULTS: "Dict[str, Kernel]" = {}  # default-configured instances; kernels are immutable, so they are shared
#: Derived orders, each with the registry's contents it was derived from (a table changed behind our back, as some
#: tests do, is noticed too).
_ORDERS: Dict[str, Tuple[Tuple[Any, ...], Tuple[str, ...]]] = {}


def register_kernel(cls: "Type[Kernel]") -> "Type[Kernel]":
    """Class decorator: make ``cls`` available by its ``name``, at the place its class attributes declare."""
    from .kernels.base import Kernel

    if not (isinstance(cls, type) and issubclass(cls, Kernel)):
        raise TypeError(f"register_kernel expects a Kernel subclass, got {cls!r}")
    if not cls.name or not cls.name.replace("_", "").isalnum():
        raise ValueError(f"kernel class {cls.__name__} needs a name of letters, digits and '_', got {cls.name!r}")
    for attribute, kinds in (("priority", int), ("listing_order", (int, type(None)))):
        value = getattr(cls, attribute)
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise TypeError(f"kernel class {cls.__name__}: {attribute} must be an int, got {value!r}")
    existing = _KERNELS.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"an attention kernel named {cls.name!r} is already registered ({existing.__name__})")
    _KERNELS[cls.name] = cls
    _changed(cls.name)
    return cls


def unregister_kernel(kernel: "Union[str, Type[Kernel]]") -> None:
    """Take a kernel registered with :func:`register_kernel` out again (by name or class); built-ins stay."""
    _load_builtins()
    name = kernel if isinstance(kernel, str) else getattr(kernel, "name", None)
    cls = _KERNELS.get(name) if isinstance(name, str) else None
    if cls is None or (not isinstance(kernel, str) and cls is not kernel):
        raise UnknownKernelError(str(name if isinstance(name, str) else kernel), kernel_names())
    if cls.__module__.startswith(f"{__package__}.kernels."):
        raise ValueError(f"{name!r} is a built-in attention kernel; built-in kernels cannot be unregistered")
    del _KERNELS[name]
    _changed(name)


def _changed(name: str) -> None:
    _DEFAULTS.pop(name, None)
    _ORDERS.clear()


def _load_builtins() -> None:
    from . import kernels  # noqa: F401  (importing the package registers the built-in kernels)


def _order(which: str) -> Tuple[str, ...]:
    _load_builtins()
    contents = tuple(_KERNELS.values())
    cached = _ORDERS.get(which)
    if cached is not None and cached[0] == contents:
        return cached[1]
    position = {cls: i for i, cls in enumerate(contents)}  # registration order breaks ties
    if which == "listing":
        classes = sorted(contents, key=lambda c: (c.listing_order is None, c.listing_order or 0, position[c]))
    else:
        classes = sorted(contents, key=lambda c: (-c.priority, position[c]))
        if which == "default":
            classes = [c for c in classes if c.default_selection]
    order = tuple(c.name for c in classes)
    _ORDERS[which] = (contents, order)
    return order


def kernel_names() -> List[str]:
    """Registered kernel names in listing order: each class's ``listing_order`` (built-ins: reference first, then
    portable, then device-specific), then kernels that declare none, as registered."""
    return list(_order("listing"))


def priority_order() -> List[str]:
    """Every registered kernel, most preferred first (``priority``): the candidates of a strategy that names none
    (``auto``)."""
    return list(_order("priority"))


def default_order() -> List[str]:
    """The kernels ``kernel=None`` tries when no strategy is set: those with ``default_selection``, by priority."""
    return list(_order("default"))


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
    """One default-configured instance of every registered kernel, in listing order."""
    return [get_kernel(name) for name in kernel_names()]
