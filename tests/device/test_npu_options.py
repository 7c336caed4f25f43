"""Ascend runtime options: exact checks and errors, all-or-nothing, the order of calls, restore(), the dry run.

On NPU paths torch_npu is the recorder of tests/fakes/torch_npu_recorder.py (not an emulator: it records the calls
of torch_npu 2.13's documented API and refuses what torch_npu's own set_option check refuses). Off NPU, torch_npu is
made unimportable so detection says why on any machine.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_port
from npu_port import _optional
from npu_port.device import npu_options
from npu_port.device.detect import backend_status
from npu_port.device.npu_options import NEW_PROCESSES_ONLY, Action
from npu_port.errors import NpuOptionError, UnknownStrategyError
from npu_port.strategy.registry import get_strategy

from ..fakes import torch_npu_recorder

ASCEND_VARS = ("TASK_QUEUE_ENABLE", "PYTORCH_NPU_ALLOC_CONF", "ASCEND_LAUNCH_BLOCKING", "DIFFUSERS_ATTN_BACKEND")
PROFILE_CALLS = [
    ("npu.set_option", ({"ACL_PRECISION_MODE": "must_keep_origin_dtype", "ACL_OP_COMPILER_CACHE_MODE": "enable"},)),
    ("npu.set_compile_mode", (False,)),
]
NOTHING_TO_APPLY = "nothing to apply: give a profile name, a YAML path or a dict"


@pytest.fixture(autouse=True)
def clean_env():
    """The variables these tests set start unset, and the whole environment is put back afterwards."""
    saved = dict(os.environ)
    for name in ASCEND_VARS:
        os.environ.pop(name, None)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def install_recorder(monkeypatch):
    """Installs the torch_npu recorder as ``torch_npu`` and ``torch.npu``; returns the module."""

    def install(initialized: bool = False):
        fake = torch_npu_recorder.build_module(initialized=initialized)
        monkeypatch.setitem(sys.modules, "torch_npu", fake)
        monkeypatch.setattr(torch, "npu", fake.npu, raising=False)
        _optional.forget("torch_npu")
        return fake

    yield install
    _optional.forget("torch_npu")


@pytest.fixture
def recorder(install_recorder):
    return install_recorder()


def env_action(key, value, previous=None, note=None):
    return Action("env", key, value, f"os.environ[{key!r}] = {value!r}", previous=previous, restorable=True, note=note)


def acl_action(key, value):
    return Action("acl_options", key, value, f"torch_npu.npu.set_option({{{key!r}: {value!r}}})")


PROFILE_ACTIONS = [
    env_action("TASK_QUEUE_ENABLE", "2"),
    env_action("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True"),
    acl_action("ACL_PRECISION_MODE", "must_keep_origin_dtype"),
    acl_action("ACL_OP_COMPILER_CACHE_MODE", "enable"),
    Action("npu", "jit_compile", False, "torch_npu.npu.set_compile_mode(jit_compile=False)"),
]


# --- applying with torch_npu present ---------------------------------------------------------------------------------


def test_the_ascend_910b_profile_is_applied_env_first_then_one_set_option_then_the_compile_mode(recorder):
    env_seen_by_set_option = []
    record = recorder.npu.set_option

    def set_option(option):
        env_seen_by_set_option.append(os.environ.get("TASK_QUEUE_ENABLE"))
        record(option)

    recorder.npu.set_option = set_option

    report = npu_port.apply_npu_options("ascend-910b")

    assert recorder.calls == PROFILE_CALLS
    assert env_seen_by_set_option == ["2"]
    assert os.environ["TASK_QUEUE_ENABLE"] == "2"
    assert os.environ["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    assert report.dry_run is False and report.reason is None and report.warnings == []
    assert report.actions == PROFILE_ACTIONS
    assert report.format() == textwrap.dedent(
        """\
        applied:
          os.environ['TASK_QUEUE_ENABLE'] = '2'  (was unset)
          os.environ['PYTORCH_NPU_ALLOC_CONF'] = 'expandable_segments:True'  (was unset)
          torch_npu.npu.set_option({'ACL_PRECISION_MODE': 'must_keep_origin_dtype'})
          torch_npu.npu.set_option({'ACL_OP_COMPILER_CACHE_MODE': 'enable'})
          torch_npu.npu.set_compile_mode(jit_compile=False)
        restore() cannot undo (torch_npu cannot read them back): acl_options.ACL_PRECISION_MODE, acl_options.ACL_OP_COMPILER_CACHE_MODE, npu.jit_compile"""
    )
    assert json.loads(json.dumps(report.as_dict()))["actions"][0] == {
        "section": "env",
        "key": "TASK_QUEUE_ENABLE",
        "value": "2",
        "call": "os.environ['TASK_QUEUE_ENABLE'] = '2'",
        "previous": None,
        "restorable": True,
        "note": None,
    }


def test_restore_puts_env_back_exactly_set_and_unset_and_is_safe_twice(recorder):
    os.environ["TASK_QUEUE_ENABLE"] = "1"
    report = npu_port.apply_npu_options("ascend-910b")
    assert report.actions[0] == env_action("TASK_QUEUE_ENABLE", "2", previous="1")
    assert os.environ["TASK_QUEUE_ENABLE"] == "2"

    report.restore()
    assert os.environ["TASK_QUEUE_ENABLE"] == "1"
    assert "PYTORCH_NPU_ALLOC_CONF" not in os.environ
    assert recorder.calls == PROFILE_CALLS  # ACL options and the compile mode cannot be read back, so stay

    os.environ["TASK_QUEUE_ENABLE"] = "0"  # changed by someone else after the restore
    report.restore()
    assert os.environ["TASK_QUEUE_ENABLE"] == "0"


def test_attributes_are_set_after_the_compile_mode_and_the_readable_ones_restored(recorder):
    npu = {"conv_allow_hf32": False, "allow_internal_format": False, "matmul_allow_hf32": True, "jit_compile": True}
    report = npu_options.apply_npu_options({"npu": npu})

    assert recorder.calls == [
        ("npu.set_compile_mode", (True,)),
        ("npu.config.allow_internal_format", (False,)),
        ("npu.matmul.allow_hf32", (True,)),
        ("npu.conv.allow_hf32", (False,)),
    ]
    assert report.actions[1:] == [
        Action("npu", "allow_internal_format", False, "torch_npu.npu.config.allow_internal_format = False"),
        Action(
            "npu", "matmul_allow_hf32", True, "torch_npu.npu.matmul.allow_hf32 = True", previous=False, restorable=True
        ),
        Action(
            "npu", "conv_allow_hf32", False, "torch_npu.npu.conv.allow_hf32 = False", previous=True, restorable=True
        ),
    ]
    del recorder.calls[:]
    report.restore()
    report.restore()
    assert recorder.calls == [("npu.conv.allow_hf32", (True,)), ("npu.matmul.allow_hf32", (False,))]
    assert recorder.npu.matmul.allow_hf32 is False and recorder.npu.conv.allow_hf32 is True


def test_values_are_normalised_to_the_strings_torch_npu_wants(recorder):
    report = npu_options.apply_npu_options(
        {
            "env": {"TASK_QUEUE_ENABLE": 2, "INF_NAN_MODE_ENABLE": True, "ASCEND_RT_VISIBLE_DEVICES": " 0, 1 "},
            "acl_options": {"ACL_OP_DEBUG_LEVEL": 0, "ACL_OP_COMPILER_CACHE_MODE": False, "MM_BMM_ND_ENABLE": True},
        }
    )
    assert [(a.key, a.value) for a in report.actions] == [
        ("TASK_QUEUE_ENABLE", "2"),
        ("INF_NAN_MODE_ENABLE", "1"),
        ("ASCEND_RT_VISIBLE_DEVICES", "0,1"),
        ("ACL_OP_DEBUG_LEVEL", "0"),
        ("ACL_OP_COMPILER_CACHE_MODE", "disable"),
        ("MM_BMM_ND_ENABLE", "enable"),
    ]
    assert recorder.calls == [
        (
            "npu.set_option",
            ({"ACL_OP_DEBUG_LEVEL": "0", "ACL_OP_COMPILER_CACHE_MODE": "disable", "MM_BMM_ND_ENABLE": "enable"},),
        )
    ]


def test_a_failing_torch_npu_call_puts_back_the_env_it_had_set(recorder):
    os.environ["TASK_QUEUE_ENABLE"] = "1"

    def broken_set_option(option):
        raise RuntimeError("ACL error 100000")

    recorder.npu.set_option = broken_set_option
    with pytest.raises(NpuOptionError) as caught:
        npu_port.apply_npu_options("ascend-910b")
    assert str(caught.value) == (
        "setting NPU options failed (RuntimeError: ACL error 100000); the environment variables and attributes set "
        "before the failure were put back"
    )
    assert os.environ["TASK_QUEUE_ENABLE"] == "1" and "PYTORCH_NPU_ALLOC_CONF" not in os.environ


def test_dry_run_true_sets_nothing_even_with_an_npu(recorder):
    report = npu_port.apply_npu_options("ascend-910b", dry_run=True)
    assert report.dry_run is True and report.reason == "dry_run=True"
    assert report.actions == PROFILE_ACTIONS
    assert recorder.calls == [] and "TASK_QUEUE_ENABLE" not in os.environ
    report.restore()
    assert recorder.calls == []


# --- off NPU --------------------------------------------------------------------------------------------------------


def test_off_npu_it_is_a_dry_run_that_sets_nothing_and_says_why(no_torch_npu):
    reason = backend_status("npu").reason
    assert reason.code == "package-missing"
    os.environ["TASK_QUEUE_ENABLE"] = "1"
    before = dict(os.environ)

    report = npu_port.apply_npu_options("ascend-910b")

    assert dict(os.environ) == before
    assert report.dry_run is True and report.reason == f"no usable NPU: {reason}"
    assert report.actions == [env_action("TASK_QUEUE_ENABLE", "2", previous="1")] + PROFILE_ACTIONS[1:]
    assert report.format().splitlines()[:3] == [
        f"dry run (no usable NPU: {reason}) — would set:",
        "  os.environ['TASK_QUEUE_ENABLE'] = '2'  (currently '1')",
        "  os.environ['PYTORCH_NPU_ALLOC_CONF'] = 'expandable_segments:True'  (currently unset)",
    ]
    report.restore()
    assert dict(os.environ) == before


def test_dry_run_false_off_npu_is_an_error_naming_the_reason(no_torch_npu):
    reason = backend_status("npu").reason
    with pytest.raises(NpuOptionError, match=re.escape(f"cannot apply NPU options: no usable NPU: {reason}")):
        npu_port.apply_npu_options("ascend-910b", dry_run=False)
    assert "TASK_QUEUE_ENABLE" not in os.environ


def test_dry_run_must_be_none_or_a_bool(no_torch_npu):
    with pytest.raises(NpuOptionError, match=re.escape("dry_run must be None, True or False, got 'yes'")):
        npu_options.apply_npu_options({}, dry_run="yes")


# --- refused settings -----------------------------------------------------------------------------------------------

VALID_ACL_KEYS = (
    "ACL_PRECISION_MODE, ACL_OP_SELECT_IMPL_MODE, ACL_OPTYPELIST_FOR_IMPLMODE, ACL_AICORE_NUM, ACL_OP_DEBUG_LEVEL, "
    "ACL_DEBUG_DIR, ACL_OP_COMPILER_CACHE_MODE, ACL_OP_COMPILER_CACHE_DIR, ACL_OP_DEBUG_OPTION, MM_BMM_ND_ENABLE"
)


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"acl_options": {"ACL_PRECISON_MODE": "must_keep_origin_dtype"}},
            f"acl_options: unknown key 'ACL_PRECISON_MODE'; valid keys: {VALID_ACL_KEYS}",
        ),
        (
            {"acl_options": {"ACL_PRECISION_MODE": "fp16"}},
            "acl_options.ACL_PRECISION_MODE: 'fp16' is not allowed; valid values: allow_fp32_to_fp16, must_keep_origin_dtype",
        ),
        (
            {"acl_options": {"ACL_AICORE_NUM": 0}},
            "acl_options.ACL_AICORE_NUM: 0 is not allowed; valid values: an integer from 1 to 32",
        ),
        (
            {"acl_options": {"ACL_AICORE_NUM": "33"}},
            "acl_options.ACL_AICORE_NUM: '33' is not allowed; valid values: an integer from 1 to 32",
        ),
        (
            {"acl_options": {"ACL_OP_DEBUG_LEVEL": True}},
            "acl_options.ACL_OP_DEBUG_LEVEL: True is not allowed; valid values: 0, 1, 2, 3, 4",
        ),
        (
            {"acl_options": {"ACL_OP_COMPILER_CACHE_DIR": "/cache", "ACL_OP_DEBUG_LEVEL": 1}},
            "acl_options.ACL_OP_COMPILER_CACHE_DIR: the operator compile cache is only used with ACL_OP_DEBUG_LEVEL 0 "
            "or 3, but ACL_OP_DEBUG_LEVEL is '1'; drop one of them",
        ),
        (
            {"acl_options": {"ACL_DEBUG_DIR": ["/tmp"]}},
            "acl_options.ACL_DEBUG_DIR: ['/tmp'] is not allowed; valid values: a string (a directory path)",
        ),
        (
            {"env": {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512"}},
            "env.PYTORCH_NPU_ALLOC_CONF: 'expandable_segments:True,max_split_size_mb:512' is not allowed; "
            "expandable_segments:True cannot be combined with max_split_size_mb (the docs say they are incompatible)",
        ),
        (
            {"env": {"PYTORCH_NPU_ALLOC_CONF": "garbage_collection_threshold:1.0"}},
            "env.PYTORCH_NPU_ALLOC_CONF: 'garbage_collection_threshold:1.0' is not allowed; "
            "garbage_collection_threshold must be a number strictly between 0 and 1, got '1.0'",
        ),
        (
            {"env": {"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:20"}},
            "env.PYTORCH_NPU_ALLOC_CONF: 'max_split_size_mb:20' is not allowed; "
            "max_split_size_mb: '20' is not allowed; valid values: an integer >= 21",
        ),
        (
            {"env": {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:true"}},
            "env.PYTORCH_NPU_ALLOC_CONF: 'expandable_segments:true' is not allowed; "
            "expandable_segments: 'true' is not allowed; valid values: True, False",
        ),
        (
            {"env": {"PYTORCH_NPU_ALLOC_CONF": "roundup_power2_divisions:4"}},
            "env.PYTORCH_NPU_ALLOC_CONF: 'roundup_power2_divisions:4' is not allowed; unknown allocator option "
            "'roundup_power2_divisions'; valid options: max_split_size_mb, garbage_collection_threshold, "
            "expandable_segments, base_addr_aligned_kb",
        ),
        (
            {"env": {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments"}},
            "env.PYTORCH_NPU_ALLOC_CONF: 'expandable_segments' is not allowed; 'expandable_segments' is not key:value; "
            "write options as key:value separated by commas",
        ),
        (
            {"env": {"HCCL_CONNECT_TIMEOUT": "60"}},
            "env.HCCL_CONNECT_TIMEOUT: '60' is not allowed; valid values: an integer from 120 to 7200",
        ),
        (
            {"env": {"TASK_QUEUE_ENABLE": True}},
            "env.TASK_QUEUE_ENABLE: True is not allowed; valid values: 0, 1, 2",
        ),
        (
            {"env": {"ASCEND_RT_VISIBLE_DEVICES": "0,0"}},
            "env.ASCEND_RT_VISIBLE_DEVICES: '0,0' is not allowed; valid values: comma-separated device ids "
            "(integers >= 0, each once), e.g. '0,1'",
        ),
        (
            {"env": {"HCCL_OP_EXPANSION_MODE": "aiv"}},
            "env.HCCL_OP_EXPANSION_MODE: 'aiv' is not allowed; valid values: AI_CPU, AIV, HOST",
        ),
        (
            {"env": {"MY-VAR": "1"}},
            "env: 'MY-VAR' is not a valid environment variable name; use letters, digits and '_', not starting with a digit",
        ),
        (
            {"env": {"DIFFUSERS_ATTN_BACKEND": True}},
            "env.DIFFUSERS_ATTN_BACKEND: True is not allowed; valid values: a string without NUL characters (or an integer)",
        ),
        (
            {"npu": {"jit_compile": "false"}},
            "npu.jit_compile: 'false' is not allowed; valid values: true, false",
        ),
        (
            {"npu": {"jit": False}},
            "npu: unknown key 'jit'; valid keys: jit_compile, allow_internal_format, matmul_allow_hf32, conv_allow_hf32",
        ),
        ({"npu": [("jit_compile", False)]}, "npu must be a mapping of name: value, got list [('jit_compile', False)]"),
        (
            42,
            "settings must be a mapping with acl_options / npu / env sections, or an object with those attributes "
            "(such as a Strategy); got int",
        ),
    ],
)
def test_invalid_settings_are_refused_with_the_valid_choices(recorder, settings, message):
    with pytest.raises(NpuOptionError) as caught:
        npu_options.apply_npu_options(settings)
    assert str(caught.value) == message
    assert recorder.calls == []


def test_one_bad_entry_late_in_the_dict_means_nothing_is_set(recorder):
    settings = {
        "env": {"TASK_QUEUE_ENABLE": "2", "DIFFUSERS_ATTN_BACKEND": "_native_npu"},
        "acl_options": {"ACL_PRECISION_MODE": "must_keep_origin_dtype"},
        "npu": {"jit_compile": False, "matmul_allow_hf32": "yes"},
    }
    with pytest.raises(NpuOptionError, match=re.escape("npu.matmul_allow_hf32: 'yes' is not allowed")):
        npu_options.apply_npu_options(settings)
    assert recorder.calls == []
    assert "TASK_QUEUE_ENABLE" not in os.environ and "DIFFUSERS_ATTN_BACKEND" not in os.environ


# --- warnings and notes ---------------------------------------------------------------------------------------------

DEPRECATED = (
    "acl_options.ACL_OP_SELECT_IMPL_MODE is deprecated: torch_npu 2.13 does not recommend setting it "
    "(accuracy or performance may not be optimal)"
)


def test_a_deprecated_acl_option_warns_once_and_is_still_applied(recorder):
    with pytest.warns(UserWarning, match=re.escape(DEPRECATED)) as caught:
        report = npu_options.apply_npu_options({"acl_options": {"ACL_OP_SELECT_IMPL_MODE": "high_precision"}})
    assert [str(w.message) for w in caught] == [DEPRECATED]
    assert report.warnings == [DEPRECATED]
    assert recorder.calls == [("npu.set_option", ({"ACL_OP_SELECT_IMPL_MODE": "high_precision"},))]
    assert report.format().endswith(
        f"\nwarning: {DEPRECATED}\nrestore() cannot undo (torch_npu cannot read them back): acl_options.ACL_OP_SELECT_IMPL_MODE"
    )


def test_documented_pitfalls_warn(no_torch_npu):
    settings = {
        "acl_options": {"ACL_AICORE_NUM": 8},
        "env": {"ASCEND_LAUNCH_BLOCKING": 1, "HCCL_EXEC_TIMEOUT": "100"},
    }
    with pytest.warns(UserWarning) as caught:
        report = npu_options.apply_npu_options(settings)
    expected = [
        "env.ASCEND_LAUNCH_BLOCKING is '1': every operator runs synchronously (slow) and the task queue is off; use it "
        "for debugging only",
        "env.HCCL_EXEC_TIMEOUT is '100', not a multiple of 68: HCCL rounds it down to 68",
        "acl_options.ACL_AICORE_NUM has no effect in current CANN versions",
    ]
    assert report.warnings == expected
    assert [str(w.message) for w in caught] == expected


def test_variables_read_at_torch_npu_init_are_noted_when_it_is_already_initialised(install_recorder):
    install_recorder(initialized=True)
    env = {"TASK_QUEUE_ENABLE": "2", "DIFFUSERS_ATTN_BACKEND": "_native_npu", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    report = npu_options.apply_npu_options({"env": env})
    assert report.actions == [
        env_action("TASK_QUEUE_ENABLE", "2", note=NEW_PROCESSES_ONLY),
        env_action("DIFFUSERS_ATTN_BACKEND", "_native_npu"),
        env_action(
            "TORCH_DEVICE_BACKEND_AUTOLOAD", "0", note="read when torch is imported: takes effect in new processes only"
        ),
    ]
    assert f"note: env.TASK_QUEUE_ENABLE: {NEW_PROCESSES_ONLY}" in report.format().splitlines()


def test_no_init_note_before_torch_npu_initialises(recorder):
    report = npu_options.apply_npu_options({"env": {"TASK_QUEUE_ENABLE": "2"}})
    assert report.actions == [env_action("TASK_QUEUE_ENABLE", "2")]


# --- the facade -----------------------------------------------------------------------------------------------------


def test_facade_by_name_by_strategy_and_by_dict(recorder):
    npu_port.apply_npu_options("ascend-910b")
    npu_port.apply_npu_options(get_strategy("ascend-910b"))
    npu_port.apply_npu_options({"name": "mine", "candidates": ["sdpa"], "npu": {"jit_compile": False}})
    assert recorder.calls == PROFILE_CALLS + PROFILE_CALLS + [("npu.set_compile_mode", (False,))]


@pytest.mark.parametrize("as_path", [str, lambda path: path], ids=["str", "Path"])
def test_facade_by_yaml_path_resolves_extends_and_the_override_wins(recorder, tmp_path, as_path):
    path = tmp_path / "my-910b.yaml"
    path.write_text(
        "kind: profile\nextends: ascend-910b\nacl_options:\n  ACL_PRECISION_MODE: allow_fp32_to_fp16\n",
        encoding="utf-8",
    )
    report = npu_port.apply_npu_options(as_path(path))
    assert recorder.calls == [
        ("npu.set_option", ({"ACL_PRECISION_MODE": "allow_fp32_to_fp16", "ACL_OP_COMPILER_CACHE_MODE": "enable"},)),
        ("npu.set_compile_mode", (False,)),
    ]
    assert os.environ["TASK_QUEUE_ENABLE"] == "2"
    assert [a.key for a in report.actions] == [a.key for a in PROFILE_ACTIONS]


def test_facade_keyword_sections_are_merged_over_the_source_key_by_key(no_torch_npu):
    report = npu_port.apply_npu_options(
        "ascend-910b", env={"TASK_QUEUE_ENABLE": 1}, npu={"matmul_allow_hf32": True}, acl_options={}
    )
    assert [(a.section, a.key, a.value) for a in report.actions] == [
        ("env", "TASK_QUEUE_ENABLE", "1"),
        ("env", "PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True"),
        ("acl_options", "ACL_PRECISION_MODE", "must_keep_origin_dtype"),
        ("acl_options", "ACL_OP_COMPILER_CACHE_MODE", "enable"),
        ("npu", "jit_compile", False),
        ("npu", "matmul_allow_hf32", True),
    ]
    only_keywords = npu_port.apply_npu_options(env={"HCCL_BUFFSIZE": 400})
    assert [(a.key, a.value) for a in only_keywords.actions] == [("HCCL_BUFFSIZE", "400")]


def test_facade_errors(no_torch_npu):
    with pytest.raises(NpuOptionError, match=re.escape(NOTHING_TO_APPLY)):
        npu_port.apply_npu_options()
    with pytest.raises(NpuOptionError, match=re.escape(NOTHING_TO_APPLY)):
        npu_port.apply_npu_options(dry_run=True)
    with pytest.raises(UnknownStrategyError, match=re.escape("unknown attention strategy 'ascend-910c'")):
        npu_port.apply_npu_options("ascend-910c")
    with pytest.raises(NpuOptionError, match=re.escape("env must be a mapping of name: value, got str 'X=1'")):
        npu_port.apply_npu_options("ascend-910b", env="X=1")


def test_every_built_in_profile_passes_the_checks(no_torch_npu):
    for name in npu_port.list_strategies("profile"):
        assert npu_port.apply_npu_options(name).dry_run is True


# --- properties -----------------------------------------------------------------------------------------------------

_ALLOC_VALUES = {
    "max_split_size_mb": st.integers(21, 1 << 20).map(str),
    "garbage_collection_threshold": st.floats(0, 1, exclude_min=True, exclude_max=True).map(repr),
    "expandable_segments": st.sampled_from(["True", "False"]),
    "base_addr_aligned_kb": st.integers(0, 16).map(str),
}


def _compatible(options):
    return options.get("expandable_segments") != "True" or not {
        "max_split_size_mb",
        "garbage_collection_threshold",
    } & set(options)


def _written(draw, options):
    """``options`` in a random order, with random spaces around keys and values, as a user might write them."""
    items = draw(st.permutations(list(options.items())))
    space = st.sampled_from(["", " "])
    return items, ",".join(f"{draw(space)}{k}{draw(space)}:{draw(space)}{v}{draw(space)}" for k, v in items)


@st.composite
def valid_alloc_confs(draw):
    options = draw(st.fixed_dictionaries({}, optional=_ALLOC_VALUES).filter(lambda o: o and _compatible(o)))
    return _written(draw, options)


@st.composite
def expandable_with_max_split(draw):
    options = draw(st.fixed_dictionaries({}, optional=_ALLOC_VALUES))
    options.update(expandable_segments="True", max_split_size_mb=draw(_ALLOC_VALUES["max_split_size_mb"]))
    return _written(draw, options)[1]


def _alloc_conf_value(text):
    report = npu_options.apply_npu_options({"env": {"PYTORCH_NPU_ALLOC_CONF": text}}, dry_run=True)
    return report.actions[0].value


@settings(max_examples=200)
@given(valid_alloc_confs())
def test_valid_alloc_confs_are_accepted_and_round_trip(conf):
    items, text = conf
    normalised = _alloc_conf_value(text)
    assert normalised == ",".join(f"{k}:{v}" for k, v in items)
    assert dict(entry.split(":") for entry in normalised.split(",")) == dict(items)
    assert _alloc_conf_value(normalised) == normalised


@settings(max_examples=100)
@given(expandable_with_max_split())
def test_expandable_segments_true_with_max_split_size_mb_is_always_refused(text):
    with pytest.raises(
        NpuOptionError, match=re.escape("expandable_segments:True cannot be combined with max_split_size_mb")
    ):
        _alloc_conf_value(text)


_CHECKED_BY_TORCH_NPU = (
    "ACL_PRECISION_MODE",
    "ACL_OP_SELECT_IMPL_MODE",
    "ACL_AICORE_NUM",
    "ACL_OP_DEBUG_LEVEL",
    "ACL_OP_COMPILER_CACHE_MODE",
)
_DOCUMENTED_VALUES = ["allow_fp32_to_fp16", "must_keep_origin_dtype", "high_performance", "high_precision", "force"]
_ACL_VALUES = st.one_of(
    st.integers(-3, 40),
    st.integers(-3, 40).map(str),
    st.sampled_from(
        _DOCUMENTED_VALUES + ["enable", "disable", "05", "\u0663", "\u00b2"]
    ),  # Arabic-Indic 3, superscript 2
    st.text(max_size=4),
)


@settings(max_examples=300)
@given(st.sampled_from(_CHECKED_BY_TORCH_NPU), _ACL_VALUES)
def test_acl_values_are_accepted_exactly_when_torch_npu_accepts_them(key, value):
    """Same verdict as torch_npu's own check for its checked keys, and what we pass on passes that check too."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated / no-effect keys warn; that is tested above
        try:
            normalised = npu_options.apply_npu_options({"acl_options": {key: value}}, dry_run=True).actions[0].value
        except NpuOptionError:
            normalised = None
    assert (normalised is not None) == torch_npu_recorder.torch_npu_accepts(key, value)
    if normalised is not None:
        assert torch_npu_recorder.torch_npu_accepts(key, normalised)
        assert normalised == (str(int(value)) if key == "ACL_AICORE_NUM" else str(value))
