"""Only the adapters in ``npu_port/upstream/`` name the internals of diffusers and transformers.

Read with :mod:`ast` from every file (lazy imports inside functions included): outside the adapters, a module may
``import diffusers`` / ``import transformers`` and import their public top-level names (``from diffusers import
FluxPipeline``), but never a submodule (``from diffusers.hooks import ModelHook``), a dotted module name in a string
(``sys.modules.get("diffusers.models.attention")``), or an attribute chain into a submodule
(``diffusers.models.attention``). Each of those goes through the library's adapter, which resolves it by feature
detection and declines when it is missing (see ``npu_port/upstream/__init__.py``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

from npu_port.upstream import adapters

PACKAGE = Path(__file__).resolve().parents[2] / "npu_port"
ADAPTERS = PACKAGE / "upstream"
LIBRARIES = ("diffusers", "transformers")
_MODULE_STRING = re.compile(rf"^(?:{'|'.join(LIBRARIES)})\.[a-z_]")

#: Files allowed to name internals, each with why (none: every use goes through an adapter). The test below fails
#: for an entry that no longer names any (it must not hide a new use).
EXCEPTIONS: Dict[str, str] = {}


def _docstrings(tree: ast.AST) -> Set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _chain(node: ast.Attribute) -> Tuple[str, ...]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return tuple(reversed(parts))
    return ()


def uses(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, what) for each place ``path`` names a library's internals."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docstrings = _docstrings(tree)
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            root, _, rest = node.module.partition(".")
            if root in LIBRARIES and rest:
                yield node.lineno, f"from {node.module} import ..."
        elif isinstance(node, ast.Import):
            for alias in node.names:
                root, _, rest = alias.name.partition(".")
                if root in LIBRARIES and rest:
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if _MODULE_STRING.match(node.value):
                yield node.lineno, f"string {node.value!r}"
        elif isinstance(node, ast.Attribute) and id(node) not in inner:  # the whole chain, once
            chain = _chain(node)
            if len(chain) >= 2 and chain[0] in LIBRARIES and chain[1][:1].islower() and not chain[1].startswith("__"):
                yield node.lineno, ".".join(chain[:2])


def _files() -> Iterator[Path]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if ADAPTERS not in path.parents:
            yield path


def _relative(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def test_only_the_adapters_name_diffusers_and_transformers_internals():
    found = [
        f"{_relative(path)}:{line}: {what}"
        for path in _files()
        if _relative(path) not in EXCEPTIONS
        for line, what in uses(path)
    ]
    assert found == [], "go through npu_port.upstream.<library> (an adapter piece) instead"


def test_each_exception_still_names_internals():
    stale = [name for name in EXCEPTIONS if not list(uses(PACKAGE.parent / name))]
    assert stale == []


def test_every_adapter_piece_is_declared_once_with_a_feature_and_a_place():
    for adapter in adapters():
        for piece in adapter.pieces():
            assert piece.feature and (piece.where or piece.derive is not None), piece
            for spec in piece.where:
                module, _, attr = spec.partition(":")
                assert module.split(".")[0] == adapter.library, f"{adapter.library}: {piece.name} looks in {spec}"
