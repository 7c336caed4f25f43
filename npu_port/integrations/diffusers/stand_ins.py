"""The stand-ins :mod:`.patches` puts in place of the globals through which kept processors reach attention:
``F.scaled_dot_product_attention`` (a :class:`RoutedFunctional` module, or the function itself) and diffusers'
``dispatch_attention_fn``. Inside a targeted module (:mod:`.routing`) each sends the call to its route's attention
function; anywhere else to the original, with the caller's arguments untouched.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable, List, Optional

import torch
import torch.nn.functional as real_functional

from .routing import current_route

SDPA = "scaled_dot_product_attention"


def _sdpa_arguments(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa


def routed_scaled_dot_product_attention(*args: Any, **kwargs: Any) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` that goes to the active route inside a targeted module."""
    route = current_route()
    if route is None:
        return real_functional.scaled_dot_product_attention(*args, **kwargs)
    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa = _sdpa_arguments(*args, **kwargs)
    return route.attend("sdpa", query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


class RoutedFunctional(types.ModuleType):
    """``torch.nn.functional`` as seen by a patched module: every name is the real one, read live on each access,
    except ``scaled_dot_product_attention``, which is :func:`routed_scaled_dot_product_attention`."""

    scaled_dot_product_attention = staticmethod(routed_scaled_dot_product_attention)

    def __init__(self) -> None:
        super().__init__(real_functional.__name__, real_functional.__doc__)

    def __getattr__(self, name: str) -> Any:
        return getattr(real_functional, name)

    def __dir__(self) -> List[str]:
        return dir(real_functional)

    def __repr__(self) -> str:
        return "<torch.nn.functional with scaled_dot_product_attention routed by npu-port>"


ROUTED_FUNCTIONAL = RoutedFunctional()


def _dispatch_arguments(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    attention_kwargs=None,
    *,
    backend=None,
    parallel_config=None,
    **unknown,
):
    """A dispatcher call's arguments, read as the diffusers adapter checked its signature to take them
    (``npu_port.upstream.diffusers.attention.DISPATCH_PARAMETERS``); ``unknown``: keywords newer than npu-port."""
    return (
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        attention_kwargs,
        parallel_config,
        unknown,
    )


def dispatcher_mask(mask: Optional[torch.Tensor], query: torch.Tensor, key: torch.Tensor) -> Optional[torch.Tensor]:
    """A mask as diffusers' native backend reads it: a 2-D ``(B, S_kv)`` one (for ``(B, S, H, D)`` query and key)
    becomes ``(B, 1, 1, S_kv)``; any other form is SDPA's already."""
    if mask is not None and mask.ndim == 2 and mask.shape[0] == query.shape[0] and mask.shape[1] == key.shape[1]:
        return mask[:, None, None, :]
    return mask


def routed_dispatch(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A ``dispatch_attention_fn`` that sends the call to the active route inside a targeted module.

    diffusers' dispatcher works in ``(B, S, H, D)``; the route gets ``(B, H, S, D)`` and the result is permuted back,
    as diffusers' native backend does; a 2-D ``(B, S_kv)`` mask becomes ``(B, 1, 1, S_kv)``, also as there. The
    per-processor ``backend`` pin is overridden (routing is the point). Two cases stay with diffusers, counted as
    declined: context parallelism (``parallel_config``; its ring/ulysses algorithms need diffusers' own backends)
    and backend-specific ``attention_kwargs`` (a sliding window for flash, say), which SDPA semantics cannot carry.
    """

    @functools.wraps(original)
    def dispatch_attention_fn(*args: Any, **kwargs: Any) -> torch.Tensor:
        route = current_route()
        if route is None:
            return original(*args, **kwargs)
        try:
            query, key, value, mask, dropout_p, is_causal, scale, gqa, extra, parallel, unknown = _dispatch_arguments(
                *args, **kwargs
            )
        except TypeError:  # more positional arguments than npu-port knows: a newer dispatcher
            unknown = {"(positional)": None}
        if unknown:  # an argument of a newer dispatcher: let diffusers run the call as it was made
            route.decline(f"dispatch_attention_fn argument(s) {', '.join(sorted(unknown))} not known to npu-port")
            return original(*args, **kwargs)
        if parallel is not None:
            route.decline("dispatch_attention_fn with parallel_config (context parallelism) runs diffusers' backend")
            return original(*args, **kwargs)
        if extra:
            route.decline(
                f"dispatch_attention_fn with attention_kwargs {sorted(extra)} runs diffusers' backend "
                "(backend-specific options have no SDPA equivalent)"
            )
            return original(*args, **kwargs)
        mask = dispatcher_mask(mask, query, key)
        query, key, value = (t.permute(0, 2, 1, 3) for t in (query, key, value))
        out = route.attend("dispatch", query, key, value, mask, dropout_p, is_causal, scale, gqa)
        return out.permute(0, 2, 1, 3)

    dispatch_attention_fn.__npu_port_original__ = original  # type: ignore[attr-defined]
    return dispatch_attention_fn
