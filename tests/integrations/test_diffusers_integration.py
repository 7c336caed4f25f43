"""The diffusers edge: ``apply_to_target`` routes every attention computation of real (tiny) diffusers models and
pipelines to npu-port kernels, keeps diffusers' own processor operations working, and restores bit-for-bit.

Models come from :mod:`tests.tiny_diffusers` (seeded, built from configs). "Baseline" is the same model before
anything was applied; float32 results must agree with it to a model-level tolerance, and after ``restore()`` they
must be *equal* (``torch.equal``) with the very same processor objects back.
"""

from __future__ import annotations

import copy
import functools
import inspect
import pickle
import subprocess
import sys
import threading

import diffusers
import pytest
import torch
from diffusers.models import attention_dispatch, attention_processor
from diffusers.models.attention_processor import (
    Attention,
    AttnProcessor,
    AttnProcessor2_0,
    AttnProcessorNPU,
    FusedAttnProcessor2_0,
    IPAdapterAttnProcessor2_0,
    JointAttnProcessor2_0,
    SlicedAttnProcessor,
    XFormersAttnProcessor,
)
from diffusers.models.transformers import transformer_flux
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_port
from npu_port._patching import PatchLeftInPlace
from npu_port.integrations.diffusers import (
    AppliedAttention,
    Route,
    RoutedAttnProcessor,
    active_route,
    apply_to_target,
    current_route,
    patches,
    tiny,
    watch,
)

from ..conftest import emulated_torch_npu, fake_flash_attn, fake_xformers

CPU_KERNELS = ["math", "sdpa", "chunked"]
#: attention modules per forward of each tiny model (the VAE forward runs its encoder's and decoder's mid-block)
ATTENTION_CALLS = {"unet": 8, "dit": 2, "sd3": 2, "flux": 2, "vae": 2}
#: how each tiny model's attention reaches the kernel
PATH = {"unet": "processor", "dit": "processor", "sd3": "sdpa", "flux": "dispatch", "vae": "processor"}
ACTION = {"unet": "replaced", "dit": "replaced", "sd3": "routed", "flux": "routed", "vae": "replaced"}
#: model outputs in float32 vs the unpatched model: kernels differ from SDPA by float32 rounding (~1e-6)
MODEL_ATOL, MODEL_RTOL = 2e-5, 1e-4


def kernel_fn(name: str):
    return functools.partial(npu_port.attention, kernel=name)


def assert_model_close(out: torch.Tensor, base: torch.Tensor, atol: float = MODEL_ATOL, rtol: float = MODEL_RTOL):
    assert out.shape == base.shape and not torch.isnan(out).any()
    torch.testing.assert_close(out, base, atol=atol, rtol=rtol)


def processors_of(model: torch.nn.Module) -> dict:
    return {name: m.processor for name, m in model.named_modules() if hasattr(m, "processor")}


def assert_same_processors(model: torch.nn.Module, saved: dict) -> None:
    now = processors_of(model)
    assert now.keys() == saved.keys()
    for name, proc in saved.items():
        assert now[name] is proc, f"{name}: processor not restored"


def assert_no_hooks(model: torch.nn.Module) -> None:
    for name, module in model.named_modules():
        assert not module._forward_pre_hooks and not module._forward_hooks, f"{name} still has hooks"


def assert_globals_original() -> None:
    assert patches.active_patches() == []
    assert attention_processor.F is torch.nn.functional
    assert transformer_flux.dispatch_attention_fn is attention_dispatch.dispatch_attention_fn


ORIGINAL_SET_PROCESSOR = Attention.set_processor


class Recorder:
    """An attention function that records each call's shapes and keyword arguments, then runs a kernel."""

    def __init__(self, kernel: str = "math"):
        self.kernel = kernel
        self.calls = []

    def __call__(
        self, query, key, value, attn_mask=None, *, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
    ):
        self.calls.append(
            dict(
                q=tuple(query.shape),
                k=tuple(key.shape),
                mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )
        )
        return npu_port.attention(
            query,
            key,
            value,
            attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
            kernel=self.kernel,
        )


@pytest.fixture(autouse=True)
def _no_leftover_patches():
    yield
    assert patches.active_patches() == [], "a test left module globals patched"
    assert watch.wrapped_classes() == [], "a test left set_processor wrapped"
    assert Attention.set_processor is ORIGINAL_SET_PROCESSOR
    assert current_route() is None


# ---- importing ------------------------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow
def test_importing_npu_port_and_the_integration_does_not_import_diffusers():
    code = (
        "import sys, npu_port, npu_port.integrations, npu_port.integrations.diffusers\n"
        "assert 'diffusers' not in sys.modules, sorted(m for m in sys.modules if m.startswith('diffusers'))\n"
        "print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# ---- every tiny model, every CPU kernel -------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", CPU_KERNELS)
@pytest.mark.parametrize("model_name", list(tiny.BUILDERS))
def test_each_model_routes_every_attention_call_and_restores_bit_for_bit(model_name, kernel):
    model = tiny.BUILDERS[model_name]()
    base = tiny.run_tiny(model)
    saved = processors_of(model)

    applied = apply_to_target(model, kernel_fn(kernel))
    assert isinstance(applied, AppliedAttention)
    assert {change.action for change in applied.modules} == {ACTION[model_name]}
    assert applied.counts()[ACTION[model_name]] == len(saved) == len(applied.modules)
    out = tiny.run_tiny(model)
    assert_model_close(out, base)
    assert applied.calls == {PATH[model_name]: ATTENTION_CALLS[model_name]}
    assert sum(applied.calls_by_module.values()) == ATTENTION_CALLS[model_name]

    tiny.run_tiny(model)
    assert applied.total_calls == 2 * ATTENTION_CALLS[model_name]

    applied.restore()
    assert torch.equal(tiny.run_tiny(model), base)
    assert_same_processors(model, saved)
    assert_no_hooks(model)
    assert_globals_original()
    applied.restore()  # idempotent
    assert torch.equal(tiny.run_tiny(model), base)


def test_the_summary_names_modules_original_processors_and_actions():
    unet = tiny.tiny_unet()
    with apply_to_target(unet, kernel_fn("math")) as applied:
        tiny.run_tiny(unet)
        names = [change.name for change in applied.modules]
        assert names == [name for name, m in unet.named_modules() if isinstance(m, Attention)]
        assert applied.modules[0] == (
            "down_blocks.0.attentions.0.transformer_blocks.0.attn1",
            "AttnProcessor2_0",
            "replaced",
        )
        assert applied.counts() == {"replaced": 8, "routed": 0, "linear": 0, "kept": 0, "custom": 0}
        text = applied.describe()
        assert text.splitlines()[0] == "UNet2DConditionModel: 8 diffusers attention modules (active)"
        assert "replaced: 8 (8 x AttnProcessor2_0)" in text
        assert "attention calls routed: 8 (processor 8)" in text
    assert applied.restored and "(restored)" in applied.describe()


# ---- stand-ins for Ascend, xformers and flash_attn ---------------------------------------------------------------

STAND_INS = {
    "npu_fusion": (emulated_torch_npu, "npu_fusion_attention"),
    "npu_fused_infer": (emulated_torch_npu, "npu_fused_infer_attention_score"),
    "xformers": (fake_xformers, "memory_efficient_attention"),
    "flash_attn": (fake_flash_attn, "flash_attn_func"),
}


@pytest.mark.parametrize("kernel", list(STAND_INS))
@pytest.mark.parametrize("model_name", list(tiny.BUILDERS))
def test_half_precision_models_through_the_device_kernels_are_as_accurate_as_diffusers_own_path(model_name, kernel):
    """fp16 models through the emulated Ascend ops / fake xformers / fake flash_attn: every attention call reaches the
    package's op, and the result is as close to the float32 model as diffusers' own float16 path is."""
    reference = tiny.run_tiny(tiny.BUILDERS[model_name]())  # float32, unpatched
    model = tiny.BUILDERS[model_name]().half()
    half_base = tiny.run_tiny(model).float()
    own_error = (half_base - reference).abs().max().item()
    install, op_name = STAND_INS[kernel]
    with install() as package:
        op_module = package
        original_op = getattr(op_module, op_name)
        op_calls = []

        def counting_op(*args, **kwargs):
            op_calls.append(1)
            return original_op(*args, **kwargs)

        setattr(op_module, op_name, counting_op)
        try:
            with apply_to_target(model, kernel_fn(kernel)) as applied:
                out = tiny.run_tiny(model).float()
        finally:
            setattr(op_module, op_name, original_op)
    assert applied.total_calls == ATTENTION_CALLS[model_name]
    assert len(op_calls) == ATTENTION_CALLS[model_name]
    routed_error = (out - reference).abs().max().item()
    assert routed_error <= 1.5 * own_error + 2e-3, (routed_error, own_error)
    assert torch.equal(tiny.run_tiny(model).float(), half_base)


# ---- masks -------------------------------------------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(
    batch=st.integers(1, 3),
    keep_bits=st.lists(st.booleans(), min_size=3 * tiny.TEXT_TOKENS, max_size=3 * tiny.TEXT_TOKENS),
    as_bool=st.booleans(),
    kernel=st.sampled_from(CPU_KERNELS),
)
def test_unet_cross_attention_with_text_padding_masks_matches_the_unpatched_unet(batch, keep_bits, as_bool, kernel):
    unet = _shared_unet()
    keep = torch.tensor(keep_bits[: batch * tiny.TEXT_TOKENS]).view(batch, tiny.TEXT_TOKENS)
    mask = keep if as_bool else keep.float()  # the UNet turns either into a (1 - m) * -10000 bias
    inputs = tiny.tiny_inputs(unet, batch_size=batch, seed=batch)
    with torch.no_grad():
        base = unet(**inputs, encoder_attention_mask=mask).sample
        recorder = Recorder(kernel)
        with apply_to_target(unet, recorder) as applied:
            out = unet(**inputs, encoder_attention_mask=mask).sample
    # a prompt whose tokens are all masked gets a -10000 bias on every score: float32 rounds logits near -10000 to
    # ~1e-3, differently in each kernel (and in SDPA), so those rows agree only to that precision
    all_masked = not bool(keep.any(dim=1).all())
    assert_model_close(out, base, *((2e-3, 2e-3) if all_masked else (MODEL_ATOL, MODEL_RTOL)))
    assert applied.calls == {"processor": 8}
    cross = [c for c in recorder.calls if c["mask"] is not None]
    assert len(cross) == 4  # the four attn2 modules get the mask, unchanged in form: additive, (B, heads, 1, S_text)
    for call in cross:
        assert call["mask"].dtype == torch.float32 and call["mask"].shape[::2] == (batch, 1)
        assert call["mask"].shape[-1] == tiny.TEXT_TOKENS and call["mask"].min() >= -10000.0
    assert all(c["dropout_p"] == 0.0 and c["is_causal"] is False and c["scale"] == 16**-0.5 for c in recorder.calls)


@functools.lru_cache(maxsize=None)
def _shared_unet():
    return tiny.tiny_unet()


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    q_len=st.integers(1, 9),
    kv_len=st.integers(1, 7),
    heads=st.integers(1, 3),
    dim_head=st.sampled_from([8, 16]),
    cross=st.booleans(),
    mask_kind=st.sampled_from([None, "bool", "additive", "-inf"]),
    scale_qk=st.booleans(),
    extras=st.booleans(),
    kernel=st.sampled_from(CPU_KERNELS),
    seed=st.integers(0, 2**16),
)
def test_any_attention_module_matches_the_processor_diffusers_gave_it(
    batch, q_len, kv_len, heads, dim_head, cross, mask_kind, scale_qk, extras, kernel, seed
):
    """An ``Attention`` with or without cross-attention, masks (bool, -10000 bias, -inf with fully masked rows),
    residual connection, rescaling, group / cross norms and q/k norms, against its default processor
    (``AttnProcessor2_0``, or the legacy ``AttnProcessor`` when ``scale_qk=False`` — whose ``attn.scale`` we honour)."""
    torch.manual_seed(seed)
    query_dim = heads * dim_head
    kwargs = dict(query_dim=query_dim, heads=heads, dim_head=dim_head, scale_qk=scale_qk, bias=True)
    if cross:
        kwargs["cross_attention_dim"] = 12
    if extras:
        kwargs.update(residual_connection=True, rescale_output_factor=2.0, norm_num_groups=heads)
        if cross:
            kwargs["cross_attention_norm"] = "layer_norm"
        if scale_qk:  # the legacy processor ignores q/k norms: only with AttnProcessor2_0
            kwargs["qk_norm"] = "layer_norm"
    attn = Attention(**kwargs).eval()
    assert type(attn.processor) is (AttnProcessor2_0 if scale_qk else AttnProcessor)
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, q_len, query_dim, generator=gen)
    encoder = torch.randn(batch, kv_len, 12, generator=gen) if cross else None
    keys = kv_len if cross else q_len
    mask = None
    if mask_kind is not None and (scale_qk or mask_kind == "additive"):  # baddbmm takes no bool mask
        keep = torch.rand(batch, 1, keys, generator=gen) > 0.3
        if mask_kind == "bool":
            mask = keep
        else:
            mask = torch.where(keep, 0.0, -10000.0 if mask_kind == "additive" else float("-inf"))
    with torch.no_grad():
        base = attn(hidden, encoder, attention_mask=mask)
        with apply_to_target(attn, kernel_fn(kernel)) as applied:
            out = attn(hidden, encoder, attention_mask=mask)
    assert applied.calls == {"processor": 1}
    assert_model_close(out, base)


def test_legacy_processor_scale_is_honoured_where_attn_processor_2_0_drops_it():
    torch.manual_seed(0)
    attn = Attention(query_dim=32, heads=2, dim_head=16, scale_qk=False).eval()  # attn.scale == 1.0
    hidden = torch.randn(2, 6, 32)
    with torch.no_grad():
        legacy = attn(hidden)  # AttnProcessor: scale 1.0
        attn.set_processor(AttnProcessor2_0())
        dropped = attn(hidden)  # 1/sqrt(16): diffusers' "TODO: add support for attn.scale"
        assert (legacy - dropped).abs().max() > 1e-2
        with apply_to_target(attn, kernel_fn("math")):
            ours = attn(hidden)
    assert_model_close(ours, legacy)


# ---- the standard processors that break off their device --------------------------------------------------------


def test_xformers_processor_that_cannot_run_here_is_replaced_and_then_runs():
    vae = tiny.tiny_vae()
    base = tiny.run_tiny(vae)
    xformers_processors = {name: XFormersAttnProcessor() for name in vae.attn_processors}
    vae.set_attn_processor(dict(xformers_processors))
    with pytest.raises(AttributeError):  # diffusers' module-level `xformers` is None without the package
        tiny.run_tiny(vae)
    with apply_to_target(vae, kernel_fn("sdpa")) as applied:
        assert [c.original for c in applied.modules] == ["XFormersAttnProcessor"] * 2
        assert_model_close(tiny.run_tiny(vae), base)
        assert all(p.__class__ is AttnProcessor2_0 for p in vae.attn_processors.values())
    assert all(vae.attn_processors[name] is proc for name, proc in xformers_processors.items())


def test_npu_processor_with_its_fp32_mask_polarity_bug_is_replaced_by_a_correct_one():
    unet = tiny.tiny_unet()
    inputs = tiny.tiny_inputs(unet)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1]])
    with torch.no_grad():
        base = unet(**inputs, encoder_attention_mask=mask).sample
        unet.set_attn_processor(AttnProcessorNPU.__new__(AttnProcessorNPU))  # its __init__ insists on torch_npu
        buggy = unet(**inputs, encoder_attention_mask=mask).sample  # fp32 path: inverted mask fed to SDPA
        assert (buggy - base).abs().max() > 1e-3
        with apply_to_target(unet, kernel_fn("math")):
            fixed = unet(**inputs, encoder_attention_mask=mask).sample
    assert_model_close(fixed, base)


# ---- diffusers' own processor operations on a model with a strategy applied ----------------------------------------


def test_attn_processors_and_set_attn_processor_round_trip():
    unet = tiny.tiny_unet()
    base = tiny.run_tiny(unet)
    with apply_to_target(unet, kernel_fn("chunked")) as applied:
        ours = unet.attn_processors
        assert all(type(p) is RoutedAttnProcessor and p.__class__ is AttnProcessor2_0 for p in ours.values())
        assert all(isinstance(p, AttnProcessor2_0) and isinstance(p, RoutedAttnProcessor) for p in ours.values())
        unet.set_attn_processor(AttnProcessor2_0())  # a plain processor is still routed, through SDPA
        assert_model_close(tiny.run_tiny(unet), base)
        assert applied.calls == {"sdpa": 8}
        unet.set_attn_processor(dict(ours))
        assert all(unet.attn_processors[name] is proc for name, proc in ours.items())
        assert_model_close(tiny.run_tiny(unet), base)
        assert applied.calls == {"sdpa": 8, "processor": 8}
    assert torch.equal(tiny.run_tiny(unet), base)


def test_set_default_attn_processor_passes_diffusers_exact_class_check():
    unet = tiny.tiny_unet()
    base = tiny.run_tiny(unet)
    saved = unet.attn_processors
    applied = apply_to_target(unet, kernel_fn("math"))
    unet.set_default_attn_processor()  # `proc.__class__ in CROSS_ATTENTION_PROCESSORS` for every processor
    assert all(type(p) is AttnProcessor for p in unet.attn_processors.values())
    assert_model_close(tiny.run_tiny(unet), base)
    applied.restore()  # the user's newer choice stays; our hooks and patches go
    assert all(type(p) is AttnProcessor for p in unet.attn_processors.values())
    assert len(applied.left_alone) == 8
    assert_no_hooks(unet)
    unet.set_attn_processor(dict(saved))
    assert torch.equal(tiny.run_tiny(unet), base)


def test_a_model_on_the_legacy_processor_is_stood_in_for_as_legacy():
    vae = tiny.tiny_vae()
    vae.set_default_attn_processor()  # AttnProcessor: baddbmm scores, upcast flags, attn.scale
    legacy = processors_of(vae)
    base = tiny.run_tiny(vae)
    with apply_to_target(vae, kernel_fn("chunked")) as applied:
        assert {(c.original, c.action) for c in applied.modules} == {("AttnProcessor", "replaced")}
        assert all(p.__class__ is AttnProcessor for p in vae.attn_processors.values())
        assert_model_close(tiny.run_tiny(vae), base)
    assert_same_processors(vae, legacy)
    assert torch.equal(tiny.run_tiny(vae), base)


def test_attention_slicing_keeps_working():
    unet = tiny.tiny_unet()
    base = tiny.run_tiny(unet)
    with apply_to_target(unet, kernel_fn("math")) as applied:
        unet.set_attention_slice(1)
        assert all(type(p) is SlicedAttnProcessor for p in unet.attn_processors.values())
        assert_model_close(tiny.run_tiny(unet), base)
        # diffusers' sliced attention is baddbmm: routed in place, one slice (here one batch*heads row) per call
        assert applied.calls == {"scores": sum(2 * m.heads for m in unet.modules() if isinstance(m, Attention))}


def test_replaced_processors_need_no_hooks_or_patches_until_a_foreign_processor_is_set():
    unet = tiny.tiny_unet()
    base = tiny.run_tiny(unet)
    with apply_to_target(unet, kernel_fn("chunked")) as applied:
        assert_no_hooks(unet)  # our processors route their own core: no per-call hook cost
        assert_globals_original()  # and nothing outside the model changes
        assert watch.wrapped_classes() == ["diffusers.models.attention_processor.Attention"]
        assert Attention.set_processor is not ORIGINAL_SET_PROCESSOR
        unet.fuse_qkv_projections()  # diffusers sets FusedAttnProcessor2_0 everywhere: now hooks and patches
        attention = [m for m in unet.modules() if isinstance(m, Attention)]
        assert all(len(m._forward_pre_hooks) == 1 and len(m._forward_hooks) == 1 for m in attention)
        assert attention_processor.F is not torch.nn.functional
        assert_model_close(tiny.run_tiny(unet), base)
        assert applied.calls == {"sdpa": 8}
        unet.unfuse_qkv_projections()  # ours come back, and the hooks go again
        assert_no_hooks(unet)
        assert_model_close(tiny.run_tiny(unet), base)
        assert applied.calls == {"sdpa": 8, "processor": 8}
    assert_globals_original()
    assert torch.equal(tiny.run_tiny(unet), base)


def test_watch_stops_once_and_leaves_a_later_wrapper_in_place():
    attn = Attention(query_dim=16, heads=2, dim_head=8)
    seen = []
    stop = watch.watch(attn, lambda module: seen.append(type(module.processor).__name__))
    attn.set_processor(AttnProcessor())
    assert seen == ["AttnProcessor"]
    theirs = Attention.set_processor  # someone wraps it after us: theirs stays when we stop
    Attention.set_processor = lambda self, processor: ORIGINAL_SET_PROCESSOR(self, processor)
    try:
        with pytest.warns(PatchLeftInPlace, match=r"Attention\.set_processor was replaced by someone else"):
            stop()
        stop()  # idempotent
        assert watch.wrapped_classes() == []
        assert Attention.set_processor is not theirs and Attention.set_processor is not ORIGINAL_SET_PROCESSOR
    finally:
        Attention.set_processor = ORIGINAL_SET_PROCESSOR
    attn.set_processor(AttnProcessor2_0())
    assert seen == ["AttnProcessor"]


def test_fuse_and_unfuse_qkv_projections():
    unet = tiny.tiny_unet()
    base = tiny.run_tiny(unet)
    saved = processors_of(unet)
    with apply_to_target(unet, kernel_fn("chunked")) as applied:
        ours = unet.attn_processors
        unet.fuse_qkv_projections()
        assert all(type(p) is FusedAttnProcessor2_0 for p in unet.attn_processors.values())
        assert_model_close(tiny.run_tiny(unet), base)
        assert applied.calls == {"sdpa": 8}
        unet.unfuse_qkv_projections()
        assert all(unet.attn_processors[name] is proc for name, proc in ours.items())
        assert_model_close(tiny.run_tiny(unet), base)
    assert_same_processors(unet, saved)

    # applied to an already fused model: the fused processors are stood in for, fused projections and all
    unet.fuse_qkv_projections()
    fused = processors_of(unet)
    fused_base = tiny.run_tiny(unet)
    with apply_to_target(unet, kernel_fn("math")) as applied:
        assert {(c.original, c.action) for c in applied.modules} == {("FusedAttnProcessor2_0", "replaced")}
        assert all(p.fused and p.__class__ is FusedAttnProcessor2_0 for p in unet.attn_processors.values())
        assert_model_close(tiny.run_tiny(unet), fused_base)
    assert_same_processors(unet, fused)
    assert torch.equal(tiny.run_tiny(unet), fused_base)


def test_save_pretrained_and_from_pretrained(tmp_path):
    unet = tiny.tiny_unet()
    base = tiny.run_tiny(unet)
    keys = set(unet.state_dict())
    with apply_to_target(unet, kernel_fn("sdpa")):
        assert set(unet.state_dict()) == keys
        unet.save_pretrained(tmp_path / "unet")
    loaded = diffusers.UNet2DConditionModel.from_pretrained(tmp_path / "unet").eval()
    assert torch.equal(tiny.run_tiny(loaded), base)
    with apply_to_target(loaded, kernel_fn("chunked")):
        assert_model_close(tiny.run_tiny(loaded), base)


@pytest.mark.parametrize("kernel", CPU_KERNELS)
@pytest.mark.parametrize("model_name", ["unet", "sd3", "flux"])
def test_training_gradients_match(model_name, kernel):
    def grads(model):
        model.zero_grad()
        out = tiny.output_of(model(**tiny.tiny_inputs(model)))
        (out.square().mean()).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    model = tiny.BUILDERS[model_name]().train()
    base = grads(model)
    with apply_to_target(model, kernel_fn(kernel)) as applied:
        routed = grads(model)
    assert applied.total_calls == ATTENTION_CALLS[model_name]
    assert routed.keys() == base.keys()
    for name in base:
        torch.testing.assert_close(routed[name], base[name], atol=1e-5, rtol=1e-3, msg=name)


@pytest.mark.parametrize("model_name", ["unet", "sd3", "flux"])
def test_gradient_checkpointing_recomputes_through_the_route(model_name):
    def grads(model):
        model.zero_grad()
        tiny.output_of(model(**tiny.tiny_inputs(model))).square().mean().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    model = tiny.BUILDERS[model_name]().train()
    model.enable_gradient_checkpointing()
    base = grads(model)
    with apply_to_target(model, kernel_fn("chunked")) as applied:
        routed = grads(model)
    assert applied.total_calls == 2 * ATTENTION_CALLS[model_name]  # forward, then the recomputation in backward
    for name in base:
        torch.testing.assert_close(routed[name], base[name], atol=1e-5, rtol=1e-3, msg=name)


def test_lora_adapters_are_routed_and_restored():
    from peft import LoraConfig  # a dev dependency: diffusers' LoRA loading needs it

    unet = tiny.tiny_unet()
    unet.add_adapter(LoraConfig(r=2, lora_alpha=2, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    base = tiny.run_tiny(unet)
    with apply_to_target(unet, kernel_fn("math")) as applied:
        assert_model_close(tiny.run_tiny(unet), base)
        assert applied.total_calls == 8
    assert torch.equal(tiny.run_tiny(unet), base)


def _ip_adapter_state_dict(unet, seed=0, image_dim=8):
    gen = torch.Generator().manual_seed(seed)
    cross = unet.config.cross_attention_dim
    ip, key_id = {}, 1
    for name in unet.attn_processors:
        if name.endswith("attn1.processor"):
            continue
        if name.startswith("mid_block"):
            hidden = unet.config.block_out_channels[-1]
        elif name.startswith("up_blocks"):
            hidden = list(reversed(unet.config.block_out_channels))[int(name[len("up_blocks.")])]
        else:
            hidden = unet.config.block_out_channels[int(name[len("down_blocks.")])]
        ip[f"{key_id}.to_k_ip.weight"] = torch.randn(hidden, cross, generator=gen) / 4
        ip[f"{key_id}.to_v_ip.weight"] = torch.randn(hidden, cross, generator=gen) / 4
        key_id += 2
    proj = {
        "proj.weight": torch.randn(4 * cross, image_dim, generator=gen) / 3,
        "proj.bias": torch.zeros(4 * cross),
        "norm.weight": torch.ones(cross),
        "norm.bias": torch.zeros(cross),
    }
    return {"image_proj": proj, "ip_adapter": ip}


def test_ip_adapter_loaded_after_applying_is_routed_and_matches():
    """diffusers builds the self-attention processors as ``attn_processors[name].__class__()``: ours reports
    AttnProcessor2_0, so that is what gets built (our class would need an attention function), and the IP-Adapter
    processors it installs (weights and all) are kept and routed through SDPA."""
    image_embeds = [torch.randn(2, 1, 8, generator=torch.Generator().manual_seed(1))]  # (B, images, dim)

    def run(unet):
        with torch.no_grad():
            return unet(**tiny.tiny_inputs(unet), added_cond_kwargs={"image_embeds": image_embeds}).sample

    plain = tiny.tiny_unet()
    plain._load_ip_adapter_weights([_ip_adapter_state_dict(plain)], low_cpu_mem_usage=False)
    base = run(plain)

    unet = tiny.tiny_unet()
    applied = apply_to_target(unet, kernel_fn("math"))
    unet._load_ip_adapter_weights([_ip_adapter_state_dict(unet)], low_cpu_mem_usage=False)
    kinds = {type(p) for p in unet.attn_processors.values()}
    assert kinds == {AttnProcessor2_0, IPAdapterAttnProcessor2_0}
    assert_model_close(run(unet), base)
    assert applied.calls == {"sdpa": 8 + 4}  # every attention plus the image attention of the 4 attn2 modules
    applied.restore()
    assert {type(p) for p in unet.attn_processors.values()} == kinds  # loaded later: left in place
    assert torch.equal(run(unet), base)

    # and applied to a model that already has IP-Adapter processors: they are kept (weights untouched) and routed
    state = {k: v.clone() for k, v in unet.state_dict().items()}
    with apply_to_target(unet, kernel_fn("chunked")) as applied:
        assert {(c.original, c.action) for c in applied.modules} == {
            ("AttnProcessor2_0", "replaced"),
            ("IPAdapterAttnProcessor2_0", "routed"),
        }
        assert_model_close(run(unet), base)
        assert applied.calls == {"processor": 4, "sdpa": 4 + 4}
    assert all(torch.equal(v, state[k]) for k, v in unet.state_dict().items())


class _RouterWithALock(Recorder):
    """Like a strategy router: state that cannot be deep-copied or pickled."""

    def __init__(self):
        super().__init__("math")
        self.lock = threading.Lock()


def test_deepcopy_and_pickle_keep_our_processor_class():
    unet = tiny.tiny_unet()
    base = tiny.run_tiny(unet)
    router = _RouterWithALock()
    with apply_to_target(unet, router) as applied:
        twin = copy.deepcopy(unet)  # EMA copies and the like: the router is shared, not copied
        assert all(type(p) is RoutedAttnProcessor and p.attention_fn is router for p in twin.attn_processors.values())
        assert_model_close(tiny.run_tiny(twin), base)
        assert applied.total_calls == 8  # counted where the original's calls are
    assert_model_close(tiny.run_tiny(twin), base)  # the copy's processors keep routing; its copied hooks are inert
    proc = RoutedAttnProcessor(kernel_fn("chunked"), AttnProcessor)
    clone = pickle.loads(pickle.dumps(proc))
    assert type(clone) is RoutedAttnProcessor and clone.__class__ is AttnProcessor
    assert clone.attention_fn.keywords == {"kernel": "chunked"}


def test_processor_signature_is_attn_processor_2_0s_so_cross_attention_kwargs_filter_the_same():
    ours = inspect.signature(RoutedAttnProcessor(kernel_fn("math")).__call__).parameters
    theirs = inspect.signature(AttnProcessor2_0().__call__).parameters
    assert list(ours) == list(theirs)
    attn = Attention(query_dim=16, heads=2, dim_head=8).eval()
    hidden = torch.randn(1, 3, 16)
    with torch.no_grad():
        base = attn(hidden, unknown_option=1)  # dropped by Attention.forward, with a warning
        with apply_to_target(attn, kernel_fn("math")):
            assert_model_close(attn(hidden, unknown_option=1), base)


# ---- specialised processors: kept, their attention core routed ---------------------------------------------------


def test_flux_processors_pinned_to_an_unavailable_backend_are_routed_anyway():
    flux = tiny.tiny_flux_transformer()
    base = tiny.run_tiny(flux)
    saved = processors_of(flux)
    for module in flux.modules():
        if hasattr(module, "set_attention_backend") and hasattr(module, "processor"):
            module.set_attention_backend("flash")  # flash_attn is not installed here
    with pytest.raises(TypeError, match="'NoneType' object is not callable"):  # diffusers' flash backend, no flash_attn
        tiny.run_tiny(flux)
    with apply_to_target(flux, kernel_fn("chunked")) as applied:
        assert_model_close(tiny.run_tiny(flux), base)
        assert applied.calls == {"dispatch": 2}
    assert_same_processors(flux, saved)
    assert all(p._attention_backend.value == "flash" for p in saved.values())  # the pin is the user's: kept
    for proc in saved.values():
        proc._attention_backend = None
    assert torch.equal(tiny.run_tiny(flux), base)


def test_sd3_joint_attention_processor_is_kept_and_its_sdpa_call_routed():
    sd3 = tiny.tiny_sd3_transformer()
    base = tiny.run_tiny(sd3)
    recorder = Recorder("sdpa")
    with apply_to_target(sd3, recorder) as applied:
        assert all(type(p) is JointAttnProcessor2_0 for p in processors_of(sd3).values())
        assert attention_processor.F is not torch.nn.functional
        assert_model_close(tiny.run_tiny(sd3), base)
    # joint attention over image patches (16) and text tokens (5) in one call per block, (B, H, S, D)
    assert [c["q"] for c in recorder.calls] == [(2, 2, 16 + tiny.TEXT_TOKENS, 16)] * 2
    assert applied.calls == {"sdpa": 2}


@pytest.mark.diffusers_min("0.37")  # diffusers' native backend widens a 2-D mask from 0.37 on (before: an error)
def test_dispatcher_router_permutes_layouts_and_widens_2d_masks_like_diffusers_native_backend():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 3, 8, generator=gen) for _ in range(3))  # (B, S, H, D)
    mask = torch.tensor([[True, True, False, True, True], [True, False, False, True, True]])
    original = attention_dispatch.dispatch_attention_fn
    flux = tiny.tiny_flux_transformer()  # held: a model that is freed takes its routing (and these patches) with it
    applied = apply_to_target(flux, kernel_fn("math"))
    try:
        routed = transformer_flux.dispatch_attention_fn
        assert routed is not original and routed.__wrapped__ is original
        expected = original(q, k, v, attn_mask=mask)
        assert torch.equal(routed(q, k, v, attn_mask=mask), expected)  # no active route: the original itself
        route = Route(kernel_fn("math"), "by hand")
        with active_route(route):
            got = routed(q, k, v, attn_mask=mask)
            kept = routed(q, k, v, attention_kwargs={"window_size": (1, 1)})
            assert torch.equal(kept, original(q, k, v))  # diffusers' backend ran it
        assert_model_close(got, expected)
        assert route.tally.calls == {"dispatch": 1}
        assert list(route.tally.declined.values()) == [1]
        assert "attention_kwargs ['window_size']" in next(iter(route.tally.declined))
    finally:
        applied.restore()


def test_attention_function_that_calls_the_patched_sdpa_itself_does_not_recurse():
    sd3 = tiny.tiny_sd3_transformer()
    base = tiny.run_tiny(sd3)
    inner = []

    def via_diffusers_f(query, key, value, attn_mask=None, **kwargs):
        inner.append(current_route())
        return attention_processor.F.scaled_dot_product_attention(query, key, value, attn_mask, **kwargs)

    with apply_to_target(sd3, via_diffusers_f) as applied:
        assert torch.equal(tiny.run_tiny(sd3), base)
    assert applied.total_calls == 2 and inner == [None, None]


def test_other_models_are_untouched_while_one_is_targeted():
    targeted, other = tiny.tiny_sd3_transformer(0), tiny.tiny_sd3_transformer(1)
    flux_other = tiny.tiny_flux_transformer(1)
    other_base, flux_base = tiny.run_tiny(other), tiny.run_tiny(flux_other)
    spy = Recorder("math")
    with apply_to_target(targeted, spy) as applied:
        with apply_to_target(tiny.tiny_flux_transformer(0), spy):
            assert torch.equal(tiny.run_tiny(other), other_base)
            assert torch.equal(tiny.run_tiny(flux_other), flux_base)
            assert spy.calls == [] and applied.total_calls == 0
            tiny.run_tiny(targeted)
            assert applied.total_calls == 2
    assert_globals_original()


def test_patches_are_shared_and_undone_by_the_last_restore():
    a, b = tiny.tiny_sd3_transformer(0), tiny.tiny_sd3_transformer(1)
    first = apply_to_target(a, kernel_fn("math"))
    proxy = attention_processor.F
    second = apply_to_target(b, kernel_fn("math"))
    assert attention_processor.F is proxy
    first.restore()
    assert attention_processor.F is proxy  # b still needs it
    tiny.run_tiny(b)
    assert second.total_calls == 2 and first.total_calls == 0
    second.restore()
    assert_globals_original()


def test_applying_twice_stacks_and_restores_in_reverse_order():
    for model_name in ("unet", "sd3"):
        model = tiny.BUILDERS[model_name]()
        base = tiny.run_tiny(model)
        saved = processors_of(model)
        outer = apply_to_target(model, kernel_fn("math"))
        outer_procs = processors_of(model)
        inner = apply_to_target(model, kernel_fn("chunked"))
        tiny.run_tiny(model)
        assert (outer.total_calls, inner.total_calls) == (0, ATTENTION_CALLS[model_name])
        inner.restore()
        assert_same_processors(model, outer_procs)
        assert_model_close(tiny.run_tiny(model), base)
        assert outer.total_calls == ATTENTION_CALLS[model_name]
        outer.restore()
        assert_same_processors(model, saved)
        assert torch.equal(tiny.run_tiny(model), base)
        assert_no_hooks(model)


def test_a_failing_forward_leaves_no_active_route_behind():
    attn = Attention(query_dim=16, heads=2, dim_head=8)

    class Exploding:
        def __call__(self, *args, **kwargs):
            assert current_route() is not None
            raise RuntimeError("boom")

    attn.set_processor(Exploding())
    with apply_to_target(attn, kernel_fn("math")) as applied:
        with pytest.raises(RuntimeError, match="boom"):
            attn(torch.randn(1, 3, 16))
        assert current_route() is None
    assert applied.counts()["kept"] == 1  # its code calls neither SDPA nor the dispatcher


def test_routes_are_per_thread():
    seen = []
    with active_route(Route(kernel_fn("math"))):
        worker = threading.Thread(target=lambda: seen.append(current_route()))
        worker.start()
        worker.join()
        assert current_route() is not None
    assert seen == [None]


def test_a_users_own_processor_module_is_routed_too():
    """A processor class defined outside diffusers that calls ``F.scaled_dot_product_attention`` (here: in this
    test module, which imported ``torch.nn.functional`` as ``F`` for it) is routed through its own module's global."""
    attn = Attention(query_dim=16, heads=2, dim_head=8).eval()
    hidden = torch.randn(2, 3, 16)
    with torch.no_grad():
        base = attn(hidden)
        attn.set_processor(_UsersProcessor())
        assert torch.equal(attn(hidden), base)
        with apply_to_target(attn, kernel_fn("chunked")) as applied:
            assert applied.modules[0].action == "routed"
            assert sys.modules[__name__].F is not torch.nn.functional
            assert_model_close(attn(hidden), base)
        assert applied.calls == {"sdpa": 1}
    assert sys.modules[__name__].F is torch.nn.functional


import torch.nn.functional as F  # noqa: E402  (the global _UsersProcessor calls through)


class _UsersProcessor:
    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None):
        b = hidden_states.shape[0]
        q, k, v = (
            layer(hidden_states).view(b, -1, attn.heads, 8).transpose(1, 2)
            for layer in (attn.to_q, attn.to_k, attn.to_v)
        )
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, -1, attn.heads * 8)
        return attn.to_out[1](attn.to_out[0](out))


# ---- the custom-processor strategy -------------------------------------------------------------------------------


class GainProcessor(torch.nn.Module):
    """A processor with a weight: AttnProcessor2_0 followed by a learnable gain."""

    def __init__(self):
        super().__init__()
        self.gain = torch.nn.Parameter(torch.tensor(0.5))
        self.inner = AttnProcessor2_0()

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **kwargs):
        return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, temb) * self.gain


def test_custom_processor_factory_installs_one_instance_per_module_and_restores():
    unet = tiny.tiny_unet()
    base = tiny.run_tiny(unet)
    saved = processors_of(unet)
    keys = set(unet.state_dict())
    unused = Recorder()
    with apply_to_target(unet, unused, processor_factory=GainProcessor) as applied:
        procs = list(unet.attn_processors.values())
        assert all(type(p) is GainProcessor for p in procs) and len({id(p) for p in procs}) == 8
        assert applied.counts() == {"replaced": 0, "routed": 0, "linear": 0, "kept": 0, "custom": 8}
        added = set(unet.state_dict()) - keys
        assert len(added) == 8 and all(k.endswith(".processor.gain") for k in added)
        out = tiny.run_tiny(unet)
        assert not torch.allclose(out, base)
        assert unused.calls == [] and applied.total_calls == 0
        assert_no_hooks(unet)
        assert patches.active_patches() == []
    assert set(unet.state_dict()) == keys
    assert_same_processors(unet, saved)
    assert torch.equal(tiny.run_tiny(unet), base)


# ---- all or nothing ----------------------------------------------------------------------------------------------


def test_a_failure_part_way_undoes_everything():
    unet = tiny.tiny_unet()
    base = tiny.run_tiny(unet)
    saved = processors_of(unet)
    victim = dict(unet.named_modules())["mid_block.attentions.0.transformer_blocks.0.attn1"]

    def refuse(processor):
        raise RuntimeError("set_processor refused")

    victim.set_processor = refuse  # the 5th attention module of 8
    with pytest.raises(RuntimeError, match="set_processor refused"):
        apply_to_target(unet, kernel_fn("math"))
    del victim.set_processor
    assert_same_processors(unet, saved)
    assert_no_hooks(unet)
    assert_globals_original()
    assert torch.equal(tiny.run_tiny(unet), base)


def test_a_factory_failing_part_way_undoes_everything():
    unet = tiny.tiny_unet()
    base = tiny.run_tiny(unet)
    saved = processors_of(unet)
    made = []

    def flaky():
        if len(made) == 3:
            raise RuntimeError("factory failed")
        made.append(GainProcessor())
        return made[-1]

    with pytest.raises(RuntimeError, match="factory failed"):
        apply_to_target(unet, None, processor_factory=flaky)
    assert_same_processors(unet, saved)
    assert not any(k.endswith("processor.gain") for k in unet.state_dict())
    assert torch.equal(tiny.run_tiny(unet), base)

    shared = GainProcessor()
    with pytest.raises(ValueError, match="the same torch.nn.Module processor for down_blocks"):
        apply_to_target(unet, None, processor_factory=lambda: shared)
    with pytest.raises(TypeError, match="processor_factory returned int for down_blocks"):
        apply_to_target(unet, None, processor_factory=lambda: 3)
    assert_same_processors(unet, saved)


# ---- targets -----------------------------------------------------------------------------------------------------


def test_pipeline_components_are_walked_with_qualified_names(tmp_path):
    pipe = tiny.tiny_dit_pipeline(save_dir=str(tmp_path / "dit"))
    base = tiny.run_tiny_pipeline(pipe)
    with apply_to_target(pipe, kernel_fn("chunked")) as applied:
        names = [c.name for c in applied.modules]
        assert names == [
            "transformer.transformer_blocks.0.attn1",
            "transformer.transformer_blocks.1.attn1",
            "vae.encoder.mid_block.attentions.0",
            "vae.decoder.mid_block.attentions.0",
        ]
        assert_model_close(tiny.run_tiny_pipeline(pipe), base, atol=1e-4)
    # 2 steps × one (guidance-doubled) transformer forward, then one decode
    assert applied.calls_by_module == {names[0]: 2, names[1]: 2, names[3]: 1}
    assert torch.equal(tiny.run_tiny_pipeline(pipe), base)


class _PipelineWithTextEncoder(diffusers.DiffusionPipeline):
    """A pipeline with a component that has no diffusers attention (standing in for a transformers text encoder)."""

    def __init__(self, transformer, text_encoder, scheduler):
        super().__init__()
        self.register_modules(transformer=transformer, text_encoder=text_encoder, scheduler=scheduler)


def test_pipeline_components_without_diffusers_attention_are_skipped_and_an_empty_pipeline_is_refused():
    encoder = torch.nn.TransformerEncoderLayer(16, 2, batch_first=True)  # attention, but not diffusers'
    pipe = _PipelineWithTextEncoder(tiny.tiny_dit(), encoder, diffusers.DDIMScheduler())
    with apply_to_target(pipe, kernel_fn("math")) as applied:
        assert [c.name.split(".")[0] for c in applied.modules] == ["transformer", "transformer"]
        assert_no_hooks(encoder)

    empty = diffusers.DDPMPipeline(
        unet=diffusers.UNet2DModel(
            block_out_channels=(8, 8),
            norm_num_groups=4,
            add_attention=False,
            down_block_types=("DownBlock2D",) * 2,
            up_block_types=("UpBlock2D",) * 2,
        ),
        scheduler=diffusers.DDPMScheduler(),
    )
    with pytest.raises(ValueError) as info:
        apply_to_target(empty, kernel_fn("math"))
    assert str(info.value) == (
        "DDPMPipeline contains no attention module npu-port can route: no diffusers attention module (diffusers."
        "models.attention_processor.Attention or AttentionModuleMixin) and no legacy attention (a class with "
        "_attention(self, query, key, value, attention_mask=None) using self.heads and self.scale, or diffusers' "
        "AttentionBlock), so there is no attention to apply a strategy to"
    )


def test_bad_targets_and_arguments_are_refused_with_exact_messages():
    with pytest.raises(TypeError) as info:
        apply_to_target("unet", kernel_fn("math"))
    assert str(info.value) == (
        "apply_to_target expects a diffusers model (ModelMixin), a DiffusionPipeline, or a torch.nn.Module that "
        "contains diffusers Attention modules; got str"
    )
    with pytest.raises(TypeError) as info:
        apply_to_target({"unet": tiny.tiny_dit()}, kernel_fn("math"))
    assert str(info.value).endswith("; got dict")
    with pytest.raises(ValueError) as info:
        apply_to_target(torch.nn.Linear(2, 2), kernel_fn("math"))
    assert str(info.value) == (
        "Linear contains no attention module npu-port can route: no diffusers attention module (diffusers.models."
        "attention_processor.Attention or AttentionModuleMixin) and no legacy attention (a class with _attention("
        "self, query, key, value, attention_mask=None) using self.heads and self.scale, or diffusers' "
        "AttentionBlock), so there is no attention to apply a strategy to"
    )
    dit = tiny.tiny_dit()
    with pytest.raises(TypeError) as info:
        apply_to_target(dit, None)
    assert str(info.value) == (
        "attention_fn must be a callable (query, key, value, attn_mask=None, *, dropout_p=0.0, is_causal=False, "
        "scale=None, enable_gqa=False) -> Tensor; got NoneType"
    )
    with pytest.raises(TypeError) as info:
        apply_to_target(dit, None, processor_factory=42)
    assert str(info.value) == (
        "processor_factory must be a zero-argument callable that returns an attention processor; got int"
    )
    assert_no_hooks(dit)


def test_a_plain_module_holding_attention_modules_is_a_target():
    block = torch.nn.Sequential(
        Attention(query_dim=16, heads=2, dim_head=8), Attention(query_dim=16, heads=2, dim_head=8)
    ).eval()
    hidden = torch.randn(1, 4, 16)
    with torch.no_grad():
        base = block(hidden)
        with apply_to_target(block, kernel_fn("math")) as applied:
            assert [c.name for c in applied.modules] == ["0", "1"]
            assert_model_close(block(hidden), base)
    assert applied.calls == {"processor": 2}
