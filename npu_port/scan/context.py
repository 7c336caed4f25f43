"""One file as the rules see it: its text, its syntax tree, and every name resolved through the file's imports.

A call is ``torch.cuda.synchronize`` because of what the names mean *in that file*: ``import torch.cuda.amp as amp``
makes ``amp.autocast`` ``torch.cuda.amp.autocast``; ``from torch.cuda.amp import autocast`` and ``autocast =
torch.cuda.amp.autocast`` make plain ``autocast`` the same; a project's own ``def flash_attn_func`` (or a parameter,
a local assignment, a loop, ``with``, ``except`` or ``match`` target, a walrus) makes ``flash_attn_func`` nothing of
the library's. Text matching gets all of these wrong.

The tree is Python's own :mod:`ast` and the resolver is ours (imports, ``from`` imports, aliases, assignments of
resolved names, the other bindings above, function, lambda and class scopes — a class body's names unseen from its
methods): one core reads about 540 files a second that way (npu-port's own 153 files: 1.8 ms each), where libcst's
parser with its scope and qualified-name providers reads about 9 (109 ms each) — and scanning a 5,000-file tree must
take seconds. Rewriting (``npu-port fix``, :mod:`.fix`) is libcst's job: it keeps comments and formatting, and parses
only the files that have something to fix.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from .rule import Finding, Rule, node_focus, node_span

#: What a name bound by the file itself resolves to: nothing of a library's.
LOCAL = "<local>"

_LINE_ENDS = re.compile(r"\r\n|\r|\n")


def split_lines(text: str) -> List[str]:
    """The lines as Python (and ast's line numbers) count them: only ``\\n``, ``\\r\\n`` and ``\\r`` end a line
    (``str.splitlines`` also splits at form feeds and other separators, and the numbers would drift)."""
    lines = _LINE_ENDS.split(text)
    return lines[:-1] if lines and lines[-1] == "" else lines


_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)

#: Fields that never hold a node a rule reads: names and numbers (``id``, ``attr``, ...), and the shared singleton
#: contexts and operators (``ctx``, ``op``, ``ops``: one ``ast.Load()`` object serves every read in the file). Not
#: walking them is a third of the tree's nodes; rules read ``BinOp.op`` from the node itself.
_NOT_CHILDREN = frozenset(
    ("id", "attr", "name", "arg", "asname", "module", "level", "kind", "type_comment", "conversion", "is_async")
    + ("ctx", "op", "ops", "tag", "simple", "lineno", "col_offset", "end_lineno", "end_col_offset")
)
_CHILD_FIELDS: Dict[type, Tuple[str, ...]] = {}


def _child_fields(kind: type) -> Tuple[str, ...]:
    """The fields of an ast node class that can hold child nodes (a constant's ``value`` is a Python value)."""
    fields = _CHILD_FIELDS.get(kind)
    if fields is None:
        skip = _NOT_CHILDREN | ({"value"} if kind in (ast.Constant, ast.MatchSingleton) else set())
        fields = _CHILD_FIELDS[kind] = tuple(f for f in kind._fields if f not in skip)
    return fields


#: Names that, bound by nothing but a ``from ... import *``, are what every Python file means by them.
_STAR_CONVENTIONS = frozenset(("torch",))

#: Statements that bind a name where they stand, in the scope they are in.
_BINDERS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
#: What else binds a name to a value of the file's own: a loop or ``with`` target, ``except ... as``, a walrus, a
#: lambda's parameters, a ``match`` capture. (A comprehension's target is its own scope's, which the file's scopes do
#: not model: it is left unbound rather than taken from the scope around it.)
_TARGET_BINDERS = (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.ExceptHandler, ast.NamedExpr, ast.Lambda)
_TARGET_BINDERS += (ast.MatchAs, ast.MatchStar, ast.MatchMapping)


@dataclass
class TextFile:
    """A non-Python file a rule reads line by line (requirements, YAML configs, CUDA sources)."""

    path: str
    text: str

    @property
    def lines(self) -> List[str]:
        return split_lines(self.text)

    def finding(self, rule: Rule, line: int, message: Optional[str] = None, column: int = 1) -> Finding:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return Finding(
            rule.code,
            self.path,
            line,
            column,
            line,
            len(text) + 1,
            message or rule.message,
            rule.severity,
            rule.fix,
            rule.handled_by,
            text.strip(),
        )


@dataclass
class PythonFile:
    """A parsed Python file: ``tree``, ``parents`` (node -> parent), :meth:`of` (nodes by type) and :meth:`resolve`."""

    path: str
    text: str
    tree: ast.Module
    parents: Dict[ast.AST, ast.AST] = field(default_factory=dict)
    _bindings: Dict[ast.AST, Dict[str, str]] = field(default_factory=dict)
    #: What rules compute from the whole file, once per file (every call resolved, the imports, ...).
    memo: Dict[str, Any] = field(default_factory=dict)
    #: Every node of the tree a rule can read, in ``ast.walk`` order (without contexts and operators): walked once
    #: here, read by every rule (walking the tree once per rule was most of a scan's time).
    nodes: List[ast.AST] = field(default_factory=list)
    #: node -> the innermost function, lambda, class or module containing it (see :meth:`scope_of`).
    _scopes: Dict[ast.AST, ast.AST] = field(default_factory=dict)
    #: node type -> the nodes of exactly that type, in walk order (see :meth:`of`).
    _by_type: Dict[type, List[ast.AST]] = field(default_factory=dict)
    _lines: Optional[List[str]] = None

    @classmethod
    def parse(cls, path: str, text: str) -> "PythonFile":
        """Parse ``text`` (a SyntaxError propagates: the engine reports it as a finding)."""
        source = cls(path, text, ast.parse(text, filename=path))
        tree = source.tree
        nodes: List[ast.AST] = [tree]
        parents = source.parents
        scopes = source._scopes
        by_type = source._by_type
        AST = ast.AST
        scope_kinds = frozenset(_SCOPES)
        fields_of = _CHILD_FIELDS
        for node in nodes:  # one breadth-first pass (ast.walk's order) recording parents, scopes and types
            kind = type(node)
            same = by_type.get(kind)
            if same is None:
                by_type[kind] = [node]
            else:
                same.append(node)
            inner = node if kind in scope_kinds else scopes.get(node, tree)
            fields = fields_of.get(kind)
            if fields is None:
                fields = _child_fields(kind)
            for name in fields:
                value = getattr(node, name, None)
                if value.__class__ is list:
                    for item in value:
                        if isinstance(item, AST):
                            parents[item] = node
                            scopes[item] = inner
                            nodes.append(item)
                elif isinstance(value, AST):
                    parents[value] = node
                    scopes[value] = inner
                    nodes.append(value)
        source.nodes = nodes
        source._bind()
        return source

    def of(self, *kinds: type) -> List[ast.AST]:
        """The nodes of exactly these types (``ast.Call``, ``ast.Constant``, ...), in walk order; the rules' way to
        visit what they look at without testing every node of the file."""
        if len(kinds) == 1:
            return self._by_type.get(kinds[0], [])
        key = ("of",) + kinds
        found = self.memo.get(key)  # type: ignore[call-overload]
        if found is None:
            wanted = set(kinds)
            found = [node for node in self.nodes if type(node) in wanted] if any(map(self._by_type.get, kinds)) else []
            self.memo[key] = found  # type: ignore[index]
        return found

    @property
    def lines(self) -> List[str]:
        """The file's lines (split once: every finding reads them)."""
        if self._lines is None:
            self._lines = split_lines(self.text)
        return self._lines

    # ---- name resolution ----------------------------------------------------------------------------------------

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The innermost function, lambda, class or module containing ``node``."""
        return self._scopes.get(node, self.tree)

    def _bind(self) -> None:
        """Record what each name means in each scope, in the order the statements appear: a later import, ``def`` or
        assignment wins, as it would when the module runs — except where the later binding is the stand-in of a
        library name bound before it: ``name = None`` after an import of ``name`` (``try: import flash_attn`` /
        ``except ImportError: flash_attn = None``), and any binding in the ``except`` of a ``try`` or the ``else`` of an
        ``if`` whose other branch bound the library's name (``try: autocast = torch.cuda.amp.autocast`` / ``except
        AttributeError: class autocast: ...``). Where the name is used, it is the library's wherever the library is
        there: that is what the code does on the machine it was written for."""
        for node in self._by_type.get(ast.Module, ()):
            self._bindings.setdefault(node, {})
        events: List[ast.AST] = [n for kind in _BINDERS + _TARGET_BINDERS for n in self._by_type.get(kind, ())]
        events.sort(key=lambda n: (n.lineno, n.col_offset))  # type: ignore[attr-defined]
        for node in events:
            table = self._bindings.setdefault(self.scope_of(node), {})
            if isinstance(node, ast.Lambda):
                self._bind_parameters(node)
                continue
            if isinstance(node, _TARGET_BINDERS):
                stand_in = self._in_alternative_branch(node)
                for bound in _bound_names(node):
                    if not (stand_in and table.get(bound, LOCAL) != LOCAL):
                        table[bound] = LOCAL
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        table[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        table[top] = top
                continue
            stand_in = self._in_alternative_branch(node)
            if isinstance(node, ast.ImportFrom):
                module = ("." * node.level) + (node.module or "")
                for alias in node.names:
                    bound = alias.asname or alias.name
                    if alias.name != "*" and not (stand_in and table.get(bound, LOCAL) != LOCAL):
                        table[bound] = LOCAL if node.level else f"{module}.{alias.name}"
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not (stand_in and table.get(node.name, LOCAL) != LOCAL):
                    table[node.name] = LOCAL
                if not isinstance(node, ast.ClassDef):
                    self._bind_parameters(node)
            elif node.value is not None:  # an assignment
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = self.resolve(node.value) if isinstance(node.value, (ast.Name, ast.Attribute)) else None
                placeholder = stand_in or (isinstance(node.value, ast.Constant) and node.value.value is None)
                for target in targets:
                    if not isinstance(target, ast.Name):  # `a, torch = ...`: each name is the file's own
                        for bound in _names_in(target):
                            if not (stand_in and table.get(bound, LOCAL) != LOCAL):
                                table[bound] = LOCAL
                        continue
                    if placeholder and table.get(target.id, LOCAL) != LOCAL:
                        continue  # a stand-in for a library name: the library's meaning stays
                    table[target.id] = value or LOCAL

    def _bind_parameters(self, function: Any) -> None:
        """A function's or lambda's parameters: names of its own scope, whatever the caller passes."""
        arguments = function.args
        own = self._bindings.setdefault(function, {})
        for argument in arguments.posonlyargs + arguments.args + arguments.kwonlyargs:
            own[argument.arg] = LOCAL
        for extra in (arguments.vararg, arguments.kwarg):
            if extra is not None:
                own[extra.arg] = LOCAL

    def _in_alternative_branch(self, node: ast.AST) -> bool:
        """Whether ``node`` stands in the ``except`` of a ``try`` or the ``else`` of an ``if`` (in the same scope):
        the place of a stand-in for what the other branch binds."""
        child, parent = node, self.parents.get(node)
        while parent is not None and not isinstance(parent, _SCOPES):
            if isinstance(parent, ast.ExceptHandler):
                return True
            if isinstance(parent, ast.If) and any(child is s for s in parent.orelse):
                return True
            child, parent = parent, self.parents.get(parent)
        return False

    def binding(self, name: str, at: ast.AST) -> Optional[str]:
        """What ``name`` means at ``at``: a qualified name, :data:`LOCAL`, or None (a builtin or undefined). A class
        body's names are seen in the body only, not in its methods (``class A: torch = 3`` leaves a method's
        ``torch`` the module's), as Python looks names up."""
        scope: Optional[ast.AST] = self.scope_of(at)
        start = scope
        while scope is not None:
            table = self._bindings.get(scope, {}) if scope is start or not isinstance(scope, ast.ClassDef) else {}
            if name in table:
                return table[name]
            scope = self.scope_of(scope) if scope is not self.tree else None
        if name in _STAR_CONVENTIONS and self._star_import():
            return name  # `from .layers import *` brought the module's `torch` along (CogVideo's rife/RIFE.py)
        return None

    def binding_scope(self, name: str, at: ast.AST) -> Optional[ast.AST]:
        """The function, class or module whose binding of ``name`` is the one :meth:`binding` sees at ``at`` (where
        to look for what the file assigned it), or None."""
        scope: Optional[ast.AST] = self.scope_of(at)
        start = scope
        while scope is not None:
            if name in self._bindings.get(scope, {}) and (scope is start or not isinstance(scope, ast.ClassDef)):
                return scope
            scope = self.scope_of(scope) if scope is not self.tree else None
        return None

    def _star_import(self) -> bool:
        return any(a.name == "*" for node in self._by_type.get(ast.ImportFrom, ()) for a in node.names)

    def resolve(self, node: ast.AST) -> Optional[str]:
        """The qualified name of a ``Name`` / ``Attribute`` chain (``torch.cuda.synchronize``), or of a call's
        function; None for anything the file defines itself or that is not a dotted name."""
        if isinstance(node, ast.Call):
            node = node.func
        parts: List[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        base = self.binding(node.id, node)
        if base is None or base == LOCAL:
            return None
        return ".".join([base, *reversed(parts)])

    # ---- what rules ask often ------------------------------------------------------------------------------------

    def cached(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()``, once per file: what several rules read (resolved calls, imports) is computed once."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def calls(self) -> List[Tuple[ast.Call, Optional[str]]]:
        """Every call, with its function's qualified name (None when unresolved); computed once per file."""
        return self.cached(
            "calls", lambda: [(node, self.resolve(node)) for node in self.nodes if isinstance(node, ast.Call)]
        )

    def guard(self, node: ast.AST) -> str:
        """How an import is guarded: ``"try"`` (inside a try with an except), ``"if"`` (under a condition),
        ``"lazy"`` (inside a function), else ``"unguarded"``."""
        parent = self.parents.get(node)
        child = node
        while parent is not None:
            if isinstance(parent, ast.Try) and child in parent.body and parent.handlers:
                return "try"
            if isinstance(parent, ast.If):
                return "if"
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return "lazy"
            child, parent = parent, self.parents.get(parent)
        return "unguarded"

    def at_import_time(self, node: ast.AST) -> bool:
        """Whether ``node`` runs when the module is imported: at module or class level, or in a function's default
        arguments or decorators (evaluated when the ``def`` runs) — not under ``if __name__ == "__main__":``."""
        child, parent = node, self.parents.get(node)
        while parent is not None:
            if isinstance(parent, ast.arguments):  # a default is evaluated where the def is; anything else is not
                defaults = parent.defaults + [d for d in parent.kw_defaults if d is not None]
                if not any(child is d for d in defaults):
                    return False
                function = self.parents.get(parent)
                child, parent = function, self.parents.get(function) if function is not None else None
                continue
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                child is d for d in parent.decorator_list
            ):
                child, parent = parent, self.parents.get(parent)
                continue
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return False
            if isinstance(parent, ast.If) and _is_main_guard(parent.test):
                return False
            child, parent = parent, self.parents.get(parent)
        return True

    def finding(
        self,
        rule: Rule,
        node: ast.AST,
        message: Optional[str] = None,
        fix: Optional[str] = None,
        severity: Optional[str] = None,
        at: Optional[ast.AST] = None,
    ) -> Finding:
        """A finding of ``rule`` at ``node`` (columns in characters, as editors and libcst count them: ast counts
        UTF-8 bytes); ``message``, ``fix`` and ``severity`` default to the rule's. A finding more serious than its
        rule's usual case says so (``.cuda()`` is handled by npu-port run; a storage's ``.cuda()`` is not, and raises):
        ``--fail-on``, the summary and SARIF read each finding's own severity. A node spread over lines is reported on
        the line of its CUDA-only part — ``at`` where the rule knows it (the ``"cuda"`` argument of a call), else
        :func:`node_focus` — and fixed where the whole node is (:attr:`Finding.anchor`)."""
        line, column, end_line, end_column = node_span(node)
        lines = self.lines
        column = _characters(lines, line, column)
        end_column = _characters(lines, end_line, end_column)
        anchor = None
        if end_line > line:  # spread over lines: reported on the line of the CUDA-only part, fixed where the node is
            focus_line, focus_column = node_focus(at if hasattr(at, "lineno") else node)  # an alias has none < 3.10
            if focus_line != line:
                anchor = (line, column, end_line, end_column)
                line, column = focus_line, _characters(lines, focus_line, focus_column)
        snippet = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        return Finding(
            rule.code,
            self.path,
            line,
            column,
            end_line,
            end_column,
            message or rule.message,
            severity or rule.severity,
            fix or rule.fix,
            rule.handled_by if (severity or rule.severity) == "handled" else None,
            snippet,
            anchor,
        )


def _names_in(target: ast.AST) -> List[str]:
    """The names an assignment target binds: ``x``, each of ``a, (b, *c)``; none for ``obj.attr`` or ``d[k]``."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _names_in(element)]
    if isinstance(target, ast.Starred):
        return _names_in(target.value)
    return []


def _bound_names(node: ast.AST) -> List[str]:
    """The names one of :data:`_TARGET_BINDERS` (not a lambda) binds."""
    if isinstance(node, (ast.For, ast.AsyncFor, ast.NamedExpr)):
        return _names_in(node.target)
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [name for item in node.items if item.optional_vars for name in _names_in(item.optional_vars)]
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
        return [node.name] if node.name else []
    if isinstance(node, ast.MatchMapping):
        return [node.rest] if node.rest else []
    return []


def _characters(lines: List[str], line: int, column: int) -> int:
    """A 1-based column counted in UTF-8 bytes (ast's) as a 1-based column in characters."""
    if not 0 < line <= len(lines):
        return column
    return len(lines[line - 1].encode("utf-8")[: column - 1].decode("utf-8", errors="ignore")) + 1


def _is_main_guard(test: ast.AST) -> bool:
    """``if __name__ == "__main__":`` — what runs under it is not import-time work."""
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )
