"""The diffusers logging pieces taken away: npu-port's quiet console declines (one warning), nothing raises."""

from __future__ import annotations

import warnings

import pytest

from npu_port.upstream.diffusers import ADAPTER
from npu_port.upstream.diffusers import pipelines as upstream

from .removal import one_decline, remove

pytest.importorskip("diffusers")

FEATURES = (upstream.LOGGING,)
PIECES = [p.name for p in ADAPTER.pieces() if p.feature in FEATURES]


@pytest.mark.parametrize("name", PIECES)
@pytest.mark.parametrize("quiet", ["_quiet_diffusers", "_no_loading_bars"])
def test_without_logging_the_quiet_console_declines(monkeypatch, name, quiet):
    from npu_port.infer import multi

    remove(monkeypatch, ADAPTER, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(multi, quiet)()
    one_decline(caught, ADAPTER, name)
