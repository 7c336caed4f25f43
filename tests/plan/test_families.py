"""The tiny family models: named errors, seeded weights, bfloat16 as ``from_pretrained(torch_dtype=bfloat16)`` loads
it (the model's float32 modules kept), and a docstring per builder that says which pipeline behaviour it reproduces.
What their calls are — head dims, masks, routing — is pinned by ``test_coverage.py``."""

from __future__ import annotations

import inspect

import pytest
import torch

from npu_port.plan import families


def test_unknown_families_are_refused_with_the_valid_names():
    valid = ", ".join(families.FAMILIES)
    for call in (lambda: families.build("sd2"), lambda: families.inputs("sd2", torch.nn.Linear(1, 1))):
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value) == f"unknown model family 'sd2'; valid families: {valid}"


def test_every_family_has_inputs_and_says_what_it_reproduces():
    assert list(families._INPUTS) == list(families.FAMILIES)
    for name, builder in families.FAMILIES.items():
        doc = inspect.getdoc(builder)
        assert "\n\nReproduces " in doc, name


def test_weights_are_seeded_and_bfloat16_except_the_modules_a_model_keeps_in_float32():
    first, again, other = families.build("wan"), families.build("wan"), families.build("wan", seed=1)
    keep = type(first)._keep_in_fp32_modules
    assert keep  # Wan keeps its norms and time embedding in float32
    state, same, different = first.state_dict(), again.state_dict(), other.state_dict()
    for name, tensor in state.items():
        expected = torch.float32 if any(part in name.split(".") for part in keep) else torch.bfloat16
        assert tensor.dtype == expected, name
        assert torch.equal(tensor, same[name]), name
    assert any(not torch.equal(tensor, different[name]) for name, tensor in state.items())


@pytest.mark.parametrize("name", ["dit", "wan", "legacy_controlvideo"])
def test_one_forward_gives_a_finite_bfloat16_output_of_the_input_shape(name):
    model = families.build(name)
    arguments = families.inputs(name, model)
    first = next(v for v in arguments.values() if isinstance(v, torch.Tensor))
    out = families.run(name, model)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    if name != "dit":  # DiT predicts a learned variance too: twice the channels
        assert out.shape == first.shape
    assert torch.equal(out, families.run(name, model))  # seeded inputs: the same forward again
