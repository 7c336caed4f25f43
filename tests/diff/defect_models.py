"""Tiny models with a defect that can be switched on in one named module, for the ``npu-port diff`` tests.

Each builder is seeded, so side A (clean) and side B (the same weights, one defect) can be built in different
processes. A defect is a flag on one module (``defect = True``), or ``defect_from = k``: on from the k-th call of the
model (step k of a capture), off before — what a defect that shows only at a later denoising step looks like.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

DIM = 32
HEADS = 4
TOKENS = 12
KEEP = 8  # tokens 0..7 are real, 8..11 padding


class _Switch(nn.Module):
    """A module whose defect is on when ``defect`` is set, or from the model's call ``defect_from`` on."""

    def __init__(self) -> None:
        super().__init__()
        self.defect = False
        self.defect_from = None
        self.calls = 0

    def defective(self) -> bool:
        on = self.defect or (self.defect_from is not None and self.calls >= self.defect_from)
        self.calls += 1
        return on


class MaskedAttention(_Switch):
    """Self-attention with a boolean keep-mask (True = a real token); the defect inverts it (padding attends)."""

    def __init__(self, causal: bool = False) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)
        self.causal = causal

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        defective = self.defective()
        mask = keep[:, None, None, :]
        if self.causal:
            # a decoder: causal attention, no padding mask; the defect drops is_causal in this one call
            o = F.scaled_dot_product_attention(q, k, v, is_causal=not defective)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask if defective else mask)
        return self.out(o.transpose(1, 2).reshape(b, n, DIM))


class Block(nn.Module):
    def __init__(self, causal: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.attn = MaskedAttention(causal)
        self.ff = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm(x), keep)
        return x + self.ff(x)


class Encoder(nn.Module):
    """Three blocks of masked (or causal) attention."""

    def __init__(self, causal: bool = False, layers: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(causal) for _ in range(layers))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, keep)
        return x


class HalfNorm(_Switch):
    """A LayerNorm; its defect computes it in float16 (and casts back), as a port that forgot to keep it float32."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.defective():
            w, b = self.norm.weight.half(), self.norm.bias.half()
            return F.layer_norm(x.half(), (DIM,), w, b, self.norm.eps).float()
        return self.norm(x)


class BigActivations(nn.Module):
    """Linear -> norm -> Linear, three times; the second stage's linear makes values of about 1e5 (over float16's
    65504) before its norm."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(3))
        self.norms = nn.ModuleList(HalfNorm() for _ in range(3))
        with torch.no_grad():
            self.proj[1].weight.mul_(4e5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for proj, norm in zip(self.proj, self.norms):
            x = norm(proj(x))
        return x


class RmsStack(nn.Module):
    """Three ``torch.nn.RMSNorm`` layers between linears (what ``fuse_ops(ops=["rms_norm"])`` fuses)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(3))
        self.norms = nn.ModuleList(nn.RMSNorm(DIM, eps=1e-6) for _ in range(3))
        with torch.no_grad():
            for norm in self.norms:
                norm.weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for proj, norm in zip(self.proj, self.norms):
            x = norm(proj(x))
        return x


class NaNAt(nn.Module):
    """Puts a NaN in element 0 of its input (when ``on``): NaN in both runs, or in one."""

    def __init__(self, on: bool = True) -> None:
        super().__init__()
        self.on = on

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.on:
            return x.clone()
        x = x.clone()
        x.view(-1)[0] = float("nan")
        return x


def build(name: str, seed: int = 0) -> nn.Module:
    """The model ``name`` with seeded weights."""
    torch.manual_seed(seed)
    if name == "encoder":
        model = Encoder()
    elif name == "decoder":
        model = Encoder(causal=True)
    elif name == "big":
        model = BigActivations()
    elif name == "rms":
        model = RmsStack()
    elif name == "nan":
        model = nn.Sequential(nn.Linear(DIM, DIM), NaNAt(), nn.Linear(DIM, DIM))
    else:
        raise ValueError(name)
    return model.eval()


def inputs(name: str, seed: int = 1):
    """The model's inputs: ``(x,)`` or ``(x, keep)``."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, TOKENS, DIM, generator=generator)
    if name in ("encoder", "decoder"):
        keep = torch.zeros(2, TOKENS, dtype=torch.bool)
        keep[:, :KEEP] = True
        return x, keep
    return (x,)


def switch_on(model: nn.Module, path: str, from_call=None) -> None:
    """Turn on the defect of the module at ``path`` (from the model's call ``from_call`` on, or always)."""
    module = model.get_submodule(path)
    if from_call is None:
        module.defect = True
    else:
        module.defect_from = from_call


def run(model: nn.Module, name: str, calls: int = 1) -> None:
    """Call the model ``calls`` times (each call is a step of a capture), the input changing a little each time."""
    args = inputs(name)
    with torch.no_grad():
        for call in range(calls):
            model(args[0] * (1 + 0.1 * call), *args[1:])


def write_dump(name: str, path: str, defect: str = "", from_call=None, calls: int = 1) -> None:
    """Build ``name``, switch on ``defect`` (a module path, or none), capture ``calls`` calls into ``path``."""
    from npu_port.diff import capture

    model = build(name)
    if defect:
        switch_on(model, defect, from_call)
    with capture(model, path, meta={"defect": defect}):
        run(model, name, calls)


if __name__ == "__main__":  # python -m tests.diff.defect_models NAME PATH [DEFECT [FROM_CALL [CALLS]]]
    arguments = sys.argv[1:] + [""] * (5 - len(sys.argv[1:]))
    name, path, defect, from_call, calls = arguments[:5]
    write_dump(name, path, defect, int(from_call) if from_call else None, int(calls or 1))
