"""What a call to the demo's API may contain: the values its page's widgets send, checked before anything else.

The page sends text, numbers, a number within each slider's range and names from the strategy pickers; a program
calling the API (gradio_client, a raw POST) can send anything. The handlers take the values as sent
(``preprocess=False``) and check them here first, so that a call no widget could make — a list where the prompt goes,
steps beyond the slider, a strategy the picker does not offer — is refused in one line naming the field and what it
takes, instead of failing inside gradio's or the model's code with a traceback in the server's log. What a person
can type but the model cannot take (a height of 4096, an empty seed) is :mod:`.form`'s to refuse: the page shows why
under the image.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Sequence

from ..errors import InferenceError
from .choices import StrategyChoices, check_strategy

TEXT = "text"  # a Textbox: a string (None: empty)
NUMBER = "number"  # a Number: a finite number or None (empty); its range is the form's to check
RANGE = "range"  # a Slider: a finite number from ``low`` to ``high``
CHOICE = "choice"  # the strategy Dropdown: one name the pickers offer
CHOICES = "choices"  # the Compare CheckboxGroup: a list of such names


class MalformedCall(InferenceError):
    """A call to the demo's API that none of its page's widgets could make: a value of the wrong type, outside a
    slider's range or not offered by a picker, or the wrong number of values."""


@dataclass(frozen=True)
class Field:
    """One input of an endpoint, in the order the page sends it: its API name, its kind, a slider's range."""

    name: str
    kind: str
    low: float = 0.0
    high: float = 0.0


def _shown(value: Any) -> str:
    """A value as a message quotes it: its type and a short repr (a long one cut)."""
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_count(endpoint: str, fields: Sequence[Field], values: Any) -> None:
    """``values`` is a list of one value per field (gradio itself fails with a traceback when there are fewer)."""
    names = ", ".join(field.name for field in fields)
    if not isinstance(values, (list, tuple)):
        raise MalformedCall(f"{endpoint} takes a list of {len(fields)} values ({names}), got {_shown(values)}")
    if len(values) != len(fields):
        raise MalformedCall(f"{endpoint} takes {len(fields)} values ({names}), got {len(values)}")


def check_value(field: Field, value: Any, choices: StrategyChoices) -> None:
    """``value`` is one the field's widget could send, else :class:`MalformedCall` naming what it takes."""
    if field.kind == TEXT:
        if value is not None and not isinstance(value, str):
            raise MalformedCall(f"{field.name} must be text, got {_shown(value)}")
    elif field.kind == NUMBER:
        if value is not None and not _number(value):
            raise MalformedCall(f"{field.name} must be a number (or empty), got {_shown(value)}")
    elif field.kind == RANGE:
        if not _number(value) or not field.low <= value <= field.high:
            raise MalformedCall(
                f"{field.name} must be a number from {field.low:g} to {field.high:g}, got {_shown(value)}"
            )
    elif field.kind == CHOICE:
        _check_name(field.name, value, choices)
    elif field.kind == CHOICES:
        if not isinstance(value, (list, tuple)):
            raise MalformedCall(
                f"{field.name} must be a list of strategy names (from: {', '.join(choices.names)}), got {_shown(value)}"
            )
        for item in value:
            _check_name(field.name, item, choices)
    else:  # pragma: no cover - a field declared with a kind this module does not know
        raise ValueError(f"unknown field kind {field.kind!r}")


def _check_name(label: str, value: Any, choices: StrategyChoices) -> None:
    if not isinstance(value, str):
        raise MalformedCall(f"{label} must be a strategy name, one of: {', '.join(choices.names)}; got {_shown(value)}")
    try:
        check_strategy(value, choices)
    except InferenceError as exc:
        raise MalformedCall(f"{label}: {exc}") from None


def check_call(endpoint: str, fields: Sequence[Field], values: Any, choices: StrategyChoices) -> List[Any]:
    """The values of one call, checked field by field in the page's order (the first problem is the message)."""
    check_count(endpoint, fields, values)
    for field, value in zip(fields, values):
        check_value(field, value, choices)
    return list(values)
