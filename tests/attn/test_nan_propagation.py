"""NaN in, NaN out: on every kernel a NaN in query, key or value comes out where the float64 reference (SDPA's
documented formula) puts it, and only a row whose keys are all masked gives zeros.

The NPU kernels run through the emulator, xformers and flash_attn through their contract stand-ins. auto must never
accept an output with NaN, whatever a kernel does with a NaN it is given.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

import npu_port
from npu_port.attn import contract, get_kernel
from npu_port.attn.api import run_call
from npu_port.attn.call import AttentionCall
from npu_port.attn.kernels.base import Kernel
from npu_port.strategy.decision import PICKED, SKIPPED
from npu_port.strategy.measure import UNMEASURED, measure, parity_error, parity_slice, reference_output
from npu_port.strategy.registry import get_strategy
from npu_port.strategy.router import StrategyRouter

from ..conftest import all_stand_ins
from ..reference import TOLERANCES, reference_attention
from ..strategies import attention_cases
from .test_attention_parity import VARIANTS, _reference, _run, _score_rounding_allowance, expected_refusals

NAN = float("nan")


@pytest.fixture(scope="module")
def monkeypatch_module():
    """A monkeypatch usable inside hypothesis tests (undone by each example itself)."""
    patch = pytest.MonkeyPatch()
    yield patch
    patch.undo()


@st.composite
def with_nans(draw, case):
    """``case`` with 1-3 NaN placed at random in query, key and value (new tensors; the case keeps its own)."""
    tensors = {"query": case.query.clone(), "key": case.key.clone(), "value": case.value.clone()}
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(tensors)))
        tensor = tensors[name]
        index = tuple(draw(st.integers(0, size - 1)) for size in tensor.shape)
        tensor[index] = NAN
    return tensors


def assert_same_nan_pattern_and_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, extra_atol=0.0):
    assert out.shape == ref.shape
    assert torch.equal(torch.isnan(out), torch.isnan(ref)), (
        f"NaN pattern differs: {int(torch.isnan(out).sum())} NaN in the output, {int(torch.isnan(ref).sum())} in the "
        f"reference; first differing position {tuple(torch.nonzero(torch.isnan(out) != torch.isnan(ref))[0].tolist())}"
    )
    finite = ~torch.isnan(ref)
    atol, rtol = TOLERANCES[dtype]
    err = (out.double() - ref).abs()[finite]
    assert bool((err <= atol + extra_atol + rtol * ref.abs()[finite]).all()), f"max |diff| {err.max().item():.3g}"


@pytest.mark.parametrize("variant", list(VARIANTS))
@settings(max_examples=60)
@given(case=attention_cases(), data=st.data())
def test_every_kernel_gives_the_float64_references_nan_pattern(variant, case, data):
    inputs = data.draw(with_nans(case))
    with all_stand_ins(), torch.no_grad():
        kernel = VARIANTS[variant]()
        call = AttentionCall.from_arguments(case.query, case.key, case.value, case.attn_mask, **case.kwargs())
        if expected_refusals(variant, case) or kernel.reasons(call):
            event("refused")
            return
        out = _run(kernel, case, **inputs)
    ref = _reference(case, **inputs)
    event(f"{int(torch.isnan(ref).any(dim=-1).sum())} NaN rows of {ref.shape[-2] * ref.shape[0] * ref.shape[1]}")
    finite_inputs = {name: tensor.nan_to_num(0.0) for name, tensor in inputs.items()}
    extra = _score_rounding_allowance(dataclasses.replace(case, **finite_inputs)) if "no-upcast" in variant else 0.0
    assert out.dtype == case.dtype
    assert_same_nan_pattern_and_close(out, ref, case.dtype, extra)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sdpa_keeps_a_nan_query_row_that_torchs_cpu_flash_kernel_turns_into_zeros(dtype):
    query, key, value = (
        torch.randn(1, 2, 6, 16, generator=torch.Generator().manual_seed(s)).to(dtype) for s in (1, 2, 3)
    )
    query[0, 1, 2, 5] = NAN
    for kernel in ("sdpa", "math", "chunked"):
        out = npu_port.attention(query, key, value, kernel=kernel)
        assert torch.isnan(out[0, 1, 2]).all(), kernel
        assert int(torch.isnan(out).sum()) == 16, kernel


@pytest.mark.parametrize("kernel", ["math", "sdpa", "chunked"])
def test_a_fully_masked_row_gives_zeros_even_with_nan_in_the_values(kernel):
    query, key, value = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8)
    value[0, 0, 3, 2] = NAN
    keep = torch.ones(4, 5, dtype=torch.bool)
    keep[1] = False
    out = npu_port.attention(query, key, value, keep, kernel=kernel)
    assert torch.equal(out[0, 0, 1], torch.zeros(8))
    assert torch.isnan(out[0, 0, [0, 2, 3], 2]).all() and not torch.isnan(out[0, 0, :, [0, 1, 3]]).any()


@pytest.mark.parametrize("kernel", ["math", "sdpa", "chunked"])
def test_a_nan_key_at_a_masked_position_still_comes_out_as_in_sdpas_formula(kernel):
    query, key, value = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    key[0, 0, 3, 0] = NAN
    keep = torch.tensor([[True, True, True, False]] * 3)
    out = npu_port.attention(query, key, value, keep, kernel=kernel)
    assert torch.isnan(out).all()


def test_a_nan_in_an_additive_mask_makes_its_row_nan():
    query, key, value = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    bias = torch.zeros(3, 4)
    bias[1, 2] = NAN
    for kernel in ("math", "sdpa", "chunked"):
        out = npu_port.attention(query, key, value, bias, kernel=kernel)
        assert torch.isnan(out[0, 0, 1]).all() and not torch.isnan(out[0, 0, [0, 2]]).any(), kernel


def test_the_routers_prepared_fast_path_keeps_nan_too():
    router = StrategyRouter(get_strategy("sdpa"))
    query, key, value = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    router(query, key, value)  # the first call prepares the runner
    query[0, 0, 3, 1] = NAN
    out = router(query, key, value)
    assert router._prepared and torch.isnan(out[0, 0, 3]).all() and int(torch.isnan(out).sum()) == 8


@pytest.mark.parametrize("kernel", ["math", "sdpa", "chunked"])
@settings(max_examples=25)
@given(case=attention_cases(dtypes=(torch.float32,)), data=st.data())
def test_the_branch_free_path_accelerators_take_gives_the_same_answers(kernel, case, data, monkeypatch_module):
    """On accelerators the contract never reads a flag back (no host synchronisation): forced here on the CPU, inputs
    without NaN come out unchanged and inputs with NaN get the reference's pattern."""
    with torch.no_grad():
        expected = _run(kernel, case)
        monkeypatch_module.setattr(contract, "CHECK_FIRST_ON", ())
        try:
            assert torch.equal(_run(kernel, case), expected)
            inputs = data.draw(with_nans(case))
            out = _run(kernel, case, **inputs)
        finally:
            monkeypatch_module.undo()
    assert_same_nan_pattern_and_close(out, _reference(case, **inputs), case.dtype)


class NanHidingKernel(Kernel):
    """A kernel that answers like sdpa but turns every NaN into 0: what auto's parity check must not let through."""

    name = "nan_hiding_test_kernel"

    def run(self, call):
        return get_kernel("math").run(call).nan_to_num(0.0)


def test_auto_parity_check_never_accepts_nan_and_a_call_with_nan_is_not_measured():
    query, key, value = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    query[0, 0, 0, 0] = NAN
    call = AttentionCall.from_arguments(query, key, value)
    sliced = parity_slice(call, 64)
    reference = reference_output(sliced)
    for kernel in (NanHidingKernel(), get_kernel("sdpa"), get_kernel("math")):
        error, tolerance = parity_error(kernel, sliced, reference)
        assert not error <= tolerance and error == float("inf"), kernel.name
    decision = measure(
        call,
        "bucket",
        [NanHidingKernel(), get_kernel("math")],
        budget_bytes=None,
        warmup=1,
        repeats=1,
        probe_seconds=5.0,
        parity_rows=64,
    )
    assert decision.source == UNMEASURED and decision.kernel == "nan_hiding_test_kernel"
    assert [(c.kernel, c.status) for c in decision.candidates] == [
        ("nan_hiding_test_kernel", PICKED),
        ("math", SKIPPED),
    ]
    out = run_call(call, NanHidingKernel())  # the output contract returns the NaN the kernel hid
    assert torch.isnan(out[0, 0, 0]).all() and not torch.isnan(out[0, 1]).any()


def test_auto_gives_nan_out_for_nan_in_and_decides_on_the_next_clean_call(tmp_path, monkeypatch):
    """A call with NaN cannot be measured (nothing can be checked against the math kernel's NaN): it runs on the
    first candidate that can run it, its NaN comes out, and nothing is decided or cached until a clean call."""
    monkeypatch.setenv("NPU_PORT_CACHE_DIR", str(tmp_path))
    query, key, value = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    dirty = key.clone()
    dirty[0, 1, 2, 3] = NAN
    with npu_port.attention_strategy("auto") as handle:
        out = npu_port.attention(query, dirty, value)
        assert_same_nan_pattern_and_close(out, reference_attention(query, dirty, value), torch.float32)
        assert torch.isnan(out[0, 1]).all() and not torch.isnan(out[0, 0]).any()
        router = handle.router
        assert router.decisions == {} and router.probes == 1
        assert "not measured: NaN or inf in query, key, value or mask" in handle.explain()
        assert not list(tmp_path.rglob("*.json"))  # nothing cached from a call that could not be measured
        clean = npu_port.attention(query, key, value)  # the same bucket, measured now
        assert len(router.decisions) == 1 and router.probes == 2
        assert next(iter(router.decisions.values())).source == "measured"
        assert torch.allclose(clean, reference_attention(query, key, value).float(), atol=1e-5)
        again = npu_port.attention(query, dirty, value)  # decided now: still NaN out, through the chosen kernel
        assert torch.equal(torch.isnan(again), torch.isnan(out))


def test_reference_itself_puts_nan_where_the_formula_does():
    query, key, value = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    key[0, 0, 2, 0] = NAN
    keep = torch.tensor([[True, True, False], [False, False, False], [True, True, True]])
    ref = reference_attention(query, key, value, keep=keep)
    assert torch.isnan(ref[0, 0, [0, 2]]).all() and torch.equal(ref[0, 0, 1], torch.zeros(4, dtype=torch.float64))


@st.composite
def nans_with_whole_rows(draw, case):
    """:func:`with_nans`, sometimes with a whole query row or every key of a head NaN (what SDPA's CPU flash kernel
    turns into rows of zeros)."""
    tensors = draw(with_nans(case))
    if draw(st.booleans()):
        name = draw(st.sampled_from(("query", "key")))
        tensor = tensors[name]
        batch, head = draw(st.integers(0, tensor.shape[0] - 1)), draw(st.integers(0, tensor.shape[1] - 1))
        if name == "query":
            tensor[batch, head, draw(st.integers(0, tensor.shape[2] - 1))] = NAN
        else:
            tensor[batch, head] = NAN
    return tensors


@settings(max_examples=60)
@given(case=attention_cases(dtypes=(torch.float32, torch.float64), forms=("none",)), data=st.data())
def test_torch_sdpa_loses_a_nan_only_as_a_row_of_zeros(case, data):
    """What ``SdpaKernel.zeros_hide_nan`` promises the fast path's output screen: whenever the inputs hold a NaN,
    torch's own SDPA output holds a NaN or a row of exact zeros."""
    tensors = data.draw(nans_with_whole_rows(case))
    if case.is_causal and case.query.shape[-2] < case.key.shape[-2]:
        keys_read = case.query.shape[-2]  # top-left causal: keys past the last query are never read (next test)
        tensors["key"][..., keys_read:, :] = case.key[..., keys_read:, :]
        tensors["value"][..., keys_read:, :] = case.value[..., keys_read:, :]
    assume(any(bool(torch.isnan(t).any()) for t in tensors.values()))
    enable_gqa = tensors["query"].shape[1] != tensors["key"].shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        tensors["query"], tensors["key"], tensors["value"], is_causal=case.is_causal, scale=case.scale,
        enable_gqa=enable_gqa,
    )  # fmt: skip
    zero_row = bool((out == 0).all(dim=-1).any())
    assert bool(torch.isnan(out).any()) or zero_row
    assert not contract._output_is_clean(out)


@settings(max_examples=60)
@given(case=attention_cases(dtypes=(torch.float32,), forms=("none",)), data=st.data())
def test_the_fast_path_gives_the_references_nan_pattern(case, data):
    """The router's prepared runner (sdpa, unmasked) screens its output, not its inputs: every NaN still comes out
    where the float64 reference puts it, and clean inputs come out bit-identical to SDPA's."""
    router = StrategyRouter(get_strategy("sdpa"))
    kwargs = {"is_causal": case.is_causal, "scale": case.scale, "enable_gqa": True}
    clean = router(case.query, case.key, case.value, **kwargs)  # prepares the runner
    again = router(case.query, case.key, case.value, **kwargs)
    assert router._prepared and torch.equal(again, clean)
    tensors = data.draw(nans_with_whole_rows(case))
    out = router(tensors["query"], tensors["key"], tensors["value"], **kwargs)
    ref = reference_attention(
        tensors["query"], tensors["key"], tensors["value"], is_causal=case.is_causal, scale=case.scale
    )
    assert_same_nan_pattern_and_close(out, ref, torch.float32)


def test_a_nan_key_past_the_last_query_under_causal_is_lost_by_torch_and_kept_by_the_fast_path():
    query, key, value = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 8, 8), torch.randn(1, 2, 8, 8)
    dirty = key.clone()
    dirty[0, 0, 7] = NAN  # no query row reaches key 7 under top-left causal attention
    raw = torch.nn.functional.scaled_dot_product_attention(query, dirty, value, is_causal=True)
    assert not torch.isnan(raw).any() and contract._output_is_clean(raw)  # torch loses it without a trace
    router = StrategyRouter(get_strategy("sdpa"))
    router(query, key, value, is_causal=True)  # prepares the runner for this signature
    out = router(query, dirty, value, is_causal=True)
    assert router._prepared
    assert_same_nan_pattern_and_close(out, reference_attention(query, dirty, value, is_causal=True), torch.float32)
    assert torch.isnan(out[0, 0]).all() and not torch.isnan(out[0, 1]).any()


@pytest.mark.parametrize("kernel", ["math", "sdpa", "chunked"])
def test_empty_value_head_dim_and_empty_keys_still_give_sdpas_empty_answer(kernel):
    query, key = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 5, 4)
    out = npu_port.attention(query, key, torch.randn(1, 1, 5, 0), kernel=kernel)
    assert out.shape == (1, 1, 3, 0)
    out = npu_port.attention(query, torch.randn(1, 1, 0, 4), torch.randn(1, 1, 0, 6), kernel=kernel)
    assert torch.equal(out, torch.zeros(1, 1, 3, 6))


@settings(max_examples=60)
@given(
    q_len=st.integers(1, 12),
    key_len=st.integers(1, 12),
    heads=st.sampled_from((1, 3)),
    seed=st.integers(0, 2**31 - 1),
    padding=st.booleans(),
)
def test_rows_with_keys_under_causal_match_the_materialised_mask(q_len, key_len, heads, seed, padding):
    """The key-padding shortcut (a running "any key kept yet") gives what the full causal mask gives."""
    gen = torch.Generator().manual_seed(seed)
    shape = (2, heads, 1, key_len) if padding else (2, heads, q_len, key_len)
    keep = torch.rand(shape, generator=gen) < 0.3
    query, key = torch.randn(2, heads, q_len, 4), torch.randn(2, heads, key_len, 4)
    call = AttentionCall.from_arguments(query, key, key, keep, is_causal=True)
    expected = call.keep_mask().any(dim=-1, keepdim=True)
    assert torch.equal(contract.rows_with_keys(call).expand_as(expected), expected)
