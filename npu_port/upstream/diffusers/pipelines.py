"""diffusers pieces: logging, and the loggers npu-port quiets in its own commands."""

from __future__ import annotations

from typing import Any, Optional

from ..adapter import Piece

#: The integration that keeps diffusers' console output quiet in npu-port's own commands.
LOGGING = "diffusers logging"
#: The logger that warns about half precision on a CPU (a ``logging.getLogger`` name: no import needed).
PIPELINE_LOGGER = "diffusers.pipelines.pipeline_utils"


def _has_quiet_switches(module: Any) -> Optional[str]:
    switches = ("set_verbosity_error", "disable_progress_bar")
    missing = [name for name in switches if not callable(getattr(module, name, None))]
    return f"diffusers' logging has no {', '.join(missing)}" if missing else None


PIECES = (
    Piece("logging", LOGGING, where=("diffusers.utils.logging",), check=_has_quiet_switches, public=True, since="0.1"),
)


def logging_module() -> Any:
    """diffusers' logging module (``diffusers.utils.logging``), or None (declined, warned once)."""
    from . import ADAPTER

    if ADAPTER.decline(LOGGING, "logging") is not None:
        return None
    return ADAPTER.get("logging")


#: The method with which Flux-style pipelines pack 2x2 latent patches into one token (a private method: read, never
#: called).
PACK_LATENTS = "_pack_latents"


def packs_latents(cls: Any) -> bool:
    """Whether a pipeline class packs 2x2 latent patches into one token (Flux-style: it has ``_pack_latents``), so
    that sizes must be multiples of twice the VAE's factor. A release that renames the method makes this False:
    sizes are then checked with the VAE's factor alone, and diffusers itself rounds what does not fit."""
    return cls is not None and callable(getattr(cls, PACK_LATENTS, None))
