"""The strategy registry: names to :class:`Strategy` objects, from the built-in YAML, user YAML and code.

Lookup order for a name: built-in files (``strategies/`` and ``strategies/profiles/``), strategies registered in
code, then files in ``NPU_PORT_STRATEGY_PATH``. Built-in names cannot be taken by anyone else. Files are parsed on
first use and re-parsed when they change on disk, so editing a profile needs no restart.
"""

from __future__ import annotations

import errno
import importlib
import inspect
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import StrategyError, StrategyFileError, UnknownStrategyError
from .loader import SUFFIXES, build, builtin_dirs, every_kernel, read_file, registry_snapshot, strategy_files, user_dirs
from .spec import Strategy, check_candidates, check_env, check_fuse_ops, check_import_path, check_name, check_option

_CODE: Dict[str, Strategy] = {}
#: Parsed files by (path, mtime), each with the kernel registry's state it was built with (see registry_snapshot).
_PARSED: Dict[Tuple[str, float], Tuple[Strategy, Optional[Tuple[str, ...]]]] = {}
_LOADING: List[str] = []  # names whose files are being built: an extends chain that comes back is a cycle


def _files(dirs: Iterable[Path]) -> Dict[str, Path]:
    found: Dict[str, Path] = {}
    for directory in dirs:
        for path in strategy_files(directory):
            found.setdefault(path.stem, path)
    return found


def _builtin_files() -> Dict[str, Path]:
    return _files(builtin_dirs())


def _user_files() -> Dict[str, Path]:
    """User files by name, without those that try to take a built-in name (see :func:`_name_clashes`)."""
    builtins = _builtin_files()
    return {name: path for name, path in _files(user_dirs()).items() if name not in builtins}


def _name_clashes() -> List[Tuple[str, Path, StrategyFileError]]:
    """User files named like a built-in: refused (the built-in keeps its meaning) and reported, not fatal."""
    builtins = _builtin_files()
    return [
        (
            name,
            path,
            StrategyFileError(
                str(path), 1, f"{name!r} is a built-in strategy name; rename the file and use 'extends: {name}'"
            ),
        )
        for name, path in _files(user_dirs()).items()
        if name in builtins
    ]


@dataclass(frozen=True)
class BrokenStrategy:
    """A strategy file that cannot be loaded: listings skip it and say why; asking for it by name raises ``error``."""

    name: str
    path: str
    error: StrategyFileError

    def describe(self) -> str:
        return f"strategy {self.name!r} skipped: {self.error}"


class StrategyFileWarning(UserWarning):
    """A strategy file on the search path is broken and was left out of a listing."""


def load_strategy_file(path: Union[str, os.PathLike]) -> Strategy:
    """The strategy in one YAML file (schema-checked, ``extends`` resolved)."""
    given = Path(path).expanduser()
    try:
        path = given.resolve()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        raise StrategyFileError(str(path), 1, "no such strategy file") from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a link loop, before Python 3.13 (ELOOP after)
        loop = isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP
        reason = "a link that loops" if loop else (exc.strerror or type(exc).__name__)
        raise StrategyFileError(str(given.absolute()), 1, f"cannot read the file: {reason}") from None
    key = (str(path), mtime)
    cached, kernels_then = _PARSED.get(key, (None, None))
    if cached is not None and kernels_then is not None and kernels_then != registry_snapshot():
        cached = None  # a kernel was registered or unregistered since: candidates derived from the registry changed
    if cached is None:
        raw = read_file(path)
        builtin = _builtin_files().get(raw.data["name"])
        if builtin is not None and builtin.resolve() != path:
            raise StrategyFileError(
                str(path), raw.line("name"), f"{raw.data['name']!r} is a built-in strategy name; choose another name"
            )
        if raw.data["name"] in _LOADING:
            chain = " -> ".join(_LOADING + [raw.data["name"]])
            raise StrategyFileError(str(path), raw.line("extends"), f"extends cycle: {chain}")
        _LOADING.append(raw.data["name"])
        try:
            cached = build(raw, get_strategy, chain=tuple(_LOADING[:-1]))
            _PARSED[key] = (cached, registry_snapshot())
        finally:
            _LOADING.pop()
    return cached


def survey(kind: Optional[str] = None) -> Tuple[List[str], List[BrokenStrategy]]:
    """Every strategy that loads (built-ins first, then code-registered, then user files), and every file that does
    not, with its error — one broken file never hides the others. ``kind``: ``"strategy"`` or ``"profile"``."""
    if kind not in (None, "strategy", "profile"):
        raise ValueError(f"kind must be 'strategy', 'profile' or None; got {kind!r}")
    loaded: Dict[str, Optional[Strategy]] = {}
    broken: List[BrokenStrategy] = []
    for name, path in _builtin_files().items():
        loaded[name] = _load_or_record(name, path, broken)
    for name, strategy in _CODE.items():
        loaded.setdefault(name, strategy)
    for name, path in _user_files().items():
        if name not in loaded:  # a code-registered strategy of the same name is the one get_strategy returns
            loaded[name] = _load_or_record(name, path, broken)
    broken += [BrokenStrategy(name, str(path), error) for name, path, error in _name_clashes()]
    names = [n for n, strategy in loaded.items() if strategy is not None and (kind is None or strategy.kind == kind)]
    return names, broken


def _load_or_record(name: str, path: Path, broken: List[BrokenStrategy]) -> Optional[Strategy]:
    try:
        return load_strategy_file(path)
    except StrategyFileError as exc:
        broken.append(BrokenStrategy(name, str(path), exc))
        return None


def list_strategies(kind: Optional[str] = None) -> List[str]:
    """Names of every strategy and profile: built-ins first, then code-registered, then user files.

    ``kind``: ``"strategy"`` or ``"profile"`` to list only those. A file that cannot be loaded is left out with a
    :class:`StrategyFileWarning` naming it and its error (:func:`survey` returns them as data); asking for it by
    name with :func:`get_strategy` raises that error.
    """
    names, broken = survey(kind)
    for entry in broken:
        warnings.warn(entry.describe(), StrategyFileWarning, stacklevel=2)
    return names


def searched_locations() -> List[str]:
    """The directories searched for strategy files (for error messages and ``npu-port strategies``)."""
    return [str(d) for d in builtin_dirs() + user_dirs()]


def get_strategy(name: str) -> Strategy:
    """A strategy by name, or :class:`UnknownStrategyError` listing every valid one and the places searched."""
    if not isinstance(name, str):
        raise TypeError(f"strategy name must be a string, got {type(name).__name__}")
    builtin = _builtin_files().get(name)
    if builtin is not None:
        return load_strategy_file(builtin)
    if name in _CODE:
        return _CODE[name]
    user = _user_files().get(name)
    if user is not None:
        return load_strategy_file(user)
    raise UnknownStrategyError(name, survey()[0], searched_locations())


def register_strategy(
    name: Union[str, Strategy],
    *,
    description: str = "",
    kernel: Optional[str] = None,
    candidates: Optional[Sequence[str]] = None,
    select: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    options: Optional[Mapping[str, Any]] = None,
    kernel_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
    processor: Any = None,
    extends: Optional[str] = None,
    fuse_ops: Optional[Sequence[str]] = None,
    replace: bool = False,
) -> Strategy:
    """Register a strategy defined in code (or a ready :class:`Strategy`); returns it.

    Same rules as a YAML file: ``kernel`` or ``candidates`` (or ``processor``, or ``extends``), valid option values,
    known kernels. ``replace=True`` allows re-registering a code-defined name; built-in names are never replaced.
    """
    if isinstance(name, Strategy):
        strategy = name
    else:
        check_name(name)
        if kernel is not None and candidates is not None:
            raise ValueError("give either kernel (one) or candidates (several), not both")
        parent = get_strategy(extends) if extends is not None else None
        picked: Tuple[str, ...] = parent.candidates if parent else ()
        mode = parent.select if parent else "fixed"
        if kernel is not None:
            picked, mode = (kernel,), "fixed"
        elif candidates is not None:
            picked, mode = check_candidates(candidates), (mode if mode != "fixed" else "first")
        if select is not None:
            mode = select
            if not picked and processor is None and mode in ("first", "measure"):
                picked = every_kernel()
        if processor is not None and not isinstance(processor, type):
            processor = check_import_path(processor)
        processor = processor if processor is not None else (parent.processor if parent else None)
        if not picked and processor is None:
            raise ValueError(f"strategy {name!r} needs kernel, candidates, processor or extends")
        strategy = Strategy(
            name=name,
            description=description or (parent.description if parent else ""),
            candidates=picked,
            select=mode,
            env={**(parent.env if parent else {}), **check_env(dict(env or {}))},
            options={
                **(parent.options if parent else {}),
                **{k: check_option(k, v) for k, v in (options or {}).items()},
            },
            kernel_options={**(parent.kernel_options if parent else {}), **dict(kernel_options or {})},
            processor=processor,
            extends=extends,
            base=(parent.base or parent.name) if parent else None,
            fuse_ops=check_fuse_ops(fuse_ops) if fuse_ops is not None else (parent.fuse_ops if parent else ()),
        )
    check_kernels(strategy)
    if strategy.name in _builtin_files():
        raise ValueError(f"{strategy.name!r} is a built-in strategy; register yours under another name")
    if strategy.name in _CODE and not replace:
        raise ValueError(f"a strategy named {strategy.name!r} is already registered; pass replace=True to replace it")
    _CODE[strategy.name] = strategy
    return strategy


def unregister_strategy(name: str) -> None:
    """Remove a code-registered strategy (built-ins and files cannot be removed)."""
    if name not in _CODE:
        raise ValueError(f"no code-registered strategy named {name!r}; registered: {', '.join(_CODE) or 'none'}")
    del _CODE[name]


def check_kernels(strategy: Strategy) -> None:
    """Every kernel the strategy names exists and takes the options it is given."""
    from ..attn.registry import get_kernel, kernel_names

    valid = kernel_names()
    if strategy.select not in ("fixed", "first", "measure"):
        raise ValueError(f"select must be one of fixed, first, measure; got {strategy.select!r}")
    if strategy.select == "fixed" and len(strategy.candidates) > 1:
        raise ValueError("select 'fixed' takes exactly one kernel")
    for name in list(strategy.candidates) + list(strategy.kernel_options):
        if name not in valid:
            raise ValueError(
                f"unknown kernel {name!r} in strategy {strategy.name!r}; valid kernels: {', '.join(valid)}"
            )
    for name, opts in strategy.kernel_options.items():
        get_kernel(name, **dict(opts))


def resolve(strategy: Any) -> Strategy:
    """What ``set_attention_strategy`` accepts, as a Strategy.

    A built-in or registered name; a path to a ``.yaml``/``.yml`` file; ``"package.module:attr"`` naming a
    Strategy or a processor class; a processor class; or a Strategy.
    """
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, type):
        return processor_strategy(strategy)
    if isinstance(strategy, os.PathLike):
        return load_strategy_file(strategy)
    if not isinstance(strategy, str):
        raise TypeError(
            "strategy must be a name, a YAML path, a processor class, 'package.module:attr' or a Strategy; "
            f"got {type(strategy).__name__}"
        )
    if strategy.endswith(SUFFIXES) or os.sep in strategy:
        return load_strategy_file(strategy)
    if ":" in strategy:
        return _from_import_path(strategy)
    return get_strategy(strategy)


def is_processor_class(value: Any) -> bool:
    """A class whose instances can be called (diffusers processors are plain classes with ``__call__``)."""
    return inspect.isclass(value) and any("__call__" in vars(c) for c in value.__mro__ if c is not object)


def processor_strategy(cls: type, origin: Optional[str] = None) -> Strategy:
    """The custom-processor strategy for one processor class."""
    if not is_processor_class(cls):
        raise StrategyError(f"a processor must be a class with __call__, got {cls!r}")
    base = get_strategy("custom-processor")
    return Strategy(
        name="custom-processor",
        description=f"{cls.__module__}.{cls.__qualname__}",
        processor=cls,
        env=base.env,
        base="custom-processor",
        processor_origin=origin,
    )


def import_attr(path: str, origin: Optional[str] = None) -> Any:
    """``"package.module:attr"`` imported, or :class:`StrategyError` that says which part failed (and where from)."""
    where = f" (from {origin})" if origin else ""
    check_import_path(path)
    module_name, attr = path.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise StrategyError(f"cannot import module {module_name!r} for {path!r}{where}: {exc}") from None
    value: Any = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise StrategyError(f"module {module_name!r} has no attribute {attr!r} (for {path!r}{where})")
        value = getattr(value, part)
    return value


def _from_import_path(path: str) -> Strategy:
    value = import_attr(path)
    if isinstance(value, Strategy):
        return value
    if isinstance(value, type):
        return processor_strategy(value, origin=path)
    raise StrategyError(f"{path!r} is a {type(value).__name__}; expected a processor class or a Strategy")


def strategy_entry(name: str) -> Dict[str, Any]:
    """One row of the listing: the definition plus availability on this machine."""
    from ..device.detect import device_requirement
    from .router import StrategyRouter

    strategy = get_strategy(name)
    entry: Dict[str, Any] = {
        "name": strategy.name,
        "kind": strategy.kind,
        "description": strategy.description,
        "select": strategy.select,
        "candidates": list(strategy.candidates),
        "extends": strategy.extends,
        "source": strategy.source,
        "device": strategy.device,
        "safe_math": dict(strategy.safe_math),
    }
    if strategy.is_custom_processor:
        ready = strategy.processor is not None
        entry["available"] = ready
        entry["reasons"] = {} if ready else {"processor": ["give processor='package.module:Class'"]}
        return entry
    availability = StrategyRouter(strategy).availability()
    entry["available"] = any(not reasons for reasons in availability.values())
    entry["reasons"] = {name: reasons for name, reasons in availability.items() if reasons}
    needs = device_requirement(strategy.device)  # a profile for one device (its ``device:`` key) needs that device
    if needs is not None:
        entry["available"] = False
        entry["reasons"] = {"device": [needs], **entry["reasons"]}
    return entry
