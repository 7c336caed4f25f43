"""The documentation site as the tests see it: the generated-tables hook (docs/hooks/generated.py, loaded from its
file as mkdocs loads it) and the pages that hold each placeholder."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import List

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
HOOK = DOCS / "hooks" / "generated.py"


@functools.lru_cache(maxsize=None)
def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generated_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def placeholder(name: str) -> str:
    return f"<!-- generated: {name} -->"


def pages_with(name: str) -> List[str]:
    """The docs pages (relative to docs/) that hold ``<!-- generated: name -->`` alone on a line."""
    line = placeholder(name)
    return sorted(
        page.relative_to(DOCS).as_posix()
        for page in DOCS.rglob("*.md")
        if line in page.read_text(encoding="utf-8").splitlines()
    )
