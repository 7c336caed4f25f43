"""How the demo shows a result image: scaled up by a whole factor with nearest-neighbour, so a 64×64 image fills
about :data:`DISPLAY_SIDE` pixels with crisp pixels instead of sitting small in a large box (or being smoothed into
blur by the browser), and labelled with its true size. Only the display is scaled: the file offered for download is
the image as the model made it. No gradio here, so tests check the pixels directly."""

from __future__ import annotations

from typing import Any

import numpy as np

#: About how many pixels the longer side is shown at (never less than the image itself: nothing is scaled down).
DISPLAY_SIDE = 512


def display_factor(height: int, width: int, side: int = DISPLAY_SIDE) -> int:
    """The whole factor that brings the longer side closest to ``side`` without passing it (at least 1)."""
    return max(1, side // max(height, width, 1))


def scale_up(pixels: np.ndarray, factor: int) -> np.ndarray:
    """``pixels`` (height × width [× channels]) with each pixel made a ``factor`` × ``factor`` block of itself."""
    if factor < 1:
        raise ValueError(f"the display factor must be a whole number >= 1, got {factor!r}")
    return np.repeat(np.repeat(pixels, factor, axis=0), factor, axis=1)


def size_label(height: int, width: int, factor: int) -> str:
    """``64 × 64 px, shown at 8×`` (width first, as image sizes are written); ``shown at its true size`` for 1."""
    shown = f"shown at {factor}×" if factor > 1 else "shown at its true size"
    return f"{width} × {height} px, {shown}"


def for_display(image: Any, side: int = DISPLAY_SIDE) -> tuple:
    """(the PIL image to show, its label) for a PIL ``image``."""
    from PIL import Image

    pixels = np.asarray(image)
    height, width = pixels.shape[:2]
    factor = display_factor(height, width, side)
    return Image.fromarray(scale_up(pixels, factor)), size_label(height, width, factor)
