"""Each test starts with no declines recorded and every adapter looking afresh, and leaves it so."""

from __future__ import annotations

import pytest

from npu_port.upstream import adapters, forget_declines


@pytest.fixture(autouse=True)
def _fresh_adapters():
    forget_declines()
    for adapter in adapters():
        adapter.reset()
    yield
    forget_declines()
    for adapter in adapters():
        adapter.reset()
