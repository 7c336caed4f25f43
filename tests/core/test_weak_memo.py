"""``npu_port.weak.Memo``: values derived from a tensor, kept while that very tensor lives and is unchanged."""

from __future__ import annotations

import gc
import weakref

import torch

from npu_port.weak import Memo, tensor_version


class Compute:
    def __init__(self):
        self.count = 0

    def __call__(self):
        self.count += 1
        return torch.full((2,), float(self.count))


def test_a_value_is_computed_once_per_source_version_and_key():
    memo, compute, source = Memo(), Compute(), torch.zeros(3)
    first = memo.get(source, tensor_version(source), "a", compute)
    assert memo.get(source, tensor_version(source), "a", compute) is first
    memo.get(source, tensor_version(source), "b", compute)
    assert compute.count == 2 and memo.computed == 2
    source.add_(1)  # in place: the version counter moves, the old values go
    assert memo.get(source, tensor_version(source), "a", compute) is not first
    assert compute.count == 3


def test_an_equal_tensor_is_another_source():
    memo, compute = Memo(), Compute()
    memo.get(torch.zeros(3), 0, "a", compute)
    memo.get(torch.zeros(3), 0, "a", compute)
    assert compute.count == 2


def test_values_go_with_their_source_and_never_keep_it_alive():
    memo, source = Memo(), torch.zeros(3)
    memo.get(source, tensor_version(source), "a", Compute())
    gone = weakref.ref(source)
    del source
    gc.collect()
    assert gone() is None and len(memo) == 0


def test_inference_tensors_are_computed_every_time():
    memo, compute = Memo(), Compute()
    with torch.inference_mode():
        source = torch.zeros(3)
    assert tensor_version(source) is None
    for _ in range(3):
        memo.get(source, tensor_version(source), "a", compute)
    assert compute.count == 3 and len(memo) == 0


def test_the_least_recently_used_source_goes_first():
    memo, compute = Memo(capacity=2, per_source=2), Compute()
    sources = [torch.zeros(1) for _ in range(3)]
    for source in sources[:2]:
        memo.get(source, 0, "a", compute)
    memo.get(sources[0], 0, "a", compute)  # used again: sources[1] is now the oldest
    memo.get(sources[2], 0, "a", compute)
    assert compute.count == 3 and len(memo) == 2
    memo.get(sources[1], 0, "a", compute)
    assert compute.count == 4
    for key in ("b", "c"):
        memo.get(sources[1], 0, key, compute)
    memo.get(sources[1], 0, "a", compute)  # per_source=2: "a" was dropped for "c"
    assert compute.count == 7
