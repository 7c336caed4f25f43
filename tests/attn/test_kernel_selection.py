"""Forced kernels explain refusals; ``kernel=None`` picks the first that can run; registry and options errors."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

import npu_port
from npu_port import _optional
from npu_port.attn import AttentionCall, get_kernel, select
from npu_port.errors import (
    KernelOptionError,
    KernelUnavailableError,
    NoKernelError,
    UnknownKernelError,
)

from ..conftest import emulated_torch_npu


def test_forcing_an_npu_kernel_without_torch_npu_names_the_package_and_the_kernels_that_can_run(no_torch_npu):
    query = key = value = torch.randn(1, 2, 4, 8)
    with pytest.raises(KernelUnavailableError) as info:
        npu_port.attention(query, key, value, kernel="npu_fusion")
    assert str(info.value) == (
        "attention kernel 'npu_fusion' cannot run this call (query (1, 2, 4, 8) float32 on cpu, key (1, 2, 4, 8), "
        "value (1, 2, 4, 8), no mask, is_causal=False, dropout_p=0, scale=0.3536):\n"
        "  - torch_npu is not installed; install it on an Ascend machine with CANN: pip install torch-npu "
        "(torch-npu must match your torch version: the same major.minor)\n"
        "kernels that can run it: math, sdpa, chunked"
    )
    assert [r.code for r in info.value.reasons] == ["package-missing"]
    assert info.value.runnable == ["math", "sdpa", "chunked"]


def test_installed_but_broken_package_counts_as_absent_with_the_import_error(tmp_path, monkeypatch):
    package = tmp_path / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            """
            raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    _optional.forget("torch_npu")
    try:
        kernel = get_kernel("npu_fusion")
        assert not kernel.available()
        (reason,) = kernel.availability()
        assert reason.code == "package-broken"
        assert str(reason) == (
            "torch_npu is installed but cannot be imported (ImportError: libhccl.so: cannot open shared object file: "
            "No such file or directory); source CANN's environment first (e.g. source "
            "/usr/local/Ascend/ascend-toolkit/set_env.sh) and check that torch and torch_npu have the same "
            "major.minor version"
        )
    finally:
        sys.modules.pop("torch_npu", None)
        _optional.forget("torch_npu")


def test_unknown_kernel_lists_every_valid_name():
    with pytest.raises(UnknownKernelError) as info:
        npu_port.attention(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4), kernel="flash")
    assert str(info.value) == (
        "unknown attention kernel 'flash'; valid kernels: math, sdpa, chunked, npu_fusion, npu_fused_infer, "
        "xformers, flash_attn"
    )


@pytest.mark.parametrize(
    "name, options, message",
    [
        (
            "chunked",
            {"max_byte": 10},
            "kernel 'chunked' has no option 'max_byte'; valid options: max_bytes, query_block, key_block, upcast",
        ),
        ("chunked", {"max_bytes": 0}, "option max_bytes must be a positive int or None, got 0"),
        ("math", {"upcast": "yes"}, "option upcast must be True or False, got 'yes'"),
        (
            "sdpa",
            {"backends": ["flash", "fast"]},
            "unknown SDPA backend 'fast'; valid backends: flash, efficient, cudnn, math, overrideable",
        ),
        ("flash_attn", {"anything": 1}, "kernel 'flash_attn' has no option 'anything'; valid options: none"),
        ("npu_fusion", {"anything": 1}, "kernel 'npu_fusion' has no option 'anything'; valid options: masked_value"),
        (
            "npu_fused_infer",
            {"masked_value": 1},
            "masked_value must be None or a negative number, the additive value your masks use for a masked "
            "position (e.g. -10000.0 for diffusers' masks); got 1",
        ),
    ],
)
def test_kernel_option_errors(name, options, message):
    with pytest.raises(KernelOptionError) as info:
        get_kernel(name, **options)
    assert str(info.value) == message


def test_default_choice_on_cpu_is_sdpa_and_on_npu_the_inference_or_training_op():
    query = key = value = torch.randn(1, 2, 4, 16, dtype=torch.float16)
    call = AttentionCall.from_arguments(query, key, value)
    assert select.resolve_kernel(None, call).name == "sdpa"
    with emulated_torch_npu():
        assert select.resolve_kernel(None, call).name == "npu_fused_infer"
        training = AttentionCall.from_arguments(query.requires_grad_(), key, value)
        assert select.resolve_kernel(None, training).name == "npu_fusion"


def test_no_kernel_error_lists_every_kernels_reasons(no_torch_npu):
    call = AttentionCall.from_arguments(*(torch.randn(1, 1, 2, 4) for _ in range(3)))
    with pytest.raises(NoKernelError) as info:
        select.first_runnable(call, ["npu_fusion", "flash_attn"])
    message = str(info.value)
    assert message.startswith("no attention kernel can run this call (query (1, 1, 2, 4) float32 on cpu")
    assert "\n  npu_fusion:\n    - torch_npu is not installed" in message
    assert (
        "\n  flash_attn:\n    - flash_attn is not installed" in message
        or "flash_attn:\n    - tensors are on cpu" in message
    )
    assert set(info.value.reasons) == {"npu_fusion", "flash_attn"}


def test_a_selector_can_be_installed_and_restored():
    call = AttentionCall.from_arguments(*(torch.randn(1, 1, 2, 4) for _ in range(3)))
    previous = select.set_default_selector(lambda c: get_kernel("chunked"))
    try:
        assert select.resolve_kernel(None, call).name == "chunked"
    finally:
        assert select.set_default_selector(previous) is not previous
    assert select.resolve_kernel(None, call).name == "sdpa"


def test_register_a_custom_kernel_and_refuse_a_name_clash():
    class DoubleMath(npu_port.Kernel):
        name = "test_double_math"
        summary = "math kernel times two (test)"

        def run(self, call):
            return 2 * get_kernel("math").run(call)

    npu_port.register_kernel(DoubleMath)
    try:
        query = key = value = torch.randn(1, 1, 3, 4)
        out = npu_port.attention(query, key, value, kernel="test_double_math")
        torch.testing.assert_close(out, 2 * npu_port.attention(query, key, value, kernel="math"))

        class Clash(npu_port.Kernel):
            name = "math"

        with pytest.raises(ValueError, match="an attention kernel named 'math' is already registered"):
            npu_port.register_kernel(Clash)
    finally:
        from npu_port.attn import registry

        registry._KERNELS.pop("test_double_math", None)
        registry._DEFAULTS.pop("test_double_math", None)


def test_kernel_objects_are_configured_copies():
    chunked = get_kernel("chunked", max_bytes=1 << 20)
    assert chunked.options["max_bytes"] == 1 << 20
    assert repr(chunked) == "ChunkedKernel(max_bytes=1048576)"
    assert get_kernel(chunked, query_block=8).options == {**chunked.options, "query_block": 8}
    assert get_kernel("chunked") is get_kernel("chunked")  # default instances are shared
