"""The same seed under several strategies: how long each took and how far its image is from the first one's.

This is how a user proves a port faithful: ``--compare vanilla,sdpa,auto`` must give the same picture up to the
rounding of the dtype. Differences are measured on the decoded image in [0, 1]: the largest absolute difference and
the PSNR (infinite for identical images).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from ..errors import InferenceError
from .models import LoadedPipeline
from .run import GenerationRequest, GenerationResult, generate

#: Largest absolute pixel difference (in [0, 1]) allowed against the first strategy, by compute dtype.
TOLERANCE = {torch.float32: 2e-3, torch.float64: 1e-6, torch.float16: 4e-2, torch.bfloat16: 8e-2}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB for images in [0, 1] (inf when identical)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


@dataclass
class Comparison:
    """Every strategy's result, its difference from the first, and whether it stayed within ``tolerance``."""

    results: Dict[str, GenerationResult]
    max_abs_diff: Dict[str, float]
    psnr_db: Dict[str, float]
    tolerance: float

    @property
    def reference(self) -> str:
        return next(iter(self.results))

    @property
    def diverged(self) -> List[str]:
        return [name for name, diff in self.max_abs_diff.items() if diff > self.tolerance]

    def as_dict(self) -> Dict[str, Any]:
        return {
            "reference": self.reference,
            "tolerance": self.tolerance,
            "diverged": self.diverged,
            "strategies": {
                name: {
                    **result.as_dict(),
                    "max_abs_diff": self.max_abs_diff[name],
                    "psnr_db": None if math.isinf(self.psnr_db[name]) else self.psnr_db[name],
                }
                for name, result in self.results.items()
            },
        }

    def format(self) -> str:
        lines = [f"{'strategy':<14} {'resolved':<22} {'total':>9} {'step':>9} {'max|diff|':>10} {'PSNR':>9}"]
        for name, result in self.results.items():
            step = result.median_step_s
            psnr_text = "inf" if math.isinf(self.psnr_db[name]) else f"{self.psnr_db[name]:.1f}"
            lines.append(
                f"{name:<14} {result.strategy_resolved[:22]:<22} {result.total_s:8.3f}s "
                f"{(step or 0) * 1e3:7.1f}ms {self.max_abs_diff[name]:10.2e} {psnr_text:>8}"
            )
        verdict = (
            f"all within {self.tolerance:g} of {self.reference}"
            if not self.diverged
            else f"DIVERGED beyond {self.tolerance:g} from {self.reference}: {', '.join(self.diverged)}"
        )
        lines.append(verdict)
        return "\n".join(lines)


def compare_strategies(
    loaded: LoadedPipeline,
    request: GenerationRequest,
    strategies: Sequence[str],
    tolerance: Optional[float] = None,
) -> Comparison:
    """Run ``request`` once per strategy (same seed), the first being the reference."""
    names = [name.strip() for name in strategies if name.strip()]
    if len(names) < 2:
        raise InferenceError(f"--compare needs at least two strategies separated by commas, got {list(strategies)!r}")
    if len(set(names)) != len(names):
        raise InferenceError(f"--compare lists a strategy twice: {', '.join(names)}")
    limit = TOLERANCE.get(loaded.dtype, 4e-2) if tolerance is None else tolerance
    results = {name: generate(loaded, replace(request, strategy=name)) for name in names}
    first = results[names[0]].image
    diffs = {name: float(np.max(np.abs(result.image - first))) for name, result in results.items()}
    return Comparison(results, diffs, {name: psnr(result.image, first) for name, result in results.items()}, limit)
