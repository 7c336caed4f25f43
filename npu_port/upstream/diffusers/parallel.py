"""diffusers pieces: parallel (see the package docstring)."""

from __future__ import annotations

from typing import Tuple

from ..adapter import Piece

PIECES: Tuple[Piece, ...] = ()
