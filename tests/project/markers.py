"""Which tests start another process: read from the test files' code with ``ast``, so the ``e2e`` marker cannot drift.

A test starts another process when its body, a module-level helper it calls, or a fixture it takes (from its own file
or a ``conftest.py`` above it) calls ``subprocess.run`` / ``Popen`` / ``check_output``, uses ``sys.executable`` or
torchrun, or drives the browser — directly or through other helpers of the same files.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Set, Tuple

TESTS = Path(__file__).resolve().parents[1]
#: ``subprocess`` functions that start a process (``CompletedProcess`` or a monkeypatched ``subprocess.run`` does not).
SPAWN_CALLS = {"run", "Popen", "check_output", "check_call", "call"}
#: Names whose use means "another process": the interpreter's path, torchrun and its ``start_processes`` (the
#: parallel tests' ranks), and the browser the demo's tests drive.
SPAWNING = {"executable", "torchrun", "start_processes", "chromium", "sync_playwright"}


def _names(node: ast.AST) -> Set[str]:
    """Names ``node`` uses, ``subprocess.<call>(...)`` recorded as ``"subprocess"``."""
    found: Set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            found.add(child.id)
        elif isinstance(child, ast.Attribute):
            found.add(child.attr)
            if isinstance(child.value, ast.Name) and child.value.id == "subprocess" and child.attr in SPAWN_CALLS:
                found.add("spawns")
    found.discard("subprocess")
    return found


def _functions(tree: ast.Module) -> Dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _parameters(fn: ast.FunctionDef) -> Set[str]:
    return {a.arg for a in fn.args.args + fn.args.kwonlyargs}


def _conftests(path: Path) -> Iterator[Path]:
    folder = path.parent
    while True:
        candidate = folder / "conftest.py"
        if candidate.exists():
            yield candidate
        if folder == TESTS:
            return
        folder = folder.parent


def spawning_tests(path: Path) -> List[str]:
    """Names of the test functions in ``path`` that start another process."""
    functions: Dict[str, ast.FunctionDef] = {}
    for source in [*reversed(list(_conftests(path))), path]:
        functions.update(_functions(ast.parse(source.read_text(encoding="utf-8"))))
    uses = {name: _names(fn) | _parameters(fn) for name, fn in functions.items()}
    spawning = {name for name, used in uses.items() if used & (SPAWNING | {"spawns"})}
    changed = True
    while changed:  # close over helpers and fixtures calling helpers and fixtures
        changed = False
        for name, used in uses.items():
            if name not in spawning and used & spawning:
                spawning.add(name)
                changed = True
    own = _functions(ast.parse(path.read_text(encoding="utf-8")))
    return sorted(name for name in own if name.startswith("test_") and name in spawning)


def marked_e2e(path: Path) -> Set[str]:
    """Test functions of ``path`` that carry ``pytest.mark.e2e`` (themselves, or the whole module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module_marked = any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
        and "e2e" in _names(node.value)
        for node in tree.body
    )
    marked = set()
    for name, fn in _functions(tree).items():
        if module_marked or any("e2e" in _names(d) for d in fn.decorator_list):
            marked.add(name)
    return marked


def test_files() -> Iterable[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "fixtures" not in p.parts)


def unmarked() -> List[Tuple[str, str]]:
    """``(file, test)`` for every test that starts a process without the ``e2e`` marker."""
    missing = []
    for path in test_files():
        marked = marked_e2e(path)
        missing += [(str(path.relative_to(TESTS)), t) for t in spawning_tests(path) if t not in marked]
    return missing
