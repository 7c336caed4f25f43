"""npu-port as a diffusers attention backend: ``"npu_port"`` in diffusers' attention dispatcher registry, with
context parallelism, so that ``model.enable_parallelism(...)`` accepts it and its processors send every attention
core here.

Why a backend of our own: diffusers' CP machinery (``_cp_plan`` hooks, the device mesh) is right and we use it, but
the backends it can run on an Ascend NPU cannot do ring attention (``_native_npu`` refuses ``return_lse``), and its
ring passes each rank's mask to every rank's keys. Here each call goes to an npu-port kernel — the applied
strategy's (its router, when a strategy routes the model), else :func:`npu_port.attention`'s choice — with masks
widened once and ``is_causal`` kept; under context parallelism :mod:`.sequence` runs Ulysses / ring with the
log-sum-exp.

diffusers names its backends with the ``AttentionBackendName`` enum; the member ``NPU_PORT`` is added to it while the
backend is registered and removed with it: :func:`register` is counted, and the last :func:`unregister` leaves the
enum and the registry exactly as they were.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..attn.api import attention
from ..integrations.diffusers.routing import current_route
from ..integrations.diffusers.stand_ins import dispatcher_mask
from ..upstream.diffusers import dispatch
from ..weak import Memo, tensor_version
from .sequence import SequenceGroups, check_call, context_parallel_attention, gather_key_mask, key_mask

#: The backend's name in diffusers (``model.set_attention_backend("npu_port")``) and its enum member's name.
BACKEND = "npu_port"
MEMBER = "NPU_PORT"

_LOCK = threading.RLock()
_USERS = 0


#: The key masks gathered, kept while the same tensor (same version) comes back: a model's layers pass the same mask
#: object call after call, so it crosses the network once per forward, not once per layer. Keyed on the tensor the
#: caller passed (``source``), not on its widened form: widening a 2-D or 3-D mask makes a new view at every call.
_GATHERED = Memo(capacity=4)


def _gathered(source: Tensor, mask: Tensor, groups: SequenceGroups) -> Tensor:
    """``mask`` (``source`` as the caller passed it, widened) gathered over ``groups``, or the copy kept for
    ``source``; a mask made under ``torch.inference_mode()`` has no version counter and is gathered every time."""
    kept_groups, gathered = _GATHERED.get(
        source, tensor_version(source), id(groups), lambda: (groups, gather_key_mask(mask, groups))
    )
    return gathered if kept_groups is groups else gather_key_mask(mask, groups)


def _attention_lse(*args: Any, **kwargs: Any) -> Tuple[Tensor, Tensor]:
    return attention(*args, return_lse=True, **kwargs)


def _kernels() -> Tuple[Callable[..., Tensor], Callable[..., Tuple[Tensor, Tensor]]]:
    """The attention function and its log-sum-exp form for this call: the active route's (a strategy's router),
    else npu_port.attention with the active selector."""
    route = current_route()
    if route is None:
        return attention, _attention_lse
    function = route.attention_fn
    return function, getattr(function, "attention_lse", _attention_lse)


def _groups(cp: Any) -> SequenceGroups:
    """The groups of a diffusers ``ContextParallelConfig``, read once and kept on it (an unhashable dataclass)."""
    groups = getattr(cp, "_npu_port_groups", None)
    if groups is None:
        groups = SequenceGroups.from_config(cp)
        cp._npu_port_groups = groups
    return groups


def npu_port_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    _parallel_config: Any = None,
):
    """The backend: diffusers' ``(B, S, H, D)`` layout in and out; ``lse`` as ``(B, S, H)`` float32."""
    function, with_lse = _kernels()
    cp = getattr(_parallel_config, "context_parallel_config", None)
    if cp is None:
        attn_mask = dispatcher_mask(attn_mask, query, key)
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        run = with_lse if return_lse else function
        out = run(q, k, v, attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        if return_lse:
            return out[0].transpose(1, 2), out[1].transpose(1, 2)
        return out.transpose(1, 2)
    groups = _groups(cp)
    check_call(query, key, value, dropout_p, is_causal, enable_gqa, groups)
    mask = key_mask(attn_mask, query.shape[0], query.shape[2], key.shape[1])
    if mask is not None:
        mask = _gathered(attn_mask, mask, groups)

    def attend(q: Tensor, k: Tensor, v: Tensor, m: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        out, lse = with_lse(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), m, scale=scale)
        return out.transpose(1, 2), lse.transpose(1, 2)

    def attend_plain(q: Tensor, k: Tensor, v: Tensor, m: Optional[Tensor]) -> Tensor:
        return function(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), m, scale=scale).transpose(1, 2)

    return context_parallel_attention(query, key, value, mask, groups, attend, return_lse, attend_plain)


# ---- registration -----------------------------------------------------------------------------------------------

_UNDO: List[Callable[[], None]] = []  # what the first register() changed in diffusers (npu_port.upstream)


def register() -> Any:
    """Register the backend with diffusers (counted; the first call does the work). Returns the enum member.
    Context parallelism checks first that diffusers has the pieces (:func:`npu_port.parallel.require`)."""
    global _USERS
    with _LOCK:
        if _USERS == 0:
            member, undo = dispatch.add_backend(BACKEND, MEMBER, npu_port_attention)
            _UNDO.append(undo)
        else:
            member = dispatch.backend_member(BACKEND)
        _USERS += 1
        return member


def unregister() -> None:
    """One user fewer; the last one puts diffusers' enum and registry back exactly as they were."""
    global _USERS
    with _LOCK:
        if _USERS == 0:
            return
        _USERS -= 1
        if _USERS:
            return
        while _UNDO:
            _UNDO.pop()()


def registered() -> bool:
    with _LOCK:
        return _USERS > 0


def attention_processors(model: torch.nn.Module) -> List[Any]:
    """The processors of ``model``'s diffusers attention modules that take a dispatcher backend (those with an
    ``_attention_backend`` attribute: the ones ``enable_parallelism`` configures), each once."""
    seen: Dict[int, Any] = {}
    for module in model.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "_attention_backend"):
            seen.setdefault(id(processor), processor)
    return list(seen.values())
