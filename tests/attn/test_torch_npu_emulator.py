"""Checks of the torch_npu emulator (tests/emulators/torch_npu_emulator.py), which stands in for the Ascend ops.

(a) Against torch_npu's own docs: the runnable examples in torch_npu 2.13.0's ``_op_plugin_docs.py`` are
    executed against the emulator, with their own reference computations and torch_npu's own comparison rule
    (``assertRtolEqual``).  Deliberately broken emulators must fail those same documented tests, so the check
    can fail.
(b) Against an independent float64 reference written here cell by cell from the docs' rules (sparse_mode
    table, polarity, GQA, invalid rows), and against torch's own scaled_dot_product_attention.
"""

from __future__ import annotations

import ast
import inspect
import math
import re
import subprocess
import sys
import types
import unittest
import zipfile
from collections.abc import Sequence
from numbers import Number

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import torch_npu_docs
from tests.emulators import torch_npu_emulator as emu

INT_MAX = 2147483647
FUSION = "npu_fusion_attention"
FIA = "npu_fused_infer_attention_score"
# Where the runnable examples sit in the two docstrings (start marker, end marker).
FUSION_EXAMPLE = (FUSION, "单算子模式调用:", "使用pse位置编码的示例")
FIA_EXAMPLE = (FIA, "单算子模式调用", "# 执行上述代码的输出out类似如下")
FUSION_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD")
FIA_LAYOUTS = ("BSH", "BSND", "BNSD", "BNSD_BSND")


# ==========================================================================================================
# torch_npu's comparison rule and the docs-example runner


class DocsTestCase(unittest.TestCase):
    """Stand-in for ``torch_npu.testing.testcase.TestCase`` in the docs' examples; only assertRtolEqual matters.

    Ported from torch_npu 2.13.0 ``torch_npu/testing/testcase.py`` (BSD-3-Clause) with its semantics kept:
    float16 compares at ``prec16`` (relative floor 6e-8), float32 and integers at ``prec`` (floor 1e-9),
    bfloat16 through ``torch.allclose(rtol=atol=prec16)``; NaNs must sit at the same places; and a float
    result fails only when more than ``size * prec`` elements miss BOTH the absolute and the relative bound.
    ``test_ported_assert_rtol_equal_matches_torch_npu`` checks the port against the wheel's original.
    """

    def assertRtolEqual(self, x, y, prec=1.0e-4, prec16=1.0e-3, auto_trans_dtype=False, message=None):  # noqa: N802
        def _assert_rtol_equal(x, y, prec, prec16, message):
            def compare_res(pre, minimum):
                diff = y - x
                nan_mask = np.isnan(x)
                if not np.equal(nan_mask, np.isnan(y)).all():
                    self.fail(message)
                if nan_mask.any():
                    diff[nan_mask] = 0
                result = np.abs(diff)
                deno = np.maximum(np.abs(x), np.abs(y))
                result_atol = np.less_equal(result, pre)
                result_rtol = np.less_equal(result / np.add(deno, minimum), pre)
                if not result_rtol.all() and not result_atol.all():
                    limit = size * pre
                    if np.sum(result_rtol == False) > limit and np.sum(result_atol == False) > limit:  # noqa: E712
                        self.fail("result error")

            minimum16 = 6e-8
            minimum = 10e-10
            if isinstance(x, Sequence) and isinstance(y, Sequence):
                for x_, y_ in zip(x, y):
                    _assert_rtol_equal(x_, y_, prec, prec16, message)
                return
            if isinstance(x, torch.Tensor) and isinstance(y, Sequence):
                y = torch.as_tensor(y, dtype=x.dtype, device=x.device)
            elif isinstance(x, Sequence) and isinstance(y, torch.Tensor):
                x = torch.as_tensor(x, dtype=y.dtype, device=y.device)
            if torch.is_tensor(x) and torch.is_tensor(y):
                if auto_trans_dtype:
                    x = x.to(y.dtype)
                if (x.dtype == torch.bfloat16) and (y.dtype == torch.bfloat16):
                    if x.shape != y.shape:
                        self.fail("shape error!")
                    if not torch.allclose(x.cpu(), y.cpu(), rtol=prec16, atol=prec16):
                        self.fail("result error!")
                    return
                x = x.detach().cpu().numpy()
                y = y.detach().cpu().numpy()
            elif isinstance(x, Number) and isinstance(y, Number):
                x = np.array(x)
                y = np.array(y)
            size = x.size
            if x.shape != y.shape:
                self.fail("shape error")
            if x.dtype != y.dtype:
                self.fail("dtype error")
            dtype_list = [
                np.bool_,
                np.uint16,
                np.int16,
                np.int32,
                np.float16,
                np.float32,
                np.int8,
                np.uint8,
                np.int64,
                np.float64,
            ]
            if x.dtype not in dtype_list:
                self.fail(
                    "required dtype in [np.bool_, np.uint16, np.int16, "
                    "np.int32, np.float16, np.float32, np.int8, np.uint8, np.int64]"
                )
            if x.dtype == np.bool_:
                if not np.equal(x, y).all():
                    self.fail("result error")
            elif x.dtype == np.float16:
                compare_res(prec16, minimum16)
            elif x.dtype in [np.float32, np.int8, np.uint8, np.uint16, np.int16, np.int32, np.int64, np.float64]:
                compare_res(prec, minimum)
            else:
                self.fail("required numpy object")

        _assert_rtol_equal(x, y, prec, prec16, message)


def _supported_devices_stub(*_args, **_kwargs):
    return lambda obj: obj


def _run_tests_stub():
    raise AssertionError("the docs example called run_tests(); it should only run under __main__")


_TORCH_NPU_IMPORT = re.compile(r"^\s*(import torch_npu\b|from torch_npu[\w.]* import\b)")


def exec_docs_example(code: str, torch_npu_module, **names) -> dict:
    """Run a docs example with its torch_npu imports removed and ``torch_npu`` bound to ``torch_npu_module``."""
    lines = code.splitlines()
    removed = [line.strip() for line in lines if _TORCH_NPU_IMPORT.match(line)]
    assert "import torch_npu" in removed, f"the example no longer imports torch_npu; did the docs change? {removed}"
    kept = "\n".join(line for line in lines if not _TORCH_NPU_IMPORT.match(line))
    namespace = {"__name__": "torch_npu_docs_example", "torch_npu": torch_npu_module, **names}
    exec(compile(kept, "<torch_npu docs example>", "exec"), namespace)  # noqa: S102 - the docs' own test code
    return namespace


def load_fusion_docs_test(torch_npu_module) -> type:
    """The docs' ``TestNPUFlashAttention`` class, calling whatever ``torch_npu_module`` provides."""
    namespace = exec_docs_example(
        torch_npu_docs.example_code(*FUSION_EXAMPLE),
        torch_npu_module,
        TestCase=DocsTestCase,
        run_tests=_run_tests_stub,
        SupportedDevices=_supported_devices_stub,
    )
    return namespace["TestNPUFlashAttention"]


# The docs' test builds masks with torch.tensor(tensor), which torch warns about; that is the docs' code, not ours.
docs_example_warnings = pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning")


@pytest.fixture
def npu_is_identity(monkeypatch):
    """The examples move tensors with ``.npu()``; here that is the identity (there is no NPU)."""
    monkeypatch.setattr(torch.Tensor, "npu", lambda self, *args, **kwargs: self, raising=False)


@pytest.fixture
def emulated_torch_npu(monkeypatch):
    return emu.install(monkeypatch)


# ==========================================================================================================
# (a) the emulator against torch_npu's own docs


@docs_example_warnings
def test_fusion_docs_test_passes_on_the_emulator(emulated_torch_npu, npu_is_identity):
    torch.manual_seed(1234)
    load_fusion_docs_test(emulated_torch_npu)().test_npu_flash_attention()


def _mutant_polarity_flipped(monkeypatch, module):
    plain = emu._fusion_plain_masked
    monkeypatch.setattr(emu, "_fusion_plain_masked", lambda *args: ~plain(*args))


def _mutant_mask_ignored(monkeypatch, module):
    monkeypatch.setattr(emu, "_fusion_keep", lambda *args, **kwargs: None)


def _mutant_scale_ignored(monkeypatch, module):
    real = module.npu_fusion_attention
    monkeypatch.setattr(module, "npu_fusion_attention", lambda *a, **kw: real(*a, **{**kw, "scale": 1.0}))


def _mutant_band_is_causal(monkeypatch, module):
    compressed = emu._compressed_mode_keep
    monkeypatch.setattr(emu, "_compressed_mode_keep", lambda mode, pre, nxt, *rest: compressed(mode, INT_MAX, 0, *rest))


FUSION_MUTANTS = {
    "mask polarity flipped": _mutant_polarity_flipped,
    "atten_mask ignored": _mutant_mask_ignored,
    "scale ignored": _mutant_scale_ignored,
    "band mode 4 ignores pre/next": _mutant_band_is_causal,
}


@docs_example_warnings
@pytest.mark.parametrize("mutant", FUSION_MUTANTS, ids=list(FUSION_MUTANTS))
def test_fusion_docs_test_fails_on_a_broken_emulator(mutant, emulated_torch_npu, npu_is_identity, monkeypatch):
    FUSION_MUTANTS[mutant](monkeypatch, emulated_torch_npu)
    torch.manual_seed(1234)
    with pytest.raises(AssertionError):
        load_fusion_docs_test(emulated_torch_npu)().test_npu_flash_attention()


@docs_example_warnings
def test_fia_docs_example_matches_the_docs_reference(emulated_torch_npu, npu_is_identity):
    torch.manual_seed(4321)
    example = exec_docs_example(torch_npu_docs.example_code(*FIA_EXAMPLE), emulated_torch_npu)
    q, k, v, out = example["q"], example["k"], example["v"], example["out"]
    docs_case = load_fusion_docs_test(emulated_torch_npu)()
    # The docs' fusion reference hard-codes scale 0.08838; the FIA example uses 1/sqrt(128) = 0.0883883 --
    # the same scale to 1e-4, far inside prec 0.01.  The example passes no mask, so the reference gets zeros.
    no_mask = torch.zeros(1, 1, q.shape[2], k.shape[2])
    expected = docs_case.supported_op_exec(q.float(), k.float(), v.float(), no_mask)
    assert out.shape == q.shape and out.dtype == q.dtype
    docs_case.assertRtolEqual(expected.half(), out, prec=0.01, prec16=0.01)


def _fusion_call_through_fia(fia):
    """npu_fusion_attention as the docs' test calls it, served by FIA, so the docs' sparse cases run on FIA."""

    def npu_fusion_attention(
        query, key, value, *, head_num, input_layout, scale, sparse_mode, atten_mask, pre_tockens, next_tockens
    ):
        if atten_mask is not None and atten_mask.dim() == 4 and atten_mask.shape[1] > 1:
            # FIA refuses per-head masks; the docs' mask is one band repeated over the heads, so one head is it all.
            assert torch.equal(atten_mask, atten_mask[:, :1].expand_as(atten_mask))
            atten_mask = atten_mask[:, :1]
        out, _ = fia(
            query,
            key,
            value,
            atten_mask=atten_mask,
            num_heads=head_num,
            input_layout=input_layout,
            scale=scale,
            pre_tokens=pre_tockens,
            next_tokens=next_tockens,
            sparse_mode=sparse_mode,
        )
        return (out,)

    return types.SimpleNamespace(npu_fusion_attention=npu_fusion_attention)


@docs_example_warnings
def test_fia_runs_the_docs_sparse_cases(npu_is_identity):
    torch.manual_seed(99)
    load_fusion_docs_test(_fusion_call_through_fia(emu.npu_fused_infer_attention_score))().test_npu_flash_attention()


def _fia_mutant_polarity_flipped(monkeypatch):
    plain = emu._fia_plain_masked
    monkeypatch.setattr(emu, "_fia_plain_masked", lambda *args: ~plain(*args))


def _fia_mutant_band_is_causal(monkeypatch):
    _mutant_band_is_causal(monkeypatch, None)


@docs_example_warnings
@pytest.mark.parametrize(
    "mutant",
    [_fia_mutant_polarity_flipped, _fia_mutant_band_is_causal],
    ids=["mask polarity flipped", "band mode 4 ignores pre/next"],
)
def test_fia_docs_sparse_cases_fail_on_a_broken_emulator(mutant, npu_is_identity, monkeypatch):
    mutant(monkeypatch)
    torch.manual_seed(99)
    docs_case = load_fusion_docs_test(_fusion_call_through_fia(emu.npu_fused_infer_attention_score))()
    with pytest.raises(AssertionError):
        docs_case.test_npu_flash_attention()


@pytest.mark.parametrize("name", [FUSION, FIA])
def test_signature_is_the_documented_prototype(name):
    documented = torch_npu_docs.prototype_parameters(name)
    actual = [
        (
            p.name,
            p.kind is inspect.Parameter.KEYWORD_ONLY,
            torch_npu_docs.REQUIRED if p.default is inspect.Parameter.empty else p.default,
        )
        for p in inspect.signature(getattr(emu, name)).parameters.values()
    ]
    assert actual == documented


# ==========================================================================================================
# the ported comparison rule is torch_npu's rule


def _rtol_cases():
    gen = torch.Generator().manual_seed(0)
    half = torch.randn(1000, generator=gen).half()
    few_off, many_off, with_nan = half.clone(), half.clone(), half.clone()
    few_off[:5] += 1  # 0.5 % of the elements wrong: under prec16 = 1 %
    many_off[:50] += 1  # 5 %: over it
    with_nan[3] = float("nan")
    single, brain = half.float(), half.bfloat16()
    return {
        "fp16 equal": (half, half.clone(), {}),
        "fp16 0.5% wrong at 1%": (half, few_off, dict(prec=0.01, prec16=0.01)),
        "fp16 5% wrong at 1%": (half, many_off, dict(prec=0.01, prec16=0.01)),
        "fp16 NaN on one side": (with_nan, half, {}),
        "fp16 NaN on both sides": (with_nan, with_nan.clone(), {}),
        "shape differs": (half, half[:-1], {}),
        "dtype differs": (half, single, {}),
        "fp32 close": (single, single + 1e-6, {}),
        "fp32 10% off": (single, single * 1.1, {}),
        "bf16 equal": (brain, brain.clone(), {}),
        "bf16 off by 1": (brain, brain + 1, {}),
        "bool differs": (half > 0, half < 0, {}),
        "sequences": ([half, single], [half.clone(), single.clone()], {}),
    }


def _outcome(case_class, x, y, kwargs) -> str:
    try:
        case_class().assertRtolEqual(x, y, **kwargs)
    except AssertionError:
        return "fail"
    return "pass"


def test_ported_assert_rtol_equal_can_fail():
    cases = _rtol_cases()
    assert _outcome(DocsTestCase, *cases["fp16 0.5% wrong at 1%"]) == "pass"
    for name in ("fp16 5% wrong at 1%", "fp16 NaN on one side", "shape differs", "dtype differs", "bf16 off by 1"):
        assert _outcome(DocsTestCase, *cases[name]) == "fail", name


def test_ported_assert_rtol_equal_matches_torch_npu():
    path = torch_npu_docs.testcase_path()
    if path is None:
        pytest.skip("torch_npu/testing/testcase.py is not next to the docs file (NPU_PORT_TORCH_NPU_DOCS set?)")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TestCase")
    method = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == "assertRtolEqual")
    namespace = {"np": np, "torch": torch, "Sequence": Sequence, "Number": Number}
    exec(compile(ast.Module(body=[method], type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    original = type("OriginalTestCase", (unittest.TestCase,), {"assertRtolEqual": namespace["assertRtolEqual"]})
    for name, (x, y, kwargs) in _rtol_cases().items():
        assert _outcome(DocsTestCase, x, y, kwargs) == _outcome(original, x, y, kwargs), name


# ==========================================================================================================
# (b) an independent float64 reference, cell by cell from the docs' rules


def reference_keep(
    sparse_mode: int, sq: int, skv: int, pre: int, nxt: int, q_len: int | None = None, kv_len: int | None = None
) -> np.ndarray:
    """(Sq, Skv) bool: may query row i use key j, per the docs' sparse_mode table (before any user mask)."""
    q_len = sq if q_len is None else q_len
    kv_len = skv if kv_len is None else kv_len
    shift = kv_len - q_len  # the bottom-right origin
    keep = np.zeros((sq, skv), dtype=bool)
    for i in range(sq):
        for j in range(skv):
            if sparse_mode == 0:
                ok = i - pre <= j <= i + nxt
            elif sparse_mode == 1:
                ok = True
            elif sparse_mode == 2:
                ok = j <= i
            elif sparse_mode == 3:
                ok = j <= i + shift
            else:
                ok = i + shift - pre <= j <= i + shift + nxt
            keep[i, j] = ok and j < kv_len
    return keep


def reference_attention(q, k, v, keep, scale: float, fix_invalid_rows: bool):
    """Attention over BNSD tensors in float64, row by row; ``keep`` broadcasts to (B, N, Sq, Skv) or is None.

    Returns (out (B, N, Sq, Dv), lse (B, N, Sq)); a row with no key is NaN (0 with the fix) and has lse -inf.
    """
    q, k, v = (t.detach().double().numpy() for t in (q, k, v))
    b, n, sq, _ = q.shape
    skv, group = k.shape[2], n // k.shape[1]
    keep = np.ones((b, n, sq, skv), dtype=bool) if keep is None else np.broadcast_to(keep, (b, n, sq, skv))
    out = np.zeros((b, n, sq, v.shape[3]))
    lse = np.full((b, n, sq), -np.inf)
    for bi in range(b):
        for h in range(n):
            kh = h // group  # consecutive query heads share a key/value head
            for i in range(sq):
                cols = keep[bi, h, i]
                if not cols.any():
                    out[bi, h, i] = 0.0 if fix_invalid_rows else np.nan
                    continue
                scores = k[bi, kh][cols] @ q[bi, h, i] * scale
                weights = np.exp(scores - scores.max())
                out[bi, h, i] = weights @ v[bi, kh][cols] / weights.sum()
                lse[bi, h, i] = scores.max() + np.log(weights.sum())
    return out, lse


def layout_from_bnsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    b, n, s, d = x.shape
    if layout in ("BNSD", "BNSD_BSND"):
        return x.clone()
    if layout == "BSND":
        return x.permute(0, 2, 1, 3).contiguous()
    if layout == "BSH":
        return x.permute(0, 2, 1, 3).reshape(b, s, n * d)
    return x.permute(2, 0, 1, 3).reshape(s, b, n * d)  # SBH


def output_to_bnsd(x: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout in ("BSND", "BNSD_BSND"):
        return x.permute(0, 2, 1, 3)
    if layout == "BSH":
        b, s, h = x.shape
        return x.reshape(b, s, heads, h // heads).permute(0, 2, 1, 3)
    s, b, h = x.shape
    return x.reshape(s, b, heads, h // heads).permute(1, 2, 0, 3)  # SBH


def compressed_mask() -> torch.Tensor:
    return torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)


def random_qkv(seed: int, b: int, n: int, nkv: int, sq: int, skv: int, d: int, dtype, dv: int | None = None):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, sq, d, generator=gen).to(dtype)
    k = torch.randn(b, nkv, skv, d, generator=gen).to(dtype)
    v = torch.randn(b, nkv, skv, dv or d, generator=gen).to(dtype)
    return q, k, v


def _tolerance(dtype) -> dict:
    eps = torch.finfo(dtype).eps
    return dict(rtol=2 * eps, atol=2 * eps)


sizes = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**31 - 1),
        "b": st.integers(1, 2),
        "nkv": st.integers(1, 2),
        "group": st.integers(1, 3),
        "sq": st.integers(1, 6),
        "skv": st.integers(1, 6),
    }
)
tokens = st.one_of(st.just(INT_MAX), st.integers(-3, 8))


@settings(max_examples=60, deadline=None)
@given(
    size=sizes,
    d=st.integers(1, 8),
    mode=st.integers(0, 4),
    pre=tokens,
    nxt=tokens,
    inner_precise=st.sampled_from([0, 1, 2]),
    layout=st.sampled_from(FUSION_LAYOUTS),
    mask_form=st.sampled_from(["BNSS", "B1SS", "11SS", "SS"]),
    mask_dtype=st.sampled_from([torch.bool, torch.uint8]),
    data=st.data(),
)
def test_fusion_matches_the_reference(size, d, mode, pre, nxt, inner_precise, layout, mask_form, mask_dtype, data):
    b, n, nkv, sq, skv = size["b"], size["nkv"] * size["group"], size["nkv"], size["sq"], size["skv"]
    q, k, v = random_qkv(size["seed"], b, n, nkv, sq, skv, d, torch.float32)
    keep = reference_keep(mode, sq, skv, pre, nxt)
    if mode in (0, 1):
        lead = {"BNSS": (b, n), "B1SS": (b, 1), "11SS": (1, 1), "SS": ()}[mask_form]
        masked = np.array(
            data.draw(st.lists(st.booleans(), min_size=sq * skv * math.prod(lead), max_size=sq * skv * math.prod(lead)))
        ).reshape(*lead, sq, skv)
        atten_mask = torch.from_numpy(masked).to(mask_dtype)
        keep = keep & ~masked
    else:
        atten_mask = compressed_mask().to(mask_dtype)
    scale = 1.0 / math.sqrt(d)
    # "2为使能无效行计算 ... 如果算子可判断出存在无效行场景, 会自动使能无效行计算, 例如sparse_mode为3, Sq > Skv场景."
    fix = inner_precise == 2 or (mode == 3 and sq > skv)
    expected, _ = reference_attention(q, k, v, keep, scale, fix)
    out = emu.npu_fusion_attention(
        *(layout_from_bnsd(t, layout) for t in (q, k, v)),
        n,
        layout,
        atten_mask=atten_mask,
        scale=scale,
        pre_tockens=pre,
        next_tockens=nxt,
        inner_precise=inner_precise,
        sparse_mode=mode,
    )[0]
    assert out.dtype == torch.float32
    np.testing.assert_allclose(
        output_to_bnsd(out, layout, n).double().numpy(), expected, rtol=1e-5, atol=1e-5, equal_nan=True
    )


def _fia_mask(data, b: int, sq: int, skv: int, dtype):
    """A random FIA mask in one of the documented forms, S sizes padded up by 0..3; returns (mask, (B|1, Sq, Skv))."""
    pad_q, pad_kv = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))
    forms = ["1SS", "B1SS", "11SS", "BS" if sq == 1 else "SS"]
    form = data.draw(st.sampled_from(forms))
    lead = b if form in ("B1SS", "BS") else 1
    full = np.array(
        data.draw(
            st.lists(
                st.booleans(),
                min_size=lead * (sq + pad_q) * (skv + pad_kv),
                max_size=lead * (sq + pad_q) * (skv + pad_kv),
            )
        )
    )
    full = full.reshape(lead, sq + pad_q, skv + pad_kv)
    if form == "BS":
        tensor = torch.from_numpy(full[:, 0, :].copy())
        full = full[:, :1, :]
    else:
        shape = {
            "1SS": (1, sq + pad_q, skv + pad_kv),
            "B1SS": (b, 1, sq + pad_q, skv + pad_kv),
            "11SS": (1, 1, sq + pad_q, skv + pad_kv),
            "SS": (sq + pad_q, skv + pad_kv),
        }[form]
        tensor = torch.from_numpy(full.reshape(shape).copy())
    return tensor.to(dtype), full[:, :sq, :skv]


@settings(max_examples=60, deadline=None)
@given(
    size=sizes,
    d=st.sampled_from([16, 32]),
    mode=st.integers(0, 4),
    pre=tokens,
    nxt=tokens,
    layout=st.sampled_from(FIA_LAYOUTS),
    dtype=st.sampled_from([torch.float16, torch.bfloat16]),
    mask_dtype=st.sampled_from([torch.bool, torch.int8, torch.uint8]),
    use_mask=st.booleans(),
    lse_flag=st.booleans(),
    data=st.data(),
)
def test_fia_matches_the_reference(size, d, mode, pre, nxt, layout, dtype, mask_dtype, use_mask, lse_flag, data):
    b, n, nkv, sq, skv = size["b"], size["nkv"] * size["group"], size["nkv"], size["sq"], size["skv"]
    if layout == "BNSD_BSND" and sq == 1:
        layout = "BNSD"
    inner_precise = data.draw(st.sampled_from([0, 1, 2, 3] if sq > 1 else [0, 1]))
    q_lens = data.draw(st.none() | st.lists(st.integers(0, sq), min_size=b, max_size=b + 1))
    kv_lens = data.draw(st.none() | st.lists(st.integers(0, skv), min_size=b, max_size=b + 1))
    q, k, v = random_qkv(size["seed"], b, n, nkv, sq, skv, d, dtype)
    atten_mask, user_masked = None, np.zeros((1, sq, skv), dtype=bool)
    if sq > 1 and mode in (2, 3, 4):
        atten_mask = compressed_mask().to(mask_dtype)
    elif use_mask:
        atten_mask, user_masked = _fia_mask(data, b, sq, skv, mask_dtype)
    # without a mask, modes 0/1 compute everything: "如果atten_mask未传入则不做mask操作, 忽略pre_tokens和next_tokens"
    effective_mode = mode if atten_mask is not None else 1
    expected_out = np.zeros((b, n, sq, d))
    expected_lse = np.zeros((b, n, sq))
    for bi in range(b):
        q_len = q_lens[bi] if q_lens is not None and sq > 1 else sq  # "Q_S为1时该参数无效"
        kv_len = kv_lens[bi] if kv_lens is not None else skv
        if sq == 1:  # "sparse_mode ... Q_S为1且不带rope输入时该参数无效"; pre/next likewise
            keep = reference_keep(0, sq, skv, INT_MAX, INT_MAX, q_len, kv_len)
        else:
            keep = reference_keep(effective_mode, sq, skv, pre, nxt, q_len, kv_len)
        keep = keep & ~user_masked[min(bi, len(user_masked) - 1)]
        out, lse = reference_attention(q[bi : bi + 1], k[bi : bi + 1], v[bi : bi + 1], keep, 0.25, inner_precise >= 2)
        if kv_len > 0:
            expected_out[bi, :, :q_len] = out[0, :, :q_len]
            expected_lse[bi, :, :q_len] = lse[0, :, :q_len]
    out, lse = emu.npu_fused_infer_attention_score(
        *(layout_from_bnsd(t, layout) for t in (q, k, v)),
        atten_mask=atten_mask,
        actual_seq_lengths=q_lens,
        actual_seq_lengths_kv=kv_lens,
        num_heads=n,
        num_key_value_heads=nkv,
        scale=0.25,
        pre_tokens=pre,
        next_tokens=nxt,
        input_layout=layout,
        sparse_mode=mode,
        inner_precise=inner_precise,
        softmax_lse_flag=lse_flag,
    )
    assert out.dtype == dtype
    np.testing.assert_allclose(
        output_to_bnsd(out, layout, n).double().numpy(), expected_out, equal_nan=True, **_tolerance(dtype)
    )
    if lse_flag:
        assert lse.shape == (b, n, sq, 1) and lse.dtype == torch.float32
        np.testing.assert_allclose(lse[..., 0].double().numpy(), expected_lse, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(lse, torch.zeros(1))


@settings(max_examples=25, deadline=None)
@given(size=sizes, mode=st.integers(0, 4), layout=st.sampled_from(FUSION_LAYOUTS))
def test_every_fusion_layout_equals_bnsd(size, mode, layout):
    b, n, nkv, sq, skv = size["b"], size["nkv"] * size["group"], size["nkv"], size["sq"], size["skv"]
    q, k, v = random_qkv(size["seed"], b, n, nkv, sq, skv, 8, torch.float16)
    mask = compressed_mask() if mode >= 2 else torch.rand(sq, skv, generator=torch.Generator().manual_seed(1)) < 0.3
    call = dict(atten_mask=mask, sparse_mode=mode, scale=0.3, pre_tockens=2, next_tockens=1, inner_precise=2)
    in_bnsd = emu.npu_fusion_attention(q, k, v, n, "BNSD", **call)
    in_layout = emu.npu_fusion_attention(*(layout_from_bnsd(t, layout) for t in (q, k, v)), n, layout, **call)
    torch.testing.assert_close(output_to_bnsd(in_layout[0], layout, n), in_bnsd[0], rtol=0, atol=0)
    for got, want in zip(in_layout[1:3], in_bnsd[1:3]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@settings(max_examples=25, deadline=None)
@given(size=sizes, layout=st.sampled_from(FIA_LAYOUTS))
def test_every_fia_layout_equals_bnsd(size, layout):
    b, n, nkv, sq, skv = size["b"], size["nkv"] * size["group"], size["nkv"], size["sq"] + 1, size["skv"]
    q, k, v = random_qkv(size["seed"], b, n, nkv, sq, skv, 16, torch.bfloat16)
    call = dict(
        num_heads=n,
        num_key_value_heads=nkv,
        atten_mask=compressed_mask(),
        sparse_mode=3,
        scale=0.3,
        softmax_lse_flag=True,
        inner_precise=2,
    )
    want, want_lse = emu.npu_fused_infer_attention_score(q, k, v, input_layout="BNSD", **call)
    got, got_lse = emu.npu_fused_infer_attention_score(
        *(layout_from_bnsd(t, layout) for t in (q, k, v)), input_layout=layout, **call
    )
    torch.testing.assert_close(output_to_bnsd(got, layout, n), want, rtol=0, atol=0)
    torch.testing.assert_close(got_lse, want_lse, rtol=0, atol=0)


def test_bnsd_bsnd_takes_bnsd_and_returns_bsnd():
    q, k, v = random_qkv(0, 2, 4, 2, 3, 5, 16, torch.float16)
    out, _ = emu.npu_fused_infer_attention_score(q, k, v, num_heads=4, num_key_value_heads=2, input_layout="BNSD_BSND")
    bnsd, _ = emu.npu_fused_infer_attention_score(q, k, v, num_heads=4, num_key_value_heads=2, input_layout="BNSD")
    assert out.shape == (2, 3, 4, 16)
    assert torch.equal(out, bnsd.transpose(1, 2))


# ---------------------------------------------------------------------------------------------------------
# targeted behaviour


@pytest.mark.parametrize(
    "op,mask_dtype",
    [(FUSION, torch.bool), (FUSION, torch.uint8), (FIA, torch.bool), (FIA, torch.uint8), (FIA, torch.int8)],
)
def test_polarity_true_means_masked(op, mask_dtype):
    """Mask every key but one (True = masked): each output row must then be exactly that key's value row."""
    sq = skv = 4
    q, k, v = random_qkv(5, 1, 2, 2, sq, skv, 16, torch.float16)
    chosen = torch.tensor([2, 0, 3, 1])
    masked = torch.ones(sq, skv, dtype=torch.bool)
    masked[torch.arange(sq), chosen] = False
    if op == FUSION:
        out = emu.npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=masked.to(mask_dtype))[0]
    else:
        out, _ = emu.npu_fused_infer_attention_score(
            q, k, v, num_heads=2, input_layout="BNSD", atten_mask=masked.to(mask_dtype)
        )
    assert torch.equal(out, v[:, :, chosen])


def test_gqa_matches_torch_sdpa():
    """Consecutive query heads share a key/value head, as torch's enable_gqa does (repeat_interleave)."""
    q, k, v = random_qkv(6, 2, 6, 2, 5, 7, 16, torch.float32)
    out = emu.npu_fusion_attention(q, k, v, 6, "BNSD", scale=0.2)[0]
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.2, enable_gqa=True)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    fia_out, _ = emu.npu_fused_infer_attention_score(
        q.half(), k.half(), v.half(), num_heads=6, num_key_value_heads=2, input_layout="BNSD", scale=0.2
    )
    torch.testing.assert_close(fia_out.float(), expected, rtol=2e-3, atol=2e-3)


def assert_fusion_sparse_mode_matches_reference(mode: int, sq: int, skv: int, pre: int, nxt: int) -> None:
    q, k, v = random_qkv(7, 1, 2, 1, sq, skv, 8, torch.float32)
    if mode in (0, 1):
        mask, keep = torch.zeros(sq, skv, dtype=torch.bool), reference_keep(mode, sq, skv, pre, nxt)
    else:
        mask, keep = compressed_mask(), reference_keep(mode, sq, skv, pre, nxt)
    expected, _ = reference_attention(q, k, v, keep, 0.5, fix_invalid_rows=True)
    out = emu.npu_fusion_attention(
        q,
        k,
        v,
        2,
        "BNSD",
        atten_mask=mask,
        scale=0.5,
        pre_tockens=pre,
        next_tockens=nxt,
        sparse_mode=mode,
        inner_precise=2,
    )[0]
    np.testing.assert_allclose(out.double().numpy(), expected, rtol=1e-5, atol=1e-5)


SPARSE_CASES = [
    (0, 6, 6, 2, 1),
    (0, 4, 7, 1, 0),
    (0, 7, 4, 9, -3),
    (0, 5, 8, -2, 6),
    (1, 5, 8, 0, 0),
    (2, 6, 6, INT_MAX, 0),
    (2, 4, 7, INT_MAX, 0),
    (2, 7, 4, INT_MAX, 0),
    (3, 6, 6, INT_MAX, 0),
    (3, 4, 7, INT_MAX, 0),
    (3, 7, 4, INT_MAX, 0),
    (4, 6, 6, 2, 1),
    (4, 4, 7, 1, 0),
    (4, 7, 4, 3, 2),
]


@pytest.mark.parametrize("mode,sq,skv,pre,nxt", SPARSE_CASES)
def test_each_sparse_mode_matches_the_reference(mode, sq, skv, pre, nxt):
    assert_fusion_sparse_mode_matches_reference(mode, sq, skv, pre, nxt)


def test_the_sparse_check_catches_a_band_counted_from_the_wrong_corner(monkeypatch):
    """With Sq != Skv, counting the sparse_mode 0 band from the bottom-right (instead of the top-left) is caught."""
    band = emu._band_keep
    monkeypatch.setattr(
        emu,
        "_band_keep",
        lambda sq, skv, pre, nxt, origins, device: band(sq, skv, pre, nxt, origins * 0 + skv - sq, device),
    )
    with pytest.raises(AssertionError):
        assert_fusion_sparse_mode_matches_reference(0, 4, 7, 1, 0)


@pytest.mark.parametrize("mode", [0, 1, 2, 3, 4])
def test_no_mask_means_full_attention_whatever_the_sparse_mode(mode):
    """ "当atten_mask输入为None时, sparse_mode, pre_tockens, next_tockens参数不生效, 固定为全计算" -- causal is lost."""
    q, k, v = random_qkv(8, 1, 2, 2, 5, 5, 8, torch.float32)
    out = emu.npu_fusion_attention(q, k, v, 2, "BNSD", scale=0.4, sparse_mode=mode, pre_tockens=0, next_tockens=0)[0]
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.4)
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)


def test_fia_without_mask_ignores_modes_0_1_and_refuses_2_3_4():
    q, k, v = random_qkv(9, 1, 2, 2, 4, 4, 16, torch.float16)
    full = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.3)
    for mode in (0, 1):
        out, _ = emu.npu_fused_infer_attention_score(
            q, k, v, num_heads=2, input_layout="BNSD", scale=0.3, sparse_mode=mode, pre_tokens=0, next_tokens=0
        )
        torch.testing.assert_close(out.float(), full, rtol=2e-3, atol=2e-3)
    for mode in (2, 3, 4):
        with pytest.raises(emu.NpuContractError, match="needs the compressed"):
            emu.npu_fused_infer_attention_score(q, k, v, num_heads=2, input_layout="BNSD", sparse_mode=mode)


def test_fia_decode_step_ignores_sparse_mode_and_tokens():
    """Q_S == 1: "sparse_mode ... Q_S为1且不带rope输入时该参数无效" and pre/next "Q_S为1时该参数无效"."""
    q, k, v = random_qkv(10, 2, 2, 2, 1, 6, 24, torch.float16)  # D=24: the 16-alignment rule is for Q_S > 1
    plain, _ = emu.npu_fused_infer_attention_score(q, k, v, num_heads=2, input_layout="BNSD")
    for mode in (0, 1, 2, 3, 4, 7):
        out, _ = emu.npu_fused_infer_attention_score(
            q, k, v, num_heads=2, input_layout="BNSD", sparse_mode=mode, pre_tokens=0, next_tokens=0
        )
        assert torch.equal(out, plain)


@pytest.mark.parametrize("inner_precise,expect_nan", [(0, True), (1, True), (2, False)])
def test_fusion_invalid_rows_are_nan_unless_corrected(inner_precise, expect_nan):
    q, k, v = random_qkv(11, 1, 2, 2, 3, 4, 8, torch.float16)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[1] = True  # row 1 sees no key
    out = emu.npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=mask, inner_precise=inner_precise)[0]
    assert bool(torch.isnan(out[:, :, 1]).all()) == expect_nan
    if not expect_nan:
        assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))
    assert torch.isfinite(out[:, :, [0, 2]]).all()


def test_fusion_right_down_causal_with_sq_above_skv_corrects_invalid_rows_by_itself():
    """ "如果算子可判断出存在无效行场景, 会自动使能无效行计算, 例如sparse_mode为3, Sq > Skv场景."""
    q, k, v = random_qkv(12, 1, 1, 1, 6, 4, 8, torch.float32)
    out = emu.npu_fusion_attention(q, k, v, 1, "BNSD", atten_mask=compressed_mask(), sparse_mode=3)[0]
    assert torch.equal(out[:, :, :2], torch.zeros_like(out[:, :, :2]))  # rows 0, 1 see no key (j <= i - 2)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("inner_precise,expect_nan", [(0, True), (1, True), (2, False), (3, False)])
def test_fia_invalid_rows_follow_bit_1_of_inner_precise(inner_precise, expect_nan):
    q, k, v = random_qkv(13, 1, 2, 2, 3, 4, 16, torch.float16)
    mask = torch.zeros(1, 1, 3, 4, dtype=torch.uint8)
    mask[..., 2, :] = 1
    out, _ = emu.npu_fused_infer_attention_score(
        q, k, v, num_heads=2, input_layout="BNSD", atten_mask=mask, inner_precise=inner_precise
    )
    assert bool(torch.isnan(out[:, :, 2]).all()) == expect_nan
    assert torch.isfinite(out[:, :, :2]).all()


def test_fia_actual_lengths_truncate_keys_and_zero_padded_queries():
    q, k, v = random_qkv(14, 2, 2, 2, 5, 7, 16, torch.float16)
    out, _ = emu.npu_fused_infer_attention_score(
        q, k, v, num_heads=2, input_layout="BNSD", actual_seq_lengths=[5, 3], actual_seq_lengths_kv=[4, 7]
    )
    first, _ = emu.npu_fused_infer_attention_score(q[:1], k[:1, :, :4], v[:1, :, :4], num_heads=2, input_layout="BNSD")
    second, _ = emu.npu_fused_infer_attention_score(q[1:], k[1:], v[1:], num_heads=2, input_layout="BNSD")
    torch.testing.assert_close(out[:1], first)
    torch.testing.assert_close(out[1:, :, :3], second[:, :, :3])
    assert torch.equal(out[1:, :, 3:], torch.zeros_like(out[1:, :, 3:]))


# ---------------------------------------------------------------------------------------------------------
# outputs


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layout", FUSION_LAYOUTS)
def test_fusion_returns_the_documented_7_tuple(layout, dtype):
    b, n, nkv, sq, skv, d = 2, 4, 2, 3, 5, 8
    q, k, v = random_qkv(15, b, n, nkv, sq, skv, d, dtype)
    result = emu.npu_fusion_attention(*(layout_from_bnsd(t, layout) for t in (q, k, v)), n, layout, scale=0.5)
    assert len(result) == 7
    out, softmax_max, softmax_sum, reserved, seed, offset, length = result
    assert out.shape == layout_from_bnsd(q, layout).shape and out.dtype == dtype
    for stat in (softmax_max, softmax_sum):
        assert stat.shape == (b, n, sq, 8) and stat.dtype == torch.float32
        assert torch.equal(stat, stat[..., :1].expand_as(stat))
    assert reserved.numel() == 0
    assert all(isinstance(x, int) for x in (seed, offset, length)) and (seed, offset) == (0, 0)
    assert length == b * n * sq * skv
    scores = q.double() @ k.double().repeat_interleave(n // nkv, dim=1).transpose(-1, -2) * 0.5
    lse = softmax_max[..., 0].double() + softmax_sum[..., 0].double().log()
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout,shape", [("BSH", (2, 3, 64)), ("BSND", (2, 3, 4, 16)), ("BNSD", (2, 4, 3, 16))])
def test_fia_returns_out_and_lse(layout, shape):
    q, k, v = random_qkv(16, 2, 4, 2, 3, 5, 16, torch.float16)
    call = dict(num_heads=4, num_key_value_heads=2, input_layout=layout, scale=0.5)
    args = [layout_from_bnsd(t, layout) for t in (q, k, v)]
    out, lse = emu.npu_fused_infer_attention_score(*args, **call)
    assert out.shape == shape and out.dtype == torch.float16
    assert torch.equal(lse, torch.zeros(1, dtype=torch.float32))
    _, lse = emu.npu_fused_infer_attention_score(*args, softmax_lse_flag=True, **call)
    scores = q.double() @ k.double().repeat_interleave(2, dim=1).transpose(-1, -2) * 0.5
    assert lse.shape == (2, 4, 3, 1) and lse.dtype == torch.float32
    torch.testing.assert_close(lse[..., 0].double(), torch.logsumexp(scores, dim=-1), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# dropout and autograd


def test_keep_prob_one_is_exact_and_repeatable():
    q, k, v = random_qkv(17, 1, 2, 2, 4, 6, 8, torch.float32)
    first = emu.npu_fusion_attention(q, k, v, 2, "BNSD", scale=0.3)
    second = emu.npu_fusion_attention(q, k, v, 2, "BNSD", scale=0.3, keep_prob=1.0)
    assert torch.equal(first[0], second[0])
    expected, _ = reference_attention(q, k, v, None, 0.3, False)
    np.testing.assert_allclose(first[0].double().numpy(), expected, rtol=1e-6, atol=1e-6)


def test_dropout_is_unbiased_and_drops_at_the_documented_rate():
    """keep_prob is "Dropout中1的比例": the mean over many draws is the keep_prob=1 result, and a lone key
    (probability 1) survives with probability keep_prob, rescaled by 1/keep_prob."""
    draws, keep_prob = 4000, 0.7
    q, k, v = random_qkv(18, 1, 2, 2, 3, 5, 8, torch.float32)
    batch = [t.expand(draws, -1, -1, -1).contiguous() for t in (q, k, v)]
    torch.manual_seed(0)
    result = emu.npu_fusion_attention(*batch, 2, "BNSD", scale=0.3, keep_prob=keep_prob)
    dropped = result[0].double()
    exact = emu.npu_fusion_attention(q, k, v, 2, "BNSD", scale=0.3)[0].double()[0]
    mean, sem = dropped.mean(0), dropped.std(0) / math.sqrt(draws)
    assert ((mean - exact).abs() <= 5 * sem + 1e-9).all()
    assert not torch.allclose(dropped[0], exact)
    assert isinstance(result[4], int) and isinstance(result[5], int)

    one_key = [t[:, :, :1].contiguous() for t in batch[1:]]
    lone = emu.npu_fusion_attention(batch[0], *one_key, 2, "BNSD", keep_prob=keep_prob)[0].double()
    kept = lone[..., 0] != 0
    rate, samples = kept.double().mean().item(), kept.numel()
    assert abs(rate - keep_prob) <= 5 * math.sqrt(keep_prob * (1 - keep_prob) / samples)
    scaled = one_key[1].double().expand_as(lone) / keep_prob
    torch.testing.assert_close(lone[kept], scaled[kept], rtol=1e-6, atol=1e-6)


def test_fusion_gradients_match_torch_sdpa():
    """Training op: autograd through the emulator equals autograd through torch's SDPA (True = take part)."""
    q, k, v = (t.requires_grad_() for t in random_qkv(19, 2, 4, 2, 5, 7, 8, torch.float32))
    keep = torch.from_numpy(reference_keep(3, 5, 7, INT_MAX, 0))
    weights = torch.randn(2, 5, 4, 8, generator=torch.Generator().manual_seed(3))
    out = emu.npu_fusion_attention(
        *(layout_from_bnsd(t, "BSND") for t in (q, k, v)),
        4,
        "BSND",
        atten_mask=compressed_mask(),
        sparse_mode=3,
        scale=0.35,
    )[0]
    got = torch.autograd.grad((out * weights).sum(), (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=0.35, enable_gqa=True)
    want = torch.autograd.grad((ref.transpose(1, 2) * weights).sum(), (q, k, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# errors


def _fusion_call(**changes):
    q, k, v = random_qkv(20, 1, 2, 2, 4, 4, 16, torch.float16)
    call = dict(query=q, key=k, value=v, head_num=2, input_layout="BNSD")
    call.update(changes)
    return lambda: emu.npu_fusion_attention(**call)


def _fia_call(sq=4, **changes):
    q, k, v = random_qkv(21, 1, 2, 2, sq, 4, 16, torch.float16)
    tensors = dict(query=q, key=k, value=v)
    options = dict(num_heads=2, input_layout="BNSD")
    for name, value in changes.items():
        (tensors if name in tensors else options)[name] = value
    return lambda: emu.npu_fused_infer_attention_score(tensors["query"], tensors["key"], tensors["value"], **options)


def _tensor(*shape, dtype=torch.float16):
    return torch.zeros(*shape, dtype=dtype)


def _qkv(q_shape, kv_shape=None):
    """Zero query/key/value of the given shapes, as keyword arguments."""
    return dict(query=_tensor(*q_shape), key=_tensor(*(kv_shape or q_shape)), value=_tensor(*(kv_shape or q_shape)))


CONTRACT = emu.NpuContractError
ERROR_CASES = {
    "fusion unknown layout": (_fusion_call(input_layout="BHSD"), CONTRACT, "input_layout must be one of"),
    "fusion TND": (_fusion_call(input_layout="TND"), NotImplementedError, "TND/varlen is not emulated"),
    "fusion 4-D tensors under BSH": (_fusion_call(input_layout="BSH"), CONTRACT, "needs 3-D query"),
    "fusion mask shape": (_fusion_call(atten_mask=_tensor(1, 2, 4, 5, dtype=torch.bool)), CONTRACT, "atten_mask shape"),
    "fusion 1NSS mask": (
        _fusion_call(**_qkv((2, 2, 4, 16)), atten_mask=_tensor(1, 2, 4, 4, dtype=torch.bool)),
        CONTRACT,
        "atten_mask shape",
    ),
    "fusion float mask": (_fusion_call(atten_mask=_tensor(4, 4)), CONTRACT, "atten_mask dtype"),
    "fusion int8 mask": (_fusion_call(atten_mask=_tensor(4, 4, dtype=torch.int8)), CONTRACT, "atten_mask dtype"),
    "fusion small compressed mask": (
        _fusion_call(atten_mask=_tensor(4, 4, dtype=torch.bool), sparse_mode=2),
        CONTRACT,
        "compressed 2048x2048",
    ),
    "fusion compressed mask of the wrong polarity": (
        _fusion_call(atten_mask=~compressed_mask(), sparse_mode=3),
        CONTRACT,
        "not that triangle",
    ),
    "fusion sparse_mode 6": (_fusion_call(sparse_mode=6), NotImplementedError, "sparse_mode=6"),
    "fusion sparse_mode 9": (_fusion_call(sparse_mode=9), CONTRACT, "sparse_mode must be"),
    "fusion keep_prob 0": (_fusion_call(keep_prob=0.0), CONTRACT, r"keep_prob must be in \(0, 1\]"),
    "fusion keep_prob 1.5": (_fusion_call(keep_prob=1.5), CONTRACT, r"keep_prob must be in \(0, 1\]"),
    "fusion float64": (_fusion_call(query=_tensor(1, 2, 4, 16, dtype=torch.float64)), CONTRACT, "query dtype"),
    "fusion mixed dtypes": (_fusion_call(key=_tensor(1, 2, 4, 16, dtype=torch.bfloat16)), CONTRACT, "share a dtype"),
    "fusion D 769": (_fusion_call(**_qkv((1, 1, 2, 769)), head_num=1), CONTRACT, "<= 768"),
    "fusion Dv > Dk": (_fusion_call(value=_tensor(1, 2, 4, 32)), CONTRACT, "Dv <= Dq = Dk"),
    "fusion head_num mismatch": (_fusion_call(head_num=4), CONTRACT, "head_num=4 but query has N=2"),
    "fusion GQA not a multiple": (_fusion_call(query=_tensor(1, 3, 4, 16), head_num=3), CONTRACT, "positive multiple"),
    "fusion 257 heads": (_fusion_call(**_qkv((1, 257, 1, 16), (1, 1, 1, 16)), head_num=257), CONTRACT, "1..256"),
    "fusion BSH H not divisible": (
        _fusion_call(**_qkv((1, 4, 30)), head_num=4, input_layout="BSH"),
        CONTRACT,
        "not divisible",
    ),
    "fusion inner_precise 3": (_fusion_call(inner_precise=3), CONTRACT, "inner_precise"),
    "fusion softmax_layout": (_fusion_call(softmax_layout="TND"), CONTRACT, "softmax_layout"),
    "FIA float32": (_fia_call(query=_tensor(1, 2, 4, 16, dtype=torch.float32)), CONTRACT, "float32 is not supported"),
    "FIA int8 query": (_fia_call(query=_tensor(1, 2, 4, 16, dtype=torch.int8)), NotImplementedError, "int8 query"),
    "FIA int8 key/value": (
        _fia_call(key=_tensor(1, 2, 4, 16, dtype=torch.int8), value=_tensor(1, 2, 4, 16, dtype=torch.int8)),
        NotImplementedError,
        "antiquant",
    ),
    "FIA D 24 with Q_S > 1": (_fia_call(**_qkv((1, 2, 4, 24))), CONTRACT, "multiple of 16"),
    "FIA D 528": (_fia_call(**_qkv((1, 2, 1, 528), (1, 2, 4, 528))), CONTRACT, "<= 512"),
    "FIA Dk != Dv": (_fia_call(sq=1, value=_tensor(1, 2, 4, 32)), CONTRACT, "identical"),
    "FIA per-head mask": (_fia_call(atten_mask=_tensor(1, 2, 4, 4, dtype=torch.bool)), CONTRACT, "per-head"),
    "FIA float mask": (_fia_call(atten_mask=_tensor(1, 1, 4, 4)), CONTRACT, "atten_mask dtype"),
    "FIA mask too short": (_fia_call(atten_mask=_tensor(1, 1, 3, 4, dtype=torch.bool)), CONTRACT, "not accepted"),
    "FIA (S, S) mask at Q_S 1 with B 2": (
        _fia_call(**_qkv((2, 2, 1, 16), (2, 2, 4, 16)), atten_mask=_tensor(1, 4, dtype=torch.bool)),
        CONTRACT,
        r"\(B, KV_S\)",
    ),
    "FIA SBH": (_fia_call(input_layout="SBH"), CONTRACT, "input_layout must be one of"),
    "FIA TND": (_fia_call(input_layout="TND"), NotImplementedError, "TND/varlen is not emulated"),
    "FIA BNSD_BSND at Q_S 1": (_fia_call(sq=1, input_layout="BNSD_BSND"), CONTRACT, "needs Q_S > 1"),
    "FIA num_heads mismatch": (_fia_call(num_heads=4), CONTRACT, "num_heads=4 but query has N=2"),
    "FIA GQA without num_key_value_heads": (
        _fia_call(query=_tensor(1, 4, 4, 16), num_heads=4),
        CONTRACT,
        "pass num_key_value_heads",
    ),
    "FIA ratio 65": (
        _fia_call(**_qkv((1, 65, 2, 16), (1, 1, 4, 16)), num_heads=65, num_key_value_heads=1),
        CONTRACT,
        "<= 64",
    ),
    "FIA key/value shapes differ": (_fia_call(value=_tensor(1, 2, 5, 16)), CONTRACT, "identical"),
    "FIA inner_precise 2 at Q_S 1": (_fia_call(sq=1, inner_precise=2), CONTRACT, "inner_precise"),
    "FIA inner_precise 4": (_fia_call(inner_precise=4), CONTRACT, "inner_precise"),
    "FIA sparse_mode 9": (_fia_call(sparse_mode=9), NotImplementedError, "treeMask"),
    "FIA sparse_mode 5": (_fia_call(sparse_mode=5), CONTRACT, "sparse_mode must be 0..4"),
    "FIA compressed mask wrong": (
        _fia_call(sparse_mode=4, atten_mask=_tensor(2048, 2048, dtype=torch.bool)),
        CONTRACT,
        "not that triangle",
    ),
    "FIA 2 lengths for B 3": (_fia_call(**_qkv((3, 2, 4, 16)), actual_seq_lengths_kv=[1, 2]), CONTRACT, "1 or >= B=3"),
    "FIA kv length too long": (_fia_call(actual_seq_lengths_kv=[5]), CONTRACT, r"in 0\.\.4"),
}


@pytest.mark.parametrize("case", ERROR_CASES, ids=list(ERROR_CASES))
def test_contract_violations_raise_clear_errors(case):
    call, error, message = ERROR_CASES[case]
    with pytest.raises(error, match=message):
        call()


FUSION_FEATURES = ["padding_mask", "prefix", "actual_seq_qlen", "actual_seq_kvlen"]
FIA_FEATURES = [
    p.name
    for p in inspect.signature(emu.npu_fused_infer_attention_score).parameters.values()
    if p.default is None and p.name not in ("atten_mask", "actual_seq_lengths", "actual_seq_lengths_kv")
]
FIA_MODES = ["block_size", "antiquant_mode", "key_antiquant_mode", "value_antiquant_mode"]


@pytest.mark.parametrize("name", FUSION_FEATURES)
def test_fusion_features_not_emulated_are_named(name):
    with pytest.raises(NotImplementedError, match=f"'{name}'"):
        _fusion_call(**{name: _tensor(1)})()


@pytest.mark.parametrize("name", FIA_FEATURES + FIA_MODES)
def test_fia_features_not_emulated_are_named(name):
    value = 1 if name in FIA_MODES else _tensor(1)
    with pytest.raises(NotImplementedError, match=name):
        _fia_call(**{name: value})()


def test_fia_feature_list_covers_the_documented_tensor_arguments():
    documented = [name for name, _, default in torch_npu_docs.prototype_parameters(FIA) if default is None]
    assert sorted(FIA_FEATURES + ["atten_mask", "actual_seq_lengths", "actual_seq_lengths_kv"]) == sorted(documented)


def test_d_not_multiple_of_16_is_fine_for_a_decode_step():
    out, _ = _fia_call(**_qkv((1, 2, 1, 24), (1, 2, 4, 24)))()
    assert out.shape == (1, 2, 1, 24)


# ==========================================================================================================
# pse: emulated only where the two documented formulas agree (scale == 1)


def test_the_docs_scale_pse_two_ways():
    """The disagreement the emulator refuses is in the docs themselves: the description's formula puts pse inside
    the scale, the pse example's reference outside it."""
    docs = torch_npu_docs.op_docstring(FUSION)
    assert "$y=Softmax(Mask(scale*(pse+query*key^{T}),atten_mask),keep_prob)$" in docs
    assert "# Reference implementation: softmax(scale * QK^T + pse) * V." in docs
    assert "ref_scores = torch.matmul(query.float().cpu(), key.float().cpu().transpose(2, 3)) * scale" in docs
    assert "torch.softmax(ref_scores + pse.float().cpu(), dim=-1)" in docs


def _pse_references(q, k, v, pse, keep):
    """Both documented formulas at scale 1, in float64: softmax(Mask(1 * (pse + q k^T))) and the example's
    softmax(q k^T * 1 + pse), masked where ``keep`` is False."""
    qk = torch.matmul(q.double(), k.double().transpose(2, 3))
    formula = 1.0 * (pse.double() + qk)
    example = qk * 1.0 + pse.double()
    outs = []
    for scores in (formula, example):
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        outs.append(torch.matmul(torch.softmax(scores, dim=-1), v.double()))
    return outs


@settings(max_examples=40, deadline=None)
@given(
    form=st.sampled_from(["BNSS", "BN1Skv", "1NSS"]),
    b=st.integers(1, 3),
    sq=st.integers(1, 9),
    skv=st.integers(1, 9),
    masked=st.sampled_from(["none", "mask", "causal"]),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
    seed=st.integers(0, 2**16),
)
def test_pse_at_scale_one_matches_both_documented_formulas(form, b, sq, skv, masked, dtype, seed):
    n = 2
    q, k, v = random_qkv(seed, b, n, n, sq, skv, 16, dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    shape = {"BNSS": (b, n, sq, skv), "BN1Skv": (b, n, 1, skv), "1NSS": (1, n, sq, skv)}[form]
    pse = (torch.randn(shape, generator=gen) * 3).to(dtype)
    keep, extra = None, {}
    if masked == "mask":
        keep = torch.rand(b, 1, sq, skv, generator=gen) > 0.3
        keep[..., 0] = True  # every row keeps a key: no invalid rows here
        extra = dict(atten_mask=~keep)
    elif masked == "causal" and sq <= skv:
        keep = torch.ones(sq, skv, dtype=torch.bool).tril()
        extra = dict(atten_mask=torch.ones(2048, 2048, dtype=torch.bool).triu(1), sparse_mode=2)
    out = emu.npu_fusion_attention(q, k, v, head_num=n, input_layout="BNSD", pse=pse, scale=1.0, **extra)[0]
    formula, example = _pse_references(q, k, v, pse, keep)
    torch.testing.assert_close(formula, example)  # the two documented formulas agree at scale 1
    torch.testing.assert_close(out.double(), formula, **_tolerance(dtype))


def test_pse_softmax_statistics_include_the_bias():
    q, k, v = random_qkv(30, 1, 2, 2, 4, 5, 16, torch.float32)
    pse = torch.randn(1, 2, 4, 5, generator=torch.Generator().manual_seed(31))
    _, row_max, row_sum, *_ = emu.npu_fusion_attention(q, k, v, head_num=2, input_layout="BNSD", pse=pse)
    scores = torch.matmul(q.double(), k.double().transpose(2, 3)) + pse.double()
    torch.testing.assert_close(row_max[..., 0].double(), scores.amax(-1), rtol=1e-6, atol=1e-6)
    lse = row_max[..., 0].double() + torch.log(row_sum[..., 0].double())
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), rtol=1e-6, atol=1e-6)


def _pse(*shape, dtype=torch.float16):
    return torch.zeros(*shape, dtype=dtype)


PSE_ERROR_CASES = {
    "scale not 1": (
        _fusion_call(pse=_pse(1, 2, 4, 4), scale=0.25),
        CONTRACT,
        "npu_fusion_attention: pse with scale=0.25: the docs scale pse two ways, softmax(Mask(scale * (pse + q k^T))) "
        "(the formula) and softmax(scale * q k^T + pse) (the pse example's reference), which agree only when "
        "scale == 1",
    ),
    "dtype": (
        _fusion_call(pse=_pse(1, 2, 4, 4, dtype=torch.float32), scale=1.0),
        CONTRACT,
        "npu_fusion_attention: pse dtype torch.float32 must equal the query's, torch.float16",
    ),
    "B1SS is not a pse format": (
        _fusion_call(pse=_pse(1, 1, 4, 4), scale=1.0),
        CONTRACT,
        "npu_fusion_attention: pse shape (1, 1, 4, 4) is none of BNSS (1, 2, 4, 4), BN1Skv (1, 2, 1, 4), "
        "1NSS (1, 2, 4, 4)",
    ),
    "SS is not a pse format": (
        _fusion_call(pse=_pse(4, 4), scale=1.0),
        CONTRACT,
        "npu_fusion_attention: pse shape (4, 4) is none of BNSS (1, 2, 4, 4), BN1Skv (1, 2, 1, 4), 1NSS (1, 2, 4, 4)",
    ),
    "sparse_mode 7": (
        _fusion_call(pse=_pse(1, 2, 4, 4), scale=1.0, sparse_mode=7),
        CONTRACT,
        "npu_fusion_attention: pse is not supported with sparse_mode=7",
    ),
    "sparse_mode 8": (
        _fusion_call(pse=_pse(1, 2, 4, 4), scale=1.0, sparse_mode=8),
        CONTRACT,
        "npu_fusion_attention: pse is not supported with sparse_mode=8",
    ),
    "pse needs grad": (
        _fusion_call(pse=_pse(1, 2, 4, 4).requires_grad_(True), scale=1.0),
        NotImplementedError,
        "npu_fusion_attention: a pse that requires grad: no gradient for pse is documented",
    ),
}


@pytest.mark.parametrize("case", PSE_ERROR_CASES, ids=list(PSE_ERROR_CASES))
def test_pse_outside_the_documented_contract_is_refused(case):
    call, error, message = PSE_ERROR_CASES[case]
    with pytest.raises(error) as info:
        call()
    assert str(info.value) == message


def test_an_alibi_compressed_pse_is_named_as_not_emulated():
    q, k, v = (torch.zeros(1, 1, 1100, 16, dtype=torch.float16) for _ in range(3))
    with pytest.raises(NotImplementedError, match="alibi-compressed pse"):
        emu.npu_fusion_attention(q, k, v, head_num=1, input_layout="BNSD", pse=_pse(1, 1, 1024, 1100))


# ==========================================================================================================
# the fake module


def test_build_module_is_an_importable_marked_torch_npu(monkeypatch):
    module = emu.install(monkeypatch)
    import importlib.util

    import torch_npu  # noqa: F401 - resolved from sys.modules, i.e. the emulator

    assert torch_npu is module and sys.modules["torch_npu"] is module
    assert importlib.util.find_spec("torch_npu") is module.__spec__ and module.__spec__.name == "torch_npu"
    assert module.__version__ == "2.13.0" and module.NPU_PORT_EMULATOR is True
    assert "emulator" in module.__doc__.lower()
    assert module.npu_fusion_attention is emu.npu_fusion_attention
    assert module.npu_fused_infer_attention_score is emu.npu_fused_infer_attention_score
    assert emu.build_module() is not module  # fresh each time


def test_errors_are_runtime_errors_like_the_real_ops():
    assert issubclass(emu.NpuContractError, RuntimeError) and issubclass(NotImplementedError, RuntimeError)


# ==========================================================================================================
# tests/torch_npu_docs.py


def _fake_docs(path, name="npu_fake_op", doc="功能描述\nhello"):
    path.write_text(f'_add_torch_npu_docstr(\n    "{name}",\n    """{doc}"""\n)\n', encoding="utf-8")
    return path


@pytest.fixture
def no_download(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"unexpected subprocess call {args}")

    monkeypatch.setattr(subprocess, "run", refuse)


def test_docs_env_var_wins(tmp_path, monkeypatch, no_download):
    monkeypatch.setenv(torch_npu_docs.ENV_VAR, str(_fake_docs(tmp_path / "docs.py")))
    assert torch_npu_docs.op_docstring("npu_fake_op") == "功能描述\nhello"
    with pytest.raises(KeyError, match="npu_missing"):
        torch_npu_docs.op_docstring("npu_missing")


def test_docs_env_var_naming_no_file_is_an_error(tmp_path, monkeypatch, no_download):
    monkeypatch.setenv(torch_npu_docs.ENV_VAR, str(tmp_path / "absent.py"))
    with pytest.raises(RuntimeError, match=torch_npu_docs.ENV_VAR):
        torch_npu_docs.op_plugin_docs_path()


def test_docs_cache_is_used_without_download(tmp_path, monkeypatch, no_download):
    monkeypatch.delenv(torch_npu_docs.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cached = torch_npu_docs.cache_dir() / "_op_plugin_docs.py"
    cached.parent.mkdir(parents=True)
    _fake_docs(cached)
    assert torch_npu_docs.op_plugin_docs_path() == cached
    assert cached.is_relative_to(tmp_path / "npu-port" / "torch_npu-2.13.0")


def test_docs_download_extracts_only_the_two_files(tmp_path, monkeypatch):
    monkeypatch.delenv(torch_npu_docs.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        target = command[command.index("-d") + 1]
        with zipfile.ZipFile(f"{target}/torch_npu-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl", "w") as zf:
            zf.writestr("torch_npu/_op_plugin_docs.py", _fake_docs(tmp_path / "src.py").read_text(encoding="utf-8"))
            zf.writestr("torch_npu/testing/testcase.py", "# testcase\n")
            zf.writestr("torch_npu/__init__.py", "raise SystemExit('must never be extracted or imported')\n")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    path = torch_npu_docs.op_plugin_docs_path()
    assert calls and calls[0][1:4] == ["-m", "pip", "download"] and "--no-deps" in calls[0]
    assert "torch-npu==2.13.0" in calls[0] and "install" not in calls[0]
    assert torch_npu_docs.op_docstring("npu_fake_op") == "功能描述\nhello"
    assert torch_npu_docs.testcase_path().read_text() == "# testcase\n"
    assert sorted(p.name for p in path.parent.rglob("*") if p.is_file()) == ["_op_plugin_docs.py", "testcase.py"]


def test_docs_download_failure_says_how_to_provide_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv(torch_npu_docs.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(
        subprocess, "run", lambda command, **kwargs: subprocess.CompletedProcess(command, 1, "", "No network here")
    )
    with pytest.raises(RuntimeError) as excinfo:
        torch_npu_docs.op_plugin_docs_path()
    message = str(excinfo.value)
    assert "No network here" in message and torch_npu_docs.ENV_VAR in message and "pip download" in message


def test_example_code_is_cut_between_markers_and_parses(tmp_path, monkeypatch, no_download):
    doc = "说明\n调用示例:\nx = 1\ny = x + 1\n# 执行上述代码的输出\n$ python example.py"
    monkeypatch.setenv(torch_npu_docs.ENV_VAR, str(_fake_docs(tmp_path / "docs.py", doc=doc)))
    assert torch_npu_docs.example_code("npu_fake_op", "调用示例:", "# 执行上述代码的输出") == "x = 1\ny = x + 1\n"
    with pytest.raises(SyntaxError):
        torch_npu_docs.example_code("npu_fake_op", "调用示例:", None)
