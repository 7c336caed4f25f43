"""Fused DiT ops, opt-in and reversible: ``npu_port.fuse_ops(model, ops=[...])`` and a strategy's ``fuse_ops:``.

Diffusion transformers spend a visible share of their time outside attention, in small element-wise layers that the
Ascend ops fuse: RMSNorm (``torch_npu.npu_rms_norm``), rotary embeddings (``torch_npu.npu_rotary_mul``), GEGLU
(``torch_npu.npu_geglu``) and adaLN's ``LN(x) * (1 + scale) + shift`` (MindIE-SD's ``layernorm_scale_shift``).
People report 2-26% end to end from such fusions (docs/explanation/ascend.md, "Fused DiT ops"). npu-port installs
them only when asked, per op, on one model, and every change goes through the project's one patching mechanism
(:mod:`npu_port._patching`), so ``handle.restore()`` puts back the very objects that were there.

Nothing here trusts a fused op blindly: each replaced module or function is compared with what it replaces on its
first call (same inputs, a tolerance per dtype, NaN never within it); a mismatch puts the original back for that
place and the handle says why (:mod:`.check`). A call the op's documented limits rule out (a 3-D tensor for
``npu_rotary_mul``, a CPU tensor, float64) runs the original and is counted with its reason.

Layout: :mod:`.api` (``fuse_ops`` and its handle), :mod:`.plan` (what a planner finds: sites, refusals, notes),
:mod:`.check` (the first-call check and the per-site record), :mod:`.backend` (torch_npu / mindiesd, the device rule),
one planner per op family (:mod:`.norms`, :mod:`.rope`, :mod:`.geglu`, :mod:`.adaln`). Importing this package
imports neither torch nor diffusers: it only registers the applier of the strategy key ``fuse_ops``
(:mod:`npu_port.strategy.appliers`), which loads the rest on first use.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..strategy.appliers import register_key_applier


def _apply_strategy_fuse_ops(target: Any, ops: Sequence[str]) -> Any:
    """A strategy's ``fuse_ops:`` on its target (non-strict: refusals are reported on the handle and warned)."""
    from .api import fuse_ops

    return fuse_ops(target, ops=list(ops))


#: How ``set_attention_strategy(target=model)`` reaches :func:`npu_port.fuse.api.fuse_ops` for a strategy that sets
#: ``fuse_ops`` (the strategy layer never imports this package).
KEY_APPLIER = register_key_applier("fuse_ops", _apply_strategy_fuse_ops)
