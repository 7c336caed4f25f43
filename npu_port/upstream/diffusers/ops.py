"""diffusers pieces: the layers and functions whose computation ``fuse_ops`` replaces (:mod:`npu_port.fuse`).

Each fused op recognises diffusers' own classes (documented layers: ``RMSNorm``, ``AdaLayerNormZero``,
``AdaLayerNormContinuous`` in "Normalization layers", ``GEGLU`` in "Activation functions") and functions (the shared
``apply_rotary_emb``, Wan's attention and processor), by identity, and replaces their forward only where it is the
class's own. A piece missing from the installed diffusers — a layer renamed or moved — declines that op: diffusers'
layers keep their own forward, one warning names diffusers, its version and the piece, and the fuse handle lists it
(``strict=True`` makes it an error before anything is patched). Nothing else of the op is affected: torch's own
``nn.RMSNorm`` is still fused when diffusers' ``RMSNorm`` cannot be found.

Nothing here imports diffusers: a model holding diffusers layers means diffusers is imported, so the planners ask
only then (:func:`find`).
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Iterable, Optional, Tuple

from ..adapter import Adapter, Decline, Piece

#: One feature per fused op (and Wan's RoPE apart from the shared function: either can be there without the other).
RMS_NORM = "fused rms_norm (diffusers RMSNorm)"
ROPE = "fused rope (diffusers apply_rotary_emb)"
WAN_ROPE = "fused rope (Wan's RoPE)"
GEGLU = "fused geglu (diffusers GEGLU)"
GEGLU_EXACT = "fused geglu_exact (diffusers GEGLU's torch_npu switch)"
ADALN = "fused adaln (diffusers adaptive layer norms)"

_NORMALIZATION = "diffusers.models.normalization"
_ACTIVATIONS = "diffusers.models.activations"
EMBEDDINGS = "diffusers.models.embeddings"
WAN = "diffusers.models.transformers.transformer_wan"
#: Where LTX's RoPE lives: a form npu_rotary_mul cannot take (named in the refusal, never resolved).
LTX = "diffusers.models.transformers.transformer_ltx"

#: The pieces each feature needs.
NEEDS: Dict[str, Tuple[str, ...]] = {
    RMS_NORM: ("RMSNorm",),
    ROPE: ("apply_rotary_emb",),
    WAN_ROPE: ("WanAttention", "WanAttnProcessor"),
    GEGLU: ("GEGLU",),
    GEGLU_EXACT: ("GEGLU npu switch",),
    ADALN: ("AdaLayerNormZero", "AdaLayerNormZeroSingle", "AdaLayerNormContinuous"),
}


def _module_class(value: Any) -> Optional[str]:
    import torch

    return None if isinstance(value, type) and issubclass(value, torch.nn.Module) else "not a torch.nn.Module class"


def _callable(value: Any) -> Optional[str]:
    return None if callable(value) else "not callable"


def _layer(name: str, feature: str, module: str, public: bool, since: str) -> Piece:
    return Piece(name, feature, where=(f"{module}:{name}",), check=_module_class, public=public, since=since)


PIECES = (
    _layer("RMSNorm", RMS_NORM, _NORMALIZATION, True, "0.30"),
    _layer("AdaLayerNormZero", ADALN, _NORMALIZATION, True, "0.30"),
    _layer("AdaLayerNormZeroSingle", ADALN, _NORMALIZATION, False, "0.30"),
    _layer("AdaLayerNormContinuous", ADALN, _NORMALIZATION, True, "0.30"),
    _layer("GEGLU", GEGLU, _ACTIVATIONS, True, "0.30"),
    Piece(
        "GEGLU npu switch",
        GEGLU_EXACT,
        where=(f"{_ACTIVATIONS}:is_torch_npu_available",),
        check=_callable,
        since="0.30",
    ),
    Piece("apply_rotary_emb", ROPE, where=(f"{EMBEDDINGS}:apply_rotary_emb",), check=_callable, since="0.30"),
    _layer("WanAttention", WAN_ROPE, WAN, False, "0.35"),
    Piece("WanAttnProcessor", WAN_ROPE, where=(f"{WAN}:WanAttnProcessor",), since="0.35"),
)


def _adapter() -> Adapter:
    from . import ADAPTER

    return ADAPTER


def holds_diffusers_layers(modules: Iterable[Tuple[str, Any]]) -> bool:
    """Whether any of the modules is one of diffusers' classes (told by the classes' modules, without importing)."""
    root = _adapter().library
    return any(type(m).__module__.split(".")[0] == root for _, m in modules)


def holds_wan_layers(modules: Iterable[Tuple[str, Any]]) -> bool:
    """Whether any module is one of diffusers' Wan classes (by name: found even where Wan's module moved)."""
    root = _adapter().library
    return any(type(m).__module__.split(".")[0] == root and type(m).__name__.startswith("Wan") for _, m in modules)


def owner(name: str) -> Any:
    """The diffusers module in which the piece ``name`` was found (where a function is replaced), or None."""
    adapter = _adapter()
    if not adapter.has(name):
        return None
    for module_name, attr in adapter.locations(name):
        module = sys.modules.get(module_name)
        if module is not None and attr and attr in vars(module):
            return module
    return None


def current(name: str) -> Any:
    """The piece's value as its module holds it now (a patched global, e.g. ``is_torch_npu_available`` made True
    on a test machine, is what diffusers itself calls), or None when it is missing."""
    module = owner(name)
    attr = dict(_adapter().locations(name)).get(getattr(module, "__name__", None))
    return getattr(module, attr, None) if module is not None and attr else None


def find(
    feature: str, modules: Iterable[Tuple[str, Any]], *, strict: bool = False
) -> Tuple[Dict[str, Any], Optional[Decline]]:
    """The feature's pieces, name -> value, and None — or, when the modules hold diffusers layers and a piece is
    missing, empty values and the :class:`Decline` (kept, warned about once). ``strict``: an explicit
    ``fuse_ops(strict=True)`` request: a missing piece is :class:`~npu_port.upstream.UpstreamMissingError` instead,
    raised before anything is patched. A model without diffusers layers needs none of them: empty values, no
    decline."""
    adapter = _adapter()
    names = NEEDS[feature]
    modules = list(modules)
    holds = holds_wan_layers if feature == WAN_ROPE else holds_diffusers_layers
    if not adapter.imported() or not holds(modules):
        return {}, None
    if strict:
        adapter.require(feature, *names)
    decline = adapter.decline(feature, *names)
    if decline is not None:
        return {}, decline
    return {name: adapter.get(name) for name in names}, None
