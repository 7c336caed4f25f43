"""Every kernel against the float64 reference, over random shapes, dtypes, GQA, causal and every mask form.

The NPU kernels run through the emulator of the documented torch_npu ops, xformers and flash_attn through their
contract stand-ins (tests/conftest.py). A kernel may refuse a call only for the reasons its documented limits give
(``expected_refusals`` restates them independently); when it runs, it must match the reference within the dtype's
tolerance, with no NaN — fully-masked rows included — and, for training kernels, with matching finite gradients.
"""

from __future__ import annotations

from typing import Callable, Dict, Set

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

import npu_port
from npu_port import masks
from npu_port.attn import AttentionCall, get_kernel, kernel_names
from npu_port.errors import KernelUnavailableError

from ..conftest import all_stand_ins
from ..reference import assert_close_to_reference, reference_attention
from ..strategies import Case, attention_cases

#: Kernel variants under test: every registered kernel, plus the chunked kernel forced into small blocks (query
#: blocks only, and query x key blocks with the online softmax) so the blocking paths see every case too.
VARIANTS: Dict[str, Callable[[], npu_port.Kernel]] = {name: (lambda n=name: get_kernel(n)) for name in kernel_names()}
VARIANTS["chunked[q-blocks]"] = lambda: get_kernel("chunked", query_block=3)
VARIANTS["chunked[q+k-blocks]"] = lambda: get_kernel("chunked", query_block=4, key_block=3)
VARIANTS["chunked[budget]"] = lambda: get_kernel("chunked", max_bytes=4096)
VARIANTS["math[no-upcast]"] = lambda: get_kernel("math", upcast=False)
VARIANTS["chunked[no-upcast]"] = lambda: get_kernel("chunked", upcast=False, query_block=5, key_block=4)

TRAINING = (
    "math",
    "sdpa",
    "chunked",
    "chunked[q-blocks]",
    "chunked[q+k-blocks]",
    "chunked[budget]",
    "npu_fusion",
    "xformers",
    "flash_attn",
)


def expected_refusals(name: str, case: Case, needs_grad: bool = False) -> Set[str]:
    """The reason codes a kernel must give for ``case``, restated from each op's documented limits."""
    base = name.split("[")[0]
    q_len, head_dim = case.query.shape[2], case.query.shape[3]
    key_len, value_dim = case.key.shape[2], case.value.shape[3]
    # the Ascend kernels convert a pure float mask (0 / -inf / finfo.min) to their bool mask; a real bias (a
    # non-zero value where a key is kept) goes to npu_fusion_attention's pse and is refused by the inference op
    # (the cases' biases never require grad, which npu_fusion would refuse)
    bias = case.form == "additive_bias" and bool((case.bias != 0).any())
    codes: Set[str] = set()
    if base == "npu_fusion":
        if value_dim > head_dim:
            codes.add("head-dim")
    elif base == "npu_fused_infer":
        if case.dtype == torch.float32:
            codes.add("dtype")
        if value_dim != head_dim or (q_len > 1 and head_dim % 16):
            codes.add("head-dim")
        if bias or case.per_head_mask:
            codes.add("mask")
        if needs_grad:
            codes.add("grad")
    elif base == "flash_attn":
        if case.dtype == torch.float32:
            codes.add("dtype")
        if case.attn_mask is not None:
            codes.add("mask")
        if case.is_causal and q_len != key_len:
            codes.add("causal")
        if value_dim != head_dim:
            codes.add("head-dim")
    return codes


def _run(kernel: npu_port.Kernel, case: Case, query=None, key=None, value=None):
    return npu_port.attention(
        case.query if query is None else query,
        case.key if key is None else key,
        case.value if value is None else value,
        case.attn_mask,
        kernel=kernel,
        **case.kwargs(),
    )


def _reference(case: Case, query=None, key=None, value=None, bias=None):
    return reference_attention(
        case.query if query is None else query,
        case.key if key is None else key,
        case.value if value is None else value,
        keep=case.keep,
        bias=case.bias if bias is None else bias,
        is_causal=case.is_causal,
        scale=case.scale,
    )


def _score_rounding_allowance(case: Case) -> float:
    """Kernels that keep q @ k^T in the input dtype round each logit by up to |logit| * eps / 2; through the softmax
    that moves the output by about 2 * max|logit| * eps * max|v|. Only the ``upcast=False`` variants need it."""
    eps = torch.finfo(case.dtype).eps
    scale = case.scale if case.scale is not None else case.query.shape[-1] ** -0.5
    group = case.query.shape[1] // case.key.shape[1]
    logits = scale * case.query.double() @ case.key.double().repeat_interleave(group, 1).transpose(-1, -2)
    return 2.0 * logits.abs().max().item() * eps * case.value.double().abs().max().item()


def _check_refusal(kernel: npu_port.Kernel, case: Case, found, expected: Set[str]) -> None:
    assert {r.code for r in found} == expected, f"{kernel.name}: reasons {list(found)}, expected codes {expected}"
    with pytest.raises(KernelUnavailableError) as info:
        _run(kernel, case)
    assert info.value.reasons == list(found)
    assert "math" in info.value.runnable  # the message always points at a kernel that can run the call


@pytest.mark.parametrize("variant", list(VARIANTS))
@settings(max_examples=80)
@given(case=attention_cases())
def test_forward_matches_float64_reference(variant, case):
    with all_stand_ins(), torch.no_grad():
        kernel = VARIANTS[variant]()
        call = AttentionCall.from_arguments(case.query, case.key, case.value, case.attn_mask, **case.kwargs())
        found = kernel.reasons(call)
        expected = expected_refusals(variant, case)
        if expected or found:
            event(f"refused: {sorted(expected)}")
            _check_refusal(kernel, case, found, expected)
            return
        event("ran")
        out = _run(kernel, case)
        assert out.dtype == case.dtype
        extra = _score_rounding_allowance(case) if variant.endswith("[no-upcast]") else 0.0
        assert_close_to_reference(out, _reference(case), case.dtype, f"{variant} {case.form}", extra_atol=extra)


@pytest.mark.parametrize("variant", ["npu_fusion", "npu_fused_infer", "flash_attn"])
@settings(max_examples=40)
@given(case=attention_cases(forms=("additive_inf", "additive_finfo_min")))
def test_pure_float_masks_run_on_bool_only_kernels_after_explicit_conversion(variant, case):
    """Ascend ops take bool masks only: a pure 0/-inf (or finfo.min) mask converts explicitly and then matches."""
    converted = Case(**{**case.__dict__, "attn_mask": masks.keep_from_additive(case.attn_mask), "form": "bool"})
    with all_stand_ins(), torch.no_grad():
        kernel = get_kernel(variant)
        call = AttentionCall.from_arguments(
            converted.query, converted.key, converted.value, converted.attn_mask, **converted.kwargs()
        )
        found = kernel.reasons(call)
        expected = expected_refusals(variant, converted)
        if expected or found:
            _check_refusal(kernel, converted, found, expected)
            return
        assert_close_to_reference(_run(kernel, converted), _reference(case), case.dtype, variant)


@pytest.mark.parametrize("variant", TRAINING)
@settings(max_examples=40)
@given(data=st.data())
def test_gradients_match_float64_reference(variant, data):
    # flash-attn takes half precision only; everyone else is checked in float32, where tolerances are tight
    dtype = torch.float16 if variant == "flash_attn" else torch.float32
    case = data.draw(attention_cases(dtypes=(dtype,), max_len=12, head_dims=(8, 16, 32)))
    with all_stand_ins():
        kernel = VARIANTS[variant]()
        query, key, value = (t.clone().requires_grad_(True) for t in (case.query, case.key, case.value))
        call = AttentionCall.from_arguments(query, key, value, case.attn_mask, **case.kwargs())
        found = kernel.reasons(call)
        expected = expected_refusals(variant, case, needs_grad=True)
        if expected or found:
            assert {r.code for r in found} == expected
            return
        grad_out = torch.randn(case.query.shape[:3] + case.value.shape[3:], generator=torch.Generator().manual_seed(1))
        out = _run(kernel, case, query, key, value)
        grads = torch.autograd.grad(out, (query, key, value), grad_out.to(dtype))
        ref_inputs = [t.detach().double().requires_grad_(True) for t in (case.query, case.key, case.value)]
        ref = _reference(case, *ref_inputs)
        ref_grads = torch.autograd.grad(ref, ref_inputs, grad_out.to(dtype).double())
    for name, grad, ref_grad in zip(("query", "key", "value"), grads, ref_grads):
        assert torch.isfinite(grad).all(), f"{variant}: non-finite gradient for {name}"
        assert_close_to_reference(grad, ref_grad, dtype, f"{variant} d{name} ({case.form})")


@pytest.mark.parametrize("variant", ["math", "sdpa", "chunked", "chunked[q+k-blocks]", "npu_fusion"])
@settings(max_examples=30)
@given(case=attention_cases(dtypes=(torch.float16, torch.bfloat16), max_len=12, head_dims=(8, 16)))
def test_half_precision_gradients_are_finite(variant, case):
    with all_stand_ins():
        kernel = VARIANTS[variant]()
        tensors = [t.clone().requires_grad_(True) for t in (case.query, case.key, case.value)]
        call = AttentionCall.from_arguments(*tensors, case.attn_mask, **case.kwargs())
        if kernel.reasons(call):
            assert {r.code for r in kernel.reasons(call)} == expected_refusals(variant, case, needs_grad=True)
            return
        out = _run(kernel, case, *tensors)
        assert not torch.isnan(out).any()
        grads = torch.autograd.grad(out.float().sum(), tensors)
    for grad in grads:
        assert torch.isfinite(grad).all()


@settings(max_examples=40)
@given(case=attention_cases(dtypes=(torch.float32,), forms=("additive_bias",), max_len=10, head_dims=(8,)))
def test_float_mask_gradient_flows_to_the_bias(case):
    """A float mask that requires grad (a learned bias) gets the reference gradient from every training kernel."""
    grad_out = torch.randn(case.query.shape[:3] + case.value.shape[3:], generator=torch.Generator().manual_seed(2))
    ref_bias = case.bias.clone().requires_grad_(True)
    ref_grad = torch.autograd.grad(_reference(case, bias=ref_bias), ref_bias, grad_out.double())[0]
    keep = case.keep.expand_as(ref_grad)
    for name in ("math", "sdpa", "chunked"):
        bias = case.attn_mask.clone().requires_grad_(True)
        out = npu_port.attention(case.query, case.key, case.value, bias, kernel=name, **case.kwargs())
        grad = torch.autograd.grad(out, bias, grad_out)[0]
        assert torch.isfinite(grad).all()
        assert_close_to_reference(grad.masked_fill(~keep, 0), ref_grad.masked_fill(~keep, 0), torch.float32, name)


@pytest.mark.parametrize("variant", ["math", "sdpa", "chunked", "chunked[q+k-blocks]", "npu_fusion", "xformers"])
def test_dropout_is_unbiased_and_scaled(variant):
    """Dropout drops probabilities with 1/(1-p) scaling: the mean over many draws approaches the p=0 output."""
    gen = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 2, 6, 8, generator=gen) for _ in range(3))
    with all_stand_ins(), torch.no_grad():
        kernel = VARIANTS[variant]()
        exact = npu_port.attention(query, key, value, kernel=kernel)
        torch.manual_seed(0)
        draws = torch.stack([npu_port.attention(query, key, value, dropout_p=0.3, kernel=kernel) for _ in range(1500)])
    assert not torch.allclose(draws[0], exact)  # dropout did something
    assert (draws.mean(0) - exact).abs().max() < 0.08
    assert torch.allclose(npu_port.attention(query, key, value, dropout_p=1.0, kernel="math"), torch.zeros_like(exact))


@given(
    dims=st.sampled_from([(3,), (2, 3)]),
    causal=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_any_leading_dims_like_sdpa(dims, causal, seed):
    """3-D and 5-D inputs behave as in SDPA (leading dimensions are batch; heads are dim -3)."""
    gen = torch.Generator().manual_seed(seed)
    shape = dims + (5, 8)
    query, key, value = (torch.randn(shape, generator=gen) for _ in range(3))
    mask = torch.rand(shape[:-1] + (5,), generator=gen) > 0.3
    # torch documents mask + is_causal as an error (only some backends combine them); npu-port intersects them
    combined = mask & torch.ones(5, 5, dtype=torch.bool).tril() if causal else mask
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, combined)
    for name in ("math", "sdpa", "chunked"):
        out = npu_port.attention(query, key, value, mask, is_causal=causal, kernel=name)
        assert out.shape == expected.shape
        torch.testing.assert_close(out, expected, atol=3e-6, rtol=1e-5)


def test_zero_length_sequences_give_empty_or_zero_output_like_sdpa():
    query = torch.randn(1, 2, 0, 8)
    key = value = torch.randn(1, 2, 5, 8)
    assert npu_port.attention(query, key, value).shape == (1, 2, 0, 8)
    no_keys = torch.zeros(1, 2, 0, 8)
    out = npu_port.attention(torch.randn(1, 2, 3, 8, requires_grad=True), no_keys, no_keys)
    assert torch.equal(out, torch.zeros(1, 2, 3, 8)) and out.requires_grad


def test_empty_batches_in_any_layout_like_sdpa():
    for shape_q, shape_k in (((0, 3, 8), (0, 5, 8)), ((0, 2, 3, 4, 8), (0, 2, 3, 6, 8))):
        query, key = torch.randn(shape_q), torch.randn(shape_k)
        expected = torch.nn.functional.scaled_dot_product_attention(query, key, key)
        assert npu_port.attention(query, key, key).shape == expected.shape
