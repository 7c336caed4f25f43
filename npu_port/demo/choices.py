"""What the demo's strategy pickers offer: ``auto`` first, then every strategy and profile that can run here; those
that cannot are listed with their first reason. Also the order a comparison runs in (the exact reference first)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from ..errors import InferenceError

#: What a comparison starts with (those of them that can run here).
DEFAULT_COMPARE = ("vanilla", "sdpa", "auto")
#: The exact math kernel: the reference of a comparison whenever it is picked, so differences are measured from it.
REFERENCE = "vanilla"


@dataclass
class StrategyChoices:
    """What the strategy pickers offer: ``auto`` first, then every strategy and profile that can run here.

    Those that cannot run here are left out of the pickers (choosing one could only fail) and listed in
    ``unavailable`` with their first reason, which the page shows under the dropdown.
    """

    names: List[str]
    unavailable: Dict[str, str] = field(default_factory=dict)

    def compare_default(self) -> List[str]:
        return [name for name in DEFAULT_COMPARE if name in self.names]


#: Why the demo does not offer a profile with ``safe_math`` settings: only ``npu-port run`` applies them.
SAFE_MATH_REASON = "its safe-math settings act only under npu-port run; here it would be plain {base}"


def _first_reason(entry: Dict[str, Any]) -> str:
    """The reason ``npu-port strategies`` gives first: a profile's device ("needs an Ascend NPU: ...") as it is, a
    kernel's reason after the kernel's name."""
    for kernel, reasons in entry.get("reasons", {}).items():
        if reasons:
            return str(reasons[0]) if kernel == "device" else f"{kernel}: {reasons[0]}"
    return "no kernel of it can run here"


def strategy_choices(entries: Optional[Sequence[Dict[str, Any]]] = None) -> StrategyChoices:
    """Split the registry into what can run here and what cannot, using ``npu-port strategies``' own rows (kernels
    that cannot run, a profile's device that is not here). One more reason is the demo's own: a profile whose
    ``safe_math`` only ``npu-port run`` applies would run here as its parent strategy under another name.

    ``entries``: rows as :func:`npu_port.strategy.registry.strategy_entry` makes them (default: every registered
    strategy and profile, checked on this machine).
    """
    if entries is None:
        from ..strategy.registry import list_strategies, strategy_entry

        entries = [strategy_entry(name) for name in list_strategies()]
    unavailable: Dict[str, str] = {}
    for entry in entries:
        if not entry["available"]:
            unavailable[entry["name"]] = _first_reason(entry)
        elif entry.get("safe_math"):
            unavailable[entry["name"]] = SAFE_MATH_REASON.format(base=entry.get("extends") or "sdpa")
    available = [entry["name"] for entry in entries if entry["name"] not in unavailable]
    names = [name for name in available if name == "auto"] + [name for name in available if name != "auto"]
    return StrategyChoices(names, unavailable)


def check_strategy(name: str, choices: StrategyChoices) -> str:
    """``name`` if the demo offers it, else why not (unknown, or cannot run here)."""
    if name in choices.names:
        return name
    if name in choices.unavailable:
        raise InferenceError(
            f"strategy {name!r} cannot run here ({choices.unavailable[name]}); choose one of: "
            + ", ".join(choices.names)
        )
    raise InferenceError(f"unknown strategy {name!r}; choose one of: {', '.join(choices.names)}")


def compare_order(selected: Optional[Sequence[str]], choices: StrategyChoices) -> List[str]:
    """The picked strategies in the order they run: vanilla (the exact reference) first when picked, then the rest
    in the pickers' order. At least two are needed."""
    selected = list(selected or [])
    for name in selected:
        check_strategy(name, choices)
    picked = [name for name in choices.names if name in selected]
    if len(picked) < 2:
        got = f"{len(picked)}: {', '.join(picked)}" if picked else "none"
        raise InferenceError(f"pick at least two strategies to compare (got {got})")
    if REFERENCE in picked:
        picked.remove(REFERENCE)
        picked.insert(0, REFERENCE)
    return picked
