"""Adding a kernel touches one module: tests/extension_kernel.py, registered here, shows up in every list that the
registry derives (listings, the default selection, auto's candidates, the router's configured kernels with their
strategy options, ``npu-port kernels`` and the doctor) and leaves the registry exactly as it was when taken out."""

from __future__ import annotations

import json

import pytest
import torch

import npu_port
from npu_port.attn import registry, select
from npu_port.cli.main import main as cli_main
from npu_port.doctor.checks_attention import check_attention_kernels
from npu_port.doctor.facts import Facts
from npu_port.errors import UnknownKernelError
from npu_port.strategy.registry import get_strategy
from npu_port.strategy.router import StrategyRouter, configured_kernels, fingerprint

from ..extension_kernel import Float64Kernel

NAME = Float64Kernel.name


def _state():
    """Everything the registry holds or derives, to compare before and after."""
    return (
        dict(registry._KERNELS),
        registry.kernel_names(),
        registry.priority_order(),
        registry.default_order(),
        get_strategy("auto").candidates,
        fingerprint(get_strategy("auto")),
    )


@pytest.fixture
def registered():
    before = _state()
    npu_port.register_kernel(Float64Kernel)
    try:
        yield before
    finally:
        registry.unregister_kernel(Float64Kernel)
    assert _state() == before


def test_the_built_in_orders_are_the_documented_ones():
    assert registry.kernel_names()[:7] == [
        "math", "sdpa", "chunked", "npu_fusion", "npu_fused_infer", "xformers", "flash_attn",
    ]  # fmt: skip
    assert registry.priority_order()[:7] == [
        "npu_fused_infer", "npu_fusion", "flash_attn", "xformers", "sdpa", "chunked", "math",
    ]  # fmt: skip
    assert registry.default_order() == ["npu_fused_infer", "npu_fusion", "sdpa", "chunked", "math"]
    assert npu_port.attn.DEFAULT_ORDER == select.DEFAULT_ORDER == tuple(registry.default_order())
    assert get_strategy("auto").candidates == tuple(registry.priority_order())


def test_a_registered_kernel_appears_in_every_derived_list(registered):
    names = [kernel.name for kernel in npu_port.kernels()]
    assert names == registered[1] + [NAME]  # no listing place declared: after the built-ins
    assert registry.default_order() == ["npu_fused_infer", "npu_fusion", "sdpa", NAME, "chunked", "math"]
    auto = get_strategy("auto")
    assert auto.candidates == (
        "npu_fused_infer",
        "npu_fusion",
        "flash_attn",
        "xformers",
        "sdpa",
        NAME,
        "chunked",
        "math",
    )
    assert fingerprint(auto)["candidates"] == list(auto.candidates)
    built = {kernel.name: kernel for kernel in configured_kernels(auto.with_overrides(memory_budget="1MiB"))}
    assert built[NAME].options == {"budget": 1 << 20}
    assert built["chunked"].options["max_bytes"] == 1 << 20
    assert configured_kernels(auto)[list(auto.candidates).index(NAME)].options == {"budget": None}


def test_a_registered_kernel_runs_and_matches_a_float64_reference(registered):
    torch.manual_seed(0)
    query, key, value = (torch.randn(2, 3, 5, 8) for _ in range(3))
    keep = torch.rand(2, 1, 5, 5) > 0.3
    out = npu_port.attention(query, key, value, keep, kernel=NAME)
    scores = (query.double() @ key.double().transpose(-1, -2)) / 8**0.5
    probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
    torch.testing.assert_close(out, (probs @ value.double()).float(), rtol=0, atol=1e-6)
    # the strategy option reaches the kernel: a budget below the scores' size refuses the call, with the reason
    router = StrategyRouter(get_strategy("auto").with_overrides(candidates=[NAME], memory_budget=64))
    with pytest.raises(
        npu_port.NpuPortError, match=f"{NAME}:\n    - needs 1200 bytes of scores, over the budget of 64"
    ):
        router(query, key, value)


def test_a_registered_kernel_is_in_npu_port_kernels_and_the_doctor(registered, capsys):
    assert cli_main(["kernels", "--json"]) == 0
    entries = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)["kernels"]}
    assert entries[NAME]["available"] is True
    assert entries[NAME]["summary"] == Float64Kernel.summary
    assert entries[NAME]["options"] == {"budget": {"default": None, "doc": "bytes of float64 scores allowed"}}
    assert cli_main(["kernels"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]  # listed after the built-ins
    assert last.split(None, 2) == [NAME, "available", Float64Kernel.summary]
    findings = {finding.check: finding for finding in check_attention_kernels(Facts())}
    assert findings[f"kernel-{NAME}"].status == "ok"


def test_unregistering_refuses_built_ins_and_unknown_names():
    with pytest.raises(ValueError, match="'math' is a built-in attention kernel; built-in kernels cannot be"):
        registry.unregister_kernel("math")
    with pytest.raises(UnknownKernelError, match="unknown attention kernel 'nope'; valid kernels: math, sdpa"):
        registry.unregister_kernel("nope")
    with pytest.raises(UnknownKernelError, match="unknown attention kernel 'test_float64'"):
        registry.unregister_kernel(Float64Kernel)  # not registered now
