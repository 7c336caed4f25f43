"""tensor_stats on tensors whose memory is not laid out plainly: the same record as for a plain copy."""

from __future__ import annotations

import pytest
import torch

from npu_port.diff.stats import tensor_stats


@pytest.mark.parametrize(
    "tensor",
    [
        torch.tensor(5).expand(1),  # Wan's timestep: one element, stride 0 (torch calls it contiguous)
        torch.tensor([7.5], dtype=torch.float64).as_strided((1,), (0,)),
        torch.tensor([True]).expand(1),
        torch.arange(6).reshape(2, 3).t(),
        torch.zeros(1, dtype=torch.bfloat16).expand(1, 1),
    ],
)
def test_odd_strides_give_the_record_of_a_plain_copy(tensor):
    plain = tensor.clone(memory_format=torch.contiguous_format)
    assert plain.reshape(-1).stride() in ((1,), ())
    assert tensor_stats(tensor) == tensor_stats(plain)
