"""Recording a model's attention calls on this machine: what a plan for another device is made from.

Two kinds of call are recorded while ``run()`` runs:

- **routed**: every call a strategy routes passes through one place, :meth:`StrategyRouter._select` (the diffusers
  integration's processors and patched globals, the flash_attn / xformers drop-ins, legacy attention and
  ``npu_port.attention(kernel=None)`` all reach a router, whether it was applied to a model or process-wide).
  :class:`RecordingRouter` is a router that notes each call there and computes it here with ``sdpa`` (``math`` for
  what sdpa refuses), so the model's outputs — and so the calls that follow — are what they would be.
- **not routed**: a direct ``torch.nn.functional.scaled_dot_product_attention`` that no integration routes (a text
  encoder, a hand-written block). On an NPU, torch_npu's own SDPA runs it; the plan judges it with the ``sdpa``
  kernel. ``F.scaled_dot_product_attention`` is patched (reversibly, :mod:`npu_port._patching`) for the run; the
  calls our own kernels make to it while computing a routed call are not counted twice.

Only the first call of each :class:`~npu_port.plan.signature.Signature` is kept, as a stand-in without its data
(zero-memory tensors of the same shapes; the mask is kept, since its values matter), with a count.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _patching
from ..attn.call import AttentionCall
from ..attn.kernels.base import Kernel
from ..attn.target import Target
from ..errors import NpuPortError, PlanError
from ..reasons import Reason
from ..strategy.api import apply_router
from ..strategy.cast import stand_in_call
from ..strategy.registry import resolve
from ..strategy.router import StrategyRouter
from ..strategy.spec import Strategy
from ..upstream import declines
from .signature import Signature

#: The strategy the recording computes with, on this machine: sdpa, and the reference for what sdpa refuses.
RECORDING_STRATEGY = Strategy(
    name="plan-recording",
    description="records every attention call for npu-port plan; computes with sdpa, else math",
    candidates=("sdpa", "math"),
    select="first",
)
#: Where not-routed calls came from: at most this many distinct ``file:line`` per signature.
MAX_SITES = 3
#: The key of the SDPA patch in :mod:`npu_port._patching`.
PATCH_KEY = "plan.sdpa"

#: The pipeline components running now, innermost last (see :func:`_label_components`).
_COMPONENT: contextvars.ContextVar[Tuple[str, ...]] = contextvars.ContextVar("npu_port_plan_component", default=())
#: True while one of our kernels computes a routed call: its own calls to SDPA are not the model's.
_IN_KERNEL: contextvars.ContextVar[bool] = contextvars.ContextVar("npu_port_plan_in_kernel", default=False)


@dataclass
class Recorded:
    """One signature: how many calls had it, the first of them (a data-free stand-in), and for calls npu-port did
    not route the places in the code they came from."""

    signature: Signature
    count: int
    call: AttentionCall
    sites: List[str] = field(default_factory=list)
    components: List[str] = field(default_factory=list)  # the pipeline components that made these calls


class Recording:
    """The attention calls of one run, grouped by signature (first seen first). ``strategy``: what the run stands in
    for (:func:`npu_port.plan.assess` judges with it unless told otherwise); ``result``: what ``run()`` returned;
    ``unreadable``: SDPA calls whose arguments npu-port's validation refused (message -> count; torch decided)."""

    def __init__(self, strategy: Any = "npu") -> None:
        self.strategy = strategy
        self.result: Any = None
        self.unreadable: Counter = Counter()
        #: integrations that declined in this process (a library lacks a piece): their calls ran on its own path
        self.declines: List[Dict[str, Any]] = []
        self._entries: Dict[Signature, Recorded] = {}
        self._lock = threading.Lock()

    @property
    def entries(self) -> List[Recorded]:
        return list(self._entries.values())

    @property
    def calls(self) -> int:
        """All recorded calls (the sum of the signatures' counts)."""
        return sum(entry.count for entry in self._entries.values())

    @property
    def routed(self) -> int:
        return sum(entry.count for entry in self._entries.values() if entry.signature.routed)

    def add(self, call: AttentionCall, routed: bool, site: Optional[str] = None) -> Signature:
        """Count ``call`` under its signature (keeping a data-free copy of the first one)."""
        signature = Signature.of(call, routed)
        with self._lock:
            entry = self._entries.get(signature)
            if entry is None:
                entry = self._entries[signature] = Recorded(signature, 0, _without_data(call, signature.grad))
            entry.count += 1
            if site is not None and site not in entry.sites and len(entry.sites) < MAX_SITES:
                entry.sites.append(site)
            running = _COMPONENT.get()
            if running and running[-1] not in entry.components:
                entry.components.append(running[-1])
        return signature

    def __repr__(self) -> str:
        return f"<Recording {self.calls} attention calls in {len(self._entries)} signatures>"


def _without_data(call: AttentionCall, grad: bool) -> AttentionCall:
    """``call`` with zero-memory query, key and value of the same shapes (a recording keeps no activations), needing
    gradients exactly when it did when recorded, and a private copy of the mask (the model may reuse its buffer)."""
    stand_in = stand_in_call(call, call.dtype)
    tensors = (stand_in.query, stand_in.key, stand_in.value)
    query, key, value = tensors if grad else (t.detach() for t in tensors)
    mask = call.mask
    if mask is not None:  # every tensor of the canonical mask copied, whatever fields it has
        copies = {
            f.name: getattr(mask, f.name).detach().clone()
            for f in dataclasses.fields(mask)
            if isinstance(getattr(mask, f.name), Tensor)
        }
        mask = dataclasses.replace(mask, **copies)
    return dataclasses.replace(stand_in, query=query, key=key, value=value, mask=mask)


class _Computing(Kernel):
    """A kernel chosen by the recording router, run with :data:`_IN_KERNEL` set (its SDPA calls are ours) and never
    prepared (so every call reaches the router and is counted)."""

    def __init__(self, inner: Kernel) -> None:
        super().__init__()
        self.inner = inner
        self.name = inner.name
        self.summary = inner.summary

    def reasons(self, call: AttentionCall, target: Optional[Target] = None) -> List[Reason]:
        return self.inner.reasons(call, target)

    @property
    def supports_lse(self) -> bool:  # type: ignore[override]
        return self.inner.supports_lse

    def run(self, call: AttentionCall) -> Tensor:
        token = _IN_KERNEL.set(True)
        try:
            return self.inner.run(call)
        finally:
            _IN_KERNEL.reset(token)

    def run_lse(self, call: AttentionCall) -> Tuple[Tensor, Tensor]:
        token = _IN_KERNEL.set(True)
        try:
            return self.inner.run_lse(call)
        finally:
            _IN_KERNEL.reset(token)


class RecordingRouter(StrategyRouter):
    """A router that records every call it is given, then computes it with :data:`RECORDING_STRATEGY`."""

    def __init__(self, recording: Recording) -> None:
        super().__init__(RECORDING_STRATEGY)
        self.recording = recording

    def _select(self, call: AttentionCall) -> Tuple[Kernel, bool]:
        self.recording.add(call, routed=True)
        kernel, settled = super()._select(call)
        return _Computing(kernel), settled


def _sdpa_arguments(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa


def _caller_site() -> Optional[str]:
    """``file:line`` of the code that called SDPA, past npu-port's own frames (a diffusers stand-in passing an
    unrouted call on); a file in an installed package is shown from the package (``transformers/...``)."""
    frame = sys._getframe(2)
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame = frame.f_back
    if frame is None:
        return None
    path = frame.f_code.co_filename
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            path = path.rsplit(marker, 1)[1]
            break
    return f"{path}:{frame.f_lineno}"


def _recording_sdpa(original: Callable[..., Tensor], recording: Recording) -> Callable[..., Tensor]:
    from ..integrations.transformers_attention import sdpa_call_is_routed

    def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Tensor:
        if not _IN_KERNEL.get() and not sdpa_call_is_routed():
            try:
                call = AttentionCall.from_arguments(*_sdpa_arguments(*args, **kwargs))
            except TypeError:
                pass  # arguments SDPA itself will refuse, with its own message
            except NpuPortError as exc:
                recording.unreadable[str(exc).splitlines()[0]] += 1
            else:
                recording.add(call, routed=False, site=_caller_site())
        return original(*args, **kwargs)

    scaled_dot_product_attention.__npu_port_original__ = original  # type: ignore[attr-defined]
    return scaled_dot_product_attention


class _Enter:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, _module: Any, _args: Any) -> None:
        _COMPONENT.set(_COMPONENT.get() + (self.name,))


class _Leave(_Enter):
    def __call__(self, _module: Any, _args: Any, _output: Any) -> None:  # type: ignore[override]
        running = _COMPONENT.get()
        if running and running[-1] == self.name:
            _COMPONENT.set(running[:-1])


def _label_components(target: Any) -> List[Any]:
    """Forward hooks that name the pipeline component (``text_encoder``, ``transformer``, ``vae``...) each call comes
    from, on every component of a pipeline and its direct children (a VAE runs through ``decode``, not ``forward``,
    but its ``decoder`` child runs ``forward``). Returns the hook handles; nothing for a target that is no pipeline."""
    components = getattr(target, "components", None)
    if not isinstance(components, dict):
        return []
    handles: List[Any] = []
    for name, component in components.items():
        if not isinstance(component, torch.nn.Module):
            continue
        for module in (component, *component.children()):
            handles.append(module.register_forward_pre_hook(_Enter(name)))
            handles.append(module.register_forward_hook(_Leave(name), prepend=True, always_call=True))
    return handles


def recording_strategy(strategy: Any) -> Strategy:
    """``strategy`` resolved and checked to route calls to kernels (what a plan can judge); :class:`PlanError`
    for ``custom-processor``, which hands attention to the user's processor instead."""
    spec = resolve(strategy)
    if spec.is_custom_processor:
        raise PlanError(
            f"strategy {spec.name!r} installs a processor class and routes no call to a kernel: there is nothing to "
            "plan; give a kernel strategy (npu, auto, sdpa, ...)"
        )
    return spec


def record_calls(run: Callable[[], Any], target_model: Any = None, strategy: Any = "npu") -> Recording:
    """Run ``run()`` here and record every attention call it makes (see the module docstring).

    ``target_model``: what the recording strategy is applied to (a diffusers pipeline or model: its attention is
    routed as the strategy would route it on the device); None applies it process-wide (``npu_port.attention``,
    drop-ins, legacy attention). ``strategy``: the strategy the run stands for, checked now and kept on the
    recording for :func:`~npu_port.plan.assess`. Everything is restored afterwards, also when ``run()`` raises.
    """
    recording_strategy(strategy)
    recording = Recording(strategy)
    handle = apply_router(RecordingRouter(recording), target_model)
    hooks = _label_components(target_model)
    try:
        patch = _patching.replace(
            F, "scaled_dot_product_attention", _recording_sdpa(F.scaled_dot_product_attention, recording), key=PATCH_KEY
        )
        try:
            recording.result = run()
        finally:
            _patching.release(patch)
            text_models = handle.report().get("text_models", []) if target_model is not None else []
    finally:
        for hook in hooks:
            hook.remove()
        handle.restore()
        recording.declines = [decline.as_dict() for decline in declines()]
    for model in text_models:  # a model npu-port leaves on its library's own attention (eager, its own code)
        if not model["routed"]:
            name = model["name"] or model["model"]
            recording.declines.append({"message": f"{name} ({model['model']}): {model['reason']}", "model": name})
    return recording
