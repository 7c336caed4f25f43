"""Classifier-free guidance over two ranks: one computes the conditional half, the other the unconditional one, and
the two results are exchanged once per step.

Pipelines run guidance in one of two ways, and both are handled by a diffusers hook on the denoiser:

* ``batch`` — one call on the concatenated batch (Stable Diffusion, SDXL, SD3, PixArt, DiT:
  ``torch.cat([latents] * 2)``): each rank runs its half of the batch; the halves are gathered back.
* ``alternate`` — two calls per step, conditional first (Flux's true CFG, Wan, QwenImage, under diffusers'
  ``cache_context("cond")`` / ``("uncond")``): rank 0 runs the first call, rank 1 the second, and each returns at once
  from the call it skips (rank 1 runs the first call once, on the first step, to learn the output's shape and form).
  The exchange happens in the second call: rank 0 gets the unconditional result as that call's output; rank 1 fills
  the placeholder it returned from the first call, in place, before the pipeline combines the two. The placeholder
  starts as NaN, so a pipeline that read it before the second call would end in a non-finite image — which
  ``npu-port infer`` refuses — never in a silently wrong one.

Both ranks keep the same latents (same seed) and run the same scheduler steps. ``auto`` picks the mode from the
pipeline's ``__call__`` (diffusers marks the two-call form with ``cache_context("uncond")``).
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Optional, Tuple

import torch
from torch import Tensor

from ..errors import ParallelError
from .sequence import all_gather_stacked

CFG_MODES = ("auto", "batch", "alternate")
HOOK_NAME = "npu_port_cfg_parallel"


def guidance_mode(pipe: Any, requested: str = "auto") -> str:
    """``batch`` or ``alternate`` for ``pipe`` (see the module docstring), or one clear error."""
    if requested not in CFG_MODES:
        raise ParallelError(f"unknown cfg mode {requested!r}; valid modes: {', '.join(CFG_MODES)}")
    if requested != "auto":
        return requested
    try:
        source = inspect.getsource(type(pipe).__call__)
    except (OSError, TypeError):
        source = ""
    if re.search(r"""cache_context\(\s*["']uncond["']""", source):
        return "alternate"
    if "[latents] * 2" in source or "[latent_model_input] * 2" in source:
        return "batch"
    raise ParallelError(
        f"cannot tell how {type(pipe).__name__} runs classifier-free guidance (one call on a doubled batch, or a "
        "conditional then an unconditional call); pass cfg_mode='batch' or cfg_mode='alternate'"
    )


def _output_tensor(output: Any) -> Tensor:
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    sample = getattr(output, "sample", None)
    if isinstance(sample, Tensor):
        return sample
    raise ParallelError(f"CFG parallel: the denoiser returned {type(output).__name__}, not a tensor or a sample")


def _with_tensor(output: Any, tensor: Tensor) -> Any:
    if isinstance(output, Tensor):
        return tensor
    if isinstance(output, tuple):
        return (tensor,) + tuple(output[1:])
    if isinstance(output, list):
        return [tensor] + list(output[1:])
    output.sample = tensor
    return output


def _hidden_states(args: Tuple[Any, ...], kwargs: dict) -> Tensor:
    for name in ("hidden_states", "sample"):
        if isinstance(kwargs.get(name), Tensor):
            return kwargs[name]
    if args and isinstance(args[0], Tensor):
        return args[0]
    raise ParallelError("CFG parallel: the denoiser was called without hidden_states / sample")


class GuidanceSplitHook:
    """The diffusers ``ModelHook`` (built by :func:`make_hook`) that runs one guidance half per rank."""

    def __init__(self, mode: str, group: Any, rank: int) -> None:
        self.mode = mode
        self.group = group
        self.rank = rank  # alternate: 0 runs the first (conditional) call, 1 the second; batch: 0 the first half
        self.calls = 0
        self.placeholder: Optional[Tensor] = None  # rank 1's answer to the first call, filled in the second
        self.sent: Optional[Tensor] = None  # rank 0's conditional result, sent in the second call
        self.output_like: Optional[Tuple[Any, ...]] = None  # the denoiser's output: shape, dtype, device, structure
        self.exchanges = 0

    # ---- batch ----------------------------------------------------------------------------------------------

    def _batch(self, forward: Any, args: Tuple[Any, ...], kwargs: dict) -> Any:
        batch = _hidden_states(args, kwargs).shape[0]
        if batch % 2:
            raise ParallelError(
                f"CFG parallel (batch mode): the denoiser got a batch of {batch}, not the doubled batch of a guided "
                "step; run without cfg parallelism, or with cfg_mode='alternate' for a pipeline that calls twice"
            )
        half = batch // 2

        def mine(value: Any) -> Any:  # nested too: SDXL's added_cond_kwargs carry the batch in a dict
            if isinstance(value, Tensor) and value.ndim and value.shape[0] == batch:
                return value[self.rank * half : (self.rank + 1) * half]
            if isinstance(value, dict):
                return {k: mine(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
                return type(value)(mine(v) for v in value)
            return value

        output = forward(*(mine(a) for a in args), **{k: mine(v) for k, v in kwargs.items()})
        tensor = _output_tensor(output)
        both = all_gather_stacked(tensor, self.group, 2)
        self.exchanges += 1
        return _with_tensor(output, torch.cat([both[0], both[1]]))

    # ---- alternate ------------------------------------------------------------------------------------------

    def _branch(self, context: Any) -> int:
        """0 for the conditional call, 1 for the unconditional one: by diffusers' cache-context name when the
        pipeline gives one ("cond" / "uncond"), else by order (conditional first)."""
        name = context if isinstance(context, str) else getattr(context, "name", None)  # older diffusers: the name
        if name in ("cond", "uncond"):
            self.calls += 1
            return 0 if name == "cond" else 1
        branch = self.calls % 2
        self.calls += 1
        return branch

    def reset(self) -> None:
        """Forget a half-finished step (an interrupted run): the next call starts a step."""
        self.calls, self.placeholder, self.sent = 0, None, None  # output_like stays: the model has not changed

    def _alternate(self, forward: Any, args: Tuple[Any, ...], kwargs: dict, context: Any = None) -> Any:
        branch = self._branch(context)
        if branch == 0:
            if self.placeholder is not None or self.sent is not None:
                raise ParallelError(
                    "CFG parallel: a conditional call came before the previous step's unconditional one (guidance off "
                    "for a step, or an interrupted run: call handle.reset() first); run such a pipeline without "
                    "--cfg-parallel"
                )
            if self.rank == 0 or self.output_like is None:
                # rank 0's call; rank 1 runs it once too, on the first step, to learn what the output looks like
                # (its shape need not be the input's: Wan's image-to-video takes 36 channels and returns 16)
                output = forward(*args, **kwargs)
                tensor = _output_tensor(output)
                self.output_like = (tensor.shape, tensor.dtype, tensor.device, _structure(output))
                if self.rank == 0:
                    self.sent = tensor  # exchanged in the second call
                else:
                    self.placeholder = tensor  # overwritten with rank 0's result in the second call
                return output
            shape, dtype, device, structure = self.output_like
            self.placeholder = torch.full(shape, float("nan"), dtype=dtype, device=device)
            return _rebuild(structure, self.placeholder)  # filled in the second call, before the pipeline reads it
        if (self.sent if self.rank == 0 else self.placeholder) is None:
            raise ParallelError(
                "CFG parallel: an unconditional call without the conditional one before it; run this pipeline without "
                "--cfg-parallel"
            )
        if self.rank == 0:  # the unconditional call is rank 1's
            both = all_gather_stacked(self.sent, self.group, 2)
            self.sent = None
            self.exchanges += 1
            return _rebuild(self.output_like[3], both[1])
        output = forward(*args, **kwargs)
        both = all_gather_stacked(_output_tensor(output), self.group, 2)
        self.exchanges += 1
        self.placeholder.copy_(both[0])
        self.placeholder = None
        return output

    def run(self, forward: Any, args: Tuple[Any, ...], kwargs: dict, context: Any = None) -> Any:
        if self.mode == "batch":
            return self._batch(forward, args, kwargs)
        return self._alternate(forward, args, kwargs, context)


def _structure(output: Any) -> Any:
    """How the denoiser wraps its output: "tensor", ("tuple", rest) or its output class (``return_dict=True``)."""
    if isinstance(output, Tensor):
        return "tensor"
    if isinstance(output, (tuple, list)):
        return ("tuple", tuple(output[1:]))
    return type(output)


def _rebuild(structure: Any, tensor: Tensor) -> Any:
    """``tensor`` wrapped as the denoiser wraps its output (:func:`_structure`)."""
    if structure == "tensor":
        return tensor
    if isinstance(structure, tuple):
        return (tensor,) + structure[1]
    return structure(sample=tensor)


def make_hook(mode: str, group: Any, rank: int) -> Any:
    """A diffusers ``ModelHook`` running :class:`GuidanceSplitHook` around the denoiser's forward. It is stateful, so
    that diffusers hands it each call's cache context ("cond" / "uncond"); a diffusers without cache contexts (or
    whose ``StateManager`` changed) is declined by the adapter, and the calls are told apart by their order."""
    from ..upstream.diffusers import parallel as upstream

    contexts, read_context, declined = upstream.context_states()

    class CFGParallelHook(upstream.model_hook()):
        _is_stateful = True  # diffusers resets it with the pipeline's other stateful hooks

        def __init__(self) -> None:
            super().__init__()
            self.split = GuidanceSplitHook(mode, group, rank)
            self.contexts = contexts  # diffusers sets each call's context on the StateManager attributes of a hook
            self.declined = declined  # why the calls are told apart by order (npu_port.upstream.Decline), or None

        def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            context = read_context(self.contexts) if self.contexts is not None else None
            return self.split.run(self.fn_ref.original_forward, args, kwargs, context)

        def reset_state(self, module: torch.nn.Module) -> None:
            self.split.reset()
            if self.contexts is not None:
                self.contexts.reset()

    return CFGParallelHook()
