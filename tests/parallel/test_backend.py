"""The ``"npu_port"`` diffusers attention backend in one process: registering it adds one member to diffusers'
``AttentionBackendName`` and one entry to its registry, and the last ``unregister`` leaves both exactly as they were;
its non-parallel path (diffusers' ``(B, S, H, D)`` layout, key masks, ``is_causal``, the log-sum-exp) matches the
float64 reference, through the kernel the active strategy picks (a ``compute_dtype`` strategy included)."""

from __future__ import annotations

import math

import pytest
import torch
from diffusers.models import attention_dispatch

from npu_port.attn import AttentionCall
from npu_port.integrations.diffusers.routing import Route, active_route
from npu_port.parallel import backend
from npu_port.parallel.backend import npu_port_attention
from npu_port.strategy.cast import CastKernel
from npu_port.strategy.registry import get_strategy
from npu_port.strategy.router import StrategyRouter

from ..conftest import emulated_torch_npu
from ..reference import assert_close_to_reference, reference_attention, reference_lse


def diffusers_state():
    """Everything of diffusers' enum and registry that registration touches, as plain copies."""
    names, registry = attention_dispatch.AttentionBackendName, attention_dispatch._AttentionBackendRegistry
    return {
        "members": list(names),
        "member_map": dict(names._member_map_),
        "value2member_map": dict(names._value2member_map_),
        "member_names": list(names._member_names_),
        "class_attributes": set(vars(names)),
        "backends": dict(registry._backends),
        "constraints": dict(registry._constraints),
        "supported_arg_names": dict(registry._supported_arg_names),
        "supports_context_parallel": set(registry._supports_context_parallel),
    }


@pytest.fixture
def registered():
    """The backend registered for one test; checked to be gone afterwards."""
    member = backend.register()
    try:
        yield member
    finally:
        backend.unregister()
    assert not backend.registered()


def test_register_adds_one_member_and_unregister_leaves_diffusers_exactly_as_before():
    names = attention_dispatch.AttentionBackendName
    before = diffusers_state()
    assert not backend.registered() and "NPU_PORT" not in before["member_names"]
    member = backend.register()
    try:
        during = diffusers_state()
        assert member is names("npu_port") is names.NPU_PORT is names["NPU_PORT"]
        assert member.value == "npu_port" and member.name == "NPU_PORT" and isinstance(member, str)
        assert during["members"] == before["members"] + [member]
        assert during["member_names"] == before["member_names"] + ["NPU_PORT"]
        assert during["backends"] == {**before["backends"], member: npu_port_attention}
        assert during["constraints"] == {**before["constraints"], member: []}
        assert during["supported_arg_names"][member] == {
            "query",
            "key",
            "value",
            "attn_mask",
            "dropout_p",
            "is_causal",
            "scale",
            "enable_gqa",
            "return_lse",
            "_parallel_config",
        }
        assert during["supports_context_parallel"] == before["supports_context_parallel"] | {"npu_port"}
        assert attention_dispatch._AttentionBackendRegistry._is_context_parallel_available(member)
    finally:
        backend.unregister()
    assert diffusers_state() == before
    with pytest.raises(ValueError):
        names("npu_port")


def test_registration_is_counted():
    before = diffusers_state()
    first = backend.register()
    second = backend.register()
    assert first is second
    backend.unregister()
    assert backend.registered() and attention_dispatch.AttentionBackendName("npu_port") is first
    backend.unregister()
    assert not backend.registered() and diffusers_state() == before
    backend.unregister()  # one too many: nothing to undo
    assert diffusers_state() == before


# ---- the non-parallel path ------------------------------------------------------------------------------------


def _bshd(batch=2, q_len=6, key_len=9, heads=4, dim=16, seed=0):
    """Diffusers' layout (B, S, H, D)."""
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, q_len, heads, dim, generator=gen)
    key = torch.randn(batch, key_len, heads, dim, generator=gen)
    value = torch.randn(batch, key_len, heads, dim, generator=gen)
    return query, key, value, gen


def _reference(query, key, value, keep=None, bias=None, is_causal=False):
    """The float64 reference in diffusers' layout: out (B, S, H, D), lse (B, S, H)."""
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out = reference_attention(q, k, v, keep, bias, is_causal).transpose(1, 2)
    return out, reference_lse(q, k, keep, bias, is_causal).transpose(1, 2)


def _assert_lse(lse, expected, atol):
    assert lse.dtype == torch.float32 and lse.shape == expected.shape
    assert torch.equal(torch.isneginf(lse), torch.isneginf(expected))
    finite = torch.isfinite(expected)
    assert (lse.double()[finite] - expected[finite]).abs().max() <= atol


def _masks(gen):
    """(the mask as passed, the ground truth keep, the ground-truth bias) for every form the backend takes."""
    padding = torch.ones(2, 9, dtype=torch.bool)
    padding[1, 6:] = False
    shared = torch.rand(2, 1, 6, 9, generator=gen) > 0.4
    shared[0, 0, 2] = False  # a query with no key: zeros, lse -inf
    per_head = torch.rand(2, 4, 6, 9, generator=gen) > 0.4
    bias = torch.randn(2, 1, 6, 9, generator=gen)
    bias[1, 0, :, 0] = -math.inf
    return {
        "none": (None, None, None),
        "key padding (B, S_kv)": (padding, padding[:, None, None, :], None),
        "bool (B, 1, S_q, S_kv)": (shared, shared, None),
        "bool per head": (per_head, per_head, None),
        "additive float": (bias, torch.isfinite(bias), bias.masked_fill(torch.isinf(bias), 0.0)),
    }


@pytest.mark.parametrize("form", list(_masks(torch.Generator())))
def test_the_non_parallel_path_matches_the_float64_reference(form):
    query, key, value, gen = _bshd()
    mask, keep, bias = _masks(gen)[form]
    expected, expected_lse = _reference(query, key, value, keep, bias)
    with torch.no_grad():
        out = npu_port_attention(query, key, value, mask)
        out_lse, lse = npu_port_attention(query, key, value, mask, return_lse=True)
    assert_close_to_reference(out, expected, torch.float32)
    assert_close_to_reference(out_lse, expected, torch.float32)
    _assert_lse(lse, expected_lse, 1e-4)


def test_is_causal_and_scale_are_kept():
    query, key, value, _ = _bshd(key_len=6)
    expected, _ = _reference(query, key, value, is_causal=True)
    assert_close_to_reference(npu_port_attention(query, key, value, is_causal=True), expected, torch.float32)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    scaled = reference_attention(q, k, v, scale=0.5).transpose(1, 2)
    assert_close_to_reference(npu_port_attention(query, key, value, scale=0.5), scaled, torch.float32)


def test_diffusers_dispatcher_reaches_the_backend_by_name(registered):
    query, key, value, gen = _bshd()
    mask = torch.rand(2, 1, 6, 9, generator=gen) > 0.4
    expected, _ = _reference(query, key, value, mask)
    out = attention_dispatch.dispatch_attention_fn(query, key, value, attn_mask=mask, backend=registered)
    assert_close_to_reference(out, expected, torch.float32)


# ---- the kernels the backend routes to ------------------------------------------------------------------------


def test_a_strategys_router_runs_the_call_and_its_lse_matches():
    query, key, value, gen = _bshd()
    mask = torch.rand(2, 1, 6, 9, generator=gen) > 0.4
    expected, expected_lse = _reference(query, key, value, mask)
    router = StrategyRouter(get_strategy("vanilla"))
    with active_route(Route(router)), torch.no_grad():
        out, lse = npu_port_attention(query, key, value, mask, return_lse=True)
    assert router.resolved() == ["math"]  # the strategy's kernel ran the call, not the default selection
    assert_close_to_reference(out, expected, torch.float32)
    _assert_lse(lse, expected_lse, 1e-4)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out, lse = router.attention_lse(q, k, v, mask)  # (B, H, S, D), as ring attention calls it per key block
    assert_close_to_reference(out.transpose(1, 2), expected, torch.float32)
    _assert_lse(lse.transpose(1, 2), expected_lse, 1e-4)


def test_a_compute_dtype_strategy_returns_a_float32_lse_from_its_half_precision_kernel():
    query, key, value, gen = _bshd()
    mask = torch.rand(2, 1, 6, 9, generator=gen) > 0.4
    mask[..., 0] = True
    expected, expected_lse = _reference(query, key, value, mask)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    with emulated_torch_npu():
        router = StrategyRouter(get_strategy("npu").with_overrides(compute_dtype="float16"))
        kernel = router.select(AttentionCall.from_arguments(q, k, v, mask, return_lse=True))
        with active_route(Route(router)), torch.no_grad():
            out, lse = npu_port_attention(query, key, value, mask, return_lse=True)
    assert isinstance(kernel, CastKernel) and kernel.name == "npu_fused_infer@float16"
    assert out.dtype == torch.float32
    assert_close_to_reference(out, expected, torch.float16)
    _assert_lse(lse, expected_lse, 2e-2)
