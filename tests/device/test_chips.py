"""The chip table: names users pass, the names torch_npu reports, and what each chip can do for attention."""

from __future__ import annotations

import pytest

from npu_port.device.chips import CHIPS, DEFAULT_CHIP, chip_from_device_name, current_chip, resolve_chip
from npu_port.errors import DeviceError


@pytest.mark.parametrize(
    "text, chip",
    [
        ("910B", "910B"),
        ("910b", "910B"),
        ("Ascend910B", "910B"),
        (" ascend 910c ", "910C"),
        ("310P", "310P"),
        ("950", "950"),
        ("910A", "910A"),
        ("Ascend910B3", "910B"),
    ],
)
def test_users_name_chips_in_several_spellings(text, chip):
    assert resolve_chip(text).name == chip


def test_an_unknown_chip_names_the_valid_ones():
    with pytest.raises(DeviceError) as caught:
        resolve_chip("A100")
    assert str(caught.value) == "unknown Ascend chip 'A100'; valid chips: 910A, 910B, 910C, 950, 310P"


@pytest.mark.parametrize(
    "device_name, chip",
    [
        ("Ascend910B1", "910B"),
        ("Ascend910B4", "910B"),
        ("Ascend910_9392", "910C"),
        ("Ascend910_9382", "910C"),
        ("Ascend910A", "910A"),
        ("Ascend910ProB", "910A"),
        ("Ascend310P3", "310P"),
        ("Ascend950PR", "950"),
    ],
)
def test_torch_npu_device_names_map_to_chips(device_name, chip):
    assert chip_from_device_name(device_name).name == chip


def test_a_device_name_the_table_does_not_know_gives_none():
    assert chip_from_device_name("Ascend710") is None
    assert chip_from_device_name(None) is None


def test_only_910a_and_310p_lack_fused_attention():
    assert [c.name for c in CHIPS.values() if not c.fused_attention] == ["910A", "310P"]
    assert CHIPS[DEFAULT_CHIP].fused_attention


def test_no_chip_without_torch_npu_loaded(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    assert current_chip() is None
