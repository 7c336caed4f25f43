"""The fix of NPU101 / NPU102: an unguarded import of what a drop-in serves goes into ``try``, with the drop-in as the
fallback::

    try:
        from flash_attn import flash_attn_func
    except ImportError:  # no working flash-attn build here: npu-port's drop-in serves it (npu_port.attention)
        from npu_port.dropins import install_dropins

        install_dropins("flash_attn", broken=True)
        from flash_attn import flash_attn_func

Safe: where the real package imports, the ``try`` succeeds and nothing else runs (npu-port is not even imported).
The ``try`` holds the import alone, so no other ImportError is caught. ``broken=True`` (the finder's mode
``"broken"``) because the ``except`` runs in two cases: the package is missing (the stand-in is served, as in mode
``"missing"``), or it is installed but fails to load — a wheel built for another torch or CUDA, the GPU case NPU101
names. There mode ``"missing"`` would find the real package again and re-raise its error, so the fix would fix
nothing; ``"broken"`` loads the real one, and only if that raises serves the stand-in, logging the real error
(``npu_port.shims`` logger), so the failure is said, not swallowed. Mode ``"always"`` would also replace a real
package that works for every later import in the process. Only the one drop-in the import needs is installed
(``install_dropins("flash_attn", ...)``): an absent xformers stays absent for the rest of the program.

An import the real package has but the drop-in lacks is never guarded (:func:`._imports.guardable`), and where the
real package loads but lacks the name (flash-attn 1.x has no ``flash_attn_func``) the second import raises the same
ImportError: the module is in ``sys.modules``, real, and no finder is asked again.

Adjacent imports (nothing but comments between them) share one ``try``. The import in the ``except`` follows
``install_dropins()`` and so is served (guard ``"dropin"`` in :mod:`._imports`); the one in the ``try`` is guarded
(NPU106): a second ``npu-port fix`` finds nothing to change.
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, Iterator, List, Optional, Sequence

from ..context import PythonFile
from ..rule import Finding, Rule
from ._imports import guardable, import_findings, names

_INSTALL = "from npu_port.dropins import install_dropins\n"


def _top_module(statement: Any) -> Optional[str]:
    """The one top-level package an ``import`` / ``from ... import`` statement imports from, or None."""
    import libcst as cst
    from libcst.helpers import get_full_name_for_node

    if isinstance(statement, cst.ImportFrom):
        modules = [get_full_name_for_node(statement.module)] if statement.module and not statement.relative else []
    elif isinstance(statement, cst.Import):
        modules = [get_full_name_for_node(alias.name) for alias in statement.names]
    else:
        return None
    tops = {module.split(".")[0] if module else None for module in modules}
    return tops.pop() if len(tops) == 1 else None


def _dropins() -> Dict[str, str]:
    """``{drop-in name: distribution}``, e.g. ``{"flash_attn": "flash-attn"}``."""
    from ...dropins.install import DROP_INS

    return {template.name: template.distribution or template.name for template in DROP_INS}


def _dropin(line: Any) -> Optional[str]:
    """The drop-in serving the one import statement of ``line`` (a ``SimpleStatementLine``), or None."""
    import libcst as cst

    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
        return None
    top = _top_module(line.body[0])
    return top if top in _dropins() else None


def _guarded(lines: Sequence[Any], leading_lines: Sequence[Any]) -> Any:
    """``try: <lines> except ImportError: install the drop-ins they need; <lines> again`` (the copies without the
    comments above them; each keeps its own trailing comment: a ``# noqa`` or ``# type: ignore`` means it too)."""
    import libcst as cst

    needed = list(dict.fromkeys(_dropin(line) for line in lines))
    shown = " / ".join(_dropins()[name] for name in needed)
    serves = "drop-in serves it" if len(needed) == 1 else "drop-ins serve them"
    comment = f"# no working {shown} build here: npu-port's {serves} (npu_port.attention)"
    install = cst.parse_statement(_INSTALL)
    arguments = "".join(f'"{name}", ' for name in needed)
    call = cst.parse_statement(f"install_dropins({arguments}broken=True)\n")
    handler = cst.ExceptHandler(
        body=cst.IndentedBlock(
            header=cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(comment)),
            body=[install, call.with_changes(leading_lines=[cst.EmptyLine(indent=False)])]
            + [line.with_changes(leading_lines=()) for line in lines],
        ),
        type=cst.Name("ImportError"),
        whitespace_after_except=cst.SimpleWhitespace(" "),
    )
    return cst.Try(body=cst.IndentedBlock(body=list(lines)), handlers=[handler], leading_lines=leading_lines)


def guard_import(line: Any) -> Optional[Any]:
    """NPU101's and NPU102's statement rewrite: ``line`` (one import on a line of its own) in ``try``, the drop-in its
    fallback; None when it is not one import of what a drop-in serves."""
    if _dropin(line) is None:
        return None
    return _guarded([line.with_changes(leading_lines=())], line.leading_lines)


def _guarded_lines(statement: Any) -> Optional[List[Any]]:
    """The imports a ``try`` written by :func:`guard_import` guards, or None for any other statement."""
    import libcst as cst

    if not (isinstance(statement, cst.Try) and len(statement.handlers) == 1):
        return None
    handler = statement.handlers[0]
    body = handler.body.body if isinstance(handler.body, cst.IndentedBlock) else ()
    if statement.orelse is not None or statement.finalbody is not None or not body:
        return None
    if not (isinstance(handler.type, cst.Name) and handler.type.value == "ImportError"):
        return None
    if cst.Module([]).code_for_node(body[0]) != _INSTALL:
        return None  # not the fallback this fix writes
    lines = list(statement.body.body)
    return lines if all(_dropin(line) is not None for line in lines) else None


def combine_guards(first: Any, second: Any) -> Optional[Any]:
    """One ``try`` for two adjacent guarded imports written by this fix, when no blank line separates them (comments
    between them move inside, above the import they were above); None to keep both."""
    ahead, behind = _guarded_lines(first), _guarded_lines(second)
    if ahead is None or behind is None or any(line.comment is None for line in second.leading_lines):
        return None
    behind[0] = behind[0].with_changes(leading_lines=[*second.leading_lines, *behind[0].leading_lines])
    return _guarded([*ahead, *behind], first.leading_lines)


class DropInImport(Rule):
    """What NPU101 and NPU102 share: an unguarded import of what one drop-in serves (``handled_by`` names it), a
    safe fix where :func:`._imports.guardable` says the statement can be guarded. A subclass sets ``broken``: what
    the import needs that is missing without CUDA, for the message."""

    severity = "handled"
    targets = ("npu", "cpu", "gpu")
    fix = "safe"
    rewrites_statement = True
    fix_targets = ("npu-port",)  # the guard imports npu-port's drop-in: not a fix that needs nothing but torch
    broken: ClassVar[str] = ""

    def check(self, source: PythonFile) -> Iterator[Finding]:
        def message(kinds, guard, place):
            return (
                f"{names(kinds)} imported unguarded {place}: fails without {self.broken}; served by the drop-in "
                "under npu-port run, or guard it with the drop-in as fallback"
            )

        return import_findings(
            self,
            source,
            lambda k, g: k.kind == "handled" and k.by == self.handled_by and g in ("unguarded", "lazy"),
            message,
            lambda node: "safe" if guardable(source, node) else "manual",
        )

    def rewrite(self, node: Any, finding: Finding) -> Optional[Any]:
        return guard_import(node)

    def combine(self, first: Any, second: Any) -> Optional[Any]:
        return combine_guards(first, second)
