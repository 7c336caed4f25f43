"""RAFT's ``alt_cuda_corr`` extension in pure PyTorch: ``forward`` and ``backward`` as the CUDA op computes them.

RAFT (princeton-vl/RAFT) builds ``alt_cuda_corr`` from ``alt_cuda_corr/correlation_kernel.cu`` for its
memory-efficient ``AlternateCorrBlock``: instead of the all-pairs volume ``(B, H, W, H, W)`` it correlates each pixel
of ``fmap1`` with a ``(2r+1)^2`` window of ``fmap2`` around ``coords``, on demand. On an NPU or a CPU the extension
cannot be built, so npu-port serves this module under its name (see :mod:`npu_port.fallbacks.registry`).

What the CUDA op does, and this module does too:

- layouts are channels-last: ``fmap1`` ``(B, H1, W1, C)``, ``fmap2`` ``(B, H2, W2, C)``, ``coords``
  ``(B, N, H1, W1, 2)`` holding ``(x, y)`` in ``fmap2``'s pixels; ``forward`` returns ``[corr]`` with ``corr``
  ``(B, N, (2r+1)^2, H1, W1)`` in ``fmap1``'s dtype — a list, as the pybind11 binding returns a ``std::vector``;
- window entry ``k = (ox + r) * (2r+1) + (oy + r)``: the x offset is the slow index (as ``CorrBlock``'s
  ``meshgrid(dy, dx)`` stacked and added to ``(x, y)`` gives, in RAFT);
- each entry is ``<fmap1[b, h, w], bilinear(fmap2, x + ox, y + oy)>``: the kernel takes the dot products at the
  ``(2r+2)^2`` integer positions ``floor(x) - r + i``, ``floor(y) - r + j`` (zero outside ``fmap2``) and mixes each
  four neighbours with the weights ``dx = x - floor(x)``, ``dy = y - floor(y)`` — bilinear sampling with zero
  padding, i.e. ``grid_sample(..., align_corners=True)`` in pixel coordinates;
- ``backward(fmap1, fmap2, coords, corr_grad, radius)`` returns ``[fmap1_grad, fmap2_grad, coords_grad]``, the first
  two the exact adjoint of ``forward``, ``coords_grad`` all zeros (the kernel never writes it), the window size taken
  from ``corr_grad`` as the kernel does.

Where it differs, on purpose: any device, dtype and stride is taken (the CUDA op wants contiguous float32 CUDA
tensors), any channel count works (the CUDA kernel reads 32 channels at a time and is only right when ``C % 32 ==
0``), arguments are checked with clear errors (the kernel indexes out of bounds instead), and ``forward``'s result
is differentiable for ``fmap1`` and ``fmap2`` through ``backward`` (the CUDA op's result is not tracked by autograd;
RAFT never backpropagates through it — ``coords`` gets no gradient, as the kernel's zero ``coords_grad`` says).

Memory: only the ``(2r+2)^2`` dot products per pixel are kept, plus one gathered slice of ``fmap2`` for a few window
positions at a time and its product with ``fmap1``: at most ``_CHUNK_ELEMENTS`` (4 Mi) elements together, or one
position's worth (twice the size of ``fmap1``) where that is larger. No all-pairs volume is ever built, which is
the point of the alternate block.
"""

from __future__ import annotations

import math
from typing import List, Tuple

import torch

from ..errors import FallbackError

#: Elements gathered from ``fmap2`` at once plus their product with ``fmap1`` (one slice of each per window
#: position, as many positions per chunk as fit; at least one).
_CHUNK_ELEMENTS = 1 << 22


def forward(fmap1: torch.Tensor, fmap2: torch.Tensor, coords: torch.Tensor, radius: int) -> List[torch.Tensor]:
    """``alt_cuda_corr.forward``: ``[corr]``, ``corr`` of shape ``(B, N, (2r+1)^2, H1, W1)``."""
    _check(fmap1, fmap2, coords, radius)
    # coords get no gradient (the kernel's coords_grad is zeros): detached, a result depending on coords alone is
    # untracked, as the CUDA op's is.
    return [_AlternateCorrelation.apply(fmap1, fmap2, coords.detach(), radius)]


def backward(
    fmap1: torch.Tensor, fmap2: torch.Tensor, coords: torch.Tensor, corr_grad: torch.Tensor, radius: int
) -> List[torch.Tensor]:
    """``alt_cuda_corr.backward``: ``[fmap1_grad, fmap2_grad, coords_grad]`` (``coords_grad`` is zeros, as in CUDA)."""
    _check(fmap1, fmap2, coords, radius)
    window = _window_of(corr_grad, coords, radius)
    with torch.no_grad():
        fmap1_grad, fmap2_grad = _backward(fmap1, fmap2, coords, corr_grad, window)
    coords_grad = torch.zeros(coords.shape, dtype=fmap1.dtype, device=fmap1.device)
    return [fmap1_grad, fmap2_grad, coords_grad]


class _AlternateCorrelation(torch.autograd.Function):
    """Saves only the inputs; the gradient is :func:`_backward`, never a graph of per-offset intermediates."""

    @staticmethod
    def forward(ctx, fmap1, fmap2, coords, radius):
        ctx.save_for_backward(fmap1, fmap2, coords)
        ctx.radius = radius
        return _forward(fmap1, fmap2, coords, radius)

    @staticmethod
    def backward(ctx, corr_grad):
        fmap1, fmap2, coords = ctx.saved_tensors
        fmap1_grad, fmap2_grad = _backward(fmap1, fmap2, coords, corr_grad, ctx.radius, ctx.needs_input_grad[:2])
        return fmap1_grad, fmap2_grad, None, None


def _check(fmap1: torch.Tensor, fmap2: torch.Tensor, coords: torch.Tensor, radius: int) -> None:
    for name, tensor, dims in (("fmap1", fmap1, 4), ("fmap2", fmap2, 4), ("coords", coords, 5)):
        if not isinstance(tensor, torch.Tensor):
            raise FallbackError(f"alt_cuda_corr: {name} must be a tensor, got {type(tensor).__name__}")
        if tensor.dim() != dims or not tensor.is_floating_point():
            raise FallbackError(
                f"alt_cuda_corr: {name} must be a {dims}-D floating-point tensor, got shape {tuple(tensor.shape)} "
                f"{tensor.dtype} (fmap1 (B, H1, W1, C), fmap2 (B, H2, W2, C), coords (B, N, H1, W1, 2), channels-last)"
            )
    if isinstance(radius, bool) or not isinstance(radius, int) or radius < 0:
        raise FallbackError(f"alt_cuda_corr: radius must be an int >= 0, got {radius!r}")
    batch, height, width, channels = fmap1.shape
    if fmap2.shape[0] != batch or fmap2.shape[3] != channels:
        raise FallbackError(
            f"alt_cuda_corr: fmap1 {tuple(fmap1.shape)} and fmap2 {tuple(fmap2.shape)} must share batch and channels "
            "(B, H, W, C, channels-last)"
        )
    if coords.shape[0] != batch or tuple(coords.shape[2:]) != (height, width, 2):
        raise FallbackError(
            f"alt_cuda_corr: coords must have shape (B, N, H1, W1, 2) = ({batch}, N, {height}, {width}, 2), "
            f"got {tuple(coords.shape)}"
        )
    if fmap1.dtype != fmap2.dtype:
        raise FallbackError(f"alt_cuda_corr: fmap1 and fmap2 must have one dtype, got {fmap1.dtype} and {fmap2.dtype}")


def _window_of(corr_grad: torch.Tensor, coords: torch.Tensor, radius: int) -> int:
    """The radius, read from ``corr_grad`` as the CUDA backward does (``rd = sqrt(corr_grad.size(2))``)."""
    batch, n, height, width, _ = coords.shape
    if not isinstance(corr_grad, torch.Tensor) or corr_grad.dim() != 5:
        raise FallbackError("alt_cuda_corr: corr_grad must be a 5-D tensor (B, N, (2r+1)^2, H1, W1), like forward's")
    side = math.isqrt(corr_grad.shape[2])
    expected = (batch, n, (2 * radius + 1) ** 2, height, width)
    if tuple(corr_grad.shape) != expected or side * side != corr_grad.shape[2]:
        raise FallbackError(
            f"alt_cuda_corr: corr_grad must have forward's shape (B, N, (2r+1)^2, H1, W1) = {expected}, "
            f"got {tuple(corr_grad.shape)}"
        )
    return (side - 1) // 2


def _corners(coords: torch.Tensor, radius: int, height2: int, width2: int):
    """Top-left integer position of each pixel's ``(2r+2)^2`` grid in ``fmap2``, and the bilinear fractions."""
    x, y = coords[..., 0], coords[..., 1]
    x_floor, y_floor = torch.floor(x), torch.floor(y)
    dx, dy = x - x_floor, y - y_floor
    side = 2 * radius + 2
    # Positions more than a window away are all outside either way; clamping keeps the integer cast in range.
    left = (x_floor - radius).clamp(-side - 1, width2 + 1).to(torch.long)
    top = (y_floor - radius).clamp(-side - 1, height2 + 1).to(torch.long)
    return left, top, dx, dy


def _gathered(fmap2_rows, left, top, start, stop, side, height2, width2):
    """Rows of ``fmap2`` at grid positions ``start:stop`` ``(B, N, P, K, C)``, which lie inside, and their index."""
    positions = torch.arange(start, stop, device=left.device)
    iy, ix = torch.div(positions, side, rounding_mode="floor"), positions % side
    rows, cols = top.unsqueeze(-1) + iy, left.unsqueeze(-1) + ix  # (B, N, P, K)
    inside = (rows >= 0) & (rows < height2) & (cols >= 0) & (cols < width2)
    batch = rows.shape[0]
    base = (torch.arange(batch, device=rows.device) * (height2 * width2)).view(batch, 1, 1, 1)
    index = (base + rows.clamp(0, height2 - 1) * width2 + cols.clamp(0, width2 - 1)).reshape(-1)
    values = fmap2_rows.index_select(0, index).view(*inside.shape, fmap2_rows.shape[-1])
    return values, inside, index


def _position_chunks(side: int, per_position: int) -> List[Tuple[int, int]]:
    """Ranges of grid positions whose gathered rows, and one temporary of their size, fit ``_CHUNK_ELEMENTS``."""
    count = max(1, _CHUNK_ELEMENTS // max(1, 2 * per_position))
    return [(start, min(start + count, side * side)) for start in range(0, side * side, count)]


def _flat(fmap1, fmap2, coords):
    batch, height1, width1, channels = fmap1.shape
    _, height2, width2, _ = fmap2.shape
    n = coords.shape[1]
    f1 = fmap1.reshape(batch, 1, height1 * width1, channels)  # broadcast over N
    f2 = fmap2.reshape(batch * height2 * width2, channels)
    flat_coords = coords.reshape(batch, n, height1 * width1, 2)
    return f1, f2, flat_coords, (batch, n, height1, width1, height2, width2, channels)


def _forward(fmap1: torch.Tensor, fmap2: torch.Tensor, coords: torch.Tensor, radius: int) -> torch.Tensor:
    f1, f2, flat_coords, (batch, n, height1, width1, height2, width2, channels) = _flat(fmap1, fmap2, coords)
    side, window = 2 * radius + 2, 2 * radius + 1
    pixels = height1 * width1
    left, top, dx, dy = _corners(flat_coords, radius, height2, width2)
    # Dot products at the integer grid around each pixel's target: (B, N, P, side * side), iy the slow index.
    dots = torch.empty((batch, n, pixels, side * side), dtype=fmap1.dtype, device=fmap1.device)
    f1_column = f1.unsqueeze(-1)  # (B, 1, P, C, 1): one matrix-vector product per pixel, no product temporary
    for start, stop in _position_chunks(side, batch * n * pixels * channels):
        values, inside, _ = _gathered(f2, left, top, start, stop, side, height2, width2)
        dots[..., start:stop] = torch.matmul(values, f1_column).squeeze(-1) * inside
    dots = dots.view(batch, n, pixels, side, side)
    dx, dy = dx.to(dots.dtype)[..., None, None], dy.to(dots.dtype)[..., None, None]
    corr = (
        dots[..., :-1, :-1] * ((1 - dy) * (1 - dx))
        + dots[..., :-1, 1:] * ((1 - dy) * dx)
        + dots[..., 1:, :-1] * (dy * (1 - dx))
        + dots[..., 1:, 1:] * (dy * dx)
    )  # (B, N, P, oy, ox)
    corr = corr.permute(0, 1, 4, 3, 2)  # (B, N, ox, oy, P): the x offset is the slow index, as in the kernel
    return corr.reshape(batch, n, window * window, height1, width1)


def _backward(
    fmap1: torch.Tensor,
    fmap2: torch.Tensor,
    coords: torch.Tensor,
    corr_grad: torch.Tensor,
    radius: int,
    needs: Tuple[bool, bool] = (True, True),
):
    f1, f2, flat_coords, (batch, n, height1, width1, height2, width2, channels) = _flat(fmap1, fmap2, coords)
    side, window = 2 * radius + 2, 2 * radius + 1
    pixels = height1 * width1
    left, top, dx, dy = _corners(flat_coords, radius, height2, width2)
    dtype = fmap1.dtype
    dx, dy = dx.to(dtype)[..., None, None], dy.to(dtype)[..., None, None]
    grad = corr_grad.to(dtype).reshape(batch, n, window, window, pixels).permute(0, 1, 4, 3, 2)  # (B, N, P, oy, ox)
    # The adjoint of the bilinear mix: the gradient of each integer-position dot product.
    dots_grad = torch.zeros((batch, n, pixels, side, side), dtype=dtype, device=fmap1.device)
    dots_grad[..., :-1, :-1] += grad * ((1 - dy) * (1 - dx))
    dots_grad[..., :-1, 1:] += grad * ((1 - dy) * dx)
    dots_grad[..., 1:, :-1] += grad * (dy * (1 - dx))
    dots_grad[..., 1:, 1:] += grad * (dy * dx)
    dots_grad = dots_grad.view(batch, n, pixels, side * side)

    fmap1_grad = torch.zeros((batch, pixels, channels), dtype=dtype, device=fmap1.device) if needs[0] else None
    fmap2_grad = torch.zeros_like(f2) if needs[1] else None
    for start, stop in _position_chunks(side, batch * n * pixels * channels):
        values, inside, index = _gathered(f2, left, top, start, stop, side, height2, width2)
        weight = dots_grad[..., start:stop] * inside  # (B, N, P, K); zero outside fmap2
        if fmap1_grad is not None:
            fmap1_grad += torch.matmul(weight.unsqueeze(-2), values).squeeze(-2).sum(1)
        if fmap2_grad is not None:
            fmap2_grad.index_add_(0, index, (weight.unsqueeze(-1) * f1.unsqueeze(-2)).reshape(-1, channels))
    if fmap1_grad is not None:
        fmap1_grad = fmap1_grad.view(fmap1.shape)
    if fmap2_grad is not None:
        fmap2_grad = fmap2_grad.view(fmap2.shape)
    return fmap1_grad, fmap2_grad
