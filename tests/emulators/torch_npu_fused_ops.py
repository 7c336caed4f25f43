"""Emulator of three torch_npu 2.13.0 fused DiT ops -- ``npu_rms_norm``, ``npu_rotary_mul``, ``npu_geglu`` -- for tests.

What this is
    Plain-PyTorch stand-ins written from the ops' own documentation (``torch_npu/_op_plugin_docs.py`` in the
    torch_npu 2.13.0 wheel, read by tests/torch_npu_docs.py), added to the emulated ``torch_npu`` module by
    tests/emulators/torch_npu_emulator.py's ``build_module()``. Like the attention emulator, it is NOT the Ascend
    kernels: nothing about speed, memory or bit-level numerics. It computes in float64 and casts to the input dtype
    once, the best case of a kernel that computes in float32 inside. The doc sentence behind each rule is quoted at
    the code; tests/fuse/test_fused_ops_emulator.py checks the emulator against those docs' formulas and examples.

Contracts (the docs' words)
    npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)
        "RmsNorm算子是大模型常用的归一化操作，相比LayerNorm算子，其去掉了减去均值的部分" (LayerNorm without the
        mean): y = self / sqrt(mean(self^2) + epsilon) * gamma over gamma's axes. self float16/bfloat16/float32,
        2-8 dimensions; gamma "数据类型需要和self保持一致". The docs give gamma "2-8维，通常为self的最后一维" and their
        example passes a 1-D gamma (``w = torch.randn(128)``): the emulator takes a gamma whose shape is self's
        trailing dimensions, 1-D included. The second output is the "reverse rms" 1/sqrt(mean + eps); its dtype and
        shape are not documented: float32, self's shape with gamma's axes kept as 1 (CANN's RmsNorm rstd).
    npu_rotary_mul(Tensor input, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) -> Tensor
        output = r1 * input + r2 * x_new, x_new from the documented half / interleave rotation, or input @ rotate.
        4-D input / r1 / r2; D even and < 896; half: B, N < 1000 and r1 in 11SD/B1SD/BNSD (BNSD), 1S1D/BS1D/BSND
        (BSND), S11D/SB1D/SBND (SBND); interleave: B * N < 1000 and r1 in 11SD / 1S1D / S11D only; r1 / r2 values in
        [-1, 1] ("数据范围：[-1, 1]"). The layout is not an argument: it is read from r1's shape (the first of BNSD,
        BSND, SBND whose form r1 fits). The jit_compile=True restrictions (half only, D = 128) are not emulated:
        npu-port's profiles set jit_compile false.
    npu_geglu(Tensor self, int dim=-1, int approximate=1) -> (Tensor, Tensor)
        "approximate ... 0表示使用none，1表示使用tanh"; outputs (out, outGelu) of half self's size on ``dim`` ("out、
        outGelu在dim维的size等于self在dim维size的1/2"); dim in [-self.dim(), self.dim()-1]. Which half is gated is
        not in the torch_npu docs; CANN's aclnnGeGluV3 docs, which extend GeGlu with ``activateLeft``, say that
        without it (activateLeft=false) "对self的右半部分做activate: out = A · Gelu(B)" — A the left half, B the
        right (hiascend.com, CANN 8.3.RC1 aclnnGeGluV3.md), which is also what diffusers' GEGLU assumes when it swaps
        ``hidden_states * gelu(gate)`` for npu_geglu. So out = A * GELU(B), outGelu = GELU(B).

Errors
    A call outside these contracts raises ``NpuContractError`` (the attention emulator's, a RuntimeError).
"""

from __future__ import annotations

import math

import torch

from .torch_npu_emulator import NpuContractError

__all__ = ["npu_geglu", "npu_rms_norm", "npu_rotary_mul"]

FLOATS = (torch.float16, torch.bfloat16, torch.float32)
RMS_NORM = "npu_rms_norm"
ROTARY = "npu_rotary_mul"
GEGLU = "npu_geglu"


def _require(condition: bool, op: str, message: str) -> None:
    if not condition:
        raise NpuContractError(f"{op}: {message}")


def _dtype(op: str, name: str, tensor: torch.Tensor) -> None:
    # "数据类型支持float16、bfloat16、float32" (each op lists these three)
    _require(tensor.dtype in FLOATS, op, f"{name} dtype must be float16, bfloat16 or float32, got {tensor.dtype}")


def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    _dtype(RMS_NORM, "self", self)
    # "gamma：Tensor类型，数据类型需要和self保持一致"
    _require(gamma.dtype == self.dtype, RMS_NORM, f"gamma dtype {gamma.dtype} must equal self dtype {self.dtype}")
    # "输入shape支持2-8维"
    _require(2 <= self.dim() <= 8, RMS_NORM, f"self must have 2-8 dimensions, got {self.dim()}")
    axes = gamma.dim()
    _require(
        1 <= axes <= self.dim() and tuple(gamma.shape) == tuple(self.shape[-axes:]),
        RMS_NORM,
        f"gamma shape {tuple(gamma.shape)} must be self's trailing dimensions (self {tuple(self.shape)})",
    )
    dims = tuple(range(-axes, 0))
    x = self.to(torch.float64)
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    y = x * rstd * gamma.to(torch.float64)
    return y.to(self.dtype), rstd.to(torch.float32)


def _rotary_layout(input: torch.Tensor, r1: torch.Tensor, mode: str):
    """(layout, B, N) read from r1's documented forms, or None."""
    b0, b1, b2, d = input.shape
    if mode == "interleave":  # "input为BNSD: 11SD; input为BSND: 1S1D; input为SBND: S11D."
        forms = {"BNSD": [(1, 1, b2, d)], "BSND": [(1, b1, 1, d)], "SBND": [(b0, 1, 1, d)]}
    else:  # "BNSD: 11SD、B1SD、BNSD; BSND: 1S1D、BS1D、BSND; SBND: S11D、SB1D、SBND."
        forms = {
            "BNSD": [(1, 1, b2, d), (b0, 1, b2, d), (b0, b1, b2, d)],
            "BSND": [(1, b1, 1, d), (b0, b1, 1, d), (b0, b1, b2, d)],
            "SBND": [(b0, 1, 1, d), (b0, b1, 1, d), (b0, b1, b2, d)],
        }
    batch_heads = {"BNSD": (b0, b1), "BSND": (b0, b2), "SBND": (b1, b2)}
    for layout, shapes in forms.items():
        if tuple(r1.shape) in shapes:
            return (layout, *batch_heads[layout])
    return None


def npu_rotary_mul(input: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half", rotate=None):
    # "rotary_mode: ... 支持'half'、'interleave'两种模式。缺省为half。"
    _require(
        rotary_mode in ("half", "interleave"),
        ROTARY,
        f"rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}",
    )
    for name, tensor in (("input", input), ("r1", r1), ("r2", r2)):
        _dtype(ROTARY, name, tensor)
        # "input：必选输入，4维Tensor" / "cos: 必选输入，4维Tensor"
        _require(tensor.dim() == 4, ROTARY, f"{name} must be 4-D, got shape {tuple(tensor.shape)}")
    _require(r1.shape == r2.shape, ROTARY, f"r1 {tuple(r1.shape)} and r2 {tuple(r2.shape)} must have one shape")
    d = input.shape[-1]
    # "D < 896，且为2的倍数"
    _require(d % 2 == 0 and d < 896, ROTARY, f"D must be even and < 896, got {d}")
    found = _rotary_layout(input, r1, rotary_mode)
    _require(
        found is not None,
        ROTARY,
        f"r1/r2 shape {tuple(r1.shape)} is not a documented {rotary_mode} form for input {tuple(input.shape)}",
    )
    _, batch, heads = found
    if rotary_mode == "half":  # "B, N < 1000"
        _require(batch < 1000 and heads < 1000, ROTARY, f"half mode needs B, N < 1000, got B={batch}, N={heads}")
    else:  # "B * N < 1000"
        _require(batch * heads < 1000, ROTARY, f"interleave mode needs B * N < 1000, got {batch * heads}")
    for name, table in (("r1", r1), ("r2", r2)):  # "r1: 数据范围：[-1, 1]"
        _require(bool(table.abs().max() <= 1), ROTARY, f"{name} values must lie in [-1, 1]")
    x = input.to(torch.float64)
    if rotate is not None:  # "传入rotate时: x_new = input @ rotate"
        _require(tuple(rotate.shape) == (d, d), ROTARY, f"rotate must be ({d}, {d}), got {tuple(rotate.shape)}")
        x_new = x @ rotate.to(torch.float64)
    elif rotary_mode == "half":  # x1, x2 = torch.chunk(input, 2, -1); x_new = torch.cat((-x2, x1), dim=-1)
        x1, x2 = torch.chunk(x, 2, -1)
        x_new = torch.cat((-x2, x1), dim=-1)
    else:  # x1 = input[..., ::2]; x2 = input[..., 1::2]; rearrange(stack((-x2, x1), -1), "... d two -> ...(d two)")
        x1, x2 = x[..., ::2], x[..., 1::2]
        x_new = torch.stack((-x2, x1), dim=-1).flatten(-2)
    out = r1.to(torch.float64) * x + r2.to(torch.float64) * x_new  # "output = r1 * input + r2 * x_new"
    return out.to(input.dtype)


def _gelu(x: torch.Tensor, approximate: int) -> torch.Tensor:
    if approximate == 1:  # tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))))
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))  # none: x * Phi(x)


def npu_geglu(self: torch.Tensor, dim: int = -1, approximate: int = 1):
    _dtype(GEGLU, "self", self)
    # "int approximate：... 0表示使用none，1表示使用tanh"
    _require(approximate in (0, 1), GEGLU, f"approximate must be 0 (none) or 1 (tanh), got {approximate!r}")
    # "当self.dim()>0时，取值在[-self.dim(), self.dim()-1]范围内"
    _require(self.dim() > 0, GEGLU, "self must have at least one dimension")
    _require(-self.dim() <= dim <= self.dim() - 1, GEGLU, f"dim {dim} out of range for {self.dim()}-D self")
    # "out、outGelu在dim维的size等于self在dim维size的1/2"
    _require(self.shape[dim] % 2 == 0, GEGLU, f"self's size on dim {dim} must be even, got {self.shape[dim]}")
    left, right = self.to(torch.float64).chunk(2, dim=dim)
    gelu = _gelu(right, approximate)  # aclnnGeGluV3, activateLeft=false: "out = A · Gelu(B)"
    return (left * gelu).to(self.dtype), gelu.to(self.dtype)
