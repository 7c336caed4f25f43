"""A multi-device layout — Ulysses degree x ring degree x (2 with CFG parallelism) — and its checks: each impossible
layout is refused with one line naming the valid choices, before any process starts or any weight is loaded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, List, Optional

from ..errors import ParallelError


def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class ParallelLayout:
    """How ``nproc`` ranks share one generation: the sequence split ``ulysses * ring`` ways (context parallelism),
    times two when the conditional and unconditional halves of classifier-free guidance run on different ranks."""

    ulysses: int = 1
    ring: int = 1
    cfg: bool = False

    def __post_init__(self) -> None:
        for name in ("ulysses", "ring"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParallelError(f"--{name} must be a whole number >= 1, got {value!r}")

    @property
    def sequence(self) -> int:
        """Ranks one sequence is split over."""
        return self.ulysses * self.ring

    @property
    def world(self) -> int:
        return self.sequence * (2 if self.cfg else 1)

    @property
    def context_parallel(self) -> bool:
        return self.sequence > 1

    def describe(self) -> str:
        parts = [f"ulysses {self.ulysses}", f"ring {self.ring}"]
        if self.cfg:
            parts.append("cfg-parallel 2")
        return " x ".join(parts) + f" = {self.world} process{'es' if self.world != 1 else ''}"

    @classmethod
    def for_processes(cls, nproc: int, ulysses: Optional[int], ring: Optional[int], cfg: bool) -> "ParallelLayout":
        """The layout for ``--nproc N`` with what was given; a degree left out takes the ranks that remain (Ulysses
        first: it needs no log-sum-exp and moves less), and a product that is not N is refused with the choices."""
        if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
            raise ParallelError(f"--nproc must be a whole number >= 1, got {nproc!r}")
        for name, value in (("ulysses", ulysses), ("ring", ring)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ParallelError(f"--{name} must be a whole number >= 1, got {value!r}")
        halves = 2 if cfg else 1
        if nproc % halves:
            raise ParallelError(f"--cfg-parallel needs an even --nproc (one half of guidance per rank), got {nproc}")
        sequence = nproc // halves
        if ulysses is None and ring is None:
            ulysses, ring = sequence, 1
        elif ulysses is None:
            ulysses = sequence // ring if ring and sequence % ring == 0 else 0
        elif ring is None:
            ring = sequence // ulysses if ulysses and sequence % ulysses == 0 else 0
        if not ulysses or not ring or ulysses * ring != sequence:
            pairs = ", ".join(f"--ulysses {u} --ring {sequence // u}" for u in divisors(sequence))
            what = f"{nproc} processes" + (" with --cfg-parallel (2 guidance halves)" if cfg else "")
            raise ParallelError(
                f"--ulysses {ulysses or '?'} x --ring {ring or '?'} does not fill {what}: the sequence is split over "
                f"{sequence} rank{'s' if sequence != 1 else ''}; valid layouts: {pairs}"
            )
        return cls(ulysses, ring, cfg)


def check_heads(heads: int, layout: ParallelLayout, anything: bool = False, hint: str = "--ulysses-anything") -> None:
    """Ulysses gives each rank ``heads / U`` heads. ``hint``: how the caller turns on the variant that pads them."""
    if layout.ulysses > 1 and heads % layout.ulysses and not anything:
        with_ring = " (with ring 1)" if layout.ring > 1 else ""
        raise ParallelError(
            f"the model has {heads} attention heads, which do not split over --ulysses {layout.ulysses}; valid "
            f"Ulysses degrees: {', '.join(map(str, divisors(heads)))} (or {hint}{with_ring}, which pads the heads)"
        )


def check_sequence(name: str, length: int, layout: ParallelLayout) -> None:
    """A sequence split over the context-parallel ranks must give each at least one token, evenly."""
    ranks = layout.sequence
    if ranks > 1 and (length < ranks or length % ranks):
        what = f"fewer than the {ranks}" if length < ranks else f"which do not split evenly over the {ranks}"
        valid = [d for d in divisors(length) if d <= 64]
        raise ParallelError(
            f"{name}: {length} token{'s' if length != 1 else ''}, {what} context-parallel ranks (ulysses "
            f"{layout.ulysses} x ring {layout.ring}); valid ulysses x ring products for it: "
            f"{', '.join(map(str, valid))}"
        )


def require(layout: ParallelLayout, anything: bool = False) -> None:
    """What ``layout`` needs from diffusers (its hooks; for a sequence split, its context parallelism and dispatcher)
    is there, else :class:`~npu_port.upstream.UpstreamMissingError` naming the missing piece — raised before any
    process starts, any process group is joined or any weight is loaded."""
    from ..upstream.diffusers import parallel as upstream

    upstream.require(context_parallel=layout.context_parallel, cfg=layout.cfg, anything=anything)


def models_with_plans(candidates: Optional[Iterable[Any]] = None) -> List[str]:
    """The diffusers model classes that carry a context-parallel plan (``_cp_plan``), by name (empty when diffusers'
    list of models cannot be read: declined, warned about once)."""
    from ..upstream.diffusers import parallel as upstream

    if candidates is None:
        import diffusers

        candidates = []
        for name in upstream.planned_model_names() or []:
            try:
                candidates.append(getattr(diffusers, name))
            except Exception:  # an optional dependency missing for one model: it cannot be used here anyway
                continue
    found = {c.__name__ for c in candidates if isinstance(c, type) and upstream.cp_plan(c)}
    return sorted(found)


def planned_models_text() -> str:
    """The part of an error about a model without a plan that names the models with one."""
    names = models_with_plans()
    return f"models with one: {', '.join(names)}" if names else "diffusers' list of models is not readable here"


def check_plan(model: Any) -> None:
    """A model without a context-parallel plan cannot be split: say which models have one."""
    from ..upstream.diffusers import parallel as upstream

    if upstream.cp_plan(model):
        return
    raise ParallelError(
        f"{type(model).__name__} has no context-parallel plan (_cp_plan), so its sequence cannot be split; "
        f"{planned_models_text()}. Use --cfg-parallel alone, or pass a cp_plan"
    )
