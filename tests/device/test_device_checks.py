"""Device-type checks in the project's own code see the redirect target as CUDA-compatible (npu_port.runtime
.device_checks): exactly the ``.type`` comparisons with "cuda" and ``.is_cuda`` reads, nothing else, line numbers kept."""

from __future__ import annotations

import textwrap
import traceback
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from npu_port.runtime.device_checks import HELPER, DeviceChecks


def _load(source: str, target: str = "cpu", name: str = "project.mod"):
    checks = DeviceChecks(target)
    source = textwrap.dedent(source)
    transformed = checks.transform(source, f"/project/{name.replace('.', '/')}.py", name)
    namespace: dict = {}
    if transformed is None:
        exec(compile(source, "<untouched>", "exec"), namespace)
    else:
        code, extra = transformed
        namespace.update(extra)
        exec(code, namespace)
    return checks, namespace, transformed is not None


def test_an_assert_on_cuda_tensors_passes_for_the_target_and_is_recorded_with_its_line():
    checks, ns, rewritten = _load(
        """
        def flash(q):
            assert q.device.type == "cuda", "flash attention needs CUDA tensors"
            assert q.is_cuda
            return q * 2
        """
    )
    assert rewritten
    assert torch.equal(ns["flash"](torch.ones(2)), torch.full((2,), 2.0))
    assert [(r.line, r.code, r.hits) for r in checks.rewrites] == [
        (3, 'q.device.type == "cuda"', 1),
        (4, "q.is_cuda", 1),
    ]
    assert checks.summary()[0] == {
        "rule": "NPU390",
        "module": "project.mod",
        "file": "/project/project/mod.py",
        "line": 3,
        "code": 'q.device.type == "cuda"',
        "hits": 1,
    }


@pytest.mark.parametrize(
    "expression, expected",
    [
        ('x.device.type == "cuda"', True),
        ('x.device.type != "cuda"', False),
        ('"cuda" == x.device.type', True),
        ('"cuda" != x.device.type', False),
        ('x.device.type in ("cuda", "xpu")', True),
        ('x.device.type not in ["cuda"]', False),
        ('x.device.type in {"cuda"}', True),
        ("x.is_cuda", True),
        ("not x.is_cuda", False),
    ],
)
def test_each_form_takes_the_branch_it_took_on_cuda(expression, expected):
    checks, ns, rewritten = _load(f"def check(x):\n    return {expression}\n")
    assert rewritten and ns["check"](torch.zeros(1)) is expected
    assert all(r.hits == 1 for r in checks.rewrites)


@pytest.mark.parametrize(
    "source",
    [
        'def check(x):\n    return x.device.type == "cpu"\n',  # not a CUDA comparison
        'def check(x):\n    return str(x.device) == "cuda"\n',  # not a .type read
        'def check(x):\n    return "cuda" in x.name\n',  # a substring test, not a device check
        'def check(x):\n    return x.device.type < "cuda"\n',  # not an (in)equality
        'def check(x):\n    return x.device.type == "cuda" == "cuda"\n',  # chained: left as written
        "def check(x):\n    return x.type\n",  # no "cuda" at all
        'DEVICE = "cuda"\ndef check(x):\n    return x.device.type == DEVICE\n',  # through a variable: left alone
    ],
)
def test_everything_else_is_left_exactly_as_written(source):
    checks, _, rewritten = _load(source)
    assert not rewritten and checks.rewrites == []


def test_other_device_types_and_other_objects_keep_their_answers():
    _, ns, _ = _load(
        """
        def kind(x):
            return x.type == "cuda"

        def flag(x):
            return x.is_cuda
        """,
        target="npu",
    )
    assert ns["kind"](torch.device("cpu")) is False  # cpu is not the target (npu): honest
    assert ns["kind"](torch.device("cuda")) is True

    class NotATensor:
        is_cuda = "whatever the project set"
        type = "cpu"

    assert ns["flag"](NotATensor()) == "whatever the project set"
    assert ns["kind"](NotATensor()) is False


def test_a_cuda_target_rewrites_nothing():
    checks, _, rewritten = _load('def check(x):\n    return x.device.type == "cuda"\n', target="cuda")
    assert not rewritten and checks.rewrites == []


def test_line_numbers_and_future_imports_survive_the_rewrite():
    checks, ns, rewritten = _load(
        """
        from __future__ import annotations


        def fail(x: SomeUndefinedAnnotation) -> None:
            if x.device.type == "cuda":
                raise ValueError("on purpose")
        """
    )
    assert rewritten
    assert ns["fail"].__annotations__ == {"x": "SomeUndefinedAnnotation", "return": "None"}
    with pytest.raises(ValueError) as info:
        ns["fail"](torch.zeros(1))
    frame = traceback.extract_tb(info.tb)[-1]
    assert frame.filename == "/project/project/mod.py" and frame.lineno == 7


def test_a_file_that_does_not_parse_is_left_to_pythons_own_error():
    checks = DeviceChecks("cpu")
    assert checks.transform('if x.device.type == "cuda"\n', "/p/bad.py", "bad") is None
    assert checks.rewrites == []


def test_the_helper_name_is_all_a_rewritten_module_gains():
    _, ns, _ = _load('def check(x):\n    return x.device.type == "cuda"\n')
    assert {name for name in ns if not name.startswith("__") or name == HELPER} == {"check", HELPER}


DEVICE_TYPES = ["cpu", "cuda", "npu", "meta", "xpu"]


@given(
    target=st.sampled_from(["cpu", "npu", "xpu"]),
    actual=st.sampled_from(DEVICE_TYPES),
    operator=st.sampled_from(["==", "!=", "in", "not in"]),
    others=st.lists(st.sampled_from(DEVICE_TYPES), max_size=2),
    flipped=st.booleans(),
)
def test_property_the_rewrite_answers_as_if_the_target_were_cuda(target, actual, operator, others, flipped):
    if operator in ("in", "not in"):
        choices = ("cuda", *others)
        expression = f"x.type {operator} {choices!r}"
    else:
        choices = None
        expression = f'"cuda" {operator} x.type' if flipped else f'x.type {operator} "cuda"'
    checks, ns, rewritten = _load(f"def check(x):\n    return {expression}\n", target=target)
    assert rewritten
    seen = "cuda" if actual == target else actual  # what CUDA-written code would have seen on CUDA
    expected = {
        "==": seen == "cuda",
        "!=": seen != "cuda",
        "in": choices is not None and seen in choices,
        "not in": choices is not None and seen not in choices,
    }[operator]
    assert ns["check"](SimpleNamespace(type=actual)) is expected  # torch.device("npu") needs torch_npu
    assert checks.rewrites[0].hits == (1 if actual == target else 0)


def test_after_deactivation_rewritten_code_answers_as_written():
    checks, ns, _ = _load("def check(x):\n    return x.device.type == 'cuda', x.is_cuda\n")
    assert ns["check"](torch.zeros(1)) == (True, True)
    checks.deactivate()
    assert ns["check"](torch.zeros(1)) == (False, False)
    assert [r.hits for r in checks.rewrites] == [1, 1]


def test_activate_then_deactivate_undoes_the_device_checks_of_modules_it_rewrote(tmp_path, monkeypatch):
    import importlib
    import sys

    import npu_port

    (tmp_path / "npu_port_dc_probe.py").write_text("def on_cuda(x):\n    return x.device.type == 'cuda'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    activation = npu_port.activate("cpu", watch=[str(tmp_path)])
    try:
        module = importlib.import_module("npu_port_dc_probe")
        assert module.on_cuda(torch.zeros(1)) is True
    finally:
        activation.deactivate()
        sys.modules.pop("npu_port_dc_probe", None)
    assert module.on_cuda(torch.zeros(1)) is False
