"""The routed methods installed on a legacy attention class: the same contract, computed by the attention function
:func:`npu_port.integrations.legacy_scope.attention_for` gives (a target's strategy while a targeted module runs, the
process-wide strategy through ``npu_port.attention`` for a class routed process-wide), and an exact
``get_attention_scores``. Where it gives none (an instance outside any target, of a class routed only for targets),
the original method runs.

Numerics, masks and the calls left to the original are :mod:`npu_port.integrations.folded`'s; a call outside the
legacy forms goes to the original method, unchanged, with a debug log line.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import torch
from torch import Tensor

from ...attn import masks
from ..folded import UNFIT, attend
from ..legacy_scope import attention_for

logger = logging.getLogger("npu_port.legacy")


def _mark(routed: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    functools.update_wrapper(routed, original)
    routed.__npu_port_original__ = original  # type: ignore[attr-defined]
    return routed


def _fall_back(module: Any, name: str) -> None:
    logger.debug("npu-port: %s.%s call left to the original (not a legacy form)", type(module).__name__, name)


def routed_attention(original: Callable[..., Tensor], owner: type) -> Callable[..., Tensor]:
    """``_attention(self, query, key, value, attention_mask=None)``: ``(batch, q_len, heads*dim)`` in the value's
    dtype, as the original returns it. ``owner``: the class it is installed on."""

    def _attention(self, query, key, value, attention_mask=None):
        attention_fn = attention_for(owner)
        if attention_fn is None:
            return original(self, query, key, value, attention_mask)
        out = attend(self, query, key, value, attention_mask, attention_fn)
        if out is UNFIT:
            _fall_back(self, "_attention")
            return original(self, query, key, value, attention_mask)
        return self.reshape_batch_dim_to_heads(out.to(value.dtype))

    return _mark(_attention, original)


def routed_sliced_attention(original: Callable[..., Tensor], owner: type) -> Callable[..., Tensor]:
    """``_sliced_attention(self, query, key, value, sequence_length, dim, attention_mask)``: the same result as the
    original's loop over ``self._slice_size`` rows of ``batch*heads`` (whose memory bound the strategy now gives),
    in the query's dtype — rows past the last whole slice stay zero, as they do there."""

    def _sliced_attention(self, query, key, value, sequence_length, dim, attention_mask):
        attention_fn = attention_for(owner)
        if attention_fn is None:
            return original(self, query, key, value, sequence_length, dim, attention_mask)
        batch_heads = query.shape[0] if isinstance(query, Tensor) and query.dim() == 3 else 0
        slice_size = getattr(self, "_slice_size", None)
        slice_size = batch_heads if slice_size is None else slice_size
        fits = (
            batch_heads
            and isinstance(slice_size, int)
            and slice_size >= 1
            and sequence_length == query.shape[1]
            and dim // self.heads == value.shape[-1]
        )
        out = attend(self, query, key, value, attention_mask, attention_fn) if fits else UNFIT
        if out is UNFIT:
            _fall_back(self, "_sliced_attention")
            return original(self, query, key, value, sequence_length, dim, attention_mask)
        out = out.to(query.dtype)
        covered = batch_heads // slice_size * slice_size
        if covered < batch_heads:
            out[covered:] = 0
        return self.reshape_batch_dim_to_heads(out)

    return _mark(_sliced_attention, original)


def exact_attention_scores(original: Callable[..., Tensor], owner: type) -> Callable[..., Tensor]:
    """``get_attention_scores(self, query, key, attention_mask=None)``: still the probabilities (its callers
    multiply them by the values themselves), computed as the original does, with two fixes: the mask is added in
    the scores' dtype (the original's ``baddbmm(mask, ...)`` fails for a half mask under ``upcast_attention``), and
    a row whose keys are all masked gives zeros, not NaN. Wherever the routed methods run the original (see
    :func:`~npu_port.integrations.legacy_scope.attention_for`), so does this."""

    def get_attention_scores(self, query, key, attention_mask=None):
        if attention_for(owner) is None:
            return original(self, query, key, attention_mask)
        if attention_mask is not None and (
            not isinstance(attention_mask, Tensor) or not attention_mask.dtype.is_floating_point
        ):
            _fall_back(self, "get_attention_scores")
            return original(self, query, key, attention_mask)
        dtype = query.dtype
        if self.upcast_attention:
            query, key = query.float(), key.float()
        scores = torch.bmm(query, key.transpose(-1, -2)) * self.scale
        if attention_mask is not None:
            scores = scores + attention_mask.to(scores.dtype)
        if self.upcast_softmax:
            scores = scores.float()
        probs = scores.softmax(dim=-1)
        if attention_mask is not None:
            dead = ~masks.keep_from_additive(attention_mask).any(dim=-1, keepdim=True)
            probs = probs.masked_fill(dead, 0.0)
        return probs.to(dtype)

    return _mark(get_attention_scores, original)


def ignored_xformers_setter(cls: type, original: Callable[..., Any]) -> Callable[..., None]:
    """A ``set_use_memory_efficient_attention_xformers`` that does nothing but say so, once per class."""
    said = []

    def set_use_memory_efficient_attention_xformers(self, *args: Any, **kwargs: Any) -> None:
        if not said:
            said.append(True)
            logger.warning(
                "npu-port: %s.set_use_memory_efficient_attention_xformers ignored; "
                "attention runs through npu-port's strategy",
                cls.__name__,
            )

    return _mark(set_use_memory_efficient_attention_xformers, original)
