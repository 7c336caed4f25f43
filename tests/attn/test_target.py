"""Kernels judge a call for another device (a plan made on a CPU for an NPU) with the same checks as a real run."""

from __future__ import annotations

import pytest
import torch

from npu_port.attn import AttentionCall, get_kernel
from npu_port.attn.target import Target
from npu_port.errors import DeviceError


def _call(dtype=torch.float16, head_dim=64):
    q = torch.zeros(1, 2, 8, head_dim, dtype=dtype)
    return AttentionCall.from_arguments(q, q, q)


def test_an_npu_kernel_runs_a_cpu_recorded_call_on_an_npu_target():
    call = _call()
    assert get_kernel("npu_fusion").reasons(call)  # here: torch_npu missing
    assert get_kernel("npu_fusion").reasons(call, Target.of("npu", "910B")) == []
    assert get_kernel("npu_fused_infer").reasons(call, Target.of("npu")) == []


@pytest.mark.parametrize("chip", ["910A", "310P"])
def test_chips_without_flash_attention_score_refuse_with_a_chip_reason(chip):
    reasons = get_kernel("npu_fusion").reasons(_call(), Target.of("npu", chip))
    assert [r.code for r in reasons] == ["chip"]
    assert str(reasons[0]).startswith(
        f"Ascend {chip} has no FlashAttentionScore: npu_fusion_attention is not available"
    )


def test_a_target_keeps_every_call_limit():
    reasons = get_kernel("npu_fused_infer").reasons(_call(torch.float32, head_dim=40), Target.of("npu"))
    assert [r.code for r in reasons] == ["dtype", "head-dim"]


def test_a_portable_kernel_on_a_target_device_it_does_not_serve():
    reasons = get_kernel("npu_fusion").reasons(_call(), Target.of("cuda"))
    assert [r.code for r in reasons] == ["device"]
    assert get_kernel("sdpa").reasons(_call(), Target.of("npu")) == []


def test_bad_targets_are_clear():
    with pytest.raises(DeviceError, match=r"unknown plan device 'tpu'; valid devices: npu, cuda, cpu"):
        Target.of("tpu")
    with pytest.raises(DeviceError, match=r"--chip names an Ascend chip; it applies to --device npu, not 'cuda'"):
        Target.of("cuda", "910B")
    assert Target.of("npu").describe() == "npu (910B)"


def test_only_the_ascend_ops_count_as_fused_by_default():
    target = Target.of("npu")
    assert get_kernel("npu_fusion").fused(_call(), target) is True
    assert get_kernel("npu_fused_infer").fused(_call(), target) is True
    assert get_kernel("math").fused(_call(), target) is False
    assert get_kernel("chunked").fused(_call(), target) is False
