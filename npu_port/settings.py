"""Declared settings, checked one way: kernel options, strategy options and Ascend runtime options all use this.

A setting is declared once — its check (which returns the normalised value), its default, a one-line doc and, where
they are few, its valid choices — in a mapping from name to :class:`Setting`. :func:`validate` checks a mapping of
values against such a declaration: an unknown name fails with the valid names, a bad value with what is allowed, each
as the caller's :class:`~npu_port.errors.NpuPortError` subclass and in the caller's words (the messages users and
tests know stay as they were), and nothing is returned unless everything is valid. Layer 0: it imports only
``errors``, so every layer can declare settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Type

from .errors import NpuPortError

#: How an unknown name is reported when the caller does not say: ``{name}`` the name, ``{valid}`` the valid names.
UNKNOWN = "unknown setting {name!r}; valid settings: {valid}"
#: How a bad value is reported when the caller does not say: ``{problem}`` is what the check said.
INVALID = "{problem}"


class InvalidSetting(ValueError):
    """Raised by a setting's check: the message says what is allowed (the caller's ``invalid`` template may add the
    name and the value around it)."""


@dataclass(frozen=True)
class Setting:
    """One declared setting: ``check(value)`` returns the normalised value or raises :class:`InvalidSetting`;
    ``default`` is used when the setting is not given; ``doc`` is one line for listings; ``choices`` names the valid
    values where they are few (for listings and schema docs; the check is what decides)."""

    default: Any
    check: Callable[[Any], Any]
    doc: str
    choices: Optional[Tuple[Any, ...]] = None


def valid_names(declared: Mapping[str, Any], empty: str = "none") -> str:
    """The declared names as a message lists them (``empty`` when there are none)."""
    return ", ".join(declared) or empty


def check_value(
    name: str,
    value: Any,
    setting: Setting,
    *,
    error: Type[NpuPortError],
    invalid: str = INVALID,
    **context: Any,
) -> Any:
    """``setting.check(value)``, or ``error`` with ``invalid`` filled in (``{name}``, ``{value!r}``, ``{problem}``
    and the caller's ``context``)."""
    try:
        return setting.check(value)
    except InvalidSetting as exc:
        raise error(invalid.format(name=name, value=value, problem=exc, **context)) from None


def check_name(
    name: Any,
    declared: Mapping[str, Setting],
    *,
    error: Type[NpuPortError],
    unknown: str = UNKNOWN,
    empty: str = "none",
    **context: Any,
) -> Setting:
    """The declaration of ``name``, or ``error`` with ``unknown`` filled in (``{name}``, ``{valid}``, ``context``)."""
    setting = declared.get(name) if isinstance(name, str) else None
    if setting is None:
        raise error(unknown.format(name=name, valid=valid_names(declared, empty), **context))
    return setting


def validate(
    values: Mapping[Any, Any],
    declared: Mapping[str, Setting],
    *,
    error: Type[NpuPortError],
    unknown: str = UNKNOWN,
    invalid: str = INVALID,
    defaults: bool = False,
    empty: str = "none",
    **context: Any,
) -> Dict[str, Any]:
    """Every value of ``values`` checked against ``declared`` and normalised; with ``defaults``, every declared
    setting, in declaration order, its default where not given. Unknown names are reported first (the first in
    sorted order, so the message does not depend on how the mapping was built), then bad values, in declaration
    order; nothing is returned unless everything is valid."""
    strange = sorted((name for name in values if name not in declared), key=str)
    if strange:
        check_name(strange[0], declared, error=error, unknown=unknown, empty=empty, **context)
    checked: Dict[str, Any] = {}
    for name, setting in declared.items():
        if name in values:
            checked[name] = check_value(name, values[name], setting, error=error, invalid=invalid, **context)
        elif defaults:
            checked[name] = setting.default
    if not defaults:  # keep the caller's order
        checked = {name: checked[name] for name in values}
    return checked


def defaults_of(declared: Mapping[str, Setting]) -> Dict[str, Any]:
    """Each declared setting's default."""
    return {name: setting.default for name, setting in declared.items()}


def check_masked_value(value: Any) -> Optional[float]:
    """The ``masked_value`` setting (a strategy option and a kernel option): None, or the negative number that an
    additive attention mask uses for "masked" (diffusers' ``-10000.0``), as a float. Positive values and NaN are
    refused: added to the scores they would never mask anything."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value < 0:
        raise InvalidSetting(
            "masked_value must be None or a negative number, the additive value your masks use for a masked "
            f"position (e.g. -10000.0 for diffusers' masks); got {value!r}"
        )
    return float(value)
