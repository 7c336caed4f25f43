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
        # a stand-in bound in the other branch of an if/else or try/except keeps the library's meaning
        (
            "try:\n    from flash_attn import f\nexcept ImportError:\n    def f(q):\n        pass\nf(1)",
            "f",
            "flash_attn.f",
        ),
        (
            "import torch\ntry:\n    autocast = torch.cuda.amp.autocast\nexcept AttributeError:\n"
            "    class autocast:\n        pass\nautocast()",
            "autocast",
            "torch.cuda.amp.autocast",
        ),
        (
            "if new:\n    from torch.backends.cuda import sdp_kernel\nelif mid:\n    sdp_kernel = a.b\nelse:\n"
            "    sdp_kernel = None\nsdp_kernel()",
            "sdp_kernel",
            "torch.backends.cuda.sdp_kernel",
        ),
        (  # a redefinition that is no other branch is the file's own
            "from torch.cuda.amp import autocast\nif old:\n    class autocast:\n        pass\nautocast()",
            "autocast",
            None,
        ),
        (  # an if/else inside a function is about the function's own names
            "from torch.cuda.amp import autocast\ndef f():\n    if a:\n        pass\n    else:\n"
            "        autocast = g\n    autocast()",
            "autocast",
            None,
        ),
        # `torch` bound by nothing but a star import is torch; other names are not guessed
        ("from .layers import *\ntorch.cuda.synchronize()", "torch.cuda.synchronize", "torch.cuda.synchronize"),
        ("from .layers import *\nnn.Linear()", "nn.Linear", None),
        ("torch.cuda.synchronize()", "torch.cuda.synchronize", None),
        (
            "def f():\n    import torch\n    torch.cuda.synchronize()",
            "torch.cuda.synchronize",
            "torch.cuda.synchronize",
        ),
        ("from . import flash_attn_func\nflash_attn_func()", "flash_attn_func", None),
        ("print(1)", "print", None),
        # a class body's names are not seen from its methods
        (
            "import torch\nclass A:\n    torch = 3\n    def m(self):\n        torch.cuda.synchronize()",
            "torch.cuda.synchronize",
            "torch.cuda.synchronize",
        ),
        ("import torch\nclass A:\n    torch = 3\n    torch.cuda.synchronize()", "torch.cuda.synchronize", None),
        # every other way a scope binds a name makes it the file's own
        ("import torch\nf = lambda torch: torch.cuda.synchronize()", "torch.cuda.synchronize", None),
        (
            "import torch\ndef f(xs):\n    for torch in xs:\n        torch.cuda.synchronize()",
            "torch.cuda.synchronize",
            None,
        ),
        (
            "import torch\ndef f(xs):\n    for i, (a, *torch) in xs:\n        torch.cuda.synchronize()",
            "torch.cuda.synchronize",
            None,
        ),
        (
            "import torch\ndef f():\n    with g() as (a, torch):\n        torch.cuda.synchronize()",
            "torch.cuda.synchronize",
            None,
        ),
        (
            "import torch\ndef f():\n    try:\n        pass\n    except E as torch:\n        torch.cuda.synchronize()",
            "torch.cuda.synchronize",
            None,
        ),
        (
            "import torch\ndef f(x):\n    if (torch := x):\n        torch.cuda.synchronize()",
            "torch.cuda.synchronize",
            None,
        ),
        ("import torch\ndef f(x):\n    a, torch = x\n    torch.cuda.synchronize()", "torch.cuda.synchronize", None),
        (
            "import torch\ndef f(x):\n    match x:\n        case [torch, *rest]:\n            torch.cuda.synchronize()",
            "torch.cuda.synchronize",
            None,
        ),
        (
            "import torch\ndef f(x):\n    match x:\n        case {**torch}:\n            torch.cuda.synchronize()",
            "torch.cuda.synchronize",
            None,
        ),
        # a comprehension's target is its own: the module's torch stays torch around it
        (
            "import torch\nnames = [torch for torch in range(3)]\ntorch.cuda.synchronize()",
            "torch.cuda.synchronize",
            "torch.cuda.synchronize",
        ),
        # a loop in the except of a try is a stand-in there, as an assignment is
        (
            "try:\n    import flash_attn\nexcept ImportError:\n    for flash_attn in ():\n        pass\nflash_attn.f()",
            "flash_attn.f",
            "flash_attn.f",
        ),
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


def test_the_node_index_is_the_walk_without_contexts_and_operators():
    """``nodes`` / ``of`` give what ``ast.walk`` gives, in its order, less the shared ``Load``/``Store`` contexts and
    operator singletons (which no rule reads as nodes); every node has its parent and its scope."""
    import npu_port.scan.context as context

    text = open(context.__file__, encoding="utf-8").read()
    source = PythonFile.parse("context.py", text)
    singletons = (ast.expr_context, ast.operator, ast.unaryop, ast.boolop, ast.cmpop)
    walked = [n for n in ast.walk(ast.parse(text)) if not isinstance(n, singletons)]
    assert [type(n) for n in source.nodes] == [type(n) for n in walked]
    assert [ast.unparse(n) for n in source.of(ast.Call)] == [ast.unparse(n) for n in walked if type(n) is ast.Call]
    two = source.of(ast.Import, ast.ImportFrom)
    assert [ast.unparse(n) for n in two] == [ast.unparse(n) for n in walked if type(n) in (ast.Import, ast.ImportFrom)]
    assert all(source.parents[n] is not None for n in source.nodes[1:])
    for node in source.of(ast.Call):  # the scope is the innermost def/class/lambda/module, as a walk up finds it
        up = source.parents[node]
        while not isinstance(up, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            up = source.parents[up]
        assert source.scope_of(node) is up
