"""The one settings helper (npu_port.settings) that kernel options, strategy options and Ascend options all use:
unknown names fail with the valid ones, bad values with what is allowed, each as the caller's NpuPortError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import npu_port
from npu_port.attn import get_kernel
from npu_port.attn.kernels.base import Option
from npu_port.device.npu_catalogue import ACL_OPTIONS
from npu_port.errors import KernelOptionError, NpuOptionError, NpuPortError, StrategyOptionError
from npu_port.settings import InvalidSetting, Setting, validate
from npu_port.strategy.spec import OPTIONS, check_option


def _positive(value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSetting(f"must be an int >= 1, got {value!r}")
    return value


DECLARED = {"size": Setting(4, _positive, "a size"), "name": Setting("x", str, "a name")}


class _Error(NpuPortError, ValueError):
    pass


def test_unknown_names_are_reported_first_with_the_valid_ones():
    with pytest.raises(_Error) as info:
        validate(
            {"size": 0, "zz": 1, "aa": 2},
            DECLARED,
            error=_Error,
            unknown="{what}: no {name!r}; valid: {valid}",
            what="t",
        )
    assert str(info.value) == "t: no 'aa'; valid: size, name"


def test_bad_values_say_what_is_allowed_in_the_callers_words():
    with pytest.raises(_Error) as info:
        validate({"size": 0}, DECLARED, error=_Error, invalid="{name}={value!r}: {problem}")
    assert str(info.value) == "size=0: must be an int >= 1, got 0"


@given(size=st.integers(min_value=1), with_name=st.booleans())
def test_valid_values_are_normalised_and_defaults_fill_in(size, with_name):
    given_values = {"size": size, **({"name": 5} if with_name else {})}
    assert validate(given_values, DECLARED, error=_Error) == given_values | ({"name": "5"} if with_name else {})
    full = validate(given_values, DECLARED, error=_Error, defaults=True)
    assert full == {"size": size, "name": "5" if with_name else "x"} and list(full) == ["size", "name"]


def test_the_three_frameworks_use_it():
    assert Option is Setting
    assert all(isinstance(setting, Setting) for setting in OPTIONS.values())
    assert all(isinstance(rule, Setting) for rule in ACL_OPTIONS.values())
    with pytest.raises(KernelOptionError, match="option upcast must be True or False, got 'yes'"):
        get_kernel("math", upcast="yes")
    with pytest.raises(StrategyOptionError, match="^repeats must be an integer >= 1, got 0$"):
        check_option("repeats", 0)
    with pytest.raises(NpuOptionError, match="^npu: unknown key 'jit'; valid keys: jit_compile, "):
        npu_port.apply_npu_options({"npu": {"jit": True}}, dry_run=True)
