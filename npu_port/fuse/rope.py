"""``rope``: rotary position embeddings through ``torch_npu.npu_rotary_mul``, in the mode each family's RoPE needs.

The op computes ``r1 * x + r2 * rotate(x)`` with two documented rotations (torch_npu 2.13.0 docs)::

    half:        x1, x2 = torch.chunk(input, 2, -1); x_new = torch.cat((-x2, x1), dim=-1)
    interleave:  x1 = input[..., ::2]; x2 = input[..., 1::2]
                 x_new = rearrange(torch.stack((-x2, x1), dim=-1), "... d two -> ...(d two)", two=2)

on 4-D input (BNSD / BSND / SBND), D even and below 896, B and N below 1000 (half) or B * N below 1000
(interleave), where interleave takes r1 / r2 only as 11SD (BNSD), 1S1D (BSND) or S11D (SBND). How a model pairs its
channels decides the mode; read from diffusers 0.42.1's sources, not guessed:

* diffusers' shared ``models/embeddings.py::apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=-1,
  sequence_dim=2)``: with ``use_real_unbind_dim=-1`` it pairs channels (2i, 2i+1) —
  ``x.reshape(..., -1, 2).unbind(-1)``, then ``stack([-x_imag, x_real], -1).flatten(3)``: exactly ``interleave``; with
  ``-2`` it pairs (i, i + D/2) — ``cat([-x_imag, x_real])``: exactly ``half``. ``out = x.float() * cos +
  x_rotated.float() * sin``, cos and sin of shape (S, D) put at ``[None, None]`` (sequence_dim 2: x is BNSD, 11SD) or
  ``[None, :, None]`` (sequence_dim 1: BSND, 1S1D). Flux (``transformer_flux.py`` ``FluxAttnProcessor``,
  ``sequence_dim=1``), HunyuanVideo (``transformer_hunyuan_video.py``, ``sequence_dim=1``, imported at call time) and
  CogVideoX (``attention_processor.py`` ``CogVideoXAttnProcessor2_0``, BNSD) call it with the default -1: interleave.
  ``use_real=False`` (Lumina's complex form) is not an ``npu_rotary_mul`` form: the original runs.
* Wan (``transformer_wan.py`` ``WanAttnProcessor``) has its own RoPE, a closure inside the processor's ``__call__``:
  ``x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)``; ``out[..., 0::2] = x1 * cos[..., 0::2] - x2 * sin[..., 1::2]``;
  ``out[..., 1::2] = x1 * sin[..., 1::2] + x2 * cos[..., 0::2]`` on (B, S, H, D) with cos / sin of shape (1, S, 1, D):
  pairs (2i, 2i+1), so ``interleave`` with ``r1 = cos[..., 0::2]`` and ``r2 = sin[..., 1::2]`` each repeated per
  pair (equal to Wan's tables, whose pairs are repeated, and exact even if they were not). A closure cannot be
  patched, so the ``WanAttention`` module's forward is: it runs the original with ``rotary_emb=None`` while forward
  hooks on ``norm_q`` / ``norm_k`` rotate their outputs — the very tensors Wan rotates, one ``unflatten`` apart.
* LTX (``transformer_ltx.py::apply_rotary_emb``) rotates (B, S, heads * head_dim) with cos / sin of that same
  shape: not 4-D, and its per-head, per-batch tables are no 1S1D form; it is reported and left alone. Any other
  processor with a RoPE of its own is reported the same way.

All rotations are computed in float32 (``x.float()``, as diffusers does) and cast back to x's dtype. Patching the
shared function changes it for the whole process, every model included — harmless, since any call it cannot take
runs the original and the first call is checked, but said in ``explain()``.
"""

from __future__ import annotations

import inspect
import sys
import threading
import types
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from .. import _patching
from ..reasons import Reason
from ..upstream.diffusers import ops
from .backend import device_reason, dtype_reason
from .check import KEY_PREFIX, FusedCall, Site
from .plan import Context, FunctionSite, ModuleSite, OpPlan, Refusal, overrides_nothing

OP = "rope"
SHARED_NAME = "apply_rotary_emb"
#: diffusers' use_real_unbind_dim -> the npu_rotary_mul mode that pairs channels the same way.
MODES = {-1: "interleave", -2: "half"}
#: Processors read in diffusers 0.42.1 that call the shared function, with the mode their calls ask for.
SHARED_CALLERS = {
    "FluxAttnProcessor": "Flux: interleave (transformer_flux.py, use_real_unbind_dim=-1, sequence_dim=1)",
    "FluxIPAdapterAttnProcessor": "Flux: interleave (transformer_flux.py, use_real_unbind_dim=-1, sequence_dim=1)",
    "HunyuanVideoAttnProcessor2_0": "HunyuanVideo: interleave (transformer_hunyuan_video.py, -1, sequence_dim=1)",
    "CogVideoXAttnProcessor2_0": "CogVideoX: interleave (attention_processor.py, use_real_unbind_dim=-1, BNSD)",
    "FusedCogVideoXAttnProcessor2_0": "CogVideoX: interleave (attention_processor.py, use_real_unbind_dim=-1, BNSD)",
}
#: RoPE forms known not to fit npu_rotary_mul, by the module that defines them.
NOT_FUSABLE = {
    ops.LTX: (
        "LTX's RoPE rotates (batch, seq, heads*head_dim) with cos/sin of that same shape: npu_rotary_mul takes 4-D "
        "input, and interleave mode only 1S1D cos/sin (one table per position, shared by batch and heads)"
    ),
}


def _limits(d: int, mode: str, batch: int, heads: int) -> Optional[str]:
    if d % 2 or d >= 896:  # "D < 896，且为2的倍数"
        return f"head dim {d}: npu_rotary_mul needs an even D < 896"
    if mode == "interleave" and batch * heads >= 1000:  # "B * N < 1000"
        return f"B*N = {batch * heads}: interleave mode needs B * N < 1000"
    if mode == "half" and (batch >= 1000 or heads >= 1000):  # "B, N < 1000"
        return f"B = {batch}, N = {heads}: half mode needs B and N < 1000"
    return None


def _pair_reason(pair: Any, expected: Tuple[int, ...], form: str) -> Optional[str]:
    """None when ``pair`` is (cos, sin), each of shape ``expected``; else why not."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        return "the rotary tables are not a (cos, sin) pair"
    for table in pair:
        if not isinstance(table, torch.Tensor) or tuple(table.shape) != expected:
            shape = tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__
            return f"cos/sin of shape {shape}, not {form} = {expected}"
    return None


def _rotary_mul(torch_npu: Any, x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, mode: str) -> torch.Tensor:
    return torch_npu.npu_rotary_mul(x.float().contiguous(), r1, r2, rotary_mode=mode).to(x.dtype)


# ---------------------------------------------------------------------------------------------------------------
# diffusers' shared apply_rotary_emb


def _shared_site(where: str, torch_npu: Any) -> Tuple[Site, Any]:
    site = Site(OP, where, "torch_npu.npu_rotary_mul (interleave for use_real_unbind_dim=-1, half for -2)")

    def eligible(
        x: torch.Tensor, freqs_cis: Any, use_real: bool = True, use_real_unbind_dim: int = -1, sequence_dim: int = 2
    ) -> Optional[str]:
        if not use_real:
            return "use_real=False (complex frequencies): not an npu_rotary_mul form"
        mode = MODES.get(use_real_unbind_dim)
        if mode is None or sequence_dim not in (1, 2):
            return f"use_real_unbind_dim={use_real_unbind_dim}, sequence_dim={sequence_dim}: not a known form"
        why = device_reason(x) or dtype_reason(x)
        if why is not None:
            return why
        if x.dim() != 4:
            return f"{x.dim()}-D input: npu_rotary_mul takes 4-D"
        heads = x.shape[1] if sequence_dim == 2 else x.shape[2]
        return _pair_reason(freqs_cis, (x.shape[sequence_dim], x.shape[-1]), "(S, D)") or _limits(
            x.shape[-1], mode, x.shape[0], heads
        )

    def fused(
        x: torch.Tensor, freqs_cis: Any, use_real: bool = True, use_real_unbind_dim: int = -1, sequence_dim: int = 2
    ) -> torch.Tensor:
        cos, sin = freqs_cis
        s, d = cos.shape
        shape = (1, 1, s, d) if sequence_dim == 2 else (1, s, 1, d)  # 11SD for BNSD, 1S1D for BSND
        r1 = cos.to(device=x.device, dtype=torch.float32).reshape(shape)
        r2 = sin.to(device=x.device, dtype=torch.float32).reshape(shape)
        return _rotary_mul(torch_npu, x, r1, r2, MODES[use_real_unbind_dim])

    return site, (fused, eligible)


def _live_shared(embeddings: types.ModuleType) -> Optional[FusedCall]:
    patch = _patching.find(embeddings, SHARED_NAME, f"{KEY_PREFIX}:{OP}")
    if patch is not None and patch.live and isinstance(patch.replacement, FusedCall):
        return patch.replacement
    return None


# ---------------------------------------------------------------------------------------------------------------
# Wan's own RoPE (a closure in WanAttnProcessor.__call__): through the WanAttention module's forward

_wan_tables_lock = threading.Lock()
_wan_tables: Dict[str, Any] = {}


def _wan_r1_r2(cos: torch.Tensor, sin: torch.Tensor, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Wan's cos[..., 0::2] and sin[..., 1::2], each repeated per pair, in float32: built once per table, not per
    attention module (every block gets the same tables in one forward)."""
    key = (id(cos), cos._version, id(sin), sin._version, str(device))
    with _wan_tables_lock:
        entry = _wan_tables.get("last")
        if entry is not None and entry[0] == key:
            return entry[1], entry[2]
        r1 = cos[..., 0::2].to(device=device, dtype=torch.float32).repeat_interleave(2, dim=-1)
        r2 = sin[..., 1::2].to(device=device, dtype=torch.float32).repeat_interleave(2, dim=-1)
        _wan_tables["last"] = (key, r1, r2, cos, sin)  # holding cos / sin keeps their ids theirs
        return r1, r2


def _wan_site(where: str, module: nn.Module, processor_class: type, torch_npu: Any) -> ModuleSite:
    site = Site(OP, where, "torch_npu.npu_rotary_mul (interleave; Wan's RoPE)")
    lock = threading.Lock()  # the hooks live on shared norm modules for one call: one call at a time per module

    def build(original: Any) -> FusedCall:
        signature = inspect.signature(original)

        def eligible(*args: Any, **kwargs: Any) -> Optional[str]:
            bound = signature.bind(*args, **kwargs).arguments
            rotary = bound.get("rotary_emb")
            if rotary is None:
                return "no rotary_emb (cross-attention)"
            if type(module.processor) is not processor_class:
                return f"processor is {type(module.processor).__name__}, not Wan's own: its RoPE is not known"
            hidden = bound["hidden_states"]
            why = device_reason(hidden) or dtype_reason(hidden)
            if why is not None:
                return why
            heads, d = module.heads, module.inner_dim // module.heads
            return _pair_reason(rotary, (1, hidden.shape[1], 1, d), "1S1D") or _limits(
                d, "interleave", hidden.shape[0], heads
            )

        def fused(*args: Any, **kwargs: Any) -> torch.Tensor:
            bound = signature.bind(*args, **kwargs)
            cos, sin = bound.arguments["rotary_emb"]
            bound.arguments["rotary_emb"] = None
            hidden = bound.arguments["hidden_states"]
            r1, r2 = _wan_r1_r2(cos, sin, hidden.device)
            rotated: List[str] = []

            def rotate(norm: nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
                rotated.append(type(norm).__name__)
                x = output.unflatten(2, (module.heads, -1))  # (B, S, H, D): what Wan rotates
                return _rotary_mul(torch_npu, x, r1, r2, "interleave").flatten(2)

            with lock:
                hooks = [module.norm_q.register_forward_hook(rotate), module.norm_k.register_forward_hook(rotate)]
                try:
                    out = original(*bound.args, **bound.kwargs)
                finally:
                    for hook in hooks:
                        hook.remove()
            if len(rotated) != 2:  # the processor no longer normalises q and k once each: its RoPE would be wrong
                raise RuntimeError(
                    f"npu-port rope at {where}: expected norm_q and norm_k to run once each, saw {len(rotated)} "
                    "norm calls; Wan's processor changed — fuse_ops cannot place the rotation"
                )
            return out

        return FusedCall(site, original, fused, eligible)

    return ModuleSite(site, module, build)


# ---------------------------------------------------------------------------------------------------------------
# planning


def _call_code(cls: type) -> Optional[types.CodeType]:
    """The code of the ``__call__`` a processor class defines (nn.Module's own excluded)."""
    for klass in cls.__mro__:
        if klass in (object, nn.Module):
            continue
        call = vars(klass).get("__call__")
        if call is not None:
            return getattr(call, "__code__", None)
    return None


def _own_closure(code: types.CodeType) -> bool:
    return any(isinstance(c, types.CodeType) and c.co_name == SHARED_NAME for c in code.co_consts)


def plan(ctx: Context) -> OpPlan:
    """Every RoPE of the target's attention processors: diffusers' shared function, Wan's, or a refusal."""
    result = OpPlan(OP)
    found, declined = ops.find(ops.ROPE, ctx.modules, strict=ctx.strict)
    result.decline(declined)  # processors calling the shared function keep diffusers' own RoPE
    embeddings = ops.owner(SHARED_NAME) if found else None
    live = _live_shared(embeddings) if embeddings is not None else None  # read now: another handle may have patched it
    shared = live.original if live is not None else getattr(embeddings, SHARED_NAME, None)
    wan, declined_wan = ops.find(ops.WAN_ROPE, ctx.modules, strict=ctx.strict)
    result.decline(declined_wan)  # Wan's attention keeps its own RoPE
    wan_attention, wan_processor = wan.get("WanAttention"), wan.get("WanAttnProcessor")
    shared_owners: Dict[str, types.ModuleType] = {}
    families: Dict[str, int] = {}
    own: Dict[type, Tuple[List[str], Reason]] = {}
    wan_modules: List[Tuple[str, nn.Module]] = []
    for name, module in ctx.modules:
        processor = getattr(module, "processor", None)
        if processor is None:
            continue
        cls = type(processor)
        where = name or type(module).__name__
        if overrides_nothing(module, wan_attention) and cls is wan_processor:
            if not getattr(module, "is_cross_attention", False):  # Wan's cross-attention gets no rotary_emb
                wan_modules.append((where, module))
            continue
        code = _call_code(cls)
        if code is None:
            continue
        owner = sys.modules.get(cls.__module__)
        if SHARED_NAME in code.co_names and declined is not None:
            continue  # diffusers' shared function could not be found: declined above, not a RoPE of its own
        if declined_wan is not None and cls.__name__.startswith("Wan"):
            continue  # Wan's classes could not be found: declined above
        if SHARED_NAME in code.co_names:
            held = vars(owner).get(SHARED_NAME) if owner is not None else None
            if shared is not None and (held is None or held is shared or held is live):
                if held is not None:
                    shared_owners[owner.__name__] = owner
                label = SHARED_CALLERS.get(cls.__name__, f"{cls.__qualname__}: mode per call (use_real_unbind_dim)")
                families[label] = families.get(label, 0) + 1
                continue
            why = NOT_FUSABLE.get(cls.__module__, f"{cls.__module__}.{SHARED_NAME} is a RoPE of its own")
        elif _own_closure(code):
            why = NOT_FUSABLE.get(cls.__module__, f"{cls.__qualname__} computes RoPE in a closure of its own")
        else:
            continue
        places, _ = own.setdefault(cls, ([], Reason("rope-form", why)))
        places.append(where)
    for cls, (places, reason) in own.items():
        shown = places[0] if len(places) == 1 else f"{places[0]} and {len(places) - 1} more ({cls.__name__})"
        result.refusals.append(Refusal(OP, shown, reason))
    if not families and not wan_modules:
        if not own and not result.declines:
            result.notes.append("rope: no rotary embedding in this model's attention processors")
        return result
    if ctx.torch_npu is None:
        return result.refuse_op(ctx.torch_npu_reason)
    for label, count in families.items():
        result.notes.append(f"rope: {count} attention modules: {label}")
    if families:
        owners = [(embeddings, SHARED_NAME)] + [(m, SHARED_NAME) for m in shared_owners.values()]
        names = [embeddings.__name__] + list(shared_owners)
        where = " + ".join(f"{n}.{SHARED_NAME}" for n in names)
        if live is not None:  # another handle installed it: share its site and first-call check
            result.sites.append(FunctionSite(live.site, owners, lambda current: live))
        else:
            site, (fused, eligible) = _shared_site(where, ctx.torch_npu)
            call: List[FusedCall] = []

            def build(current: Any) -> FusedCall:
                if not call:
                    call.append(FusedCall(site, current, fused, eligible))
                return call[0]

            result.sites.append(FunctionSite(site, owners, build))
        result.notes.append(
            f"rope: {SHARED_NAME} is patched process-wide ({where}); calls it cannot take run the original"
        )
    for where, module in wan_modules:
        result.sites.append(_wan_site(where, module, wan_processor, ctx.torch_npu))
    if wan_modules:
        result.notes.append(f"rope: {len(wan_modules)} attention modules: Wan: interleave (transformer_wan.py)")
    return result
