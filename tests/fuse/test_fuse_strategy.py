"""A strategy's ``fuse_ops:`` key: checked when the file is read (file:line, the valid ops), inherited through
``extends``, applied with the strategy to its target through the key applier npu_port.fuse registers, explained and
restored with the strategy's handle."""

from __future__ import annotations

import pytest
import torch

import npu_port
from npu_port.errors import StrategyError, StrategyFileError
from npu_port.fuse import KEY_APPLIER
from npu_port.fuse.api import FuseHandle
from npu_port.strategy import appliers
from npu_port.strategy.loader import build
from npu_port.strategy.registry import get_strategy, load_strategy_file, unregister_strategy
from npu_port.strategy.schema import KEYS, parse

VALID = "rms_norm, rope, geglu_exact, geglu_tanh, adaln"


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("description: x\nkernel: sdpa\nfuse_ops: [rms_norm, flash]\n", 3, f"unknown fused op 'flash'; valid ops: {VALID}"),
        ("description: x\nkernel: sdpa\n\nfuse_ops: rms_norm\n", 4, f"fuse_ops must be a list of op names ({VALID}); got 'rms_norm'"),
        (
            "description: x\nkernel: sdpa\nfuse_ops: [geglu_exact, geglu_tanh]\n",
            3,
            "geglu_exact and geglu_tanh exclude each other (exact erf GELU, or the tanh approximation); pick one",
        ),
    ],
)  # fmt: skip
def test_a_bad_fuse_ops_key_is_an_error_with_file_and_line(text, line, message):
    with pytest.raises(StrategyFileError) as caught:
        parse(text, "mine.yaml")
    assert str(caught.value) == f"mine.yaml:{line}: {message}"


def test_fuse_ops_is_a_documented_key():
    assert KEYS["fuse_ops"] == (
        "fused DiT ops installed on the model the strategy is applied to (npu_port.fuse_ops): " + VALID
    )


def test_fuse_ops_is_inherited_through_extends_and_an_empty_list_turns_it_off(tmp_path):
    parent = tmp_path / "fused-sdpa.yaml"
    parent.write_text("extends: sdpa\ndescription: sdpa plus fused ops\nfuse_ops: [rms_norm, rope, rms_norm]\n")
    strategy = load_strategy_file(parent)
    assert strategy.fuse_ops == ("rms_norm", "rope")
    child = build(parse("name: child\nextends: fused-sdpa\ndescription: x\n", "child.yaml"), lambda name: strategy)
    assert child.fuse_ops == ("rms_norm", "rope")
    off = build(
        parse("name: no-fuse\nextends: fused-sdpa\ndescription: x\nfuse_ops: []\n", "off.yaml"), lambda name: strategy
    )
    assert off.fuse_ops == ()
    assert get_strategy("ascend-910b").fuse_ops == ()  # not measured on an NPU (docs/explanation/ascend.md)


def _tiny_flux():
    from npu_port.integrations.diffusers.tiny_flux import tiny_flux_transformer

    return tiny_flux_transformer()


def _class_forwards(model):
    return all("forward" not in vars(m) for m in model.modules())


def test_applied_to_a_model_the_strategy_installs_its_fused_ops_and_restore_undoes_both(npu):
    model = _tiny_flux()
    processors = dict(model.attn_processors)
    handle = npu_port.set_attention_strategy("sdpa", target=model, fuse_ops=["rms_norm", "rope"])
    assert isinstance(handle.fused, FuseHandle) and handle.fused.counts() == {"rms_norm": 6, "rope": 1}
    explained = handle.explain()
    assert "  fused ops (rms_norm, rope): 7 sites fused, 0 refused" in explained
    assert "    rms_norm: transformer_blocks.0.attn.norm_q -> torch_npu.npu_rms_norm: installed" in explained
    assert handle.report()["fuse_ops"]["fused"] == {"rms_norm": 6, "rope": 1}
    with torch.no_grad():
        model(**_inputs())
    assert all(site.state == "checked" for site in handle.fused.sites)
    handle.restore()
    assert _class_forwards(model) and handle.fused.restored
    assert all(model.attn_processors[name] is processor for name, processor in processors.items())


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return dict(
        hidden_states=torch.randn(1, 16, 64, generator=gen),
        encoder_hidden_states=torch.randn(1, 8, 32, generator=gen),
        pooled_projections=torch.randn(1, 32, generator=gen),
        timestep=torch.tensor([0.5]),
        img_ids=torch.zeros(16, 3),
        txt_ids=torch.zeros(8, 3),
        return_dict=False,
    )


def test_a_strategy_file_with_fuse_ops_refused_here_still_applies_and_says_why(no_torch_npu, tmp_path):
    path = tmp_path / "fused.yaml"
    path.write_text("extends: sdpa\ndescription: fused\nfuse_ops: [rms_norm]\n")
    model = _tiny_flux()
    with pytest.warns(npu_port.fuse.check.FuseWarning):
        handle = npu_port.set_attention_strategy(str(path), target=model)
    assert [r.reason.code for r in handle.fused.refused] == ["package-missing"]
    assert "refused: rms_norm: torch_npu is not installed" in handle.explain()
    handle.restore()


def test_process_wide_there_is_no_model_to_fuse_and_the_handle_says_so(npu):
    with npu_port.attention_strategy("sdpa", fuse_ops=["rms_norm"]) as handle:
        assert handle.fused is None
        assert handle.notes[-1] == (
            "fuse_ops (rms_norm) change a model: apply the strategy with target=model or pipeline (nothing was fused "
            "process-wide)"
        )


def test_an_unknown_op_as_a_strategy_override_names_the_valid_ops(npu):
    with pytest.raises(ValueError, match=f"^unknown fused op 'flash'; valid ops: {VALID}$"):
        npu_port.set_attention_strategy("sdpa", target=_tiny_flux(), fuse_ops=["flash"])


def test_register_strategy_takes_fuse_ops(npu):
    try:
        strategy = npu_port.register_strategy("fused-math", kernel="math", fuse_ops=["rope"], description="x")
        assert strategy.fuse_ops == ("rope",)
        with pytest.raises(ValueError, match=f"unknown fused op 'ropes'; valid ops: {VALID}"):
            npu_port.register_strategy("fused-bad", kernel="math", fuse_ops=["ropes"], description="x")
    finally:
        unregister_strategy("fused-math")


def test_if_fusing_fails_the_strategys_attention_is_undone_too(npu, monkeypatch):
    model = _tiny_flux()
    processors = dict(model.attn_processors)

    def failing(target, ops):
        raise RuntimeError("fuse failed")

    monkeypatch.setitem(appliers._key_appliers, "fuse_ops", appliers._KeyApplier("fuse_ops", failing))
    with pytest.raises(RuntimeError, match="fuse failed"):
        npu_port.set_attention_strategy("sdpa", target=model, fuse_ops=["rms_norm"])
    assert all(model.attn_processors[name] is processor for name, processor in processors.items())


def test_without_the_key_applier_the_strategy_says_what_is_missing(npu, monkeypatch):
    monkeypatch.delitem(appliers._key_appliers, "fuse_ops")
    with pytest.raises(StrategyError) as caught:
        npu_port.set_attention_strategy("sdpa", target=_tiny_flux(), fuse_ops=["rms_norm"])
    assert str(caught.value) == (
        "the strategy sets 'fuse_ops' but nothing that applies it is registered (npu_port.fuse registers fuse_ops "
        "when npu_port is imported)"
    )
    assert KEY_APPLIER.active is False
    monkeypatch.undo()
    assert KEY_APPLIER.active
