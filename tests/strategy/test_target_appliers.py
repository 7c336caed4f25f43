"""``set_attention_strategy(target=...)`` reaches a target through the applier an integration registered for it
(``npu_port.strategy.appliers``): the strategy core imports no integration, and the diffusers one is registered as
soon as ``npu_port`` is imported, without importing diffusers or torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import npu_port
from npu_port.errors import StrategyError
from npu_port.integrations import DIFFUSERS_APPLIER, TRANSFORMERS_APPLIER
from npu_port.strategy.appliers import applier_for, register_target_applier, registered_target_appliers

from ..reference import assert_close_to_reference, reference_attention

#: npu-port's own appliers, in the order they are asked: transformers models by their test, then the catch-all.
BUILT_IN = [TRANSFORMERS_APPLIER, DIFFUSERS_APPLIER]


class LegacyModel:
    """A target no built-in integration knows."""


class Record:
    """What an applier returns: the handle explains and restores through it."""

    def __init__(self):
        self.restored = 0

    def restore(self):
        self.restored += 1

    def counts(self):
        return {"routed": 2, "kept": 0}

    def describe(self):
        return "2 attention modules\n  blocks.0.attn: routed\n  blocks.1.attn: routed"

    def states(self):
        return []


def _recording_applier(calls):
    def apply(target, attention_fn, *, processor_factory=None):
        record = Record()
        calls.append((target, attention_fn, processor_factory, record))
        return record

    return apply


def test_a_registered_applier_gets_its_targets_with_the_strategys_router_and_the_handle_undoes_it():
    calls, model = [], LegacyModel()
    with register_target_applier(
        "legacy-test", _recording_applier(calls), accepts=lambda t: isinstance(t, LegacyModel)
    ):
        handle = npu_port.set_attention_strategy("vanilla", target=model)
        ((target, attention_fn, factory, record),) = calls
        assert target is model and factory is None and handle.applied is record
        assert attention_fn is handle.router  # what the applier routes attention to: the strategy's choice

        generator = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(2, 3, 7, 8, generator=generator) for _ in range(3))
        out = attention_fn(q, k, v, is_causal=True)
        assert_close_to_reference(out, reference_attention(q, k, v, is_causal=True), torch.float32)
        assert handle.calls == {"math": 1}

        explained = handle.explain()
        assert "  applied to LegacyModel: 2 routed attention modules" in explained
        assert "    blocks.0.attn: routed" in explained
        handle.restore()
        handle.restore()
        assert record.restored == 1 and handle.restored


def test_the_custom_processor_strategy_hands_the_applier_its_processor_class():
    class MyProcessor:
        def __call__(self, attn, hidden_states, *args, **kwargs):
            return hidden_states

    calls = []
    with register_target_applier(
        "legacy-test", _recording_applier(calls), accepts=lambda t: isinstance(t, LegacyModel)
    ):
        with npu_port.attention_strategy("custom-processor", target=LegacyModel(), processor=MyProcessor) as handle:
            ((_, attention_fn, factory, record),) = calls
            assert attention_fn is None and factory is MyProcessor and handle.applied is record
        assert record.restored == 1


def test_unregistered_the_applier_is_no_longer_asked_and_the_diffusers_catch_all_refuses_as_before():
    pytest.importorskip("diffusers")
    registration = register_target_applier("legacy-test", _recording_applier([]), accepts=lambda t: True)
    registration.restore()
    registration.restore()
    assert not registration.active and applier_for(LegacyModel()) is DIFFUSERS_APPLIER
    with pytest.raises(TypeError) as info:
        npu_port.set_attention_strategy("vanilla", target=LegacyModel())
    assert str(info.value) == (
        "apply_to_target expects a diffusers model (ModelMixin), a DiffusionPipeline, or a torch.nn.Module that "
        "contains diffusers Attention modules; got tests.strategy.test_target_appliers.LegacyModel"
    )
    with pytest.raises(TypeError) as info:
        npu_port.set_attention_strategy("vanilla", target="unet")
    assert str(info.value).endswith("contains diffusers Attention modules; got str")


def test_appliers_with_a_test_are_asked_latest_first_and_the_catch_all_last():
    first, second, catch_all = [], [], []
    with register_target_applier("test-first", _recording_applier(first), accepts=lambda t: True) as a:
        with register_target_applier("test-second", _recording_applier(second), accepts=lambda t: True) as b:
            with register_target_applier("test-catch-all", _recording_applier(catch_all)) as c:
                assert applier_for(LegacyModel()) is b
                assert registered_target_appliers() == [
                    b,
                    a,
                    TRANSFORMERS_APPLIER,
                    c,
                    DIFFUSERS_APPLIER,
                ]  # latest first
            with register_target_applier("test-second", _recording_applier(second), accepts=lambda t: False) as again:
                assert not b.active and again.active  # the same name replaces the earlier registration
                assert applier_for(LegacyModel()) is a
    assert registered_target_appliers() == BUILT_IN


def test_with_no_applier_at_all_the_error_says_so(monkeypatch):
    from npu_port.strategy import appliers

    monkeypatch.setattr(appliers, "_appliers", {})  # as if no integration had registered one
    with pytest.raises(StrategyError) as info:
        npu_port.set_attention_strategy("vanilla", target=LegacyModel())
    assert str(info.value) == (
        "no registered target applier takes LegacyModel; registered target appliers: none "
        "(pass target=None to apply the strategy process-wide)"
    )


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("", print), {}, "a target applier needs a name (a non-empty str), got ''"),
        ((3, print), {}, "a target applier needs a name (a non-empty str), got 3"),
        (
            ("x", "module:apply"),
            {},
            "apply for target applier 'x' must be a callable (target, attention_fn, *, processor_factory=None), "
            "got str",
        ),
        (
            ("x", print),
            {"accepts": True},
            "accepts for target applier 'x' must be None (any target) or a callable (target) -> bool, got bool",
        ),
    ],
)
def test_bad_registrations_are_refused_with_exact_messages(args, kwargs, message):
    with pytest.raises(StrategyError) as info:
        register_target_applier(*args, **kwargs)
    assert str(info.value) == message
    assert registered_target_appliers() == BUILT_IN


@pytest.mark.e2e
@pytest.mark.slow
def test_importing_npu_port_registers_the_diffusers_applier_without_importing_diffusers_or_torch():
    code = (
        "import json, sys, npu_port\n"
        "from npu_port.strategy.appliers import registered_target_appliers\n"
        "print(json.dumps({'appliers': [(a.name, a.accepts is None) for a in registered_target_appliers()],\n"
        "                  'loaded': sorted(m for m in ('torch', 'diffusers', 'transformers', 'yaml') if m in sys.modules)}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"appliers": [["transformers", False], ["diffusers", True]], "loaded": []}
