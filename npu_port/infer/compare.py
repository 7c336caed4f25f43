"""The same seed under several strategies: how long each took and how far its image is from the first one's.

This is how a user proves a port faithful: ``--compare vanilla,sdpa,auto`` must give the same picture up to the
rounding of the dtype. Differences are measured on the decoded image in [0, 1]: the largest absolute difference and
the PSNR (infinite for identical images).

It fails closed: an image with NaN or inf anywhere in it has diverged, whatever the tolerance (a NaN difference
compares false with every number, so a plain ``diff > tolerance`` would let it pass); when the reference itself is
not finite nothing can be compared and every strategy counts as diverged. The tolerance must be finite and >= 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from .deadline import Deadline
from .limits import check_tolerance
from .models import LoadedPipeline
from .run import GenerationRequest, GenerationResult, generate
from .strategies import compare_names

#: Largest absolute pixel difference (in [0, 1]) allowed against the first strategy, by compute dtype.
TOLERANCE = {torch.float32: 2e-3, torch.float64: 1e-6, torch.float16: 4e-2, torch.bfloat16: 8e-2}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB for images in [0, 1] (inf when identical; NaN when either is not finite)."""
    with np.errstate(invalid="ignore", over="ignore"):
        mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    if not math.isfinite(mse):
        return math.nan
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


@dataclass
class Comparison:
    """Every strategy's result, its difference from the first, and whether it stayed within ``tolerance``."""

    results: Dict[str, GenerationResult]
    max_abs_diff: Dict[str, float]
    psnr_db: Dict[str, float]
    tolerance: float

    @classmethod
    def measure(cls, results: Dict[str, GenerationResult], tolerance: float) -> "Comparison":
        """Each image's max |diff| and PSNR against the first one's (NaN where either image is not finite)."""
        check_tolerance(tolerance)
        first = next(iter(results.values())).image
        with np.errstate(invalid="ignore"):  # inf - inf is NaN: a non-finite image gives a NaN difference, by design
            diffs = {name: float(np.max(np.abs(result.image - first))) for name, result in results.items()}
        return cls(results, diffs, {name: psnr(result.image, first) for name, result in results.items()}, tolerance)

    @property
    def reference(self) -> str:
        return next(iter(self.results))

    @property
    def not_finite(self) -> List[str]:
        """Strategies whose image has NaN or inf in it."""
        return [name for name, result in self.results.items() if not result.finite]

    @property
    def beyond_tolerance(self) -> List[str]:
        """Finite images further than the tolerance from a finite reference."""
        if self.reference in self.not_finite:
            return []
        return [
            name
            for name, diff in self.max_abs_diff.items()
            if name not in self.not_finite and not diff <= self.tolerance  # "not <=": a NaN difference fails
        ]

    @property
    def diverged(self) -> List[str]:
        """Every strategy that failed, in run order: all of them when the reference is not finite."""
        if self.reference in self.not_finite:
            return list(self.results)
        failed = set(self.not_finite) | set(self.beyond_tolerance)
        return [name for name in self.results if name in failed]

    def as_dict(self) -> Dict[str, Any]:
        return {
            "reference": self.reference,
            "tolerance": self.tolerance,
            "diverged": self.diverged,
            "not_finite": self.not_finite,
            "strategies": {
                name: {
                    **result.as_dict(),
                    "max_abs_diff": self.max_abs_diff[name],  # NaN when either image is not finite: null in JSON
                    "psnr_db": None if math.isinf(self.psnr_db[name]) else self.psnr_db[name],
                }
                for name, result in self.results.items()
            },
        }

    def verdict(self) -> str:
        """One line: "all within ... of ...", or "DIVERGED ..." naming each failed strategy and why."""
        if not self.diverged:
            return f"all within {self.tolerance:g} of {self.reference}"
        if self.reference in self.not_finite:
            return (
                f"DIVERGED: the reference {self.reference}'s output was not finite (NaN or inf), so nothing can be "
                f"compared with it: {', '.join(self.diverged)}"
            )
        parts = []
        if self.beyond_tolerance:
            parts.append(f"beyond {self.tolerance:g} from {self.reference}: {', '.join(self.beyond_tolerance)}")
        if self.not_finite:
            parts.append(f"output not finite (NaN or inf): {', '.join(self.not_finite)}")
        return "DIVERGED " + "; ".join(parts)

    def format(self) -> str:
        lines = [f"{'strategy':<14} {'resolved':<22} {'total':>9} {'step':>9} {'max|diff|':>10} {'PSNR':>9}"]
        for name, result in self.results.items():
            step = result.median_step_s
            diff, db = self.max_abs_diff[name], self.psnr_db[name]
            diff_text = f"{diff:10.2e}" if math.isfinite(diff) else f"{'not finite':>10}"
            psnr_text = "inf" if math.isinf(db) else ("-" if math.isnan(db) else f"{db:.1f}")
            lines.append(
                f"{name:<14} {result.strategy_resolved[:22]:<22} {result.total_s:8.3f}s "
                f"{(step or 0) * 1e3:7.1f}ms {diff_text} {psnr_text:>8}"
            )
        lines.append(self.verdict())
        return "\n".join(lines)


def compare_strategies(
    loaded: LoadedPipeline,
    request: GenerationRequest,
    strategies: Sequence[str],
    tolerance: Optional[float] = None,
    *,
    deadline: Optional[Deadline] = None,
) -> Comparison:
    """Run ``request`` once per strategy (same seed), the first being the reference. ``deadline`` bounds the whole
    comparison (every strategy's run)."""
    names = compare_names(strategies)
    limit = TOLERANCE.get(loaded.dtype, 4e-2) if tolerance is None else check_tolerance(tolerance)  # before any run
    results = {name: generate(loaded, replace(request, strategy=name), deadline=deadline) for name in names}
    return Comparison.measure(results, limit)
