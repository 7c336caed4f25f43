"""NPU101: ``import flash_attn`` (or a module the flash_attn drop-in serves) that is not guarded."""

from __future__ import annotations

from ..rule import register_rule
from ._dropin_guard import DropInImport
from ._imports import DROPIN_HANDLER


@register_rule
class FlashAttnImport(DropInImport):
    """An unguarded import of ``flash_attn``, ``flash_attn.flash_attn_interface`` or ``flash_attn.bert_padding``.

    flash-attn is built only for CUDA GPUs (and not for every one of them): on an NPU, a CPU or a GPU without a
    matching wheel the import fails, and at module level the whole module with it. Under ``npu-port run`` the
    flash_attn drop-in is served instead (computing through ``npu_port.attention``). The safe fix puts the import in
    ``try``; its ``except ImportError`` installs the drop-in (``install_dropins("flash_attn", broken=True)``: also
    where flash-attn is installed but fails to load) and imports again — nothing changes where flash-attn imports
    (:mod:`._dropin_guard` says why this is safe). Dynamic imports and statements that also import what no drop-in
    serves are left to you. Imports of flash_attn modules the drop-in does not serve are NPU104; guarded ones NPU106;
    one after ``install_dropins()`` is served and not reported.

    Example::

        from flash_attn import flash_attn_func            # NPU101, fixed to the guarded import
        from flash_attn.bert_padding import pad_input      # NPU101, fixed to the guarded import
        fa = importlib.import_module("flash_attn")         # NPU101, a manual fix
    """

    code = "NPU101"
    name = "flash-attn-import"
    message = "unguarded flash_attn import: fails without a CUDA flash-attn build"
    handled_by = DROPIN_HANDLER["flash_attn"]
    triggers = ("flash_attn",)
    broken = "a CUDA flash-attn build"
