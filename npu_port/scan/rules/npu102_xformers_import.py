"""NPU102: ``import xformers`` (or a module the xformers drop-in serves) that is not guarded."""

from __future__ import annotations

from ..rule import register_rule
from ._dropin_guard import DropInImport
from ._imports import DROPIN_HANDLER


@register_rule
class XformersImport(DropInImport):
    """An unguarded import of ``xformers``, ``xformers.ops``, ``xformers.ops.fmha`` or its ``attn_bias``.

    xformers wheels are built against one torch and one CUDA: on an NPU, a CPU, or a GPU whose build does not match,
    the import fails (or warns and leaves every op broken), and at module level the whole module fails with it.
    Under ``npu-port run`` the xformers drop-in is served instead (``memory_efficient_attention`` and the attention
    biases, through ``npu_port.attention``). The safe fix puts the import in ``try``; its ``except ImportError``
    installs the drop-in (``install_dropins("xformers", broken=True)``: also where xformers is installed but fails
    to load) and imports again — nothing changes where xformers imports. Dynamic imports and statements that also
    import what the drop-in lacks (``from xformers.ops import fmha, SwiGLU``) are left to you. xformers modules the
    drop-in does not serve are NPU104; guarded imports NPU106; one after ``install_dropins()`` is served.

    Example::

        import xformers.ops as xops                      # NPU102, fixed to the guarded import
        from xformers.ops import memory_efficient_attention  # NPU102, fixed to the guarded import
    """

    code = "NPU102"
    name = "xformers-import"
    message = "unguarded xformers import: fails without a matching CUDA xformers build"
    handled_by = DROPIN_HANDLER["xformers"]
    triggers = ("xformers",)
    broken = "a matching CUDA xformers build"
