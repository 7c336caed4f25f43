"""Each diffusers class or function ``fuse_ops`` replaces, taken away as a release that moved it would: the op
declines on the tiny model that holds it — one warning naming diffusers, its version and the piece, the decline on
the handle (``declines``, ``explain()``, ``report()``), nothing patched for it — and the model's output is the
unfused one, exactly. ``strict=True`` turns the decline into an error before anything is patched.

The fused ops run on the torch_npu emulator (and the MindIE-SD fake for ``adaln``) with CPU tensors allowed, as in
tests/fuse; with every piece in place each scenario fuses the layers in question, so a decline below is the
piece's doing.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import npu_port
from npu_port.fuse import backend
from npu_port.upstream import UpstreamMissingError
from npu_port.upstream.diffusers import ADAPTER, ops

from ..emulators import torch_npu_emulator
from ..fakes import mindiesd_fake
from .removal import one_decline, remove, with_every_piece

pytest.importorskip("diffusers")

FEATURES = tuple(ops.NEEDS)
pytestmark = with_every_piece(ADAPTER, FEATURES)
#: piece -> (op, tiny model) of its scenario.
SCENARIO = {
    "RMSNorm": ("rms_norm", "sd3-rms"),
    "AdaLayerNormZero": ("adaln", "flux"),
    "AdaLayerNormZeroSingle": ("adaln", "flux"),
    "AdaLayerNormContinuous": ("adaln", "flux"),
    "GEGLU": ("geglu_tanh", "unet"),
    "apply_rotary_emb": ("rope", "flux"),
    "WanAttention": ("rope", "wan"),
    "WanAttnProcessor": ("rope", "wan"),
}
SWITCH = "GEGLU npu switch"
assert sorted([*SCENARIO, SWITCH]) == sorted(p.name for p in ADAPTER.pieces() if p.feature in FEATURES)


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _build(kind):
    """A tiny model and a function running it on fixed inputs (its output tensor)."""
    from npu_port.integrations.diffusers import tiny

    if kind == "sd3-rms":  # tiny SD3 with RMSNorm on q and k: diffusers' own RMSNorm layers
        from diffusers import SD3Transformer2DModel

        torch.manual_seed(0)
        model = SD3Transformer2DModel(
            sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=tiny.TEXT_DIM, caption_projection_dim=32, pooled_projection_dim=tiny.TEXT_DIM,
            out_channels=4, pos_embed_max_size=8, qk_norm="rms_norm",
        )  # fmt: skip
    elif kind == "wan":
        from npu_port.integrations.diffusers.tiny_wan import tiny_wan_transformer

        model = tiny_wan_transformer()

        def run(module):
            return module(
                hidden_states=_x(1, 16, 2, 8, 8, seed=1),
                timestep=torch.tensor([500]),
                encoder_hidden_states=_x(1, 8, 32, seed=2),
                return_dict=False,
            )[0]

        return model.eval(), run
    else:
        model = tiny.tiny_model(kind)
    model = model.eval()
    return model, lambda module: tiny.output_of(module(**tiny.tiny_inputs(module, batch_size=1)))


@pytest.fixture(scope="module")
def models():
    """Each tiny model, and its output with nothing fused."""
    built = {}
    for kind in {kind for _, kind in SCENARIO.values()}:
        model, run = _build(kind)
        with torch.no_grad():
            built[kind] = (model, run, run(model))
    return built


@pytest.fixture
def devices(monkeypatch):
    """torch_npu = the emulator, mindiesd = the fake, and the fused ops take CPU tensors."""
    monkeypatch.setattr(backend, "DEVICE_TYPES", ("npu", "cpu"))
    monkeypatch.setitem(__import__("sys").modules, "mindiesd", mindiesd_fake.build_module())
    return torch_npu_emulator.install(monkeypatch)


def _declined_classes(name):
    return tuple(c for c in [ADAPTER.get(n) for n in ops.NEEDS[_feature(name)]] if isinstance(c, type))


def _feature(name):
    return ADAPTER.piece(name).feature


def test_with_every_piece_each_scenario_fuses_its_layers(models, devices):
    for name, (op, kind) in SCENARIO.items():
        model, run, _ = models[kind]
        with npu_port.fuse_ops(model, ops=[op]) as handle, torch.no_grad():
            run(model)
            assert handle.declines == [] and handle.counts()[op] > 0, (name, handle.explain())


@pytest.mark.parametrize("name", list(SCENARIO))
def test_without_the_piece_the_op_declines_and_the_output_is_the_unfused_one(models, devices, monkeypatch, name):
    op, kind = SCENARIO[name]
    model, run, expected = models[kind]
    classes = _declined_classes(name)  # read before the piece is taken away
    remove(monkeypatch, ADAPTER, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with npu_port.fuse_ops(model, ops=[op]) as handle, torch.no_grad():
            got = run(model)
            explained, report = handle.explain(), handle.report()
    message = one_decline(caught, ADAPTER, name)
    assert message.startswith(f"{_feature(name)}: diffusers {ADAPTER.version()} has no {name} (")
    assert [str(d) for d in handle.declines] == [message] and f"  not fused: {message}" in explained
    assert [d["message"] for d in report["declines"]] == [message]
    assert handle.counts()[op] == 0 and not [s for s in handle.sites if s.op == op]
    assert all("forward" not in vars(m) for m in model.modules() if isinstance(m, classes))
    assert torch.equal(got, expected)


@pytest.mark.parametrize("name", list(SCENARIO))
def test_strict_makes_the_missing_piece_an_error_before_anything_is_patched(models, devices, monkeypatch, name):
    op, kind = SCENARIO[name]
    model = models[kind][0]
    remove(monkeypatch, ADAPTER, name)
    with pytest.raises(UpstreamMissingError) as raised:
        npu_port.fuse_ops(model, ops=[op], strict=True)
    assert str(raised.value).startswith(f"{_feature(name)} needs ") and name in str(raised.value)
    assert all("forward" not in vars(m) for m in model.modules())


def test_without_geglus_npu_switch_geglu_exact_declines_and_patches_nothing(models, devices, monkeypatch):
    """The switch is the global diffusers' GEGLU reads to pick its NPU branch; a release without it computes GEGLU
    some other way, which geglu_exact cannot know: GEGLU keeps diffusers' forward. (The model is not run here:
    taking the global away breaks diffusers' own forward too, which reads it at every call.)"""
    from diffusers.models import activations

    model = models["unet"][0]
    monkeypatch.setattr(activations, "is_torch_npu_available", lambda: True)  # diffusers' NPU branch, as on an NPU
    monkeypatch.setattr(activations, "torch_npu", devices, raising=False)
    with npu_port.fuse_ops(model, ops=["geglu_exact"]) as intact:
        assert intact.counts()["geglu_exact"] == 4 and intact.declines == []
    remove(monkeypatch, ADAPTER, SWITCH)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with npu_port.fuse_ops(model, ops=["geglu_exact"]) as handle:
            assert handle.sites == [] and all("forward" not in vars(m) for m in model.modules())
    message = one_decline(caught, ADAPTER, SWITCH)
    assert [d["message"] for d in handle.report()["declines"]] == [message]
    with pytest.raises(UpstreamMissingError, match=SWITCH):
        npu_port.fuse_ops(model, ops=["geglu_exact"], strict=True)


def test_a_model_without_diffusers_layers_needs_no_piece(devices, monkeypatch):
    """torch's own RMSNorm is fused whatever diffusers lacks, and nothing is declined for it."""
    remove(monkeypatch, ADAPTER, "RMSNorm")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.RMSNorm(8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with npu_port.fuse_ops(model, ops=["rms_norm"], strict=True) as handle:
            assert handle.counts()["rms_norm"] == 1 and handle.declines == []
    assert not [w for w in caught if "diffusers" in str(w.message)]
