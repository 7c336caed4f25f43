"""npu-port as a transformers attention implementation: a strategy applied to a pipeline routes its text encoders too.

Why: transformers models (CLIP, T5, UMT5: the text encoders of diffusers pipelines) compute attention through
``ALL_ATTENTION_FUNCTIONS`` (transformers' ``AttentionInterface``), chosen by ``config._attn_implementation``; on an
NPU their ``sdpa`` runs torch_npu's SDPA, which takes the slow path that builds the whole score matrix for T5's float
position bias, and the diffusers integration never saw those calls. Here:

* :func:`npu_port_attention_forward` has the interface's signature and hands the call to the strategy's router
  (the route of the model running now: :func:`~npu_port.integrations.diffusers.routing.current_route`), combining
  ``position_bias`` with the mask exactly as transformers' own ``sdpa_attention_forward`` does (same causal rule,
  same combined float mask from transformers' ``create_position_bias_mask``, key cropping, ``enable_gqa`` for
  grouped keys, ``(B, S, H, D)`` output and ``None`` weights). transformers' NPU-only rewrite of a float mask into a
  bool one is not copied: npu-port's kernels convert pure masks exactly and refuse what they cannot run, with reasons.
* :func:`register` / :func:`unregister` put ``"npu_port"`` into ``AttentionInterface`` and take it out again,
  counted across users; the last one leaves the interface exactly as it was.
* :func:`apply_to_transformers` points every config of a ``PreTrainedModel`` (its own, its sub-models', their
  ``sub_configs``) at ``"npu_port"`` and hooks the model so its calls find its route; the record's ``restore()``
  puts every config's value back. Applications stack: a config goes back to the value it had before the first one
  when the last one is restored, whatever the order; a config someone changed since is left as they set it.

The diffusers applier calls :func:`apply_to_transformers` for a pipeline's transformers components (text_encoder,
text_encoder_2, ...), and a bare ``PreTrainedModel`` target reaches it through its own target applier
(:mod:`npu_port.integrations`). transformers is imported only by these functions.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ..errors import NpuPortError
from ..weak import weak
from . import is_transformers_model
from .diffusers.routing import AttentionFn, Route, Tally, current_route, install_route_hooks

#: The name in transformers' AttentionInterface (``config._attn_implementation``).
IMPLEMENTATION = "npu_port"
#: The path routed calls are counted under (``handle.applied.calls``).
PATH = "transformers"

_LOCK = threading.RLock()
_USERS = 0
_MISSING = object()
_saved: Any = _MISSING  # [(table, its entry under IMPLEMENTATION before the first registration)]


class NotRoutedError(NpuPortError):
    """A model set to npu_port's attention ran a call outside any model a strategy routes."""


def _no_route(module: Any) -> NotRoutedError:
    return NotRoutedError(
        f"{type(module).__name__} runs attention implementation {IMPLEMENTATION!r} outside a model npu-port routes "
        "(a copy of a model made while a strategy was applied to it, or a part of it called on its own), so no "
        "strategy is there to run it; call the model the strategy was applied to, or set another implementation: "
        "model.set_attn_implementation('sdpa')"
    )


def npu_port_attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    position_bias: Optional[Tensor] = None,
    cache: Any = None,
    **kwargs: Any,
) -> Tuple[Tensor, None]:
    """transformers' attention interface: ``(B, H, S, D)`` query / key / value in, ``((B, S, H, D) output, None)``
    out, computed by the running model's strategy. Semantics of transformers' ``sdpa_attention_forward``."""
    from transformers.integrations import sdpa_attention as reference

    route = current_route()
    if route is None:
        raise _no_route(module)
    if kwargs.get("softcap") is not None:
        raise ValueError(
            f"attention implementation {IMPLEMENTATION!r} does not support `softcap` (neither does transformers' "
            "`sdpa`); use `eager` or `flex_attention` for this model"
        )
    if kwargs.get("output_attentions", False):
        reference.logger.warning_once(
            f"`{IMPLEMENTATION}` attention does not support `output_attentions=True`; set the attention "
            "implementation to `eager` for attention weights."
        )
    if isinstance(cache, reference.PagedAttentionCache):
        key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx, kwargs=kwargs)

    enable_gqa = getattr(module, "num_key_value_groups", 1) > 1  # SDPA's grouped keys: repeat_kv's result, exactly
    q_length, kv_length = query.shape[2], key.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(q_length > 1 and attention_mask is None and is_causal)
    if is_causal and q_length > 1 and kv_length > q_length:  # a prefill into a longer static cache: as sdpa does
        key, value = key[:, :, :q_length, :], value[:, :, :q_length, :]
        if position_bias is not None:
            position_bias = position_bias[:, :, :, :q_length]
    if position_bias is not None:
        attention_mask = reference.create_position_bias_mask(position_bias, attention_mask, is_causal, query, key)
        is_causal = False

    output = route.attend(
        PATH, query, key, value, attention_mask, dropout_p=dropout, is_causal=is_causal, scale=scaling,
        enable_gqa=enable_gqa,
    )  # fmt: skip
    output = output.reshape(output.shape[0], -1, q_length, value.shape[-1])
    return output.transpose(1, 2).contiguous(), None


# ---- registration in transformers' AttentionInterface -----------------------------------------------------------


def _tables() -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """transformers' two class-wide tables: attention functions, and the mask builders models pick by the same name."""
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    return AttentionInterface._global_mapping, AttentionMaskInterface._global_mapping


def register() -> None:
    """Put ``"npu_port"`` into transformers' ``AttentionInterface``, and into ``AttentionMaskInterface`` with
    ``sdpa``'s mask builder (an implementation without one gets no mask at all: padding would be attended), counted;
    the first call does the work."""
    global _USERS, _saved
    with _LOCK:
        if _USERS == 0:
            from transformers.masking_utils import sdpa_mask

            functions, masks = _tables()
            _saved = [(table, table.get(IMPLEMENTATION, _MISSING)) for table in (functions, masks)]
            functions[IMPLEMENTATION] = npu_port_attention_forward
            masks[IMPLEMENTATION] = sdpa_mask
        _USERS += 1


def unregister() -> None:
    """One user fewer; the last one leaves both interfaces exactly as they were before the first."""
    global _USERS, _saved
    with _LOCK:
        if _USERS == 0:
            return
        _USERS -= 1
        if _USERS:
            return
        for table, old in _saved:
            if old is _MISSING:
                table.pop(IMPLEMENTATION, None)
            else:
                table[IMPLEMENTATION] = old
        _saved = _MISSING


def registered() -> bool:
    with _LOCK:
        return _USERS > 0


# ---- configs: set, stacked, put back ----------------------------------------------------------------------------


class _ConfigLayer:
    """One config set to npu_port: the value it had before the first application, and how many hold it."""

    __slots__ = ("config", "original", "users")

    def __init__(self, config: Any, original: Any) -> None:
        self.config = weakref.ref(config)
        self.original = original
        self.users = 0


#: id(config) -> its layer (configs define __eq__, so they are not hashable; entries go when the config is freed).
_CONFIGS: Dict[int, _ConfigLayer] = {}


def _forget(key: int, layer: _ConfigLayer) -> None:
    with _LOCK:
        if _CONFIGS.get(key) is layer:
            del _CONFIGS[key]


def _hold(config: Any) -> None:
    with _LOCK:
        layer = _CONFIGS.get(id(config))
        if layer is None or layer.config() is not config:
            layer = _CONFIGS[id(config)] = _ConfigLayer(config, config._attn_implementation_internal)
            weakref.finalize(config, _forget, id(config), layer)
        layer.users += 1
        config._attn_implementation_internal = IMPLEMENTATION


def _release(config: Any) -> bool:
    """One application fewer on ``config``; the last puts its value back. False: changed since, left alone."""
    with _LOCK:
        layer = _CONFIGS.get(id(config))
        if layer is None or layer.config() is not config:
            return True
        layer.users -= 1
        if layer.users > 0:
            return True
        del _CONFIGS[id(config)]
        if config._attn_implementation_internal != IMPLEMENTATION:
            return False
        config._attn_implementation_internal = layer.original
        return True


def held_configs() -> int:
    """Configs set to npu_port by an application now (for tests: back to 0 once every handle is restored)."""
    with _LOCK:
        return len(_CONFIGS)


def _configs(model: Any) -> List[Any]:
    """Every config the model's attention may read: each sub-model's and, recursively, their ``sub_configs``."""
    found: Dict[int, Any] = {}
    queue = [m.config for m in model.modules() if is_transformers_model(m)]
    while queue:
        config = queue.pop(0)
        if id(config) in found:
            continue
        found[id(config)] = config
        queue += [getattr(config, key) for key in getattr(config, "sub_configs", {}) if getattr(config, key, None)]
    return list(found.values())


class TextModelState(NamedTuple):
    """One transformers model of a target: its name, its class, the implementation it had, and what it has now."""

    name: str
    model: str
    original: str
    now: str


class AppliedTransformers:
    """A strategy applied to transformers models (a pipeline's text encoders, or one model): :meth:`restore` puts
    back each config's implementation and removes the hooks (idempotent). ``calls``: routed calls by path."""

    def __init__(self, target: Any, tally: Optional[Tally] = None) -> None:
        self._target = weak(target)
        self.tally = tally if tally is not None else Tally()
        self.models: List[Tuple[str, "weakref.ref[Any]", str]] = []  # (name, model, implementation it had)
        self.left_alone: List[str] = []
        self.own_code: List[str] = []  # a pipeline's models that compute attention in their own code: not routed
        self._configs: List[Any] = []
        self._hooks: List[Any] = []
        self._registered = False
        self.restored = False

    @property
    def target(self) -> Any:
        return self._target()

    @property
    def calls(self) -> Counter:
        return self.tally.calls

    @property
    def total_calls(self) -> int:
        return self.tally.total

    def add(self, name: str, model: Any, attention_fn: AttentionFn) -> None:
        """Route ``model``'s attention (every config it reads) to ``attention_fn``, counted under ``name``."""
        if not self._registered:
            register()
            self._registered = True
        self.models.append((name, weakref.ref(model), str(model.config._attn_implementation)))
        route = Route(attention_fn, name, self.tally)
        for config in _configs(model):
            self._configs.append(config)  # before the change: a failure half-way is undone by restore()
            _hold(config)
        for sub in model.modules():
            if is_transformers_model(sub):
                self._hooks.extend(install_route_hooks(sub, route))

    def counts(self) -> Dict[str, int]:
        return {"text models": len(self.models)}

    def states(self) -> List[TextModelState]:
        states = []
        for name, ref, original in self.models:
            model = ref()
            now = "freed" if model is None else str(model.config._attn_implementation)
            states.append(TextModelState(name, type(model).__name__ if model is not None else "-", original, now))
        return states

    def describe(self) -> str:
        state = "restored" if self.restored else "active"
        lines = [f"{len(self.models)} transformers models ({state}): attention implementation {IMPLEMENTATION!r}"]
        for s in self.states():
            lines.append(f"  {s.name or s.model}: {s.model}, {s.original} -> {s.now}")
        if self.tally.calls.get(PATH):
            lines.append(f"  transformers attention calls routed: {self.tally.calls[PATH]}")
        if self.own_code:
            lines.append(
                f"  not routed (attention in their own code, not AttentionInterface): {', '.join(self.own_code)}"
            )
        if self.left_alone:
            lines.append(f"  implementation changed since, kept on restore: {', '.join(self.left_alone)}")
        return "\n".join(lines)

    def restore(self) -> None:
        if self.restored:
            return
        self.restored = True
        for hook in reversed(self._hooks):
            hook.remove()
        self._hooks.clear()
        for config in reversed(self._configs):
            if not _release(config):
                self.left_alone.append(type(config).__name__)
        self._configs.clear()
        if self._registered:
            unregister()
            self._registered = False

    def __repr__(self) -> str:
        return f"<AppliedTransformers {len(self.models)} models; {'restored' if self.restored else 'active'}>"


def text_models(components: List[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    """The transformers models among ``(name, component)`` pairs (a pipeline's text encoders, image encoders)."""
    return [(name, c) for name, c in components if is_transformers_model(c)]


def apply_to_transformers(
    target: Any,
    attention_fn: Optional[AttentionFn],
    *,
    processor_factory: Optional[Callable[[], Any]] = None,
    models: Optional[List[Tuple[str, Any]]] = None,
    tally: Optional[Tally] = None,
) -> AppliedTransformers:
    """Route the attention of ``models`` (default: ``target`` itself, a ``PreTrainedModel``) to ``attention_fn``.

    The target applier for transformers models, and what the diffusers applier calls for a pipeline's transformers
    components. All or nothing: a failure part-way undoes what was done. ``processor_factory`` (the
    ``custom-processor`` strategy) installs diffusers processors, which transformers models do not have: refused.
    """
    if processor_factory is not None or attention_fn is None:
        raise TypeError(
            f"custom-processor installs diffusers attention processors; {type(target).__name__} is a transformers "
            "model, whose attention is an implementation, not a processor: give a kernel strategy (sdpa, npu, ...)"
        )
    if not callable(attention_fn):
        raise TypeError(f"attention_fn must be callable, got {type(attention_fn).__name__}")
    chosen = models if models is not None else [("", target)]
    own_code = [(n, m) for n, m in chosen if not type(m)._can_set_attn_implementation()]
    if models is None and own_code:
        raise ValueError(
            f"{type(target).__name__} computes attention in its own code, not through transformers' "
            "AttentionInterface (transformers' own set_attn_implementation refuses it too), so npu-port cannot route it"
        )
    applied = AppliedTransformers(target, tally)
    applied.own_code = [f"{n} ({type(m).__name__})" for n, m in own_code]
    try:
        for name, model in chosen:
            if (name, model) not in own_code:
                applied.add(name, model, attention_fn)
    except BaseException:
        applied.restore()
        raise
    return applied
