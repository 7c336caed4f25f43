"""NPU112 / NPU113 against npu-port's xformers drop-in itself: what the scan calls served is what the drop-in
defines and computes, what it calls missing raises AttributeError there."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from npu_port.dropins import xformers_attn_bias_impl, xformers_ops_impl
from npu_port.scan.engine import scan_file, select_rules
from npu_port.scan.rules._attention_calls import XFORMERS_BIASES, xformers_bias_classes


def test_the_biases_the_scan_knows_are_the_drop_ins():
    real = {
        name
        for name, value in vars(xformers_attn_bias_impl).items()
        if inspect.isclass(value)
        and issubclass(value, xformers_attn_bias_impl.AttentionBias)
        and value is not xformers_attn_bias_impl.AttentionBias
    }
    assert set(xformers_bias_classes()) == real == set(XFORMERS_BIASES)
    for name, known in xformers_bias_classes().items():
        cls = getattr(xformers_attn_bias_impl, name)
        fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        public = {m for m in dir(cls) if not m.startswith("__")} | fields
        assert {m for m in known.members if not m.startswith("__")} <= public


def test_what_a_bias_method_returns_is_what_the_scan_follows():
    classes = xformers_bias_classes()
    mask = xformers_attn_bias_impl.BlockDiagonalMask.from_seqlens([2, 3])
    assert type(mask).__name__ == "BlockDiagonalMask" and classes["BlockDiagonalMask"].returns["from_seqlens"] == "cls"
    causal = xformers_attn_bias_impl.BlockDiagonalCausalMask.from_seqlens([2])
    assert type(causal).__name__ == "BlockDiagonalCausalMask"  # a classmethod builds cls
    for method in ("make_causal", "make_causal_from_bottomright"):
        assert type(getattr(mask, method)()).__name__ == classes["BlockDiagonalMask"].returns[method]
    with_bias = xformers_attn_bias_impl.LowerTriangularMask().add_bias(None)
    assert type(with_bias).__name__ == classes["LowerTriangularMask"].returns["add_bias"]
    assert classes["BlockDiagonalMask"].returns["from_tensor_list"] is None  # a tuple: not followed


EXPRESSIONS = [
    "xops.fmha.attn_bias.BlockDiagonalPaddedKeysMask.from_seqlens(s, 8, s)",
    "xops.fmha.attn_bias.BlockDiagonalMask.from_seqlens(s).make_causal().make_local_attention(4)",
    "xops.fmha.attn_bias.BlockDiagonalMask.from_seqlens(s).make_causal()",
    "xops.fmha.attn_bias.LocalAttentionFromBottomRightMask(2, 0)",
    "xops.LowerTriangularMask()",
    "xops.fmha.attn_bias.LowerTriangularMaskWithTensorBias(s)",
    "xops.fmha.BlockDiagonalCausalLocalAttentionMask.from_seqlens(s)",
]


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_a_bias_is_reported_missing_exactly_when_the_drop_in_lacks_it(tmp_path, expression):
    try:
        eval(expression, {"xops": xformers_ops_impl, "s": [2, 3]})
        lacks = False
    except AttributeError:
        lacks = True
    path = tmp_path / "m.py"
    path.write_text(
        "import xformers.ops as xops\n"
        "def f(q, k, v, s):\n"
        f"    return xops.memory_efficient_attention(q, k, v, attn_bias={expression})\n",
        encoding="utf-8",
    )
    found = {(f.line, f.code) for f in scan_file(str(path), False, select_rules(["NPU112", "NPU113"])).findings}
    assert (3, "NPU113" if lacks else "NPU112") in found
    assert (3, "NPU112" if lacks else "NPU113") not in found


@pytest.mark.parametrize(
    ("expression", "lacks"),
    [
        ("xops.memory_efficient_attention_partial", True),
        ("xops.fmha.cutlass.FwOp", True),
        ("xops.fmha.memory_efficient_attention_forward", False),
        ("xops.MemoryEfficientAttentionFlashAttentionOp", False),
        ("xops.fmha.MemoryEfficientAttentionCutlassOp", False),
    ],
)
def test_functions_and_ops_the_drop_in_lacks_raise_attribute_error_there(expression, lacks):
    from npu_port.scan.rules._attention_calls import xformers_missing

    assert (xformers_missing(expression.replace("xops.", "xformers.ops.")) is not None) == lacks
    if lacks:
        with pytest.raises(AttributeError):
            eval(expression, {"xops": xformers_ops_impl})
    else:
        eval(expression, {"xops": xformers_ops_impl})


# ---- flash_attn: what the scan calls served is what the drop-in defines (NPU110 / NPU114) ----------------------------

FLASH_NAMES = [
    ("flash_attn.flash_attn_func", "flash_attn_impl"),
    ("flash_attn.flash_attn_interface.flash_attn_varlen_func", "flash_attn_impl"),
    ("flash_attn.flash_attn_interface._flash_attn_forward", "flash_attn_impl"),
    ("flash_attn.flash_attn_interface._flash_attn_varlen_backward", "flash_attn_impl"),
    ("flash_attn.flash_attn_interface._wrapped_flash_attn_forward", "flash_attn_impl"),
    ("flash_attn.bert_padding.pad_input", "flash_attn_bert_padding"),
    ("flash_attn.bert_padding.unpad_input", "flash_attn_bert_padding"),
    ("flash_attn.bert_padding.index_first_axis", "flash_attn_bert_padding"),
    ("flash_attn.bert_padding.index_put_first_axis", "flash_attn_bert_padding"),
    ("flash_attn.bert_padding.unpad_input_for_concatenated_sequences", "flash_attn_bert_padding"),
]


@pytest.mark.parametrize(("qualified", "module"), FLASH_NAMES)
def test_a_flash_attn_name_is_served_exactly_when_the_drop_in_defines_it(qualified, module):
    import importlib

    from npu_port.scan.rules._attention_calls import flash_missing

    defined = hasattr(importlib.import_module(f"npu_port.dropins.{module}"), qualified.rsplit(".", 1)[-1])
    assert (flash_missing(qualified) is None) == defined


def test_flash_attention_3_and_unserved_modules_are_missing_as_a_whole():
    from npu_port.scan.rules._attention_calls import flash_missing

    assert flash_missing("flash_attn_interface.flash_attn_func") == "flash_attn_interface"
    assert flash_missing("flash_attn_3.flash_attn_interface._flash_attn_forward") == "flash_attn_3"
    assert flash_missing("flash_attn.flash_attn_triton.flash_attn_func") == "flash_attn.flash_attn_triton"
    assert flash_missing("flash_attn.layers.rotary.apply_rotary_emb") == "flash_attn.layers"


def test_the_names_the_scan_calls_refused_raise_drop_in_error_in_the_drop_in():
    from npu_port.dropins import flash_attn_impl
    from npu_port.errors import DropInError
    from npu_port.scan.rules._attention_calls import FLASH_REFUSED

    for name in FLASH_REFUSED:
        with pytest.raises(DropInError, match=name):
            getattr(flash_attn_impl, name)(None, None, None)


@pytest.mark.parametrize("names", [3, 4, 5, 6])
def test_unpad_input_unpacked_into_four_names_is_the_one_that_breaks_under_the_drop_in(tmp_path, names):
    import torch

    from npu_port.dropins.flash_attn_bert_padding import unpad_input

    hidden, mask = torch.ones(2, 3, 4), torch.tensor([[1, 1, 0], [1, 0, 0]])
    try:
        exec(f"{', '.join(f'n{i}' for i in range(names))} = unpad_input(hidden, mask)", {"unpad_input": unpad_input,
             "hidden": hidden, "mask": mask})  # fmt: skip
        breaks = False
    except ValueError:
        breaks = True
    path = tmp_path / "m.py"
    targets = ", ".join(f"n{i}" for i in range(names))
    path.write_text(
        f"from flash_attn.bert_padding import unpad_input\ndef f(h, m):\n    {targets} = unpad_input(h, m)\n",
        encoding="utf-8",
    )
    found = {(f.line, f.code) for f in scan_file(str(path), False, select_rules(["NPU110", "NPU114"])).findings}
    assert breaks == (names != 5)  # the drop-in returns five values
    assert found == {(3, "NPU114" if names == 4 else "NPU110")}  # four: flash-attn < 2.6's unpacking
