"""Fused ops match the modules and functions they replace — on single layers and on tiny Flux, Wan and HunyuanVideo
transformers — judged against a float64 run of the original: the fused result is never meaningfully further from it
than the original's own result in the same dtype. The torch_npu emulator computes the documented ops (float64
inside, one rounding), so this checks npu-port's side: which op, which mode, which tables and layouts it passes."""

from __future__ import annotations

import copy
import itertools
import math
import re

import pytest
import torch
import torch.nn.functional as F
from diffusers.models import activations, embeddings
from diffusers.models.attention import BasicTransformerBlock
from diffusers.models.attention_processor import Attention, CogVideoXAttnProcessor2_0
from diffusers.models.normalization import AdaLayerNormContinuous, AdaLayerNormZero, AdaLayerNormZeroSingle, RMSNorm
from diffusers.models.transformers.transformer_flux import FluxAttention
from torch import nn

import npu_port

from ..emulators import torch_npu_fused_ops as emu

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _x(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _leaves(value):
    return [t for item in value for t in _leaves(item)] if isinstance(value, (tuple, list)) else [value]


def assert_as_close_as_the_original(fused, original, reference, dtype):
    """|fused - float64 reference| <= 2 |original - reference| + one unit in the last place at the largest value."""
    for f, o, r in zip(_leaves(fused), _leaves(original), _leaves(reference)):
        f, o, r = f.detach(), o.detach(), r.detach()
        assert f.dtype == o.dtype == dtype and f.shape == o.shape
        r = r.double()
        scale = float(r.abs().max())
        err_fused, err_original = float((f.double() - r).abs().max()), float((o.double() - r).abs().max())
        assert err_fused <= 2 * err_original + torch.finfo(dtype).eps * scale, (err_fused, err_original, scale)


def fused_then_original(module, op, call, dtype):
    """(fused result of the second call, the original's result, float64 reference) for ``call(module)``; the first
    call with the ops installed is each site's checked one (a site called twice in a forward runs fused the second
    time), so the second call is the one compared."""
    module = module.to(dtype).eval()
    reference_module = copy.deepcopy(module).double()
    with torch.no_grad():
        original = call(module, dtype)
        reference = call(reference_module, torch.float64)
        with npu_port.fuse_ops(module, ops=op) as handle:
            call(module, dtype)
            fused = call(module, dtype)
            assert handle.sites and all(s.state == "checked" and s.fused_calls >= 2 for s in handle.sites), (
                handle.explain()
            )
    return fused, original, reference


# ---------------------------------------------------------------------------------------------------------------
# rms_norm


@pytest.mark.parametrize(
    "weight_dtype, input_dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)]
)
def test_diffusers_rms_norm_casts_like_diffusers_does_with_mixed_dtypes(npu, weight_dtype, input_dtype):
    """Half weight: the input goes to the weight's dtype (diffusers' NPU path); float32 weight with a half input gives
    float32, as diffusers' torch path does."""
    norm = RMSNorm(16, eps=1e-6).to(weight_dtype)
    x = _x(2, 5, 16, dtype=input_dtype)
    with torch.no_grad(), npu_port.fuse_ops(norm, ops=["rms_norm"]) as handle:
        norm(x)
        fused = norm(x)
    original = RMSNorm.forward(norm, x)
    assert handle.sites[0].state == "checked" and fused.dtype == original.dtype == weight_dtype
    reference = RMSNorm.forward(copy.deepcopy(norm).double(), x.double())
    assert_as_close_as_the_original(fused, original, reference, weight_dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["diffusers", "torch"])
def test_rms_norm_matches_the_layer_it_replaces(npu, kind, dtype):
    norm = RMSNorm(32, eps=1e-6, bias=True) if kind == "diffusers" else nn.RMSNorm(32, eps=None)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.2, 2.0, 32))
        if kind == "diffusers":
            norm.bias.copy_(torch.linspace(-1, 1, 32))
    x = _x(2, 7, 32, seed=1) * 3

    def call(module, dt):
        return module(x.to(dt))

    assert_as_close_as_the_original(*fused_then_original(norm, ["rms_norm"], call, dtype), dtype)


# ---------------------------------------------------------------------------------------------------------------
# rope: diffusers' shared apply_rotary_emb, both pairings, both sequence dims


def _tables(s, d, dtype=torch.float64):
    """cos / sin of the S x D/2 angles (each pair's; :func:`_paired` lays them out as (S, D) for a pairing)."""
    angles = torch.arange(s, dtype=torch.float64)[:, None] * torch.linspace(0.1, 2.0, d // 2, dtype=torch.float64)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _paired(table, unbind_dim):
    return table.repeat_interleave(2, dim=-1) if unbind_dim == -1 else torch.cat([table, table], dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_shared_rotary_function_is_fused_in_the_mode_each_call_asks_for(npu, dtype):
    """Installed through a Flux attention module; then every form of call diffusers' function takes."""
    original = embeddings.apply_rotary_emb
    spy = []
    rotary_mul = npu.npu_rotary_mul
    npu.npu_rotary_mul = lambda *a, **k: spy.append(k["rotary_mode"]) or rotary_mul(*a, **k)
    with npu_port.fuse_ops(FluxAttention(32, heads=2, dim_head=16), ops=["rope"]) as handle:
        fused_function = embeddings.apply_rotary_emb
        for unbind_dim, sequence_dim, (b, n, s, d) in itertools.product(
            (-1, -2), (1, 2), [(1, 2, 5, 16), (2, 3, 4, 8), (1, 1, 1, 2)]
        ):
            cos, sin = (_paired(t, unbind_dim) for t in _tables(s, d))
            shape = (b, n, s, d) if sequence_dim == 2 else (b, s, n, d)
            x = _x(*shape, dtype=dtype, seed=s * 10 + d)
            spy.clear()
            kwargs = dict(use_real_unbind_dim=unbind_dim, sequence_dim=sequence_dim)
            fused_function(x, (cos.float(), sin.float()), **kwargs)  # the site's first call is the checked one
            fused = fused_function(x, (cos.float(), sin.float()), **kwargs)
            unfused = original(x, (cos.float(), sin.float()), **kwargs)
            reference = original(x.double(), (cos, sin), **kwargs)
            assert spy[-1] == {-1: "interleave", -2: "half"}[unbind_dim]
            assert_as_close_as_the_original(fused, unfused, reference, dtype)
        (site,) = handle.sites
        assert site.state == "checked" and not site.fallbacks
    npu.npu_rotary_mul = rotary_mul


def test_calls_the_rotary_op_cannot_take_run_the_original_exactly(npu):
    original = embeddings.apply_rotary_emb
    with npu_port.fuse_ops(FluxAttention(32, heads=2, dim_head=16), ops=["rope"]) as handle:
        x3 = _x(2, 5, 16)
        cos, sin = (_paired(t, -1).float() for t in _tables(5, 16))
        x_big_heads = _x(1, 5, 1000, 16)  # interleave: B * N = 1000 is over the limit
        complex_freqs = torch.polar(torch.ones(1, 5, 8), torch.rand(1, 5, 8))
        calls = [
            ((_x(1, 2, 5, 16, dtype=torch.float64), (cos.double(), sin.double())), {}),
            ((x_big_heads, (cos, sin)), {"sequence_dim": 1}),
            ((_x(1, 5, 2, 16), complex_freqs), {"use_real": False}),  # Lumina's form: (B, S, H, D)
            ((_x(1, 5, 2, 16), (cos[:1], sin[:1])), {"sequence_dim": 1}),  # (1, D) tables: broadcast, not (S, D)
        ]
        for args, kwargs in calls:
            assert torch.equal(embeddings.apply_rotary_emb(*args, **kwargs), original(*args, **kwargs))
        with pytest.raises(RuntimeError) as theirs:  # 3-D: the original fails on it, and so does the call
            original(x3, (cos, sin))
        with pytest.raises(RuntimeError, match=re.escape(str(theirs.value))):
            embeddings.apply_rotary_emb(x3, (cos, sin))
        (site,) = handle.sites
        assert site.state == "installed" and site.fused_calls == 0
        assert set(site.fallbacks) == {
            "input dtype float64: the op takes float16, bfloat16 or float32",
            "B*N = 1000: interleave mode needs B * N < 1000",
            "use_real=False (complex frequencies): not an npu_rotary_mul form",
            "cos/sin of shape (1, 16), not (S, D) = (5, 16)",
            "3-D input: npu_rotary_mul takes 4-D",
        }


def test_cogvideox_rotates_bnsd_slices_in_interleave_mode(npu):
    """CogVideoX's processor imports apply_rotary_emb at call time and rotates query[:, :, text:] (B, H, S, D)."""
    attn = Attention(
        32, heads=2, dim_head=16, qk_norm="layer_norm", eps=1e-6, bias=True, processor=CogVideoXAttnProcessor2_0()
    )
    hidden, text = _x(2, 6, 32, seed=1), _x(2, 3, 32, seed=2)
    cos, sin = (_paired(t, -1).float() for t in _tables(6, 16))

    def call(module, dt):
        tables = (cos.to(dt), sin.to(dt)) if dt == torch.float64 else (cos, sin)
        return module(hidden.to(dt), text.to(dt), image_rotary_emb=tables)

    fused, original, reference = fused_then_original(attn, ["rope"], call, torch.float32)
    assert_as_close_as_the_original(fused, original, reference, torch.float32)


# ---------------------------------------------------------------------------------------------------------------
# whole tiny models


def _flux_inputs(dtype):
    return dict(
        hidden_states=_x(1, 16, 64, dtype=dtype, seed=1),
        encoder_hidden_states=_x(1, 8, 32, dtype=dtype, seed=2),
        pooled_projections=_x(1, 32, dtype=dtype, seed=3),
        timestep=torch.tensor([0.5], dtype=dtype),
        img_ids=torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0), indexing="ij"), -1)
        .reshape(16, 3)
        .to(dtype),
        txt_ids=torch.zeros(8, 3, dtype=dtype),
        return_dict=False,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiny_flux_with_rms_norm_rope_and_adaln_matches_the_original(npu, mindiesd, dtype):
    from npu_port.integrations.diffusers.tiny_flux import tiny_flux_transformer

    def call(module, dt):
        return module(**_flux_inputs(dt))[0]

    fused, original, reference = fused_then_original(
        tiny_flux_transformer(), ["rms_norm", "rope", "adaln"], call, dtype
    )
    assert_as_close_as_the_original(fused, original, reference, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiny_wan_with_rms_norm_and_its_own_rope_matches_the_original(npu, dtype):
    from npu_port.integrations.diffusers.tiny_wan import tiny_wan_transformer

    model = tiny_wan_transformer()

    def call(module, dt):
        return module(
            hidden_states=_x(1, 16, 2, 8, 8, dtype=dt, seed=1),
            timestep=torch.tensor([500]),
            encoder_hidden_states=_x(1, 8, 32, dtype=dt, seed=2),
            return_dict=False,
        )[0]

    with npu_port.fuse_ops(model, ops=["rope"]) as handle:  # what was found: self-attention only, per block
        assert [s.where for s in handle.sites] == ["blocks.0.attn1", "blocks.1.attn1"]
        assert "rope: 2 attention modules: Wan: interleave (transformer_wan.py)" in handle.notes
    fused, original, reference = fused_then_original(model, ["rms_norm", "rope"], call, dtype)
    assert_as_close_as_the_original(fused, original, reference, dtype)


def test_wan_rope_is_exact_even_for_tables_whose_pairs_differ(npu):
    """Wan uses cos[..., 0::2] and sin[..., 1::2] only; the fused tables are built from exactly those."""
    from diffusers.models.transformers.transformer_wan import WanAttention, WanAttnProcessor

    attn = WanAttention(dim=32, heads=2, dim_head=16, processor=WanAttnProcessor())
    hidden = _x(1, 6, 32, seed=4)
    cos, sin = (_x(1, 6, 1, 16, seed=s).tanh() for s in (5, 6))  # pairs not repeated: not Wan's own tables

    def call(module, dt):
        return module(hidden.to(dt), None, None, (cos.to(dt), sin.to(dt)))

    fused, original, reference = fused_then_original(attn, ["rope"], call, torch.float32)
    assert_as_close_as_the_original(fused, original, reference, torch.float32)


def test_tiny_hunyuan_video_rope_reaches_the_function_it_imports_at_call_time(npu):
    from diffusers import HunyuanVideoTransformer3DModel

    torch.manual_seed(0)
    model = HunyuanVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=16,
        num_layers=1,
        num_single_layers=1,
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=32,
        pooled_projection_dim=16,
        rope_axes_dim=(4, 6, 6),
    )

    def call(module, dt):
        return module(
            hidden_states=_x(1, 4, 2, 4, 4, dtype=dt, seed=1),
            timestep=torch.tensor([500]),
            encoder_hidden_states=_x(1, 6, 32, dtype=dt, seed=2),
            encoder_attention_mask=torch.ones(1, 6),
            pooled_projections=_x(1, 16, dtype=dt, seed=3),
            guidance=torch.tensor([3.0]),
            return_dict=False,
        )[0]

    with npu_port.fuse_ops(model, ops=["rope"]) as handle:
        assert handle.notes[0] == (
            "rope: 2 attention modules: HunyuanVideo: interleave (transformer_hunyuan_video.py, -1, sequence_dim=1)"
        )
    fused, original, reference = fused_then_original(model, ["rope"], call, torch.float32)
    assert_as_close_as_the_original(fused, original, reference, torch.float32)


def test_ltx_rope_is_reported_not_fused(npu):
    from diffusers import LTXVideoTransformer3DModel

    model = LTXVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
        num_layers=1, caption_channels=16,
    )  # fmt: skip
    with pytest.warns(npu_port.fuse.check.FuseWarning), npu_port.fuse_ops(model, ops=["rope"]) as handle:
        pass
    ((refusal,),) = [handle.refused]
    assert refusal.where == "transformer_blocks.0.attn1 and 1 more (LTXVideoAttnProcessor)"
    assert refusal.reason.code == "rope-form" and str(refusal.reason).startswith("LTX's RoPE rotates (batch, seq")
    assert handle.sites == []


# ---------------------------------------------------------------------------------------------------------------
# GEGLU: exact on NPU, or tanh when asked


@pytest.fixture
def diffusers_npu_branch(npu, monkeypatch):
    """diffusers' GEGLU takes its NPU branch (npu_geglu, approximate=1), as it does wherever torch_npu is installed."""
    monkeypatch.setattr(activations, "is_torch_npu_available", lambda: True)
    monkeypatch.setattr(activations, "torch_npu", npu, raising=False)
    return npu


def _geglu_block(seed=0):
    torch.manual_seed(seed)
    return BasicTransformerBlock(32, num_attention_heads=2, attention_head_dim=16, activation_fn="geglu")


def _block_reference(block, x, approximate):
    """The block in float64 with GEGLU computing GELU as ``approximate`` says (our own formula, not the op)."""
    reference = copy.deepcopy(block).double()
    for module in reference.modules():
        if isinstance(module, activations.GEGLU):

            def forward(hidden_states, *args, _m=module, **kwargs):
                value, gate = _m.proj(hidden_states).chunk(2, dim=-1)
                return value * F.gelu(gate, approximate=approximate)

            module.forward = forward
    with torch.no_grad():
        return reference(x.double())


def test_geglu_exact_removes_the_tanh_difference_diffusers_has_on_npu(diffusers_npu_branch):
    block = _geglu_block()
    x = _x(2, 6, 32, seed=7) * 4
    exact = _block_reference(block, x, "none")
    with torch.no_grad():
        on_npu = block(x)  # diffusers' NPU branch: tanh GELU
        with npu_port.fuse_ops(block, ops=["geglu_exact"]) as handle:
            block(x)
            fused = block(x)
        assert handle.sites[0].how == "torch_npu.npu_geglu(approximate=0)" and handle.sites[0].state == "checked"
    scale = float(exact.abs().max())
    assert float((on_npu.double() - exact).abs().max()) > 1e-6 * scale  # the silent difference: 16x float32 noise
    assert float((fused.double() - exact).abs().max()) <= 4 * torch.finfo(torch.float32).eps * scale


def test_geglu_tanh_is_the_tanh_form_and_says_it_changes_numbers(npu):
    block = _geglu_block()
    x = _x(2, 6, 32, seed=8) * 4
    tanh, exact = _block_reference(block, x, "tanh"), _block_reference(block, x, "none")
    with torch.no_grad(), npu_port.fuse_ops(block, ops=["geglu_tanh"]) as handle:
        block(x)
        fused = block(x)
    assert handle.sites[0].state == "checked"
    assert any(note.startswith("geglu_tanh: GEGLU uses tanh-approximate GELU") for note in handle.notes)
    scale = float(tanh.abs().max())
    assert float((fused.double() - tanh).abs().max()) <= 4 * torch.finfo(torch.float32).eps * scale
    assert float((fused.double() - exact).abs().max()) > 1e-6 * scale


def test_geglu_exact_changes_nothing_where_diffusers_already_computes_erf(npu):
    block = _geglu_block()
    with npu_port.fuse_ops(block, ops=["geglu_exact"]) as handle:
        assert handle.sites == [] and handle.refused == []
        assert handle.notes == [
            "geglu_exact: diffusers' GEGLU already computes exact GELU here (its torch_npu branch is off: "
            "diffusers.utils.is_torch_npu_available() is False); nothing patched"
        ]


def test_the_largest_gap_between_tanh_and_erf_gelu_is_what_the_docs_say():
    x = torch.linspace(-10, 10, 200_001, dtype=torch.float64)
    gap = (F.gelu(x) - F.gelu(x, approximate="tanh")).abs()
    assert math.isclose(float(gap.max()), 4.7e-4, rel_tol=0.02) and abs(float(x[gap.argmax()]) + 2.70) < 0.01
    assert float((emu.npu_geglu(torch.tensor([[1.0, -2.7]]), approximate=0)[0]
                  - emu.npu_geglu(torch.tensor([[1.0, -2.7]]), approximate=1)[0]).abs()) > 4e-4  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# adaln through MindIE-SD


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["zero", "zero-single", "continuous", "zero-with-labels"])
def test_adaln_matches_diffusers_adaptive_norms(mindiesd, kind, dtype):
    torch.manual_seed(0)
    x, emb = _x(2, 5, 16, seed=1), _x(2, 16, seed=2)
    if kind == "zero":
        module = AdaLayerNormZero(16)
    elif kind == "zero-single":
        module = AdaLayerNormZeroSingle(16)
    elif kind == "continuous":
        module = AdaLayerNormContinuous(16, 16, elementwise_affine=True, eps=1e-6)
        with torch.no_grad():
            module.norm.weight.copy_(torch.linspace(0.5, 1.5, 16))
    else:
        module = AdaLayerNormZero(16, num_embeddings=10)  # the embedding inside (timestep + class label)

    def call(m, dt):
        if kind == "continuous":
            return m(x.to(dt), emb.to(dt))
        if kind == "zero-with-labels":
            return m(x.to(dt), timestep=torch.tensor([3, 7]), class_labels=torch.tensor([1, 2]), hidden_dtype=dt)
        return m(x.to(dt), emb=emb.to(dt))

    assert_as_close_as_the_original(*fused_then_original(module, ["adaln"], call, dtype), dtype)


def test_adaln_refuses_norms_that_are_not_layer_norm(mindiesd):
    model = nn.ModuleDict(
        {
            "rms": AdaLayerNormContinuous(16, 16, elementwise_affine=False, eps=1e-6, norm_type="rms_norm"),
            "fp32": AdaLayerNormZero(16, norm_type="fp32_layer_norm"),
            "ok": AdaLayerNormZeroSingle(16),
        }
    )
    with npu_port.fuse_ops(model, ops=["adaln"]) as handle:
        assert [s.where for s in handle.sites] == ["ok"]
        assert [(r.where, r.reason.code, str(r.reason)) for r in handle.refused] == [
            ("rms", "norm-type", "its norm is RMSNorm, not torch.nn.LayerNorm: layernorm_scale_shift computes LN"),
            (
                "fp32",
                "norm-type",
                "its norm is FP32LayerNorm, not torch.nn.LayerNorm: layernorm_scale_shift computes LN",
            ),
        ]
