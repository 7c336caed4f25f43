"""A registered attention strategy that returns NaN: what a broken kernel or port does, for the tests that check
that ``npu-port infer`` and the demo fail closed on it. Registered through the public API (``register_kernel``,
``register_strategy``); removed afterwards."""

from __future__ import annotations

import contextlib
from typing import Iterator

import npu_port
from npu_port.attn import get_kernel
from npu_port.strategy.registry import unregister_strategy

STRATEGY = "test-nan"
KERNEL = "test_nan_attention"


class NanKernel(npu_port.Kernel):
    name = KERNEL
    summary = "the math kernel's output times NaN (test)"

    def run(self, call):
        return get_kernel("math").run(call) * float("nan")


@contextlib.contextmanager
def nan_strategy() -> Iterator[str]:
    from npu_port.attn import registry

    npu_port.register_kernel(NanKernel)
    try:
        npu_port.register_strategy(STRATEGY, kernel=KERNEL, description="NaN attention (test)")
        try:
            yield STRATEGY
        finally:
            unregister_strategy(STRATEGY)
    finally:  # there is no unregister_kernel: the registry's own tables are cleaned, as test_kernel_selection does
        registry._KERNELS.pop(KERNEL, None)
        registry._DEFAULTS.pop(KERNEL, None)
