"""Every feature of every adapter has a removal test: each ``test_removal_*.py`` module lists the features whose
pieces it takes away (``FEATURES``), and together they cover all of them — so a piece added to an adapter without a
scenario that proves its decline fails here."""

from __future__ import annotations

import importlib
from pathlib import Path

from npu_port.upstream import adapters

HERE = Path(__file__).parent


def _covered():
    covered = {}
    for path in sorted(HERE.glob("test_removal_*.py")):
        if path.name == Path(__file__).name:
            continue
        module = importlib.import_module(f"tests.upstream.{path.stem}")
        for feature in module.FEATURES:
            covered.setdefault(feature, []).append(path.name)
    return covered


def test_every_adapter_feature_has_a_removal_test():
    covered = _covered()
    missing = [f"{a.library}: {feature}" for a in adapters() for feature in a.features() if feature not in covered]
    assert missing == []


def test_removal_tests_name_only_features_that_exist():
    known = {feature for a in adapters() for feature in a.features()}
    assert sorted(set(_covered()) - known) == []
