"""What a scan rule is: a stable code, a one-line message, a severity, the devices it concerns, a fix kind, and a
docstring with an example — one class per rule, one module per rule (``npu_port/scan/rules/``), registered by
:func:`register_rule`, as ruff's rules are.

Severities, most serious first:

- ``import``: the module cannot even be imported without CUDA (an unguarded ``import flash_attn``);
- ``runtime``: raises when the line is reached (``torch.cuda.set_device(0)`` on a machine without CUDA);
- ``handled``: works under npu-port already — ``npu-port run``, a strategy or a drop-in deals with it, and the finding
  says which (``handled_by``);
- ``perf``: works, but slow or memory-hungry on the target (hand-written attention that builds the whole score matrix);
- ``deprecated``: works today, but uses an API that is going away (``torch.cuda.amp``: ``torch.amp`` replaces it);
- ``guarded``: CUDA-only, but reachable only where CUDA is (behind ``if torch.cuda.is_available():``): the guard may
  be all that keeps the program running without CUDA, so the line is shown, with the guard named, below the ones that
  break;
- ``info``: worth knowing, changes nothing by itself.

Fix kinds: ``safe`` (a rewrite that keeps the behaviour on CUDA and is portable elsewhere), ``unsafe`` (a rewrite
that may change behaviour), ``manual`` (the finding says what to do). ``npu-port fix`` applies the first kind, and
the second only when asked (``--unsafe-fixes``); a rule declaring either has a :meth:`Rule.rewrite`, or its findings
are listed with the manual ones.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Dict, Iterator, List, Optional, Pattern, Tuple, Type, Union

if TYPE_CHECKING:  # imported for annotations only: the contexts import this module
    from .context import PythonFile, TextFile

SEVERITIES = ("import", "runtime", "handled", "perf", "deprecated", "guarded", "info")
FIX_KINDS = ("safe", "unsafe", "manual")
#: The devices a rule can concern: an Ascend NPU, a CPU, a GPU where CUDA-only builds (xformers, flash-attn) fail.
TARGETS = ("npu", "cpu", "gpu")


@dataclass(frozen=True)
class Finding:
    """One place a rule matched. Lines and columns are 1-based (editors' and SARIF's convention).

    ``line`` is where the CUDA-only call or name is: a node spread over lines is reported from the line of the part
    :func:`node_focus` names (the ``.cuda`` of a call chain, the ``"cuda"`` of a keyword, the first name of a
    parenthesised ``from`` import) to where the node ends. ``anchor`` is then the whole node's span (None: the
    finding's own): ``npu-port fix`` finds the node to rewrite there (:attr:`span`)."""

    code: str
    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    message: str
    severity: str
    fix: str
    handled_by: Optional[str] = None
    snippet: str = ""
    anchor: Optional[Tuple[int, int, int, int]] = None

    @property
    def span(self) -> Tuple[int, int, int, int]:
        """``(line, column, end_line, end_column)`` of the whole node the rule matched: what a rewrite replaces."""
        return self.anchor or (self.line, self.column, self.end_line, self.end_column)

    def to_dict(self) -> Dict[str, object]:
        return {
            "code": self.code,
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "message": self.message,
            "severity": self.severity,
            "fix": self.fix,
            "handled_by": self.handled_by,
            "snippet": self.snippet,
        }


class Rule:
    """Base class of scan rules. A subclass sets the class attributes and implements :meth:`check` (Python files) or
    :meth:`check_text` (other files, chosen by ``file_patterns``); its docstring is the rule's documentation (what
    it finds, why it matters, an example), shown by ``npu-port scan --rules`` and the README's rule table.

    ``triggers``: substrings at least one of which a file must contain for the rule to look at it — the scan parses
    only files some rule may match, which is what keeps a 5,000-file tree fast. A trigger may also be a compiled
    regular expression, for a word that is everywhere in one use and rare in the one the rule reads (``._C`` is in
    every ``torch._C`` call; an import of a compiled ``_C`` module is what NPU104 looks for).
    """

    code: ClassVar[str] = ""
    name: ClassVar[str] = ""
    message: ClassVar[str] = ""
    severity: ClassVar[str] = "info"
    targets: ClassVar[Tuple[str, ...]] = ("npu", "cpu")
    fix: ClassVar[str] = "manual"
    handled_by: ClassVar[Optional[str]] = None
    triggers: ClassVar[Tuple[Union[str, Pattern[str]], ...]] = ()
    #: More triggers, of which the file must *also* contain one (empty: no second condition) — for a rule whose
    #: words are common alone: NPU410 reads float64 only in RoPE code, so a file must also name rope/rotary/freqs.
    also_triggers: ClassVar[Tuple[Union[str, Pattern[str]], ...]] = ()
    #: Globs (matched against the file name) of the non-Python files :meth:`check_text` reads; empty: Python only.
    file_patterns: ClassVar[Tuple[str, ...]] = ()

    def check(self, source: "PythonFile") -> Iterator[Finding]:
        return iter(())

    def check_text(self, source: "TextFile") -> Iterator[Finding]:
        return iter(())

    #: Modules the rewrite needs imported (added once, after the file's own imports).
    fix_imports: ClassVar[Tuple[str, ...]] = ()
    #: Qualified names the rewrite replaces: a ``from`` import of one left unused afterwards is removed.
    fix_replaces: ClassVar[Tuple[str, ...]] = ()
    #: The torch release the rewritten code needs (``"2.3"``); ``fix`` leaves the finding, saying so, where the torch
    #: installed beside it is older or absent. None: any torch npu-port supports.
    fix_needs_torch: ClassVar[Optional[str]] = None
    #: The ``fix --target`` values the rewrite is for (None: every target). A rewrite that brings npu-port into the
    #: project (the drop-in guard around ``import flash_attn``) is not made for ``torch``, whose fixes need nothing
    #: but torch: the finding is listed, saying which target makes it.
    fix_targets: ClassVar[Optional[Tuple[str, ...]]] = None
    #: Whether :meth:`rewrite` replaces the whole statement, not the node: it is then given the small statement found
    #: (``import flash_attn``) on a line of its own — a ``SimpleStatementLine``, with the comments above it and the
    #: line's trailing one — and returns the statements to put there (a ``try``, which no line can hold).
    rewrites_statement: ClassVar[bool] = False
    #: What :meth:`rewrite` writes for (:mod:`npu_port.scan.targets`): ``fix`` sets it on the instance it asks.
    target: str = "npu-port"

    def rewrite(self, node: Any, finding: Finding) -> Optional[Any]:
        """The libcst node to put in place of ``node`` (found exactly where ``finding`` is), or None to leave it;
        with ``rewrites_statement``, a statement or a list of them. Rules with a ``safe`` or ``unsafe`` fix implement
        it; see :mod:`npu_port.scan.fix`."""
        return None

    def combine(self, first: Any, second: Any) -> Optional[Any]:
        """With ``rewrites_statement``: one statement doing what ``first`` then ``second`` do — two statements this
        fix just wrote, adjacent in one block, ``second`` written by this rule — or None to keep both."""
        return None

    @classmethod
    def summary(cls) -> str:
        """The docstring's first paragraph, on one line."""
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        return " ".join(doc.split())


@dataclass
class _Registry:
    rules: Dict[str, Type[Rule]] = field(default_factory=dict)


_REGISTRY = _Registry()


def register_rule(cls: Type[Rule]) -> Type[Rule]:
    """Class decorator: add ``cls`` to the registry under its ``code`` (checked: unique, well-formed)."""
    problems = []
    if not (cls.code.startswith("NPU") and cls.code[3:].isdigit() and len(cls.code) == 6):
        problems.append(f"code {cls.code!r} is not NPU followed by three digits")
    if cls.severity not in SEVERITIES:
        problems.append(f"severity {cls.severity!r} is not one of {', '.join(SEVERITIES)}")
    if cls.fix not in FIX_KINDS:
        problems.append(f"fix {cls.fix!r} is not one of {', '.join(FIX_KINDS)}")
    if not set(cls.targets) <= set(TARGETS) or not cls.targets:
        problems.append(f"targets {cls.targets!r} must be some of {', '.join(TARGETS)}")
    if not cls.name or not cls.message or not (cls.__doc__ or "").strip():
        problems.append("a rule needs a name, a message and a docstring with an example")
    if not cls.triggers:
        problems.append("a rule needs triggers (substrings a file must contain for it to look)")
    if cls.severity == "handled" and not cls.handled_by:
        problems.append("a 'handled' rule says what handles it (handled_by)")
    existing = _REGISTRY.rules.get(cls.code)
    if existing is not None and existing is not cls:
        problems.append(f"code {cls.code} is already taken by {existing.__name__}")
    if problems:
        raise ValueError(f"scan rule {cls.__name__}: " + "; ".join(problems))
    _REGISTRY.rules[cls.code] = cls
    return cls


def rules() -> List[Type[Rule]]:
    """Every registered rule, by code (importing the built-in rules package registers them)."""
    from . import rules as _builtin  # noqa: F401

    return [_REGISTRY.rules[code] for code in sorted(_REGISTRY.rules)]


def node_span(node: ast.AST) -> Tuple[int, int, int, int]:
    """``(line, column, end_line, end_column)``, 1-based, of an ast node."""
    line = getattr(node, "lineno", 1)
    column = getattr(node, "col_offset", 0) + 1
    end_line = getattr(node, "end_lineno", None) or line
    end_column = (getattr(node, "end_col_offset", None) or column - 1) + 1
    return line, column, end_line, end_column


def node_focus(node: ast.AST) -> Tuple[int, int]:
    """``(line, column)``, 1-based (column in UTF-8 bytes, as ast counts), of the part of ``node`` a finding points
    at — the line a reader looks for, where a statement spreads over several: the attribute name of a call or an
    attribute (``.cuda`` in ``(torch.zeros(3)\n.cuda())``), the value of a keyword (``device=\n"cuda"``), the first
    name of a plain import (``import os, \\\nflash_attn``); else where the node starts — a ``from`` import's first
    line, which names the module (``from flash_attn import (\nflash_attn_func,\n)``: the module is what is CUDA-only;
    a rule about one imported name points at it with ``at=``)."""
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.keyword):
            node = node.value
        elif isinstance(node, ast.Import) and hasattr(node.names[0], "lineno"):  # Python >= 3.10
            node = node.names[0]
        elif isinstance(node, ast.Attribute) and node.end_lineno is not None and node.end_col_offset is not None:
            return node.end_lineno, node.end_col_offset - len(node.attr.encode("utf-8")) + 1
        else:
            return getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1
