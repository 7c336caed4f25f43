"""The names code refers to, read from bytecode: how the integrations tell what a function, a class or a module
calls (``F.scaled_dot_product_attention``, ``get_attention_scores``, ``self.heads``) without running it."""

from __future__ import annotations

import types
from typing import Any, Dict, FrozenSet, Iterable, Set, Tuple


def _code_names(code: types.CodeType, into: Set[str]) -> None:
    into.update(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_names(const, into)


def _functions_of(value: Any) -> Iterable[Any]:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if f is not None]
    return [value]


_names_cache: Dict[Tuple[str, int], FrozenSet[str]] = {}


def names_used_by(module: types.ModuleType) -> FrozenSet[str]:
    """Every global/attribute name the functions and classes defined in ``module`` refer to (from bytecode)."""
    key = (module.__name__, id(module))
    cached = _names_cache.get(key)
    if cached is not None:
        return cached
    names: Set[str] = set()
    for value in list(vars(module).values()):
        if isinstance(value, types.ModuleType) or getattr(value, "__module__", None) != module.__name__:
            continue
        members = vars(value).values() if isinstance(value, type) else (value,)
        for member in members:
            for fn in _functions_of(member):
                code = getattr(fn, "__code__", None)
                if isinstance(code, types.CodeType):
                    _code_names(code, names)
    result = frozenset(names)
    _names_cache[key] = result
    return result


def names_used_by_class(cls: type) -> FrozenSet[str]:
    """Names referred to by the methods ``cls`` itself defines (not its bases)."""
    names: Set[str] = set()
    for member in vars(cls).values():
        for fn in _functions_of(member):
            code = getattr(fn, "__code__", None)
            if isinstance(code, types.CodeType):
                _code_names(code, names)
    return frozenset(names)


def code_names(fn: Any) -> FrozenSet[str]:
    """Global and attribute names a function's code (nested functions included) refers to."""
    names: Set[str] = set()
    code = getattr(fn, "__code__", None)
    if isinstance(code, types.CodeType):
        _code_names(code, names)
    return frozenset(names)
