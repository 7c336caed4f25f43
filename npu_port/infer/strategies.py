"""Strategy names and files checked through the strategy registry before a model is loaded.

A run that names a strategy that does not exist, a YAML file that is not there or a strategy that cannot run on
this machine must say so in one line before the (possibly long) model load, not after all the compute — with the
valid names, since that is what the user needs next.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Sequence

from ..errors import InferenceError, StrategyError, StrategyFileError, UnknownStrategyError


def _looks_like_file(name: str) -> bool:
    from ..strategy.loader import SUFFIXES

    return name.endswith(SUFFIXES) or os.sep in name or "/" in name


def check_strategy(name: str) -> Any:
    """The :class:`~npu_port.strategy.spec.Strategy` ``name`` resolves to (a registered name, a YAML file or
    ``package.module:attr``), checked to be able to run here; else :class:`InferenceError` in one line."""
    from ..strategy.registry import list_strategies, resolve
    from ..strategy.router import StrategyRouter

    if _looks_like_file(name) and not Path(name).expanduser().is_file():
        raise InferenceError(
            f"strategy file {name!r} does not exist; give a strategy YAML file that exists or one of the strategies: "
            f"{', '.join(list_strategies())}"
        )
    try:
        strategy = resolve(name)
    except UnknownStrategyError:
        raise
    except (StrategyFileError, StrategyError) as exc:
        raise InferenceError(f"strategy {name!r}: {str(exc).splitlines()[0]}") from None
    if strategy.is_custom_processor:
        if strategy.processor is None:
            raise InferenceError(
                f"strategy {name!r} needs a processor class: give 'package.module:ProcessorClass' instead"
            )
        return strategy
    try:
        StrategyRouter(strategy).check_available()
    except StrategyError as exc:  # its first reason, on the one line a CLI error gets
        first = str(exc).splitlines()[1].strip()
        raise InferenceError(
            f"strategy {name!r} cannot run on this machine ({first}); `npu-port strategies` lists those that can"
        ) from None
    return strategy


def compare_names(names: Sequence[str]) -> List[str]:
    """A comparison's strategy names, stripped: at least two, none twice."""
    cleaned = [name.strip() for name in names if name.strip()]
    if len(cleaned) < 2:
        raise InferenceError(f"--compare needs at least two strategies separated by commas, got {list(names)!r}")
    if len(set(cleaned)) != len(cleaned):
        raise InferenceError(f"--compare lists a strategy twice: {', '.join(cleaned)}")
    return cleaned


def check_strategies(names: Sequence[str]) -> List[str]:
    """``--compare``'s list (:func:`compare_names`), each one checked by :func:`check_strategy`."""
    cleaned = compare_names(names)
    for name in cleaned:
        check_strategy(name)
    return cleaned
