"""What a bench run measures: the device, the dtype, the strategies and the settings, each checked before any work.

A bad ``--device``, ``--dtype`` or ``--strategies`` is a :class:`~npu_port.bench.BenchError` (or the registry's own
error) that names the valid choices, raised before anything is timed. Strategies that cannot run on this machine are
left out of the default selection with their reasons, so the report can say why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..device import free_memory_bytes, get_device
from ..errors import DeviceError
from ..strategy.registry import get_strategy, survey
from ..strategy.router import FREE_MEMORY_SHARE, StrategyRouter
from ..strategy.spec import Strategy
from . import BenchError

DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Settings:
    device: torch.device
    dtype: torch.dtype
    warmup: int = 2
    repeats: int = 10
    memory_budget: Optional[int] = None  # bytes of scores a kernel may materialise; None: auto's rule
    parity_rows: int = 64

    def as_dict(self) -> Dict[str, Any]:
        return {
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "warmup": self.warmup,
            "repeats": self.repeats,
            "memory_budget_bytes": self.memory_budget,
            "parity_rows": self.parity_rows,
        }


def resolve_device(text: Optional[str]) -> torch.device:
    """``--device``: None is :func:`npu_port.get_device` (``$NPU_PORT_DEVICE`` or the best usable device); a device
    this machine cannot use is an error with the reason and the usable devices."""
    try:
        return get_device(text)
    except DeviceError as exc:
        raise BenchError(str(exc)) from None


def resolve_dtype(text: str) -> torch.dtype:
    if text not in DTYPES:
        raise BenchError(f"unknown dtype {text!r}; valid dtypes: {', '.join(DTYPES)}")
    return getattr(torch, text)


def unavailable_reason(router: StrategyRouter) -> Optional[str]:
    """None if some candidate can run here; else every candidate's reasons, one line (shared reasons merged)."""
    found = router.availability()
    if not all(found.values()):
        return None
    grouped: Dict[str, List[str]] = {}
    for name, reasons in found.items():
        grouped.setdefault("; ".join(reasons), []).append(name)
    return "; ".join(f"{', '.join(names)}: {reasons}" for reasons, names in grouped.items())


def fresh_router(strategy: Strategy) -> StrategyRouter:
    """A router that measures afresh (``cache=False``): the bench reports this run, not an old decision."""
    return StrategyRouter(strategy.with_overrides(cache=False) if strategy.select == "measure" else strategy)


#: How a skipped strategy whose file cannot be loaded is labelled (the CLI also warns about those on stderr).
BROKEN_FILE = "broken strategy file: "


def select_strategies(text: Optional[str]) -> Tuple[List[Strategy], List[Tuple[str, str]]]:
    """The strategies a ``--strategies`` value names, and the (name, reason) of default ones left out.

    None: every strategy (profiles excluded) that can run on this machine; ``all``: every strategy, unavailable ones
    included (they show their reasons). Unknown names raise :class:`~npu_port.UnknownStrategyError`, which lists
    the valid ones. A strategy file that cannot be loaded is skipped with its error when listing; named explicitly,
    it raises that error.
    """
    if text is not None and not text.strip():
        raise BenchError("--strategies names no strategy; valid strategies: " + ", ".join(survey()[0]))
    if text is not None and text.strip() != "all":
        names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
        if not names:
            raise BenchError("--strategies names no strategy; valid strategies: " + ", ".join(survey()[0]))
        return [get_strategy(n) for n in names], []  # a broken file asked for by name raises its own error
    chosen: List[Strategy] = []
    names, broken = survey(kind="strategy")
    skipped: List[Tuple[str, str]] = [(entry.name, f"{BROKEN_FILE}{entry.error}") for entry in broken]
    for name in names:
        strategy = get_strategy(name)
        if not strategy.candidates:
            skipped.append((name, "routes no attention kernel (it installs a diffusers processor class)"))
            continue
        reason = unavailable_reason(fresh_router(strategy)) if text is None else None
        if reason:
            skipped.append((name, f"cannot run on this machine: {reason}"))
        else:
            chosen.append(strategy)
    return chosen, skipped


def memory_budget(settings: Settings) -> Optional[int]:
    """The bench's score budget: as given, else auto's own rule (a share of the device's free memory)."""
    if settings.memory_budget is not None:
        return settings.memory_budget
    free = free_memory_bytes(settings.device)
    return int(free * FREE_MEMORY_SHARE) if free else None
