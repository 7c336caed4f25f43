"""The processor installed in place of diffusers' standard ones: ``AttnProcessor2_0`` step for step, with only the
attention core handed to an attention function.

Why replace rather than route these: the standard processors are the ones that break when a model moves device
(``XFormersAttnProcessor`` needs xformers and CUDA, ``AttnProcessorNPU`` feeds an inverted mask to SDPA in fp32,
the legacy ``AttnProcessor`` materialises ``baddbmm`` scores), and ``AttnProcessor2_0`` ignores ``attn.scale``
(diffusers' "TODO: add support for attn.scale"). Owning the whole processor lets us fix all of that in one place:
every other step is diffusers' own, in diffusers' order (reference/attention_dispatch.md §2.13), so the result
matches the processor it stands in for.

Two compatibility details:

* diffusers decides what a processor is with exact-class checks (``proc.__class__ in CROSS_ATTENTION_PROCESSORS``
  in ``set_default_attn_processor``; ``attn_processors[name].__class__()`` when loading IP-Adapters). An instance
  reports the class it stands in for as ``__class__`` (as ``unittest.mock`` specs do), so those checks pass and
  build what they would have built, with no global patching; ``type(proc)`` is still :class:`RoutedAttnProcessor`,
  and ``isinstance`` works for both classes. The standard processors that cannot run off their device (xformers,
  NPU) are stood in for by ``AttnProcessor2_0``.
* ``Attention.forward`` inspects ``processor.__call__`` to filter ``cross_attention_kwargs``; the signature below is
  ``AttnProcessor2_0.__call__``'s, so the same keyword arguments pass and the same ones are dropped with a warning.

Older diffusers: on a 0.12–0.14 ``CrossAttention`` the processor runs those versions' own steps
(:mod:`.cross_attention_steps`); on the ``Attention`` modules of 0.15 and 0.16, which lack some later attributes
(``spatial_norm``, ``residual_connection``, ``rescale_output_factor``; ``norm_q`` / ``norm_k`` came later still), a
missing one counts as absent — what those versions' ``AttnProcessor2_0`` does.

Differences from the original, on purpose: ``attn.scale`` is honoured (the same value ``AttnProcessor2_0`` uses
whenever ``scale_qk=True``, which is when diffusers picks it); a module with ``norm_q`` / ``norm_k`` gets them
applied even where the replaced legacy / xformers / NPU processor skipped them.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ...upstream.diffusers import attention as upstream
from .cross_attention_steps import cross_attention_call
from .routing import AttentionFn, Route, Tally

_SCALE_DEPRECATION = (
    "The `scale` argument is deprecated and will be ignored. Please remove it, as passing it will raise an error in "
    "the future. `scale` should directly be passed while calling the underlying pipeline component i.e., via "
    "`cross_attention_kwargs`."
)


class RoutedAttnProcessor:
    """A diffusers attention processor that computes ``AttnProcessor2_0``'s steps and sends the attention core to
    ``attention_fn`` (``(B, H, S, D)``, SDPA semantics), with ``scale=attn.scale``.

    ``stands_in_for``: the diffusers processor class this instance reports as its ``__class__`` (default
    ``AttnProcessor2_0``). ``fused``: project with the fused ``to_qkv`` / ``to_kv`` layers, as
    ``FusedAttnProcessor2_0`` does. ``module_name`` and ``tally``: where calls are counted (see
    :class:`~.routing.Tally`; a fresh tally when not given).
    """

    def __init__(
        self,
        attention_fn: AttentionFn,
        stands_in_for: Optional[type] = None,
        fused: bool = False,
        *,
        module_name: str = "",
        tally: Optional[Tally] = None,
    ) -> None:
        if not callable(attention_fn):
            raise TypeError(f"attention_fn must be callable, got {type(attention_fn).__name__}")
        self.stands_in_for = stands_in_for if stands_in_for is not None else upstream.default_processor()
        self.fused = bool(fused)
        self.route = Route(attention_fn, module_name, tally)
        self._cross_attention_steps = upstream.layout() == upstream.CROSS_ATTENTION  # diffusers 0.12-0.14

    @property
    def attention_fn(self) -> AttentionFn:
        return self.route.attention_fn

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # see the module docstring: diffusers' exact-class checks
        return self.stands_in_for

    def __reduce__(self):  # pickle rebuilds this class (not the one __class__ reports); counts are not carried
        return (RoutedAttnProcessor, (self.attention_fn, self.stands_in_for, self.fused))

    def __copy__(self) -> "RoutedAttnProcessor":
        route = self.route
        return RoutedAttnProcessor(
            route.attention_fn, self.stands_in_for, self.fused, module_name=route.module_name, tally=route.tally
        )

    def __deepcopy__(self, memo: dict) -> "RoutedAttnProcessor":
        # A copied model (EMA, copy.deepcopy(unet)) keeps routing to the same attention function, counted in the same
        # place, as its copied hooks do; the function itself (a strategy router with locks and caches) is shared.
        return self.__copy__()

    def __repr__(self) -> str:
        fused = ", fused=True" if self.fused else ""
        return f"RoutedAttnProcessor(stands_in_for={self.stands_in_for.__name__}{fused}, {self.attention_fn!r})"

    def _project(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor]):
        """Steps 8–10 (``to_q``, ``norm_cross``, ``to_k`` / ``to_v``), or their fused form."""
        if self.fused and encoder_hidden_states is None:
            qkv = attn.to_qkv(hidden_states)
            return torch.split(qkv, qkv.shape[-1] // 3, dim=-1)
        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        if self.fused:
            kv = attn.to_kv(encoder_hidden_states)
            key, value = torch.split(kv, kv.shape[-1] // 2, dim=-1)
        else:
            key = attn.to_k(encoder_hidden_states)
            value = attn.to_v(encoder_hidden_states)
        return query, key, value

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        temb: Optional[torch.Tensor] = None,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        return self.run(self.route, attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)

    def run(
        self,
        route: Route,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        temb: Optional[torch.Tensor] = None,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """The processor's steps with the attention core sent to ``route`` (its own, when called as a processor;
        a module's route when it stands in for a processor class routed in place: :mod:`.patches`)."""
        if self._cross_attention_steps:
            if temb is not None:  # not an argument of 0.12-0.14 processors: refused there, as by the originals
                kwargs["temb"] = temb
            steps = (attn, hidden_states, encoder_hidden_states, attention_mask, *args)
            return cross_attention_call(route, self.stands_in_for, *steps, **kwargs)

        # 1. the deprecated `scale` argument is accepted and ignored, with diffusers' warning; without diffusers'
        #    `deprecate` (declined when applied: upstream.SCALE) the call is diffusers' own processor's
        if len(args) > 0 or kwargs.get("scale", None) is not None:
            deprecate = upstream.deprecate_function()
            if deprecate is None:
                original = self.stands_in_for()
                return original(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
            deprecate("scale", "1.0.0", _SCALE_DEPRECATION)

        # 2-3. residual before the spatial norm
        residual = hidden_states
        spatial_norm = getattr(attn, "spatial_norm", None)  # absent before 0.17
        if spatial_norm is not None:
            hidden_states = spatial_norm(hidden_states, temb)

        # 4. (B, C, H, W) -> (B, H*W, C)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch_size, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch_size, channel, height * width).transpose(1, 2)

        # 5. batch and key length from the encoder states when given
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
        )

        # 6. (B*heads, 1|Sq, Skv) -> (B, heads, 1|Sq, Skv); additive or bool, passed on unchanged
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])

        # 7. group norm over channels
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        # 8-10. projections
        query, key, value = self._project(attn, hidden_states, encoder_hidden_states)

        # 11-12. heads: (B, S, heads*D) -> (B, heads, S, D)
        inner_dim = key.shape[-1]
        head_dim = inner_dim // attn.heads
        query = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        key = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)

        # 13. per-head q/k norms
        norm_q, norm_k = getattr(attn, "norm_q", None), getattr(attn, "norm_k", None)  # absent in older versions
        if norm_q is not None:
            query = norm_q(query)
        if norm_k is not None:
            key = norm_k(key)

        # 14. the attention core: the only step that differs (routed; attn.scale honoured)
        hidden_states = route.attend(
            "processor", query, key, value, attention_mask, dropout_p=0.0, is_causal=False, scale=attn.scale
        )

        # 15. (B, heads, S, D) -> (B, S, heads*D)
        hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = hidden_states.to(query.dtype)

        # 16. output projection and dropout
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)

        # 17. back to (B, C, H, W)
        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch_size, channel, height, width)

        # 18-19. residual and rescale
        if getattr(attn, "residual_connection", False):  # both absent before 0.17
            hidden_states = hidden_states + residual
        hidden_states = hidden_states / getattr(attn, "rescale_output_factor", 1.0)
        return hidden_states
