"""Handles on one model restore in any order and leave it exactly as before: the very processor objects, no forward
hooks, ``set_processor`` unwrapped, no patched module globals, no process-wide strategy left, and outputs
bit-identical to the untouched model's — for every order of 2 and 3 handles, target handles mixed with a
process-wide one."""

from __future__ import annotations

import itertools
import os

import pytest
import torch
from diffusers.models import attention_dispatch, attention_processor
from diffusers.models.attention_processor import Attention
from diffusers.models.transformers import transformer_flux

import npu_port
from npu_port.attn import select as kernel_select
from npu_port.integrations.diffusers import RoutedAttnProcessor, patches, tiny, watch
from npu_port.strategy.process import STATE

ORIGINAL_SET_PROCESSOR = Attention.set_processor

#: (strategy, applied to the model or process-wide); each is one handle of a scenario.
TARGET_A, TARGET_B, TARGET_C, PROCESS = ("vanilla", True), ("chunked", True), ("sdpa", True), ("sdpa", False)
SCENARIOS = {
    "two targets": [TARGET_A, TARGET_B],
    "target + process": [TARGET_A, PROCESS],
    "three targets": [TARGET_A, TARGET_B, TARGET_C],
    "two targets + process": [TARGET_A, PROCESS, TARGET_B],
}
CASES = [
    (model, scenario, order)
    for model in ("unet", "dit", "sd3")
    for scenario, handles in SCENARIOS.items()
    for order in itertools.permutations(range(len(handles)))
]


def processors_of(model):
    return {name: m.processor for name, m in model.named_modules() if hasattr(m, "processor")}


def hooks_of(model):
    return {name: len(m._forward_pre_hooks) + len(m._forward_hooks) for name, m in model.named_modules()}


@pytest.mark.parametrize("model_name, scenario, order", CASES, ids=[f"{m}-{s}-{o}" for m, s, o in CASES])
def test_handles_restore_in_any_order_and_leave_the_model_exactly_as_before(model_name, scenario, order):
    model = tiny.tiny_model(model_name)
    base = tiny.run_tiny(model)
    saved_processors, saved_hooks = processors_of(model), hooks_of(model)
    env_before = dict(os.environ)
    selector_before = kernel_select.current_selector()
    backend_before = attention_dispatch._AttentionBackendRegistry._active_backend

    handles = [
        npu_port.set_attention_strategy(name, target=model if targeted else None)
        for name, targeted in SCENARIOS[scenario]
    ]
    tiny.run_tiny(model)
    targeted = [h for h in handles if h.target is not None]
    assert targeted[-1].calls and not any(h.calls for h in targeted[:-1])  # the last applied routes the model

    for step, index in enumerate(order):
        handles[index].restore()
        remaining = [h for i, h in enumerate(handles) if i not in order[: step + 1] and h.target is not None]
        out = tiny.run_tiny(model)
        if remaining:  # the newest handle still applied routes the model, whatever was restored below or above it
            newest = remaining[-1]
            before = sum(newest.calls.values())
            tiny.run_tiny(model)
            assert sum(newest.calls.values()) > before, f"after restoring {index}: {newest} no longer routes"
            torch.testing.assert_close(out, base, atol=2e-5, rtol=1e-4)
        else:
            assert not any(type(p) is RoutedAttnProcessor for p in processors_of(model).values()), (
                "npu-port's processor left installed"
            )

    now = processors_of(model)
    assert now.keys() == saved_processors.keys()
    assert all(now[name] is proc for name, proc in saved_processors.items()), "processors not the very same objects"
    assert hooks_of(model) == saved_hooks
    assert Attention.set_processor is ORIGINAL_SET_PROCESSOR and watch.wrapped_classes() == []
    assert patches.active_patches() == []
    assert attention_processor.F is torch.nn.functional
    assert transformer_flux.dispatch_attention_fn is attention_dispatch.dispatch_attention_fn
    assert not STATE.active and kernel_select.current_selector() is selector_before
    assert attention_dispatch._AttentionBackendRegistry._active_backend is backend_before
    assert dict(os.environ) == env_before
    assert torch.equal(tiny.run_tiny(model), base)
