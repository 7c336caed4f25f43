"""The emulator of npu_rms_norm / npu_rotary_mul / npu_geglu (tests/emulators/torch_npu_fused_ops.py) against the
torch_npu 2.13.0 docs it was written from: the prototypes, the quoted rules, the docs' own formula code run as the
reference, and each documented limit refused."""

from __future__ import annotations

import inspect
import math
import re
import textwrap

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests import torch_npu_docs
from tests.emulators import torch_npu_emulator
from tests.emulators import torch_npu_fused_ops as emu
from tests.emulators.torch_npu_emulator import NpuContractError

OPS = ("npu_rms_norm", "npu_rotary_mul", "npu_geglu")

#: The doc sentences each emulator rule quotes (tests/emulators/torch_npu_fused_ops.py): they must be in the docs.
QUOTED = {
    "npu_rms_norm": ["相比LayerNorm算子，其去掉了减去均值的部分", "数据类型需要和self保持一致", "输入shape支持2-8维"],
    "npu_rotary_mul": [
        "D < 896，且为2的倍数",
        "B * N < 1000",
        "B, N < 1000",
        "input为BNSD: 11SD;",
        "input为BSND: 1S1D;",
        "input为SBND: S11D.",
        "数据范围：[-1, 1]",
        "output = r1 * input + r2 * x_new",
        "x_new = input @ rotate",
    ],
    "npu_geglu": [
        "0表示使用none，1表示使用tanh",
        "out、outGelu在dim维的size等于self在dim维size的1/2",
        "当self.dim()>0时，取值在[-self.dim(), self.dim()-1]范围内",
    ],
}


def _params(function):
    return [
        (
            p.name,
            p.kind is inspect.Parameter.KEYWORD_ONLY,
            torch_npu_docs.REQUIRED if p.default is p.empty else p.default,
        )
        for p in inspect.signature(function).parameters.values()
    ]


@pytest.mark.parametrize("name", ["npu_rms_norm", "npu_rotary_mul"])
def test_signature_is_the_documented_prototype(name):
    assert _params(getattr(emu, name)) == torch_npu_docs.prototype_parameters(name)


def test_geglu_signature_is_the_documented_prototype():
    """Its prototype line reads ``torch_npu. npu_geglu(...)`` (a stray space), so it is parsed here."""
    line = next(x for x in torch_npu_docs.op_docstring("npu_geglu").splitlines() if "npu_geglu(" in x)
    assert line.strip() == "torch_npu. npu_geglu(Tensor self, int dim=-1, int approximate=1) -> (Tensor, Tensor)"
    assert _params(emu.npu_geglu) == [
        ("self", False, torch_npu_docs.REQUIRED),
        ("dim", False, -1),
        ("approximate", False, 1),
    ]


@pytest.mark.parametrize("name", OPS)
def test_every_quoted_rule_is_in_the_docs(name):
    doc = torch_npu_docs.op_docstring(name)
    source = inspect.getsource(emu)
    for sentence in QUOTED[name]:
        assert sentence in doc, sentence
        assert sentence in source, sentence


def test_the_emulated_module_carries_the_fused_ops():
    module = torch_npu_emulator.build_module()
    for name in OPS:
        assert getattr(module, name) is getattr(emu, name)


# ---------------------------------------------------------------------------------------------------------------
# npu_rotary_mul: the docs' formula code is the reference


def _rearrange(tensor, pattern, two):
    """einops' ``rearrange`` for the one pattern the docs' interleave formula uses."""
    assert pattern == "... d two -> ...(d two)" and two == 2
    return tensor.flatten(-2)


def docs_rotary(mode: str):
    """The docs' own formula for ``mode`` (no rotate), as a function of input / r1 / r2."""
    doc = torch_npu_docs.op_docstring("npu_rotary_mul")
    start, end = ("half模式：\n", "interleave模式：") if mode == "half" else ("interleave模式：\n", "传入rotate时")
    code = textwrap.dedent(torch_npu_docs.text_between(doc, start, end))

    def formula(input, r1, r2):
        namespace = {"torch": torch, "rearrange": _rearrange, "input": input, "r1": r1, "r2": r2}
        exec(compile(code, f"<npu_rotary_mul docs, {mode}>", "exec"), namespace)  # noqa: S102 - the docs' formula
        return namespace["output"]

    return formula


LAYOUT_TABLES = {  # r1 shape per layout for input (B, N, S, D) laid out as named
    "BNSD": lambda b, n, s, d: ((b, n, s, d), (1, 1, s, d)),
    "BSND": lambda b, n, s, d: ((b, s, n, d), (1, s, 1, d)),
    "SBND": lambda b, n, s, d: ((s, b, n, d), (s, 1, 1, d)),
}


@settings(max_examples=30)
@given(
    mode=st.sampled_from(["half", "interleave"]),
    layout=st.sampled_from(sorted(LAYOUT_TABLES)),
    b=st.integers(1, 3),
    n=st.integers(1, 4),
    s=st.integers(1, 5),
    half_d=st.integers(1, 8),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
)
def test_rotary_mul_is_the_documented_formula(mode, layout, b, n, s, half_d, dtype):
    x_shape, table_shape = LAYOUT_TABLES[layout](b, n, s, 2 * half_d)
    gen = torch.Generator().manual_seed(b * 100 + n * 10 + s)
    x = torch.randn(x_shape, generator=gen, dtype=torch.float64)
    r1 = torch.rand(table_shape, generator=gen, dtype=torch.float64) * 2 - 1
    r2 = torch.rand(table_shape, generator=gen, dtype=torch.float64) * 2 - 1
    expected = docs_rotary(mode)(x, r1, r2)
    got = emu.npu_rotary_mul(x.to(dtype), r1.to(dtype), r2.to(dtype), rotary_mode=mode)
    assert got.dtype == dtype and got.shape == x.shape
    reference = docs_rotary(mode)(*(t.to(dtype).double() for t in (x, r1, r2)))  # the docs on the rounded inputs
    assert torch.equal(got, reference.to(dtype))  # float64 inside, one rounding: bit for bit
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)


def test_the_two_modes_differ_so_the_formula_check_can_fail():
    x = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    r1 = torch.full((1, 1, 3, 8), 0.5, dtype=torch.float64)
    r2 = torch.full((1, 1, 3, 8), 0.75, dtype=torch.float64)
    half = emu.npu_rotary_mul(x.float(), r1.float(), r2.float(), "half").double()
    assert (half - docs_rotary("interleave")(x, r1, r2)).abs().max() > 0.1
    assert (half - docs_rotary("half")(x, r1, r2)).abs().max() < 1e-6


def test_rotate_matrix_of_the_docs_half_example_is_half_mode():
    """示例3 builds the half rotation as a matrix; through ``rotate`` it must equal rotary_mode='half'."""
    n = 16
    rotate = torch.zeros(n, n)
    half = n // 2
    rotate[:half, half:] = torch.eye(half)
    rotate[half:, :half] = -torch.eye(half)
    x, r1, r2 = torch.randn(2, 2, 5, n), torch.rand(1, 1, 5, n), torch.rand(1, 1, 5, n)
    torch.testing.assert_close(
        emu.npu_rotary_mul(x, r1, r2, "half", rotate), emu.npu_rotary_mul(x, r1, r2, "half"), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize(
    "x_shape, r_shape, mode, message",
    [
        ((1, 2, 3, 7), (1, 1, 3, 7), "half", "D must be even and < 896, got 7"),
        ((1, 2, 3, 896), (1, 1, 3, 896), "interleave", "D must be even and < 896, got 896"),
        ((40, 25, 3, 8), (1, 1, 3, 8), "interleave", "interleave mode needs B * N < 1000, got 1000"),
        ((1000, 1, 3, 8), (1, 1, 3, 8), "half", "half mode needs B, N < 1000, got B=1000, N=1"),
        ((2, 3, 4, 8), (2, 1, 4, 8), "interleave", "r1/r2 shape (2, 1, 4, 8) is not a documented interleave form"),
        ((2, 3, 8), (1, 3, 8), "half", "input must be 4-D, got shape (2, 3, 8)"),
    ],
)
def test_rotary_mul_refuses_what_the_docs_rule_out(x_shape, r_shape, mode, message):
    with pytest.raises(NpuContractError, match=re.escape(message)):
        emu.npu_rotary_mul(torch.randn(x_shape), torch.rand(r_shape), torch.rand(r_shape), rotary_mode=mode)


def test_rotary_mul_takes_b1sd_in_half_mode_only_and_tables_in_minus_one_one():
    x, table = torch.randn(2, 3, 4, 8), torch.rand(2, 1, 4, 8)
    emu.npu_rotary_mul(x, table, table, "half")  # B1SD is a documented half form
    with pytest.raises(NpuContractError, match=re.escape("r1 values must lie in [-1, 1]")):
        emu.npu_rotary_mul(x, table + 1.5, table, "half")
    with pytest.raises(NpuContractError, match="rotary_mode must be 'half' or 'interleave', got 'rotated'"):
        emu.npu_rotary_mul(x, table, table, "rotated")


# ---------------------------------------------------------------------------------------------------------------
# npu_rms_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rms_norm_is_layer_norm_without_the_mean_times_gamma(dtype):
    """The docs' example shapes (24, 1, 128) with a 1-D gamma of 128, against torch's own rms_norm in float64."""
    x, w = torch.randn(24, 1, 128).to(dtype), torch.randn(128).to(dtype)
    y, rstd = emu.npu_rms_norm(x, w, epsilon=1e-5)
    expected = F.rms_norm(x.double(), (128,), w.double(), eps=1e-5)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.double(), expected.to(dtype).double(), atol=0, rtol=0)
    assert rstd.dtype == torch.float32 and rstd.shape == (24, 1, 1)
    torch.testing.assert_close(
        rstd.double(), torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5).float().double()
    )


def test_rms_norm_with_a_two_dimensional_gamma_normalises_over_its_axes():
    x, w = torch.randn(3, 4, 5), torch.randn(4, 5)
    y, _ = emu.npu_rms_norm(x, w)
    torch.testing.assert_close(y, F.rms_norm(x.double(), (4, 5), w.double(), eps=1e-6).float())


@pytest.mark.parametrize(
    "x, w, message",
    [
        (torch.randn(4, 8), torch.randn(8).half(), "gamma dtype torch.float16 must equal self dtype torch.float32"),
        (torch.randn(8), torch.randn(8), "self must have 2-8 dimensions, got 1"),
        (torch.randn(4, 8).double(), torch.randn(8).double(), "self dtype must be float16, bfloat16 or float32"),
        (torch.randn(4, 8), torch.randn(4), "gamma shape (4,) must be self's trailing dimensions"),
    ],
)
def test_rms_norm_refuses_what_the_docs_rule_out(x, w, message):
    with pytest.raises(NpuContractError, match=re.escape(message)):
        emu.npu_rms_norm(x, w)


# ---------------------------------------------------------------------------------------------------------------
# npu_geglu


def _gelu64(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


@pytest.mark.parametrize("approximate, torch_name", [(0, "none"), (1, "tanh")])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_geglu_gates_the_left_half_with_gelu_of_the_right_half(approximate, torch_name, dim):
    x = torch.randn(4, 6, 8, dtype=torch.float64)
    out, gelu = emu.npu_geglu(x.float(), dim=dim, approximate=approximate)
    left, right = x.chunk(2, dim=dim)
    torch.testing.assert_close(gelu.double(), F.gelu(right, approximate=torch_name), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.double(), left * _gelu64(right, torch_name), atol=1e-6, rtol=0)
    assert out.shape[dim] == x.shape[dim] // 2 == gelu.shape[dim]


def test_geglu_tanh_and_erf_differ_so_the_gelu_check_can_fail():
    x = torch.tensor([[1.0, -2.7]])  # right half -2.7: near the largest tanh / erf gap, 4.7e-4
    exact, _ = emu.npu_geglu(x, approximate=0)
    tanh, _ = emu.npu_geglu(x, approximate=1)
    assert 4e-4 < float((exact - tanh).abs().max()) < 5e-4


@pytest.mark.parametrize(
    "x, kwargs, message",
    [
        (torch.randn(2, 4), {"approximate": 2}, "approximate must be 0 (none) or 1 (tanh), got 2"),
        (torch.randn(2, 5), {}, "self's size on dim -1 must be even, got 5"),
        (torch.randn(2, 4), {"dim": 2}, "dim 2 out of range for 2-D self"),
        (torch.randn(2, 4).double(), {}, "self dtype must be float16, bfloat16 or float32"),
    ],
)
def test_geglu_refuses_what_the_docs_rule_out(x, kwargs, message):
    with pytest.raises(NpuContractError, match=re.escape(message)):
        emu.npu_geglu(x, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# the MindIE-SD fake (tests/fakes/mindiesd_fake.py): layernorm_scale_shift as documented


@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("scale_shape", [(2, 16), (2, 1, 16)])
def test_layernorm_scale_shift_is_the_documented_formula(affine, scale_shape):
    """``out = layernorm(x) * (1 + scale) + shift``: its fused path equals MindIE-SD's own unfused path."""
    from tests.fakes import mindiesd_fake

    norm = nn.LayerNorm(16, eps=1e-6, elementwise_affine=affine).double()
    if affine:
        with torch.no_grad():
            norm.weight.copy_(torch.linspace(0.5, 1.5, 16))
            norm.bias.copy_(torch.linspace(-1, 1, 16))
    x, scale, shift = (
        torch.randn(2, 5, 16).double(),
        torch.randn(scale_shape).double(),
        torch.randn(scale_shape).double(),
    )
    fused = mindiesd_fake.layernorm_scale_shift(norm, x, scale, shift, fused=True)
    unfused = mindiesd_fake.layernorm_scale_shift(norm, x, scale, shift, fused=False)
    by_hand = norm(x) * (1 + scale.view(2, 1, 16)) + shift.view(2, 1, 16)
    torch.testing.assert_close(fused, by_hand, atol=1e-12, rtol=0)
    torch.testing.assert_close(unfused, by_hand, atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "x_shape, scale_shape, message",
    [
        ((2, 16), (2, 16), "The dimensional of input x must be a 3, but got 2."),
        ((2, 5, 16), (2, 3, 16), "If scale is a 3D tensor, the second dimension must be 1, but got 3."),
        ((2, 5, 16), (2, 8), "The last dimensions of x, scale and shift must be equal, got 16, 8, 8."),
    ],
)
def test_layernorm_scale_shift_checks_what_mindiesd_checks(x_shape, scale_shape, message):
    from tests.fakes import mindiesd_fake

    with pytest.raises(mindiesd_fake.ParametersInvalid, match=re.escape(message)):
        mindiesd_fake.layernorm_scale_shift(
            nn.LayerNorm(16), torch.randn(x_shape), torch.randn(scale_shape), torch.randn(scale_shape)
        )
    with pytest.raises(mindiesd_fake.ParametersInvalid, match="layernorm must be torch.nn.LayerNorm"):
        mindiesd_fake.layernorm_scale_shift(
            nn.RMSNorm(16), torch.randn(2, 5, 16), torch.randn(2, 16), torch.randn(2, 16)
        )
