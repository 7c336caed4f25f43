"""diffusers models trained with gradient checkpointing under each npu-port strategy give the gradients they give
without it: diffusers' own ``test_gradient_checkpointing_equivalence`` (tests/models/testing_utils/training.py,
``TrainingTesterMixin``) reproduced with a strategy applied.

Its pattern: a model in training mode runs a forward and a backward; a second model, built the same way, loaded with
the first one's state dict and with ``enable_gradient_checkpointing()``, does the same; the losses and every
parameter's gradient must agree (diffusers' tolerances: loss 1e-5, 1e-4 for DiT; gradients 5e-5). Each model gets the
strategy applied on its own, so the second one's router is fresh: its very first attention call is inside a
checkpointed block, and the recompute in the backward is its second. With diffusers' default checkpointing
(non-reentrant) torch compares what the forward and the recompute saved for backward; this used to raise
``CheckpointError`` under sdpa and auto, where the first call and the later calls of a shape took two paths.

The Ascend kernels run through the emulator of the documented ops (``npu``: npu_fusion_attention, float32).
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Optional

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import npu_port
from npu_port.integrations.diffusers import apply_to_target, tiny
from npu_port.integrations.diffusers.tiny_flux import T5_DIM
from npu_port.integrations.diffusers.tiny_wan import LATENT_CHANNELS, tiny_wan_transformer
from npu_port.strategy.registry import get_strategy
from npu_port.strategy.router import StrategyRouter

from ..conftest import all_stand_ins

pytestmark = pytest.mark.diffusers_min("0.35")

MODELS = ["dit", "unet", "vae", "sd3", "flux"]
STRATEGIES = ["sdpa", "auto", "vanilla", "chunked", "npu"]
#: the tiny models, and Wan's video transformer (2 layers: self-attention over 32 video tokens, cross-attention)
BUILDERS = {**tiny.BUILDERS, "wan": tiny_wan_transformer}
#: attention modules per forward of each tiny model (the VAE forward runs its encoder's and decoder's mid-block)
ATTENTION_CALLS = {"unet": 8, "dit": 2, "sd3": 2, "flux": 2, "vae": 2, "wan": 4}
#: diffusers' tolerances (TrainingTesterMixin; DiT's test passes loss_tolerance=1e-4)
LOSS_TOLERANCE = {"dit": 1e-4}
GRAD_TOLERANCE = 5e-5


@contextlib.contextmanager
def strategy_on(model: torch.nn.Module, strategy: str):
    """The strategy applied to ``model`` as a user applies it; yields a function giving the calls routed so far.
    ``npu`` goes in through its router (the emulator makes the kernels take CPU tensors, but no NPU is visible, so
    ``set_attention_strategy`` would refuse the strategy before any call)."""
    with all_stand_ins():
        if strategy == "npu":
            router = StrategyRouter(get_strategy(strategy))
            with apply_to_target(model, router):
                yield lambda: dict(router.calls)
            return
        handle = npu_port.set_attention_strategy(strategy, target=model)
        try:
            yield lambda: dict(handle.calls)
        finally:
            handle.restore()


def inputs_of(model: torch.nn.Module) -> Dict[str, Any]:
    """Seeded inputs: :func:`tiny.tiny_inputs`, and for Wan 2 latent frames of 8x8 with 8 text tokens."""
    if type(model).__name__ != "WanTransformer3DModel":
        return tiny.tiny_inputs(model)
    gen = torch.Generator().manual_seed(0)
    return {
        "hidden_states": torch.randn(2, LATENT_CHANNELS, 2, 8, 8, generator=gen),
        "timestep": torch.tensor([7, 14]),
        "encoder_hidden_states": torch.randn(2, 8, T5_DIM, generator=gen),
    }


def train_step(model: torch.nn.Module, labels: Optional[torch.Tensor] = None):
    """diffusers' step: forward, ``(out - labels).mean()``, backward. (loss, labels, gradients by name)."""
    out = tiny.output_of(model(**inputs_of(model)))
    if labels is None:
        labels = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)
    model.zero_grad()
    loss = (out - labels).mean()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), labels, grads


def checkpointed_twin(model: torch.nn.Module, name: str, reentrant: bool = False) -> torch.nn.Module:
    """A second model built the same way, with the first one's weights and gradient checkpointing on (diffusers'
    default function: non-reentrant; or torch's reentrant one, which transformers-era training code still uses)."""
    twin = BUILDERS[name]()
    twin.load_state_dict(model.state_dict())
    twin.train()
    if reentrant:
        twin.enable_gradient_checkpointing(lambda module, *args: checkpoint(module.__call__, *args, use_reentrant=True))
    else:
        twin.enable_gradient_checkpointing()
    assert twin.is_gradient_checkpointing and twin.training
    return twin


def assert_equivalent(name: str, loss, loss_2, grads: Dict[str, torch.Tensor], grads_2: Dict[str, torch.Tensor]):
    assert (loss - loss_2).abs() < LOSS_TOLERANCE.get(name, 1e-5), (loss, loss_2)
    assert grads.keys() == grads_2.keys()
    for param, grad in grads.items():
        torch.testing.assert_close(grads_2[param], grad, atol=GRAD_TOLERANCE, rtol=0, msg=param)


@pytest.mark.parametrize(
    "model_name, strategy",
    [(model, strategy) for model in MODELS for strategy in STRATEGIES] + [("wan", "sdpa"), ("wan", "auto")],
)
def test_gradient_checkpointing_equivalence_under_each_strategy(model_name, strategy):
    model = BUILDERS[model_name]().train()
    with strategy_on(model, strategy) as calls:
        loss, labels, grads = train_step(model)
        assert sum(calls().values()) == ATTENTION_CALLS[model_name]
    twin = checkpointed_twin(model, model_name)
    with strategy_on(twin, strategy) as calls:
        loss_2, _, grads_2 = train_step(twin, labels)
        routed = calls()
    assert sum(routed.values()) == 2 * ATTENTION_CALLS[model_name]  # the forward, then the recompute, both routed
    if strategy != "auto":
        assert len(routed) == 1, routed
    assert_equivalent(model_name, loss, loss_2, grads, grads_2)


@pytest.mark.parametrize("strategy", ["sdpa", "auto", "npu"])
@pytest.mark.parametrize("model_name", ["dit", "unet"])
def test_reentrant_checkpointing_gives_the_same_gradients(model_name, strategy):
    """Reentrant checkpointing runs the forward without autograd and the recompute with it: auto decides the two
    buckets on its own (no dropout: at most the rounding of two kernels), the others run one kernel (npu: the
    inference op for the forward, npu_fusion for the recompute — within the same tolerance)."""
    model = tiny.BUILDERS[model_name]().train()
    with strategy_on(model, strategy):
        loss, labels, grads = train_step(model)
    twin = checkpointed_twin(model, model_name, reentrant=True)
    with strategy_on(twin, strategy) as calls:
        loss_2, _, grads_2 = train_step(twin, labels)
        assert sum(calls().values()) == 2 * ATTENTION_CALLS[model_name]
    assert_equivalent(model_name, loss, loss_2, grads, grads_2)


@pytest.mark.parametrize("strategy", ["sdpa", "auto", "vanilla", "chunked"])
def test_a_nan_in_one_sample_under_checkpointing(strategy):
    """A NaN in one sample's latents: the NaN contract fills that sample's attention rows in the forward and in the
    recompute alike (no CheckpointError), the other sample's loss is the one it has without checkpointing, and auto
    keeps the kernel of the call it could not measure for that call's recompute."""
    model = tiny.BUILDERS["dit"]().train()
    inputs = tiny.tiny_inputs(model)
    inputs["hidden_states"][1, 0, 3, 3] = float("nan")

    def step(model):
        out = tiny.output_of(model(**inputs))
        model.zero_grad()
        loss = out[0].square().mean()  # sample 0 only: finite
        loss.backward()
        return loss.detach(), out.detach()

    with strategy_on(model, strategy):
        loss, out = step(model)
    twin = checkpointed_twin(model, "dit")
    with strategy_on(twin, strategy) as calls:
        loss_2, out_2 = step(twin)
        routed = calls()
    assert torch.isnan(out[1]).all() and torch.isnan(out_2[1]).all()
    assert torch.isfinite(loss) and (loss - loss_2).abs() < 1e-6
    torch.testing.assert_close(out_2[0], out[0], atol=1e-6, rtol=0)
    assert len(routed) == 1, routed  # forward and recompute: one kernel
    for param, p in twin.named_parameters():
        if p.grad is not None:
            assert torch.isnan(p.grad).any() == torch.isnan(dict(model.named_parameters())[param].grad).any()


def test_the_issue_reproduction_sdpa_and_auto_on_a_fresh_dit_with_checkpointing():
    """The report: DiT with gradient checkpointing, set_attention_strategy("sdpa" / "auto", target=model), one
    training step — raised CheckpointError (46 tensors saved by the forward, 41 by the recompute)."""
    for strategy in ("sdpa", "auto"):
        model = tiny.BUILDERS["dit"]().train()
        model.enable_gradient_checkpointing()
        handle = npu_port.set_attention_strategy(strategy, target=model)
        try:
            for _ in range(2):  # the first step (fresh router) and a later one (prepared runners)
                model.zero_grad()
                tiny.output_of(model(**tiny.tiny_inputs(model))).square().mean().backward()
        finally:
            handle.restore()
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
