"""Float, key-padding and causal masks on the fused Ascend path (and SDPA on an NPU), through the emulator.

A float mask that is a pure mask (0 and masked values: -inf, finfo.min, a declared masked_value) becomes the op's
bool mask; a key-padding mask becomes ``actual_seq_lengths_kv`` on the inference op; a bias goes to
npu_fusion_attention's ``pse`` (scale 1, the query pre-scaled) and is refused by the inference op with the reason. Every answer is checked against the float64 reference, what reaches the op is read off a spy, and the
conversions are counted: once per mask tensor and call signature, not per call.
"""

from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_port
from npu_port.attn import AttentionCall, get_kernel, masks
from npu_port.attn.kernels import _ascend, sdpa
from npu_port.attn.target import Target
from npu_port.errors import KernelOptionError, NoKernelError, StrategyOptionError
from npu_port.strategy.registry import get_strategy
from npu_port.strategy.router import StrategyRouter, strategy_options_for

from ..conftest import emulated_torch_npu
from ..reference import assert_close_to_reference, reference_attention, reference_lse

ASCEND = ("npu_fused_infer", "npu_fusion")
OPS = {"npu_fused_infer": "npu_fused_infer_attention_score", "npu_fusion": "npu_fusion_attention"}
NPU_910B = Target.of("npu", "910B")


class Spy:
    """Wraps an emulated op and records every call's keyword arguments."""

    def __init__(self, module, name):
        self.calls = []
        self.original = getattr(module, name)
        setattr(module, name, self)

    def __call__(self, *args, **kwargs):
        self.calls.append(kwargs)
        return self.original(*args, **kwargs)


def _qkv(batch=2, heads=2, q_len=6, key_len=7, dim=16, dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, heads, q_len, dim, generator=gen).to(dtype),
        torch.randn(batch, heads, key_len, dim, generator=gen).to(dtype),
        torch.randn(batch, heads, key_len, dim, generator=gen).to(dtype),
    )


def _padding_keep(lengths, key_len):
    """(B, 1, 1, Skv) keep-mask of right-padded keys: the first ``lengths[b]`` keys of item b take part."""
    return (torch.arange(key_len)[None] < torch.tensor(lengths)[:, None])[:, None, None, :]


def _additive(keep, fill, dtype):
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, fill)


def _run(name, query, key, value, mask, is_causal=False, options=None):
    """The kernel's output and the keyword arguments its op received."""
    kernel = get_kernel(name, **(options or {}))
    with emulated_torch_npu() as module, torch.no_grad():
        spy = Spy(module, OPS[name])
        out = npu_port.attention(query, key, value, mask, is_causal=is_causal, kernel=kernel)
    (passed,) = spy.calls
    return out, passed


def _is_key_padding(keep):
    """Whether ``keep`` is (B|1, 1, 1, Skv) with each item's kept keys a prefix (restated, not npu_port's check)."""
    if keep.shape[1] != 1 or keep.shape[2] != 1:
        return False
    return all(row.tolist() == sorted(row.tolist(), reverse=True) for row in keep[:, 0, 0])


# ---- pure float masks become the op's bool mask, exactly ---------------------------------------------------------


@pytest.mark.parametrize("name", ASCEND)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fill", ["-inf", "finfo.min"])
def test_a_pure_additive_mask_reaches_the_op_as_its_bool_mask(name, dtype, fill):
    query, key, value = _qkv(dtype=dtype)
    keep = torch.rand(2, 1, 6, 7, generator=torch.Generator().manual_seed(1)) > 0.4
    keep[0, 0, 3] = False  # a row with no key: zeros
    value_fill = -math.inf if fill == "-inf" else torch.finfo(dtype).min
    out, passed = _run(name, query, key, value, _additive(keep, value_fill, dtype))
    expected = ~keep
    expected[0, 0, 3] = False  # given its keys back for the op, zeroed after it
    assert passed["atten_mask"].dtype == torch.bool and torch.equal(passed["atten_mask"], expected)
    assert passed["sparse_mode"] == 0
    assert torch.equal(out[0, :, 3], torch.zeros(2, 16, dtype=dtype))
    assert_close_to_reference(out, reference_attention(query, key, value, keep=keep), dtype)


@pytest.mark.parametrize("name", ASCEND)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_declared_masked_value_makes_diffusers_minus_10000_masks_exact_bool_masks(name, dtype):
    """diffusers' ``(1 - mask) * -10000.0``: bfloat16 holds -10000 as -9984, and the declaration still matches it."""
    query, key, value = _qkv(dtype=dtype)
    keep = torch.rand(2, 1, 6, 7, generator=torch.Generator().manual_seed(2)) > 0.5
    keep[1, 0, 0] = False  # every key of this row holds -10000
    mask = (1 - keep.to(dtype)) * -10000.0
    out, passed = _run(name, query, key, value, mask, options={"masked_value": -10000.0})
    assert torch.equal(passed["atten_mask"][1, 0, 1:], ~keep[1, 0, 1:])
    assert_close_to_reference(out, reference_attention(query, key, value, keep=keep), dtype)
    # As a bias, -10000 zeroes the probabilities too: the two agree except in the row whose every key holds it,
    # which the declaration turns into a row with no key (zeros) instead of the average over its keys.
    as_bias = reference_attention(query, key, value, bias=mask.double())
    assert_close_to_reference(out[1, :, 1:], as_bias[1, :, 1:], dtype)
    assert_close_to_reference(out[0], as_bias[0], dtype)
    assert torch.equal(out[1, :, 0], torch.zeros(2, 16, dtype=dtype))
    assert not torch.allclose(as_bias[1, :, 0], torch.zeros(2, 16, dtype=torch.float64))


def test_without_the_declaration_minus_10000_is_a_bias_refused_by_the_inference_op_taken_by_npu_fusion():
    query, key, value = _qkv()
    keep = torch.rand(2, 1, 6, 7, generator=torch.Generator().manual_seed(2)) > 0.5
    call = AttentionCall.from_arguments(query, key, value, (1 - keep.half()) * -10000.0)
    with emulated_torch_npu():
        found = get_kernel("npu_fused_infer").reasons(call)
        declared = get_kernel("npu_fused_infer", masked_value=-10000.0).reasons(call)
        as_pse = get_kernel("npu_fusion").reasons(call)
    assert [(r.code, str(r)) for r in found] == [
        (
            "mask",
            "float mask (2, 1, 6, 7) is a bias, not a pure mask: it holds -10000, and a pure mask holds only 0 (kept) "
            f"and masked values (-inf, values <= -32752); {_ascend.FIA_PSE_NOTE}; pass a bool keep-mask or a pure "
            "mask (declare your masks' masking value, e.g. diffusers' -10000, with the masked_value option), or run "
            "the call on the sdpa or chunked kernel, which add a bias as it is",
        )
    ]
    assert declared == [] and as_pse == []


def test_the_inference_ops_pse_note_says_why_and_where_biases_go():
    assert _ascend.FIA_PSE_NOTE == (
        "npu_fused_infer_attention_score's pse_shift input could carry a bias, but its documented formula "
        "softmax(scale * q k^T + atten_mask) has no pse, so how it is scaled is not documented (npu_fusion takes "
        "biases, as npu_fusion_attention's pse)"
    )


def test_a_bias_with_a_declared_value_is_refused_with_the_declaration_in_the_message():
    query, key, value = _qkv()
    bias = torch.zeros(1, 1, 6, 7, dtype=torch.float16)
    bias[0, 0, 2, 3] = -10000.0
    bias[0, 0, 4, 5] = float("nan")
    call = AttentionCall.from_arguments(query, key, value, bias)
    with emulated_torch_npu():
        (reason,) = get_kernel("npu_fused_infer", masked_value=-10000.0).reasons(call)
    assert str(reason).startswith(
        "float mask (1, 1, 6, 7) is a bias, not a pure mask: it holds nan, and a pure mask holds only 0 (kept) and "
        "masked values (-inf, values <= -32752, or the declared masked_value -10000); "
    )
    assert str(reason).endswith(
        "; pass a bool keep-mask or a pure mask, or run the call on the sdpa or chunked kernel, which add a bias as it is"
    )


def test_a_pure_float_mask_that_needs_a_gradient_stays_off_the_training_op():
    query, key, value = (t.float().requires_grad_(True) for t in _qkv())
    mask = torch.zeros(1, 1, 6, 7).masked_fill(torch.rand(1, 1, 6, 7, generator=torch.Generator()) > 0.7, -math.inf)
    call = AttentionCall.from_arguments(query, key, value, mask.requires_grad_(True))
    with emulated_torch_npu():
        found = get_kernel("npu_fusion").reasons(call)
    assert [(r.code, str(r)) for r in found] == [
        (
            "mask",
            "float mask (1, 1, 6, 7) requires grad: as npu_fusion's bool mask it would get no gradient; use a kernel "
            "that adds it to the scores (sdpa, chunked, math)",
        )
    ]


# ---- compact forms: key lengths, the compressed causal mask --------------------------------------------------------


@pytest.mark.parametrize("form", ["bool", "-inf", "-10000"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_key_padding_reaches_the_inference_op_as_key_lengths_and_no_mask(form, causal):
    query, key, value = _qkv(batch=3, q_len=6, key_len=9)
    keep = _padding_keep([9, 4, 0], 9)  # item 2 has no valid key: its rows are zeros
    mask = {"bool": keep, "-inf": _additive(keep, -math.inf, torch.float16)}.get(form)
    options = {}
    if form == "-10000":
        mask, options = (1 - keep.half()) * -10000.0, {"masked_value": -10000.0}
    out, passed = _run("npu_fused_infer", query, key, value, mask, is_causal=causal, options=options)
    assert passed["actual_seq_lengths_kv"] == [9, 4, 9]  # the empty item gets its keys back, then zeros
    if causal:
        assert passed["sparse_mode"] == 2 and passed["atten_mask"].shape == (2048, 2048)
    else:
        assert passed["sparse_mode"] == 0 and passed["atten_mask"] is None
    assert torch.equal(out[2], torch.zeros(2, 6, 16, dtype=torch.float16))
    assert_close_to_reference(out, reference_attention(query, key, value, keep=keep, is_causal=causal), torch.float16)


def test_a_key_padding_mask_with_holes_goes_as_the_full_mask():
    query, key, value = _qkv(batch=2, key_len=5)
    keep = torch.tensor([[1, 0, 1, 1, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)[:, None, None, :]
    out, passed = _run("npu_fused_infer", query, key, value, keep)
    assert passed["actual_seq_lengths_kv"] is None
    assert torch.equal(passed["atten_mask"], (~keep).expand(2, 1, 6, 5))
    assert_close_to_reference(out, reference_attention(query, key, value, keep=keep), torch.float16)


def test_one_length_serves_every_batch_item_of_a_shared_padding_mask():
    query, key, value = _qkv(batch=3, key_len=8)
    keep = _padding_keep([5], 8)
    out, passed = _run("npu_fused_infer", query, key, value, keep)
    assert passed["actual_seq_lengths_kv"] == [5] and passed["atten_mask"] is None
    assert_close_to_reference(out, reference_attention(query, key, value, keep=keep), torch.float16)


def test_the_training_op_gets_key_padding_as_its_full_mask():
    """npu_fusion_attention takes key lengths only in its TND (varlen) layout: it gets the full (B, 1, Sq, Skv)."""
    query, key, value = _qkv(batch=2, key_len=8)
    keep = _padding_keep([8, 3], 8)
    out, passed = _run("npu_fusion", query, key, value, _additive(keep, -math.inf, torch.float16), is_causal=True)
    causal = torch.ones(6, 8, dtype=torch.bool).tril()
    assert passed["sparse_mode"] == 0 and torch.equal(passed["atten_mask"], ~(keep & causal))
    assert "actual_seq_kvlen" not in passed
    assert_close_to_reference(out, reference_attention(query, key, value, keep=keep, is_causal=True), torch.float16)


def test_a_single_causal_query_with_key_padding_gets_an_explicit_mask():
    """With q_len 1 the inference op ignores sparse_mode: top-left causal means key 0 only."""
    query, key, value = _qkv(batch=2, q_len=1, key_len=5)
    keep = _padding_keep([5, 0], 5)
    out, passed = _run("npu_fused_infer", query, key, value, keep, is_causal=True)
    assert passed["actual_seq_lengths_kv"] is None
    assert passed["atten_mask"].tolist() == [
        [[[False, True, True, True, True]]],
        [[[False, False, False, False, False]]],
    ]
    assert_close_to_reference(out, reference_attention(query, key, value, keep=keep, is_causal=True), torch.float16)


@pytest.mark.parametrize("name", ASCEND)
def test_rows_with_no_key_have_minus_inf_lse_also_when_the_declared_value_empties_them(name):
    query, key, value = _qkv()
    keep = _padding_keep([7, 0], 7)
    with emulated_torch_npu(), torch.no_grad():
        out, lse = npu_port.attention(
            query, key, value, (1 - keep.half()) * -10000.0, return_lse=True, kernel=get_kernel(name, masked_value=-1e4)
        )
    assert torch.isneginf(lse[1]).all() and torch.isfinite(lse[0]).all()
    assert torch.equal(out[1], torch.zeros_like(out[1]))


# ---- decided once, converted once -----------------------------------------------------------------------------------


class _Counter:
    def __init__(self, monkeypatch, module, name):
        self.count, original = 0, getattr(module, name)

        def counted(*args, **kwargs):
            self.count += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)


@pytest.mark.parametrize("name", ASCEND)
def test_layers_sharing_one_mask_tensor_convert_it_once(monkeypatch, name):
    """Eight layers pass one 2-D text mask, widened per call as diffusers' dispatcher does (a new view each time):
    one purity check and one conversion (the full mask; the key lengths on the inference op); an in-place change
    is seen at once."""
    query, key, value = _qkv(batch=2, key_len=8)
    keep = _padding_keep([8, 3], 8)[:, 0, 0, :]
    text_mask = _additive(keep, -math.inf, torch.float16)
    checked = _Counter(monkeypatch, masks, "_masked_entries")
    built = _Counter(monkeypatch, _ascend, "_full_mask")
    kernel = get_kernel(name)
    with emulated_torch_npu(), torch.no_grad():
        computed = masks.MEMO.computed
        outs = [npu_port.attention(query, key, value, text_mask[:, None, None, :], kernel=kernel) for _ in range(8)]
        assert (masks.MEMO.computed - computed, checked.count) == (2, 1)  # purity, then the mask or the lengths
        assert built.count == (1 if name == "npu_fusion" else 0)
        text_mask[1, 3] = 0.0  # in place: key 3 of item 1 takes part now
        again = npu_port.attention(query, key, value, text_mask[:, None, None, :], kernel=kernel)
    assert (masks.MEMO.computed - computed, checked.count) == (4, 2)
    reference = reference_attention(query, key, value, keep=keep[:, None, None, :])
    for out in outs:
        assert_close_to_reference(out, reference, torch.float16)
    keep[1, 3] = True
    assert_close_to_reference(again, reference_attention(query, key, value, keep=keep[:, None, None, :]), torch.float16)


def test_the_kept_forms_never_keep_the_mask_alive():
    query, key, value = _qkv()
    mask = _additive(torch.rand(2, 1, 6, 7, generator=torch.Generator()) > 0.3, -math.inf, torch.float16)
    with emulated_torch_npu(), torch.no_grad():
        npu_port.attention(query, key, value, mask, kernel="npu_fusion")
    before = len(masks.MEMO)
    gone = weakref.ref(mask)
    del mask
    gc.collect()
    assert gone() is None and len(masks.MEMO) < before  # its entry went with it


def test_a_mask_made_under_inference_mode_is_read_at_every_call(monkeypatch):
    """An inference tensor has no version counter: nothing derived from it can be kept safely."""
    query, key, value = _qkv()
    with torch.inference_mode():
        mask = _additive(_padding_keep([7, 2], 7), -math.inf, torch.float16)
    converted = _Counter(monkeypatch, _ascend, "_full_mask")
    with emulated_torch_npu(), torch.inference_mode():
        for _ in range(3):
            npu_port.attention(query, key, value, mask, kernel="npu_fusion")
    assert converted.count == 3


# ---- planning from a CPU ---------------------------------------------------------------------------------------------


def _plan(name, mask, is_causal=False, batch=2, q_len=6, key_len=8, masked_value=None):
    """reasons / fused / plan_bytes for a call recorded on the CPU, without the emulator (no torch_npu here)."""
    query, key, value = _qkv(batch=batch, q_len=q_len, key_len=key_len)
    call = AttentionCall.from_arguments(query, key, value, mask, is_causal=is_causal)
    kernel = get_kernel(name, masked_value=masked_value)
    return kernel.reasons(call, NPU_910B), kernel.fused(call, NPU_910B), kernel.plan_bytes(call)


@pytest.mark.parametrize(
    "name, mask, is_causal, plan",
    [
        ("npu_fused_infer", None, True, ([], True, 0)),
        ("npu_fused_infer", "padding", False, ([], True, 0)),
        ("npu_fused_infer", "padding", True, ([], True, 0)),
        ("npu_fused_infer", "full", False, ([], True, 2 * 6 * 8)),
        ("npu_fusion", None, True, ([], True, 0)),
        ("npu_fusion", "padding", False, ([], True, 2 * 6 * 8)),
        ("npu_fusion", "full", True, ([], True, 2 * 6 * 8)),
    ],
)
def test_a_plan_of_cpu_recorded_calls_agrees_with_the_run(name, mask, is_causal, plan):
    keep = {"padding": _padding_keep([8, 5], 8), "full": torch.rand(2, 1, 6, 8, generator=torch.Generator()) > 0.5}
    given_mask = None if mask is None else _additive(keep[mask], -math.inf, torch.float16)
    assert _plan(name, given_mask, is_causal) == plan


@pytest.mark.parametrize(
    "name, mask",
    [
        (name, mask)
        for name in ASCEND
        for mask in (None, "padding", "shared-padding", "holes", "per-row", "per-head")
        if (name, mask) != ("npu_fused_infer", "per-head")  # refused: its masks are (B|1, 1, Sq, Skv)
    ],
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("q_len", [1, 6])
def test_plan_bytes_are_the_bytes_of_the_mask_the_op_gets(name, mask, causal, q_len):
    gen = torch.Generator().manual_seed(6)
    keep = {
        "padding": _padding_keep([8, 0], 8),
        "shared-padding": _padding_keep([3], 8),
        "holes": torch.rand(2, 1, 1, 8, generator=gen) > 0.5,
        "per-row": torch.rand(2, 1, q_len, 8, generator=gen) > 0.5,
        "per-head": torch.rand(1, 2, q_len, 8, generator=gen) > 0.5,
    }.get(mask)
    given_mask = None if keep is None else _additive(keep, -math.inf, torch.float16)
    query, key, value = _qkv(batch=2, q_len=q_len, key_len=8)
    planned = get_kernel(name).plan_bytes(AttentionCall.from_arguments(query, key, value, given_mask, is_causal=causal))
    out, passed = _run(name, query, key, value, given_mask, is_causal=causal)
    atten_mask = passed["atten_mask"]
    built = 0 if atten_mask is None or atten_mask.shape == (2048, 2048) else atten_mask.numel()
    assert planned == built
    reference = reference_attention(query, key, value, keep=keep, is_causal=causal)
    assert_close_to_reference(out, reference, torch.float16)


def test_a_plan_refuses_a_bias_as_the_run_does():
    bias = torch.full((2, 1, 6, 8), 0.5, dtype=torch.float16)
    (reason,) = _plan("npu_fused_infer", bias)[0]
    assert reason.code == "mask" and "it holds 0.5" in str(reason)


# ---- sdpa on an NPU ----------------------------------------------------------------------------------------------


def _sdpa_spy(monkeypatch):
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_on_an_npu_passes_a_pure_float_mask_as_its_bool_mask(monkeypatch, causal):
    """The emulator has no SDPA: the conversion is run on the CPU (as if it were an NPU) and what SDPA gets is read."""
    monkeypatch.setattr(sdpa, "CONVERT_ON", ("npu", "cpu"))
    calls = _sdpa_spy(monkeypatch)
    query, key, value = _qkv(dtype=torch.float32)
    keep = torch.rand(2, 1, 6, 7, generator=torch.Generator().manual_seed(4)) > 0.5
    keep[0, 0, 1] = False
    mask = (1 - keep.float()) * -10000.0
    out = npu_port.attention(query, key, value, mask, is_causal=causal, kernel=get_kernel("sdpa", masked_value=-1e4))
    (passed,) = calls
    full = keep & torch.ones(6, 7, dtype=torch.bool).tril() if causal else keep
    expected = full | ~full.any(-1, keepdim=True)  # rows with no key get their keys back, then zeros
    assert passed["attn_mask"].dtype == torch.bool and torch.equal(passed["attn_mask"], expected)
    assert passed["is_causal"] is False
    assert_close_to_reference(out, reference_attention(query, key, value, keep=keep, is_causal=causal), torch.float32)


def test_sdpa_keeps_a_bias_as_a_float_mask_and_the_declared_value_masked_on_every_device(monkeypatch):
    monkeypatch.setattr(sdpa, "CONVERT_ON", ("npu", "cpu"))
    calls = _sdpa_spy(monkeypatch)
    query, key, value = _qkv(dtype=torch.float32)
    bias = torch.randn(1, 1, 6, 7, generator=torch.Generator().manual_seed(5))
    bias[0, 0, :, 6] = -10000.0
    bias[0, 0, 2] = -10000.0  # a row whose every key holds the declared value: zeros
    out = npu_port.attention(query, key, value, bias, kernel=get_kernel("sdpa", masked_value=-10000.0))
    (passed,) = calls
    assert passed["attn_mask"].dtype == torch.float32
    keep = bias != -10000.0
    assert torch.isneginf(passed["attn_mask"][~keep.expand(1, 1, 6, 7) & keep.any(-1, keepdim=True)]).all()
    expected = reference_attention(query, key, value, keep=keep, bias=bias.double().masked_fill(~keep, 0))
    assert_close_to_reference(out, expected, torch.float32)


def test_sdpa_on_the_cpu_passes_float_masks_as_they_are(monkeypatch):
    calls = _sdpa_spy(monkeypatch)
    query, key, value = _qkv(dtype=torch.float32)
    mask = _additive(torch.rand(2, 1, 6, 7, generator=torch.Generator()) > 0.3, -math.inf, torch.float32)
    npu_port.attention(query, key, value, mask, kernel="sdpa")
    assert calls[0]["attn_mask"].dtype == torch.float32


@pytest.mark.parametrize(
    "shape, dtype, mask, target, fused",
    [
        ((2, 8, 16, 64), torch.float16, None, NPU_910B, True),
        ((2, 8, 16, 64), torch.bfloat16, "pure", NPU_910B, True),
        ((2, 8, 16, 64), torch.float16, "bias", NPU_910B, False),  # a float mask: the math path
        ((2, 8, 16, 64), torch.float16, "bool", NPU_910B, True),
        ((2, 8, 16, 64), torch.float16, None, Target.of("npu", "910A"), False),  # below Ascend910B1
        ((2, 8, 16, 64), torch.float16, None, Target.of("npu", "310P"), False),
        ((2, 8, 16, 64), torch.float16, None, Target.of("cuda"), False),
        ((2, 8, 16, 64), torch.float32, None, NPU_910B, True),
        ((2, 8, 16, 6), torch.float32, None, NPU_910B, False),  # float32 needs head dims % 4 == 0
        ((2, 8, 16, 6), torch.float16, None, NPU_910B, True),
        ((2, 8, 16, 64), torch.float64, None, NPU_910B, False),
        ((1, 2048, 2, 4), torch.float16, None, NPU_910B, True),
        ((1, 2049, 2, 4), torch.float16, None, NPU_910B, False),  # N_LIMIT
        ((1, 1, 2, 512), torch.float16, None, NPU_910B, True),
        ((1, 1, 2, 513), torch.float16, None, NPU_910B, False),  # D_LIMIT
    ],
)
def test_sdpa_says_which_calls_torch_npu_sends_to_flash_attention_score(shape, dtype, mask, target, fused):
    query = torch.zeros(shape, dtype=dtype)
    keep = torch.rand(shape[0], 1, shape[2], shape[2], generator=torch.Generator()) > 0.5
    given_mask = {
        None: None,
        "bool": keep,
        "pure": _additive(keep, -math.inf, dtype),
        "bias": torch.full(keep.shape, 0.5, dtype=dtype),
    }[mask]
    call = AttentionCall.from_arguments(query, query, query, given_mask)
    assert get_kernel("sdpa").reasons(call, target) == []
    assert get_kernel("sdpa").fused(call, target) is fused


def test_sdpa_with_grouped_query_heads_is_fused_without_enable_gqa_on_the_npu():
    query, key = torch.zeros(1, 8, 4, 64, dtype=torch.float16), torch.zeros(1, 2, 4, 64, dtype=torch.float16)
    call = AttentionCall.from_arguments(query, key, key, enable_gqa=True)
    assert get_kernel("sdpa").fused(call, NPU_910B) is True


# ---- the option, from a strategy -------------------------------------------------------------------------------------


def test_masked_value_is_an_option_set_from_the_strategy():
    strategy = get_strategy("npu").with_overrides(masked_value=-10000)
    assert strategy.option("masked_value") == -10000.0
    for name in ("npu_fused_infer", "npu_fusion", "sdpa"):
        assert strategy_options_for(name, strategy) == {"masked_value": -10000.0}
    with pytest.raises(StrategyOptionError) as info:
        get_strategy("npu").with_overrides(masked_value=10000)
    assert str(info.value) == (
        "masked_value must be None or a negative number, the additive value your masks use for a masked position "
        "(e.g. -10000.0 for diffusers' masks); got 10000"
    )
    with pytest.raises(KernelOptionError, match="masked_value must be None or a negative number"):
        get_kernel("npu_fusion", masked_value=float("nan"))


def test_a_router_tells_a_pure_mask_from_a_bias_of_the_same_shape():
    """The router keeps one choice per bucket: a pure mask and a bias of one shape are two buckets, so a bias never
    reaches the kernel chosen for the pure mask (the inference op, which refuses biases): it runs on npu_fusion."""
    query, key, value = _qkv()
    pure = _additive(torch.rand(2, 1, 6, 7, generator=torch.Generator()) > 0.3, -math.inf, torch.float16)
    bias = torch.randn(2, 1, 6, 7, generator=torch.Generator().manual_seed(3)).half()
    with emulated_torch_npu(), torch.no_grad():
        router = StrategyRouter(get_strategy("npu"))
        out = router(query, key, value, pure)
        biased = router(query, key, value, bias)
    assert_close_to_reference(out, reference_attention(query, key, value, keep=pure == 0), torch.float16)
    assert_close_to_reference(biased, reference_attention(query, key, value, bias=bias.double()), torch.float16)
    assert dict(router.calls) == {"npu_fused_infer": 1, "npu_fusion": 1}
    buckets = sorted(d.bucket.split("mask=")[1].split()[0] for d in router.decisions.values())
    assert buckets == ["float-bias[B1QK]", "float-pure[B1QK]"]


def test_a_router_never_hands_a_float_mask_that_wants_a_gradient_to_the_kernel_chosen_for_one_that_does_not():
    """npu_fusion takes a pure float mask as its bool mask only when no gradient is wanted for it: a mask of the same
    shape that requires grad is a bucket of its own, refused there as it is when asked directly (before, the router
    reused npu_fusion and the mask's gradient was silently None)."""
    keep = torch.rand(2, 1, 6, 7, generator=torch.Generator().manual_seed(11)) > 0.3
    query, key, value = (t.requires_grad_() for t in _qkv())
    with emulated_torch_npu():
        router = StrategyRouter(get_strategy("npu"))
        router(query, key, value, _additive(keep, -math.inf, torch.float16))
        wants_grad = _additive(keep, -math.inf, torch.float16).requires_grad_()
        with pytest.raises(NoKernelError) as info:
            router(query, key, value, wants_grad)
    assert list(router.calls.items()) == [("npu_fusion", 1)]
    assert "float mask (2, 1, 6, 7) requires grad" in str(info.value)
    assert wants_grad.grad is None
    buckets = sorted(d.bucket.split("mask=")[1].split()[0] for d in router.decisions.values())
    assert buckets == ["float-pure[B1QK]"]


def test_a_router_judges_purity_with_each_kernels_own_masked_value():
    """kernel_options can give the two Ascend kernels different masked values: a -10000 mask is pure to npu_fusion and a
    bias to npu_fused_infer, so it must not reuse the kernel the router chose for a 0/-inf mask of the same shape
    (before, it did, and npu_fused_infer raised KernelRuntimeError on a valid configuration)."""
    query, key, value = _qkv()
    keep = torch.rand(2, 1, 6, 7, generator=torch.Generator().manual_seed(12)) > 0.3
    strategy = get_strategy("npu").with_overrides(
        masked_value=-10000.0, kernel_options={"npu_fused_infer": {"masked_value": None}}
    )
    with emulated_torch_npu(), torch.no_grad():
        router = StrategyRouter(strategy)
        router(query, key, value, _additive(keep, -math.inf, torch.float16))
        out = router(query, key, value, (1 - keep.half()) * -10000.0)
    assert list(router.calls.items()) == [("npu_fused_infer", 1), ("npu_fusion", 1)]
    assert_close_to_reference(out, reference_attention(query, key, value, keep=keep), torch.float16)
    buckets = sorted(d.bucket.split("mask=")[1].split()[0] for d in router.decisions.values())
    assert buckets == ["float-bias/pure[B1QK]", "float-pure/pure[B1QK]"]


def test_a_strategy_declares_diffusers_masks_for_every_layer():
    query, key, value = _qkv()
    keep = torch.rand(2, 1, 6, 7, generator=torch.Generator().manual_seed(8)) > 0.4
    with emulated_torch_npu(), torch.no_grad():
        router = StrategyRouter(get_strategy("npu").with_overrides(masked_value=-10000.0))
        out = router(query, key, value, (1 - keep.half()) * -10000.0)
    assert_close_to_reference(out, reference_attention(query, key, value, keep=keep), torch.float16)


# ---- any pure mask ---------------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(ASCEND),
    batch=st.integers(1, 3),
    q_len=st.integers(1, 9),
    key_len=st.integers(1, 9),
    form=st.sampled_from(["random", "padding", "shared-padding"]),
    fill=st.sampled_from(["-inf", "finfo.min", "-4e4", "declared"]),
    dtype=st.sampled_from([torch.float16, torch.bfloat16]),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_any_pure_mask_gives_the_reference(name, batch, q_len, key_len, form, fill, dtype, causal, seed):
    gen = torch.Generator().manual_seed(seed)
    query, key, value = _qkv(batch=batch, q_len=q_len, key_len=key_len, dtype=dtype, seed=seed)
    if form == "random":
        keep = torch.rand(batch, 1, q_len, key_len, generator=gen) > 0.5
    else:
        lengths = torch.randint(0, key_len + 1, (1 if form == "shared-padding" else batch,), generator=gen).tolist()
        keep = _padding_keep(lengths, key_len)
    value_fill = {"-inf": -math.inf, "finfo.min": torch.finfo(dtype).min, "-4e4": -4e4, "declared": -7.5}[fill]
    options = {"masked_value": -7.5} if fill == "declared" else {}
    out, passed = _run(name, query, key, value, _additive(keep, value_fill, dtype), is_causal=causal, options=options)
    compact = name == "npu_fused_infer" and _is_key_padding(keep) and not (causal and q_len == 1)
    assert (passed.get("actual_seq_lengths_kv") is not None) == compact
    assert_close_to_reference(out, reference_attention(query, key, value, keep=keep, is_causal=causal), dtype)


# ---- a bias through npu_fusion_attention's pse -----------------------------------------------------------------------


class ArgSpy(Spy):
    """A :class:`Spy` that also keeps the positional arguments (the query the op got)."""

    def __call__(self, *args, **kwargs):
        self.calls.append({"args": args, **kwargs})
        return self.original(*args, **kwargs)


def _run_pse(query, key, value, mask, is_causal=False, scale=None, options=None):
    """npu_fusion's output for a biased call and what its op received."""
    kernel = get_kernel("npu_fusion", **(options or {}))
    with emulated_torch_npu() as module, torch.no_grad():
        spy = ArgSpy(module, "npu_fusion_attention")
        out = npu_port.attention(query, key, value, mask, is_causal=is_causal, scale=scale, kernel=kernel)
    (passed,) = spy.calls
    return out, passed


DOCUMENTED_PSE = ("BNSS", "BN1Skv", "1NSS")


def _pse_format(shape, batch, heads, q_len, key_len):
    forms = {(batch, heads, q_len, key_len): "BNSS", (batch, heads, 1, key_len): "BN1Skv"}
    forms.setdefault((1, heads, q_len, key_len), "1NSS")
    return forms.get(tuple(shape))


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 3),
    heads=st.sampled_from([1, 2]),
    q_len=st.integers(1, 9),
    key_len=st.integers(1, 9),
    bias_shape=st.sampled_from(["BNQK", "1NQK", "B1QK", "11QK", "BN1K", "B11K", "111K"]),
    holes=st.sampled_from(["none", "-inf", "finfo.min", "rows"]),
    causal=st.booleans(),
    scale=st.sampled_from([None, 1.0, 0.3]),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
    seed=st.integers(0, 2**16),
)
def test_any_bias_through_pse_gives_the_reference(
    batch, heads, q_len, key_len, bias_shape, holes, causal, scale, dtype, seed
):
    gen = torch.Generator().manual_seed(seed)
    query, key, value = _qkv(batch, heads, q_len, key_len, dim=24, dtype=dtype, seed=seed)  # 1/sqrt(24): rounded
    sizes = {"B": batch, "N": heads, "Q": q_len, "K": key_len, "1": 1}
    shape = tuple(sizes[c] for c in bias_shape)
    bias = torch.randn(shape, generator=gen) * 2
    keep = torch.ones(shape, dtype=torch.bool)
    if holes != "none":
        keep = torch.rand(shape, generator=gen) > 0.3
        if holes == "rows":
            keep[..., 0, :] = False  # a row (for a one-row bias: every row) with no key: zeros
        fill = -math.inf if holes in ("-inf", "rows") else torch.finfo(dtype).min
        bias = bias.masked_fill(~keep, fill)
    bias = bias.to(dtype)
    out, passed = _run_pse(query, key, value, bias, is_causal=causal, scale=scale)
    pse = passed["pse"]
    call_scale = 1.0 / math.sqrt(24) if scale is None else scale
    if bool((bias[keep] != 0).any()):  # a bias: pse at scale 1, the query pre-scaled once in its dtype
        assert pse.dtype == dtype and _pse_format(pse.shape, batch, heads, q_len, key_len) in DOCUMENTED_PSE
        assert passed["scale"] == 1.0 and torch.equal(passed["args"][0], query * call_scale)
    else:  # every kept entry drew 0 (or none is kept): a pure mask, the op's bool mask alone
        assert pse is None and passed["scale"] == call_scale and passed["args"][0] is query
    kept_bias = bias.double().masked_fill(~keep, 0.0)
    expected = reference_attention(query, key, value, keep=keep, bias=kept_bias, is_causal=causal, scale=scale)
    # The pre-scale rounds q * scale to the dtype once per element: a relative error of at most one unit in the
    # last place of each query element, i.e. of each score; within the dtype's tolerance.
    assert_close_to_reference(out, expected, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
def test_t5_relative_position_bias_with_a_padding_mask_runs_on_npu_fusion(dtype, causal):
    """T5 adds its (1, N, S, S) relative-position bias to the (B, 1, 1, S) padding mask (finfo.min where padded)
    and calls attention with scale=1.0: one (B, N, S, S) float mask, passed as BNSS pse plus its bool mask."""
    batch, heads, length = 3, 4, 10
    query, key, value = _qkv(batch, heads, length, length, dim=16, dtype=dtype, seed=11)
    position_bias = (torch.randn(1, heads, length, length, generator=torch.Generator().manual_seed(12)) * 4).to(dtype)
    keep = _padding_keep([10, 6, 0], length)  # item 2 is all padding: zeros
    padding = _additive(keep, torch.finfo(dtype).min, dtype)
    mask = position_bias + padding
    out, passed = _run_pse(query, key, value, mask, is_causal=causal, scale=1.0)
    assert passed["pse"].shape == (batch, heads, length, length) and passed["scale"] == 1.0
    assert passed["args"][0] is query  # scale 1: nothing multiplied
    expected_masked = ~(keep | ~keep.any(-1, keepdim=True))  # item 2 given its keys back, zeroed after
    if causal:
        expected_masked = ~((keep & torch.ones(length, length, dtype=torch.bool).tril()) | ~keep.any(-1, True))
    assert torch.equal(passed["atten_mask"], expected_masked.expand(batch, heads, length, length))
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    kept_bias = position_bias.double().expand(batch, heads, length, length)
    expected = reference_attention(query, key, value, keep=keep, bias=kept_bias, is_causal=causal, scale=1.0)
    assert_close_to_reference(out, expected, dtype)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_bias_that_masks_nothing_needs_no_mask_or_only_the_compressed_causal_one(causal):
    """ALiBi-like: (1, N, Sq, Skv) with no masked entry; causal takes sparse_mode 2 with pse (the docs forbid pse
    only with sparse modes 7 and 8), so no (Sq, Skv) bool mask is built."""
    query, key, value = _qkv(2, 2, 6, 6, dim=16, dtype=torch.float16, seed=13)
    distance = (torch.arange(6)[None] - torch.arange(6)[:, None]).abs()
    alibi = (-distance * torch.tensor([0.5, 0.25])[:, None, None])[None].half()
    out, passed = _run_pse(query, key, value, alibi, is_causal=causal)
    assert passed["pse"].shape == (1, 2, 6, 6)
    if causal:
        assert passed["sparse_mode"] == 2 and passed["atten_mask"].shape == (2048, 2048)
    else:
        assert passed["sparse_mode"] == 0 and passed["atten_mask"] is None
    expected = reference_attention(query, key, value, bias=alibi.double(), is_causal=causal)
    assert_close_to_reference(out, expected, torch.float16)


def test_the_pse_is_built_once_per_mask_tensor_and_again_after_an_in_place_change(monkeypatch):
    built = []
    original = _ascend._pse
    monkeypatch.setattr(_ascend, "_pse", lambda *args: built.append(1) or original(*args))
    query, key, value = _qkv(dtype=torch.float16)
    bias = torch.randn(2, 2, 6, 7, generator=torch.Generator().manual_seed(14)).half()
    bias[0, 0, 1, 2] = -math.inf
    kernel = get_kernel("npu_fusion")
    with emulated_torch_npu() as module, torch.no_grad():
        spy = Spy(module, "npu_fusion_attention")
        for _ in range(3):  # three layers sharing one mask tensor
            npu_port.attention(query, key, value, bias, kernel=kernel)
        assert len(built) == 1
        assert spy.calls[0]["pse"] is spy.calls[2]["pse"]
        bias.add_(0.5)  # an in-place change is seen
        out = npu_port.attention(query, key, value, bias, kernel=kernel)
    assert len(built) == 2
    keep = ~torch.isneginf(bias)
    expected = reference_attention(query, key, value, keep=keep, bias=bias.double().masked_fill(~keep, 0))
    assert_close_to_reference(out, expected, torch.float16)


@pytest.mark.parametrize(
    "mask_shape, causal, pse_shape, full_mask",
    [
        ((1, 2, 6, 8), False, (1, 2, 6, 8), None),  # 1NSS, masks nothing: no bool mask
        ((2, 1, 6, 8), True, (2, 2, 6, 8), None),  # B1SS is no pse format: BNSS; causal: the compressed mask
        ((2, 2, 1, 8), False, (2, 2, 1, 8), (2, 2, 6, 8)),  # BN1Skv; masked keys: a BNSS bool mask (no BN1S form)
        ((1, 1, 1, 8), True, (2, 2, 1, 8), (1, 1, 6, 8)),  # BN1Skv is smaller than 1NSS here
    ],
)
def test_plan_bytes_count_the_pse_and_the_mask_the_op_gets(mask_shape, causal, pse_shape, full_mask):
    bias = torch.randn(mask_shape, generator=torch.Generator().manual_seed(15)).half()
    if full_mask is not None:
        bias[..., 3] = -math.inf
    query, key, value = _qkv(batch=2, q_len=6, key_len=8)
    call = AttentionCall.from_arguments(query, key, value, bias, is_causal=causal)
    assert get_kernel("npu_fusion").reasons(call, NPU_910B) == [] and get_kernel("npu_fusion").fused(call, NPU_910B)
    planned = get_kernel("npu_fusion").plan_bytes(call)
    out, passed = _run_pse(query, key, value, bias, is_causal=causal)
    atten_mask = passed["atten_mask"]
    assert tuple(passed["pse"].shape) == pse_shape
    assert (None if atten_mask is None or atten_mask.shape == (2048, 2048) else tuple(atten_mask.shape)) == full_mask
    built = 0 if full_mask is None else atten_mask.numel()
    assert planned == built + passed["pse"].numel() * 2
    keep = ~torch.isneginf(bias)
    expected = reference_attention(
        query, key, value, keep=keep, bias=bias.double().masked_fill(~keep, 0), is_causal=causal
    )
    assert_close_to_reference(out, expected, torch.float16)


def test_gradients_flow_through_the_pre_scaled_query_and_the_bias_stays_constant():
    query, key, value = (t.float().requires_grad_(True) for t in _qkv(dim=24))
    bias = torch.randn(1, 2, 6, 7, generator=torch.Generator().manual_seed(16))
    bias[0, 1, 2, :3] = -math.inf
    with emulated_torch_npu():
        out = npu_port.attention(query, key, value, bias, kernel="npu_fusion")
        grads = torch.autograd.grad(out.square().sum(), (query, key, value))
    keep = ~torch.isneginf(bias)
    ref_inputs = [t.detach().double().requires_grad_(True) for t in (query, key, value)]
    ref = reference_attention(*ref_inputs, keep=keep, bias=bias.double().masked_fill(~keep, 0))
    ref_grads = torch.autograd.grad(ref.square().sum(), ref_inputs)
    assert_close_to_reference(out.detach(), ref.detach(), torch.float32)
    for grad, ref_grad, name in zip(grads, ref_grads, "qkv"):
        assert_close_to_reference(grad, ref_grad, torch.float32, what=f"d{name}")


def test_a_bias_that_needs_a_gradient_is_refused_even_when_a_router_chose_npu_fusion_for_its_bucket():
    query, key, value = (t.float().requires_grad_(True) for t in _qkv())
    bias = torch.randn(1, 1, 6, 7, requires_grad=True)
    call = AttentionCall.from_arguments(query, key, value, bias)
    with emulated_torch_npu(), pytest.raises(npu_port.errors.KernelRuntimeError) as info:
        get_kernel("npu_fusion").run(call)
    assert str(info.value).startswith(
        "a bias that requires grad cannot be npu_fusion_attention's pse; reasons() refuses this call ("
    )


def test_nan_in_a_bias_makes_its_row_nan_on_npu_fusion():
    query, key, value = _qkv(dtype=torch.float32)
    bias = torch.randn(2, 1, 6, 7, generator=torch.Generator().manual_seed(17))
    bias[1, 0, 4, 2] = float("nan")
    out, _ = _run_pse(query, key, value, bias)
    assert torch.isnan(out[1, :, 4]).all()
    out[1, :, 4] = 0
    expected = reference_attention(query, key, value, bias=bias.double().nan_to_num(0.0))
    expected[1, :, 4] = 0
    assert_close_to_reference(out, expected, torch.float32)


def test_a_plan_under_the_npu_strategy_counts_bias_calls_fused_on_npu_fusion():
    from npu_port.plan import assess, record_calls

    query, key, value = _qkv(dtype=torch.float16)
    bias = torch.randn(1, 2, 6, 7, generator=torch.Generator().manual_seed(18)).half()

    def run():
        for _ in range(4):
            npu_port.attention(query, key, value, bias)
            npu_port.attention(query, key, value)

    plan = assess(record_calls(run), NPU_910B)
    assert (plan.calls, plan.fused) == (8, 8)
    kernels = {item.kernel for item in plan.signatures}
    assert kernels == {"npu_fusion", "npu_fused_infer"}


def test_the_log_sum_exp_of_a_biased_call_includes_the_bias_and_the_call_scale():
    query, key, value = _qkv(dtype=torch.float32, dim=24)
    bias = torch.randn(2, 2, 6, 7, generator=torch.Generator().manual_seed(19))
    bias[1, 0, 3] = -math.inf  # a row with no key: -inf
    with emulated_torch_npu(), torch.no_grad():
        out, lse = npu_port.attention(query, key, value, bias, kernel="npu_fusion", return_lse=True)
    keep = ~torch.isneginf(bias)
    kept_bias = bias.double().masked_fill(~keep, 0)
    expected = reference_lse(query, key, keep, bias=kept_bias)
    assert torch.isneginf(lse[1, 0, 3]) and torch.isneginf(expected[1, 0, 3])
    torch.testing.assert_close(lse.double(), expected, rtol=1e-5, atol=1e-5)
    assert_close_to_reference(out, reference_attention(query, key, value, keep=keep, bias=kept_bias), torch.float32)
