"""``npu-port fix``: apply the rewrites rules declare, where the scan found them, keeping comments and formatting.

One engine for scanning and fixing: the scan (our resolver) decides *where*; a rule with a fix implements
:meth:`Rule.rewrite` for the libcst node found at exactly that place (start and end), and lists the imports the
rewrite needs (``fix_imports``), which libcst's ``AddImportsVisitor`` adds once, after the file's own imports. A
rewrite returning None leaves that place as it is: the finding is listed with the manual ones. A rule whose rewrite
needs a whole statement (``rewrites_statement``: a ``try`` around ``import flash_attn``, which no line can hold) gets
the small statement found there on a line of its own — a line it shares (``import os; import flash_attn``) is split,
a one-line suite (``def f(): import flash_attn``) becomes an indented block, the comments above go with the first
line and the trailing one with the last — and returns statements; two it wrote side by side in a block may be joined
(:meth:`Rule.combine`: one ``try`` for adjacent imports).

The result is checked before anything is written: it must parse (a file whose rewrite would not is left as it was,
and named). The fixed code has no safe fix left for a second run to make (``tests/scan/test_fix.py`` holds every
safe rewrite to that, and to parsing, with a property test). ``--write`` replaces each file atomically (a temporary
file in the same folder, renamed over it, with the file's permissions), one file at a time: Ctrl-C leaves every file
either as it was or fully fixed. By default nothing is written: the unified diff is the output (a dry run).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import io
import os
import re
import stat
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

from . import targets
from .engine import ScanError, scan, scan_file, select_rules, split_selection
from .rule import Finding, Rule

Span = Tuple[int, int, int, int]


@dataclass
class FileFix:
    """What fixing one file gives: the new text (None when nothing changed), the findings fixed and those left."""

    path: str
    old: str
    new: Optional[str]
    fixed: List[Finding] = field(default_factory=list)
    left: List[Finding] = field(default_factory=list)
    problem: Optional[str] = None  # why the file was left as it was, when a rewrite went wrong
    unwritten: bool = False  # --write could not replace the file (its folder is read-only): it is as it was
    #: How the file is written back: the encoding it declares (PEP 263), ``utf-8-sig`` when it starts with a BOM.
    encoding: str = "utf-8"

    def diff(self) -> str:
        """The change as a unified diff that ``git apply`` and ``patch -p1`` take: lines split at ``\\n`` only (a
        form feed or a lone ``\\r`` is content, as git sees it; ``str.splitlines`` splits there and the context
        would not match the file), a last line without a newline marked ``\\ No newline at end of file``, a name
        with a space ended by a tab, as git writes it (``patch`` reads a name up to a tab), and a byte-order mark
        shown where the file has it (the first line's context would not match without it)."""
        return "".join(self._diff_lines())

    def diff_bytes(self) -> bytes:
        """:meth:`diff` as bytes that apply to the file: its lines in the file's own encoding (a latin-1 file's
        ``é`` is the one byte the file holds), the names as the file system spells them."""
        lines = self._diff_lines()
        encoding = "utf-8" if self.encoding == "utf-8-sig" else self.encoding  # the BOM is in the text already
        names = [line.encode("utf-8", "surrogateescape") for line in lines[:2]]
        return b"".join(names + [line.encode(encoding) for line in lines[2:]])

    def _diff_lines(self) -> List[str]:
        if self.new is None:
            return []
        mark = "\ufeff" if self.encoding == "utf-8-sig" else ""
        shown = _shown(self.path) + ("\t" if " " in self.path else "")
        lines = difflib.unified_diff(
            _LINES.findall(mark + self.old), _LINES.findall(mark + self.new), f"a/{shown}", f"b/{shown}"
        )
        return [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines]


#: A line as ``diff`` and ``patch`` count them: up to and with its ``\n``, or the last one without.
_LINES = re.compile(r"[^\n]*\n|[^\n]+$")


def _shown(path: str) -> str:
    """``path`` relative to the working folder when it is under it (as git shows paths in a diff)."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else path.lstrip("/")


def fixable(finding: Finding, unsafe: bool) -> bool:
    return finding.fix == "safe" or (unsafe and finding.fix == "unsafe")


def _rewrite(text: str, wanted: Dict[Span, List[Tuple[Type[Rule], Finding]]], target: str) -> Tuple[str, List[Finding]]:
    """Apply the rewrites at ``wanted`` spans for ``target``; returns the new text and the findings rewritten."""
    try:
        import libcst as cst
    except ImportError as exc:
        from .._optional import extra_hint

        raise ScanError(
            f"npu-port fix rewrites with libcst, which cannot be imported ({exc}): {extra_hint('fix')}"
        ) from None
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor
    from libcst.metadata import MetadataWrapper, PositionProvider

    wrapper = MetadataWrapper(cst.parse_module(text))
    positions = wrapper.resolve(PositionProvider)
    done: Dict[Finding, None] = {}  # in the order made; looked up once per node with a finding (a list made it n^2)
    imports: List[str] = []
    statements: Dict[cst.BaseSmallStatement, List[Tuple[Type[Rule], Finding]]] = {}  # statement rewrites to make
    made: Dict[cst.BaseStatement, Type[Rule]] = {}  # the statements they wrote, by rule

    replaced_names: List[str] = []

    def apply(rule: Type[Rule], finding: Finding, node: Any) -> Any:
        instance = rule()
        instance.target = target
        replaced = instance.rewrite(node, finding)
        if replaced is not None:
            done[finding] = None
            imports.extend(targets.imports(rule.fix_imports, target))
            replaced_names.extend(rule.fix_replaces)
        return replaced

    def own_lines(line: Any) -> Any:
        """``line`` (or a one-line suite, ``def f(): import x``) with each small statement to rewrite on a line of
        its own, the others kept together, then rewritten: the comments above go with the first line, the trailing
        one with the last; a suite becomes an indented block."""
        suite = isinstance(line, cst.SimpleStatementSuite)
        groups: List[List[Any]] = []
        for statement in line.body:
            if statement in statements or not groups or groups[-1][0] in statements:
                groups.append([statement])
            else:
                groups[-1].append(statement)
        pieces: List[Any] = []
        for index, group in enumerate(groups):
            piece = cst.SimpleStatementLine(
                [*group[:-1], group[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)],
                leading_lines=line.leading_lines if index == 0 and not suite else (),
                trailing_whitespace=line.trailing_whitespace if index == len(groups) - 1 else cst.TrailingWhitespace(),
            )
            written = [piece]
            for rule, finding in statements.get(group[0], []):  # the first rewrite taken replaces the statement
                replaced = apply(rule, finding, piece)
                if replaced is not None:
                    written = list(replaced) if isinstance(replaced, (list, tuple)) else [replaced]
                    made.update(dict.fromkeys(written, rule))
                    break
            pieces.extend(written)
        if not any(piece in made for piece in pieces):
            return line  # no rewrite taken: the line stays as it was
        return cst.IndentedBlock(combined(pieces)) if suite else cst.FlattenSentinel(pieces)

    def combined(body: Sequence[Any]) -> List[Any]:
        """``body`` with adjacent statements the rewrites wrote joined where the rule says how (one ``try``)."""
        out: List[Any] = []
        for statement in body:
            if out and out[-1] in made and statement in made:
                joined = made[statement]().combine(out[-1], statement)
                if joined is not None:
                    made[joined] = made[statement]
                    out[-1] = joined
                    continue
            out.append(statement)
        return out

    class Rewriter(cst.CSTTransformer):
        def on_leave(self, original, updated):  # type: ignore[override]
            where = positions.get(original)
            if where is not None:
                span = (where.start.line, where.start.column + 1, where.end.line, where.end.column + 1)
                for rule, finding in wanted.get(span, []):
                    if finding in done:
                        continue
                    if rule.rewrites_statement:  # made when the line holding it is left (below)
                        if isinstance(updated, cst.BaseSmallStatement):
                            statements.setdefault(updated, []).append((rule, finding))
                        continue
                    replaced = apply(rule, finding, updated)
                    if replaced is not None:
                        updated = replaced
            if isinstance(updated, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
                if any(statement in statements for statement in updated.body):
                    return own_lines(updated)
            elif isinstance(updated, (cst.Module, cst.IndentedBlock)) and any(s in made for s in updated.body):
                return updated.with_changes(body=combined(updated.body))
            return updated

    module = wrapper.module.visit(Rewriter())
    if imports:
        context = CodemodContext()
        for name in dict.fromkeys(imports):
            AddImportsVisitor.add_needed_import(context, name)
        module = AddImportsVisitor(context).transform_module(module)
    if replaced_names:
        module = _drop_unused(module, set(replaced_names))
    return module.code, list(done)


def _torch_too_old(needed: Optional[str]) -> Optional[str]:
    """Why a rewrite that needs torch >= ``needed`` is not made here (the torch installed where ``fix`` runs — the
    project's environment — is older, or absent), or None. Read from the package metadata: torch is not imported."""
    if needed is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("torch")
    except PackageNotFoundError:
        return f"not fixed: the fix needs torch >= {needed}, and torch is not installed here"
    if _release(installed) < _release(needed):
        return f"not fixed: the fix needs torch >= {needed}; this environment has torch {installed}"
    return None


def _release(text: str) -> Tuple[int, ...]:
    """``(2, 3)`` for ``"2.3.1+cpu"``: the major and minor numbers, enough to compare torch releases."""
    numbers = re.findall(r"\d+", text.split("+")[0])[:2]
    return tuple(int(n) for n in numbers)


def _drop_unused(module: Any, names: set) -> Any:
    """``module`` without the ``from X import name`` of ``names`` the rewrites left unused (libcst's
    ``RemoveImportsVisitor`` removes one only where nothing refers to it any more)."""
    import libcst as cst
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import RemoveImportsVisitor
    from libcst.helpers import get_full_name_for_node

    context = CodemodContext()
    found = False
    for node in _import_froms(module):
        if node.module is None or node.relative or isinstance(node.names, cst.ImportStar):
            continue
        origin = get_full_name_for_node(node.module)
        for alias in node.names:
            name = get_full_name_for_node(alias.name)
            if f"{origin}.{name}" in names:
                asname = get_full_name_for_node(alias.asname.name) if alias.asname else None
                RemoveImportsVisitor.remove_unused_import(context, origin, name, asname)
                found = True
    return RemoveImportsVisitor(context).transform_module(module) if found else module


def _import_froms(module: Any) -> List[Any]:
    """The module's own top-level ``from`` imports: one inside ``try`` / ``if`` has a fallback beside it (``except
    ImportError: class GradScaler: ...``), and removing it would leave ``try: pass``."""
    import libcst as cst

    return [
        small
        for statement in module.body
        if isinstance(statement, cst.SimpleStatementLine)
        for small in statement.body
        if isinstance(small, cst.ImportFrom)
    ]


def fix_file(path: str, selected: Sequence[Type[Rule]], unsafe: bool = False, target: str = "torch") -> FileFix:
    """Fix one file in memory (nothing is written), the rewrites written for ``target``."""
    found = scan_file(path, False, selected).findings
    data = Path(path).read_bytes()
    try:  # as the scan read it: the declared encoding, a BOM kept apart (and written back)
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):  # the scan reported it (NPU001): nothing to fix
        return FileFix(path, "", None, left=found)
    by_code = {r.code: r for r in selected}
    wanted: Dict[Span, List[Tuple[Type[Rule], Finding]]] = {}
    for index, finding in enumerate(found):
        rule = by_code.get(finding.code)
        if rule is not None and fixable(finding, unsafe) and rule.rewrite is not Rule.rewrite:
            if rule.fix_targets is not None and target not in rule.fix_targets:  # listed, saying which target fixes it
                wants = ", ".join(f"--target {t}" for t in rule.fix_targets)
                message = f"{finding.message} (fixed by {wants})"
                found[index] = dataclasses.replace(finding, fix="manual", message=message)
                continue
            missing = _torch_too_old(rule.fix_needs_torch)
            if missing is not None:  # the rewrite would not run here: said, with the manual ones
                found[index] = dataclasses.replace(finding, fix="manual", message=f"{finding.message} ({missing})")
                continue
            wanted.setdefault(finding.span, []).append((rule, finding))  # the node's span (Finding.anchor)
    attempted = {f for pairs in wanted.values() for _, f in pairs}
    result = FileFix(path, text, None, encoding=encoding)
    result.left = _left(found, by_code, attempted)
    if not wanted:
        return result
    try:
        new, done = _rewrite(text, wanted, target)
        ast.parse(new, filename=path)
        new.encode(encoding)
    except SyntaxError as exc:  # a rule's rewrite is wrong: never write it, say so, go on with the other files
        result.problem = f"not fixed: the fixes would not parse ({exc.msg}, line {exc.lineno})"
        return result
    except UnicodeEncodeError:
        result.problem = f"not fixed: the fixes cannot be written in the file's encoding ({encoding})"
        return result
    except RecursionError:  # libcst recurses; code nested past its limit is left as it is
        result.problem = "not fixed: nested too deeply for the rewriter"
        return result
    result.new = new if new != text else None
    result.fixed = done
    made = set(done)
    result.left = _left([f for f in found if f not in made], by_code, attempted)
    return result


def _left(found: Sequence[Finding], by_code: Dict[str, Type[Rule]], attempted: set) -> List[Finding]:
    """``found`` as what is left to do once the rewrites ran: a fix that was tried and not made, or that no rule can
    make here (the rule declares a fix kind but has no rewrite, or reads a file that is not Python), is a manual
    change; an unsafe fix not asked for stays ``unsafe`` (``--unsafe-fixes`` would make it)."""
    left = []
    for finding in found:
        rule = by_code.get(finding.code)
        automatic = rule is not None and rule.rewrite is not Rule.rewrite and finding.path.endswith(".py")
        if finding.fix != "manual" and (finding in attempted or not automatic):
            finding = dataclasses.replace(finding, fix="manual")
        left.append(finding)
    return left


def fix(
    paths: Sequence[str],
    *,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    unsafe: bool = False,
    write: bool = False,
    target: str = "torch",
) -> List[FileFix]:
    """Fix every file under ``paths`` that has a fixable finding; with ``write``, replace the files atomically.
    ``target``: what the rewrites write (:mod:`npu_port.scan.targets`): torch's device-agnostic API by default, the
    ``npu_port`` helpers where the installed torch is older than that API (the CLI says so before the diff)."""
    if target not in targets.TARGETS:
        raise ScanError(f"unknown fix target {target!r}; the targets are {', '.join(targets.TARGETS)}")
    target = targets.resolve(target)[0]
    chosen = select_rules(select, ignore)
    severities = split_selection(select)[1]
    result = scan(paths, select=[r.code for r in chosen] + severities, ignore=split_selection(ignore)[1], jobs=1)
    fixes: List[FileFix] = []
    by_code = {r.code: r for r in chosen}
    roots = [os.path.realpath(p) for p in paths]
    for path in sorted({f.path for f in result.findings}):
        if not path.endswith(".py"):  # requirements, configs: what the text rules found is said, never rewritten
            fixes.append(
                FileFix(path, "", None, left=_left([f for f in result.findings if f.path == path], by_code, set()))
            )
            continue
        one = fix_file(path, chosen, unsafe, target)
        fixes.append(one)
        if write and one.new is not None:
            refusal = _not_to_write(path, roots)
            if refusal is not None:  # said, with what was not made; the other files are fixed
                one.problem = refusal
                unmade = _left(one.fixed, by_code, set(one.fixed))
                one.left = sorted(one.left + unmade, key=lambda f: (f.line, f.column, f.code))
                one.new, one.fixed, one.unwritten = None, [], True
                continue
            try:
                _replace(path, one.new.encode(one.encoding))
            except OSError as exc:  # a folder that cannot be written: this file is as it was, the others go on
                one.problem = f"not written: {exc.strerror or exc}"
                unmade = _left(one.fixed, by_code, set(one.fixed))  # manual now: nothing was written
                one.left = sorted(one.left + unmade, key=lambda f: (f.line, f.column, f.code))
                one.new, one.fixed, one.unwritten = None, [], True
    return fixes


def _not_to_write(path: str, roots: Sequence[str]) -> Optional[str]:
    """Why ``--write`` leaves ``path``, or None: a link to a file outside the paths given is someone else's file (a
    shared checkout, a system file), and a file no one may write (mode 0444) was made read-only on purpose — a
    rename would replace either without asking."""
    real = os.path.realpath(path)
    if not any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in roots):
        return f"not written: it links to {real}, outside the paths given"
    if not stat.S_IMODE(os.stat(real).st_mode) & 0o222:
        return "not written: the file is read-only (no one may write it)"
    return None


def _replace(path: str, data: bytes) -> None:
    """Write ``data`` over ``path`` atomically, keeping its permission bits and its owner (``sudo npu-port fix
    --write`` made every fixed file root's: the new file is the writer's); an owner only root may give is kept
    where the writer may give it, else the file is the writer's, as any editor's rename leaves it."""
    from ..atomic import atomic_path

    before = os.stat(path)
    with atomic_path(path, mode=stat.S_IMODE(before.st_mode), exact_mode=True) as temporary:
        temporary.write_bytes(data)
        if (before.st_uid, before.st_gid) != (os.geteuid(), os.getegid()):
            try:
                os.chown(temporary, before.st_uid, before.st_gid)
            except OSError:
                pass  # the mode is set after this block (atomic_path), so chown's clearing of set-ID bits is undone
