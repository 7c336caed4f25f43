"""The inputs of one bench shape and the answer every strategy is checked against.

Inputs are drawn on the CPU in float32 from a fixed seed, so every device and dtype sees the same numbers. The
reference is the math kernel in float64 on the CPU, on the slice ``auto`` checks (batch 0, up to 2 heads, the first
``parity_rows`` query rows over every key): cheap enough for any shape, exact enough to judge any dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Tuple

import torch

from ..attn.call import AttentionCall
from ..attn.registry import get_kernel
from ..strategy.measure import parity_slice
from .choices import Settings
from .shapes import Shape


def make_call(shape: Shape, settings: Settings, seed: int = 0) -> AttentionCall:
    """Seeded random inputs for ``shape`` (drawn on the CPU in float32, so every device and dtype sees the same)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(shape.batch, shape.heads, shape.seq, shape.head_dim, generator=gen)
    k = torch.randn(shape.batch, shape.heads, shape.key_len, shape.head_dim, generator=gen)
    v = torch.randn(shape.batch, shape.heads, shape.key_len, shape.head_dim, generator=gen)
    q, k, v = (t.to(device=settings.device, dtype=settings.dtype) for t in (q, k, v))
    return AttentionCall.from_arguments(q, k, v, None, 0.0, shape.causal, None, False)


@dataclass(frozen=True)
class Reference:
    """The float64 answer on the parity slice, and how to cut the same slice out of a strategy's output."""

    heads: int
    rows: int
    output: torch.Tensor  # (1, heads, rows, Dv) float64 on the CPU

    def error(self, out: torch.Tensor) -> Tuple[float, float]:
        """(max abs error, the same relative to max(1, max|reference|)) of ``out`` on the slice."""
        got = out[:1, : self.heads, : self.rows].detach().to("cpu", torch.float64)
        error = float((got - self.output).abs().max()) if got.numel() else 0.0
        scale = max(1.0, float(self.output.abs().max())) if self.output.numel() else 1.0
        return error, error / scale


def reference(call: AttentionCall, rows: int) -> Reference:
    """The math kernel in float64 on the CPU, on ``parity_slice(call, rows)`` of the (dtype-rounded) inputs."""
    sliced = parity_slice(call, rows)
    on_cpu = replace(
        sliced,
        query=sliced.query.to("cpu", torch.float64),
        key=sliced.key.to("cpu", torch.float64),
        value=sliced.value.to("cpu", torch.float64),
    )
    with torch.no_grad():
        output = get_kernel("math").run(on_cpu)
    return Reference(sliced.heads, sliced.q_len, output)
