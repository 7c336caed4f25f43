"""The layers of DESIGN.md hold: no module of npu-port imports a layer above its own, and its parts import each other
without cycles. Imports are read with :mod:`ast` from every file, those inside functions included (a lazy import is
still a dependency)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

PACKAGE = Path(__file__).resolve().parents[2] / "npu_port"

#: Each part of the package (a sub-package or a top-level module) and its layer: a part may import its own layer and
#: those below, never above. ``errors`` / ``reasons`` and the small helpers are the bottom; ``cli`` and the package's
#: own ``__init__`` (the public surface) the top.
LAYER = {
    "errors": 0,
    "reasons": 0,
    "settings": 0,
    "_optional": 0,
    "_version": 0,
    "atomic": 0,
    "weak": 0,
    "_patching": 0,
    "hits": 0,
    "support": 0,  # the support policy (version ranges), read by doctor, the adapters and the CI lanes
    "device": 1,
    "upstream": 1,  # the adapters to diffusers / transformers / gradio internals (feature detection, declines)
    "distributed": 1,
    "attn": 2,
    "console": 2,  # the quiet console of npu-port's own commands (uses the upstream adapters' logging switches)
    "strategy": 3,
    "strategies": 3,
    "npu_setup": 3,
    "integrations": 4,
    "dropins": 4,
    "fallbacks": 4,
    "shims": 4,  # the old paths of dropins / fallbacks, deprecated (one release)
    "runtime": 4,
    "fuse": 4,  # fused DiT ops (npu_port.fuse_ops); reached from the strategy layer through its key applier
    "parallel": 4,  # multi-device: diffusers context parallelism, CFG parallelism (uses integrations)
    "bench": 5,
    "doctor": 5,
    "scan": 4,  # read by runtime: npu-port run rewrites what a scan rule finds
    "infer": 5,
    "plan": 5,
    "diff": 5,  # npu-port diff: records runs (strategy's router watch) and compares them; runs pipelines via infer  # npu-port plan: records a run (uses infer, strategy, integrations) and judges it for a target
    "demo": 5,
    "cli": 6,
    "__main__": 7,
    "__init__": 7,
}
#: Known upward imports, each with the issue that removes it. Empty is the goal.
EXCEPTIONS: Dict[Tuple[str, str], str] = {}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    relative = path.with_suffix("").relative_to(PACKAGE.parent)
    name = ".".join(relative.parts)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def imports() -> Iterator[Tuple[str, str, int, str]]:
    """(importing part, imported part, line, file) for every import of npu-port's own modules."""
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                    names = [target] if node.module else [f"{target}.{alias.name}" for alias in node.names]
                else:
                    names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name == "npu_port" or name.startswith("npu_port."):
                    yield _part(module), _part(name), node.lineno, str(path.relative_to(PACKAGE.parent))


def test_every_part_has_a_layer():
    parts = {_part(_module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert parts - set(LAYER) == set(), "give each new part of npu_port a layer in LAYER"


def test_nothing_imports_a_layer_above_its_own():
    upward = [
        f"{where}:{line}: {source} (layer {LAYER[source]}) imports {target} (layer {LAYER[target]})"
        for source, target, line, where in imports()
        if source != target and LAYER.get(target, 99) > LAYER.get(source, 99) and (source, target) not in EXCEPTIONS
    ]
    assert upward == []


def test_the_parts_import_each_other_without_cycles():
    graph: Dict[str, Set[str]] = defaultdict(set)
    for source, target, _, _ in imports():
        if source != target and (source, target) not in EXCEPTIONS:
            graph[source].add(target)

    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            node = stack.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(graph[node])
        return False

    cycles = sorted(f"{a} <-> {b}" for a in list(graph) for b in graph[a] if a < b and reaches(b, a))
    assert cycles == []


def test_each_known_exception_still_exists():
    """An exception that no longer occurs is removed from the list (it must not hide a new one)."""
    found = {(source, target) for source, target, _, _ in imports()}
    assert sorted(set(EXCEPTIONS) - found) == []
