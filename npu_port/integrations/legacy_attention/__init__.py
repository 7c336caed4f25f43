"""Legacy attention: route diffusers <= 0.14-era attention code and diffusers' xformers switches through npu-port's
attention strategy, reversibly.

"Legacy" means the attention code CUDA video/diffusion projects copied from diffusers before processors existed
(diffusers <= 0.11 ``CrossAttention``; ControlVideo's ``FullyFrameAttention`` / ``IndividualAttention``, Tune-A-Video's
and AnimateDiff's attention classes): heads folded into the batch, ``(batch*heads, seq, head_dim)`` tensors, and one
method that does the whole computation — ``_attention(self, query, key, value, attention_mask=None)`` with ``baddbmm``
scores scaled by ``self.scale``, a softmax, a ``bmm``, and ``reshape_batch_dim_to_heads`` (which reads ``self.heads``)
on the way out. It materialises the ``(batch*heads, q_len, key_len)`` scores and probabilities (ControlVideo's 112.5 GiB
allocation), switches to ``xformers.ops`` behind ``_use_memory_efficient_attention_xformers``, and its
``set_use_memory_efficient_attention_xformers`` raises without CUDA.

The parts, one module each:

* :mod:`.contract`: :func:`is_legacy_attention_class` — the contract, checked narrowly (exact parameter names, the
  ``heads`` / ``scale`` attributes actually read): routing a method whose meaning we only guessed would change
  results silently. diffusers' current ``Attention`` has no ``_attention`` and never matches.
* :mod:`.routed`: the methods installed on a legacy class;
* :mod:`.patch`: :func:`patch_legacy_attention` — routed ``_attention`` / ``_sliced_attention`` and an exact
  ``get_attention_scores`` on the class, xformers flags cleared, repo-local xformers setters made no-ops;
  :class:`LegacyPatch` undoes it. :func:`route_target_legacy` is the same for ``set_attention_strategy(target=
  model)``: the methods route only inside the target (:mod:`npu_port.integrations.legacy_scope`).
* :mod:`.xformers_hook`: :func:`hook_enable_xformers` — diffusers' ``enable_xformers_memory_efficient_attention`` and
  friends install npu-port's strategy instead; :class:`XformersHook` undoes it.

Pinned old diffusers: 0.11's own ``CrossAttention`` has exactly this contract and is routed like a project's copy;
diffusers' ``AttentionBlock`` (0.11–0.16: the VAE's attention), which computes attention inline in ``forward``, is
routed by the same patches with an equivalent ``forward`` (:mod:`npu_port.integrations.attention_block`); 0.12–0.14's
processor-based ``CrossAttention`` takes the strategy like today's ``Attention`` (see the hook below).

The routed methods unfold ``(batch*heads, seq, dim)`` to ``(batch, heads, seq, dim)`` with ``self.heads``, turn the
legacy additive mask into the 4-D float mask SDPA takes (:func:`npu_port.masks.unfold_heads`), call
``npu_port.attention(..., scale=self.scale)`` — so the process-wide strategy (``set_attention_strategy("chunked")``,
``auto``, the Ascend ops) picks the kernel — or, inside a model a strategy was applied to, that strategy, and hand
the result to the module's own ``reshape_batch_dim_to_heads``, in the dtype the original returned.

Numerics, masks and the calls left to the original: :mod:`npu_port.integrations.folded` (shared with the diffusers
processors that compute attention through ``get_attention_scores``). A call outside the legacy forms goes to the
original method, unchanged, with a debug log line.

Importing this module imports neither diffusers nor the user's code.
"""

from .contract import (
    find_legacy_attention,
    is_legacy_attention_class,
    is_routable_class,
    original_function,
    target_modules,
)
from .patch import LegacyPatch, active_patches, patch_legacy_attention, route_target_legacy
from .xformers_hook import (
    XformersHook,
    XformersRoute,
    hook_enable_xformers,
    hook_hits,
    hooked_routes,
    unhook_enable_xformers,
    xformers_route,
)

__all__ = [
    "LegacyPatch",
    "XformersHook",
    "XformersRoute",
    "active_patches",
    "find_legacy_attention",
    "hook_enable_xformers",
    "hook_hits",
    "hooked_routes",
    "is_legacy_attention_class",
    "is_routable_class",
    "original_function",
    "patch_legacy_attention",
    "route_target_legacy",
    "target_modules",
    "unhook_enable_xformers",
    "xformers_route",
]
