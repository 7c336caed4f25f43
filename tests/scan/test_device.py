"""The device family's table (npu_port/scan/rules/_device.py) against the torch installed here and against what
npu-port run's CUDA redirect really answers: the scan's classification must not drift from either."""

from __future__ import annotations

import warnings

import pytest
import torch

from npu_port.device.redirect import cuda_api
from npu_port.device.redirect.mapping import DeviceMapper
from npu_port.scan.rules import _device

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks torch's behaviour without CUDA")

#: Arguments for the table's names that need some (the rest are called with none).
ARGUMENTS = {
    "manual_seed": (0,),
    "manual_seed_all": (0,),
    "set_rng_state": (torch.random.get_rng_state(),),
    "set_rng_state_all": ([],),
    "set_device": (0,),
    "set_per_process_memory_fraction": (0.5,),
    "device": (0,),
    "stream": (None,),
    "set_stream": (None,),
    "can_device_access_peer": (0, 1),
    "caching_allocator_alloc": (8,),
    "nvtx.range_push": ("x",),
    "nvtx.range": ("x",),
    "nvtx.mark": ("x",),
    "set_sync_debug_mode": (0,),
    "get_device_properties": (0,),
    **{name: (2,) for name in _device.LEGACY_TENSOR_TYPES},
}
#: Not called here: they need a real callable, a CUDA pointer or would write files.
NOT_CALLED = {
    "make_graphed_callables",
    "amp.custom_fwd",
    "amp.custom_bwd",
    "caching_allocator_delete",
    "memory._dump_snapshot",
    "device_of",
    "ExternalStream",
    "graph",
    "memory_usage",
}


def _call(name):
    target = torch.cuda
    for part in name.split("."):
        target = getattr(target, part)
    result = target(*ARGUMENTS.get(name, ()))
    if hasattr(result, "__enter__"):  # context managers act on entry; leave at once (no state leaks to other tests)
        result.__enter__()
        result.__exit__(None, None, None)
    return result


@needs_no_cuda
@pytest.mark.parametrize("name", sorted(n for n in _device.CUDA_API if n not in NOT_CALLED))
def test_the_table_says_what_torch_does_without_cuda(name):
    kind = _device.classify(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if kind == _device.RAISES:
            with pytest.raises((AssertionError, AttributeError, RuntimeError, TypeError, KeyError, ImportError)):
                _call(name)
            return
        _call(name)
    if kind == _device.WARNS:
        assert caught, f"torch.cuda.{name} was expected to warn"


def test_the_legacy_tensor_types_are_the_redirects():
    assert _device.LEGACY_TENSOR_TYPES == cuda_api.LEGACY_TENSOR_TYPES


def test_what_the_table_calls_redirected_is_what_the_redirect_answers():
    answered = set(cuda_api._stand_ins(torch.device("cpu"), DeviceMapper("cpu"))) | {
        f"nvtx.{n}" for n in cuda_api.nvtx_api()
    }
    answered |= set(cuda_api.LEGACY_TENSOR_TYPES) | {"amp.autocast", "amp.GradScaler"}  # via torch.amp's __init__
    assert set(_device.REDIRECTED) <= answered
    # and the table classifies everything the redirect answers
    assert {n for n in answered if _device.classify(n) is None} == set()


def test_helpers_named_for_fixes_exist():
    import npu_port.device

    for helper in _device.HELPERS.values():
        assert hasattr(npu_port.device, helper.rsplit(".", 1)[1]), helper


@pytest.mark.parametrize(
    "text, expected",
    [
        ('"cuda"', True),
        ('"cuda:3"', True),
        ('f"cuda:{rank}"', True),
        ('"cuda:" + str(rank)', True),
        ('"cuda:%d" % rank', True),
        ('"cuda:{}".format(rank)', True),
        ('"cuda" if ok else "cpu"', True),
        ('"cpu"', False),
        ('"cudagraph"', False),
        ('f"using cuda:{rank}"', False),
        ('"npu:0"', False),
        ("device", False),
    ],
)
def test_cuda_literals(text, expected):
    import ast

    assert _device.is_cuda_literal(ast.parse(text, mode="eval").body) is expected
