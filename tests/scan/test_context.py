"""Names resolved through each file's imports and aliases, in statement order; where code runs at import time."""

from __future__ import annotations

import ast
import textwrap

import pytest

from npu_port.scan.context import PythonFile


def _calls(text: str):
    source = PythonFile.parse("m.py", textwrap.dedent(text))
    return {ast.unparse(call.func): name for call, name in source.calls()}, source


@pytest.mark.parametrize(
    "text, call, expected",
    [
        ("import torch.cuda.amp as amp\namp.autocast()", "amp.autocast", "torch.cuda.amp.autocast"),
        ("from torch.cuda.amp import autocast\nautocast()", "autocast", "torch.cuda.amp.autocast"),
        ("import torch\nautocast = torch.cuda.amp.autocast\nautocast()", "autocast", "torch.cuda.amp.autocast"),
        ("import torch as th\nth.cuda.synchronize()", "th.cuda.synchronize", "torch.cuda.synchronize"),
        ("import torch.cuda\ntorch.cuda.synchronize()", "torch.cuda.synchronize", "torch.cuda.synchronize"),
        ("def flash_attn_func(q, k, v):\n    pass\nflash_attn_func(1, 2, 3)", "flash_attn_func", None),
        (
            "from flash_attn import flash_attn_func\ndef flash_attn_func(q):\n    pass\nflash_attn_func(1)",
            "flash_attn_func",
            None,
        ),
        (
            "try:\n    import flash_attn\nexcept ImportError:\n    flash_attn = None\nflash_attn.flash_attn_func()",
            "flash_attn.flash_attn_func",
            "flash_attn.flash_attn_func",
        ),
        ("import torch\ndef f(torch):\n    torch.cuda.synchronize()", "torch.cuda.synchronize", None),
        (
            "def f():\n    import torch\n    torch.cuda.synchronize()",
            "torch.cuda.synchronize",
            "torch.cuda.synchronize",
        ),
        ("from . import flash_attn_func\nflash_attn_func()", "flash_attn_func", None),
        ("print(1)", "print", None),
    ],
)
def test_names_resolve_through_imports_and_aliases(text, call, expected):
    calls, _ = _calls(text)
    assert calls[call] == expected


def test_import_time_is_module_level_defaults_and_decorators_not_bodies_or_main():
    source = PythonFile.parse(
        "m.py",
        textwrap.dedent(
            """
            import torch
            a = torch.cuda.current_device()
            def f(device=torch.cuda.current_device()):
                return torch.cuda.current_device()
            @register(torch.cuda.current_device())
            def g():
                pass
            class C:
                d = torch.cuda.current_device()
            if __name__ == "__main__":
                torch.cuda.current_device()
            """
        ),
    )
    lines = sorted(
        call.lineno
        for call, name in source.calls()
        if name == "torch.cuda.current_device" and source.at_import_time(call)
    )
    assert lines == [3, 4, 6, 10]
