"""NPU401: attention written out by hand — scores of q and k, a softmax, the probabilities times v."""

from __future__ import annotations

import ast
import re
from typing import Dict, Iterator, List, Optional, Set, Tuple

from ..context import LOCAL, PythonFile
from ..rule import Finding, Rule, register_rule

SCORES, PROBS = "scores", "probs"
#: What an expression holds: (SCORES or PROBS, the node making the scores, line of the softmax or 0).
Kind = Tuple[str, ast.AST, int]
#: Library functions that multiply two tensors, and where their two operands sit among the positional arguments.
_PRODUCTS = {"torch.matmul": (0, 1), "torch.bmm": (0, 1), "torch.baddbmm": (1, 2), "torch.mm": (0, 1)}
_PRODUCT_METHODS = {"matmul": (None, 0), "bmm": (None, 0), "baddbmm": (0, 1), "baddbmm_": (0, 1), "mm": (None, 0)}
_EINSUMS = ("torch.einsum", "torch.functional.einsum", "einops.einsum")
_SOFTMAXES = ("torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax", "torch._softmax")
#: Statements whose bodies hold more statements, in the order they run.
_BODIES = ("body", "orelse", "handlers", "finalbody", "cases")


@register_rule
class HandwrittenAttention(Rule):
    """Attention written out by hand: a product of q and k (``torch.baddbmm``, ``matmul``, ``bmm``, ``@`` or
    ``einsum``), a softmax of those scores, then the probabilities times v — the same tensors flowing through, across
    simple assignments (``attn = attn * scale``, ``attn = self.dropout(attn)``), and through a function or method of
    the file that returns the scores or the probabilities (old diffusers' ``get_attention_scores``, called as
    ``attn.get_attention_scores(q, k, mask)`` by the processors). Reported where the scores are made (once, however
    many places multiply the probabilities by v): that is the line to replace.

    It works everywhere, but it builds the whole ``(batch * heads, queries, keys)`` score matrix in memory — for long
    video sequences that is tens of GiB (ControlVideo's hand-written ``_attention`` asks for 112 GiB at 512x512x16
    frames), where a fused kernel needs a few MiB. Call ``npu_port.attention(q, k, v, attn_mask, scale=...)``
    instead (SDPA's semantics, the fused kernel of the device: ``npu_fusion_attention`` on Ascend); a legacy
    diffusers-style class with ``_attention(query, key, value, attention_mask=None)`` is routed as it is by
    ``npu_port.patch_legacy_attention`` (which ``npu-port run`` applies to a project's own modules).

    Example::

        attn = torch.baddbmm(empty, q, k.transpose(-1, -2), beta=0, alpha=self.scale)   # NPU401
        attn = attn.softmax(dim=-1)
        out = torch.bmm(attn, v)
    """

    code = "NPU401"
    name = "handwritten-attention"
    message = (
        "hand-written attention builds the whole score matrix: use npu_port.attention(q, k, v, ...) "
        "(a legacy `_attention` class is routed by npu_port.patch_legacy_attention / npu-port run)"
    )
    severity = "perf"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    triggers = ("softmax", "Softmax")  # torch.softmax, F.softmax, x.softmax(...), nn.Softmax(...)
    #: ... and a product: a function, a method, or ``@`` between operands (a decorator's ``@`` starts its line)
    also_triggers = ("matmul", "bmm", "einsum", "mm(", re.compile(r"[\w)\]]\s*@=?\s*[\w(]"))

    def check(self, source: PythonFile) -> Iterator[Finding]:
        scopes = _softmax_scopes(source)
        flows = [_Flow(source).run(scope.body) for scope in scopes]
        returning = _returning(scopes, flows)
        if returning:  # a second pass, knowing what the file's functions return (most files have none)
            flows = [_Flow(source, returning).run(scope.body) for scope in _softmax_scopes(source, returning)]
        reported: Set[int] = set()
        for flow in flows:
            for node, first, softmax_line in flow.found:
                for scores in [first, *flow.alternates.get(id(first), [])]:
                    if id(scores) in reported:
                        continue
                    reported.add(id(scores))
                    message = (
                        f"hand-written attention (softmax on line {softmax_line}, times v on line {node.lineno}) "
                        "builds the whole score matrix: use npu_port.attention(q, k, v, ...) (a legacy `_attention` "
                        "class is routed by npu_port.patch_legacy_attention / npu-port run)"
                    )
                    yield source.finding(self, scores, message)


class _Flow:
    """Which names hold attention scores or probabilities, statement by statement through one function's body (not
    into nested functions or classes: each is a scope of its own)."""

    def __init__(self, source: PythonFile, returning: Optional[Dict[str, Kind]] = None) -> None:
        self.source = source
        #: name -> (kind, the node making the scores, line of the softmax or 0)
        self.names: Dict[str, Kind] = {}
        #: (the product of the probabilities and v, the node making the scores, line of the softmax)
        self.found: List[Tuple[ast.AST, ast.AST, int]] = []
        #: What the function's ``return`` statements give back, in order.
        self.returned: List[Kind] = []
        #: The file's functions (by name) that return scores or probabilities: calling one gives them.
        self.returning = returning or {}
        #: id(a scores node) -> the scores nodes other branches of an ``if`` give the same name
        #: (``if fp32: sim = einsum(...) else: sim = einsum(...)``): one softmax, a finding for each
        self.alternates: Dict[int, List[ast.AST]] = {}
        self._seen: Set[int] = set()

    def run(self, statements: List[ast.stmt]) -> "_Flow":
        for statement in statements:
            self.statement(statement)
        return self

    def statement(self, node: ast.stmt) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = self.kind(node.value) if node.value is not None else None
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in _names(target):
                    if value is None:
                        self.names.pop(name, None)
                    else:
                        self.names[name] = value
            return
        if isinstance(node, ast.AugAssign):
            value = self.kind(node.value)
            if isinstance(node.target, ast.Name) and node.target.id not in self.names and value is not None:
                self.names[node.target.id] = value
            return
        if isinstance(node, ast.If):
            self.branches(node)
            return
        if isinstance(node, ast.Return) and node.value is not None:
            returned = self.kind(node.value)
            if returned is not None:
                self.returned.append(returned)
            return
        for field_name, value in ast.iter_fields(node):  # tests, iterables, returned values, with-items
            if field_name in _BODIES:
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.expr):
                    self.kind(child)
                elif isinstance(child, ast.withitem):
                    self.kind(child.context_expr)
        for field_name in _BODIES:
            for child in getattr(node, field_name, None) or []:
                if isinstance(child, ast.stmt):
                    self.statement(child)
                elif isinstance(child, ast.ExceptHandler):
                    self.run(child.body)
                elif hasattr(child, "body"):  # match cases
                    self.run(child.body)

    def branches(self, node: ast.If) -> None:
        """An ``if``: each branch from the state before it; after it, a name holds what either branch gave it, the
        scores of both branches remembered when both make them."""
        self.kind(node.test)
        before = dict(self.names)
        self.run(node.body)
        body, self.names = self.names, before.copy()
        self.run(node.orelse)
        for name, kind in body.items():
            other = self.names.get(name)
            if other is None:
                self.names[name] = kind
            elif other[0] == kind[0] and other[1] is not kind[1]:
                self.alternates.setdefault(id(other[1]), []).append(kind[1])

    def kind(self, node: ast.AST) -> Optional[Kind]:
        """What ``node`` evaluates to: scores, probabilities, or nothing of interest (None). Records a finding when
        it is the probabilities times another tensor."""
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return None
        if isinstance(node, (ast.Compare, ast.BoolOp)) or _is_metadata(node):
            self._children(node)  # still look for products inside
            return None
        operands = self.operands(node)
        if operands is not None:
            kinds = [self.kind(o) for o in operands]
            for other in node.args[:1] if _is_baddbmm(self.source, node) else []:  # the input baddbmm adds to
                self.kind(other)
            probs = [k for k in kinds if k is not None and k[0] == PROBS]
            if probs:
                if id(node) not in self._seen:
                    self._seen.add(id(node))
                    self.found.append((node, probs[0][1], probs[0][2]))
                return None
            if all(k is None for k in kinds):
                return (SCORES, node, 0)
            return None
        softmax_of = self.softmax_input(node)
        if softmax_of is not None:
            inner = self.kind(softmax_of)
            self._children(node, skip=softmax_of)
            if inner is not None:
                return (PROBS, inner[1], node.lineno)
            return None
        found = self._children(node)
        callee = _callee(self.source, node) if self.returning else None
        return self.returning.get(callee, found) if callee is not None else found

    def _children(self, node: ast.AST, skip: Optional[ast.AST] = None) -> Optional[Kind]:
        """The strongest kind among ``node``'s sub-expressions (``attn * scale`` is still scores)."""
        best: Optional[Kind] = None
        for child in ast.iter_child_nodes(node):
            if child is skip or not isinstance(child, (ast.expr, ast.keyword)):
                continue
            found = self.kind(child.value if isinstance(child, ast.keyword) else child)
            if found is not None and (best is None or (found[0] == PROBS and best[0] == SCORES)):
                best = found
        return best

    def operands(self, node: ast.AST) -> Optional[List[ast.expr]]:
        """The two tensors a product multiplies (``a @ b``, ``torch.matmul(a, b)``, ``a.bmm(b)``, ``torch.baddbmm(c,
        a, b)``, ``einsum("...", a, b)``), or None when ``node`` is not a product of two tensors."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            return [node.left, node.right]
        if not isinstance(node, ast.Call):
            return None
        name = self.source.resolve(node)
        args = [a for a in node.args if not isinstance(a, ast.Starred)]
        if name in _PRODUCTS:
            first, second = _PRODUCTS[name]
            return [args[first], args[second]] if len(args) > second else None
        if name in _EINSUMS:
            tensors = args[1:] if args and isinstance(args[0], ast.Constant) else args[:-1]
            return tensors if len(tensors) == 2 else None
        if name is None and isinstance(node.func, ast.Attribute) and node.func.attr in _PRODUCT_METHODS:
            first, second = _PRODUCT_METHODS[node.func.attr]
            receiver = node.func.value
            if first is None:
                return [receiver, args[second]] if len(args) > second else None
            return [args[first], args[second]] if len(args) > second else None
        return None

    def softmax_input(self, node: ast.AST) -> Optional[ast.expr]:
        """What a softmax call normalises: ``torch.softmax(x, -1)``, ``F.softmax(x)``, ``x.softmax(-1)``,
        ``self.softmax(x)`` (an ``nn.Softmax`` module); None when ``node`` is not one."""
        if not isinstance(node, ast.Call):
            return None
        name = self.source.resolve(node)
        if name in _SOFTMAXES or (name is None and isinstance(node.func, ast.Name) and "softmax" in node.func.id):
            return node.args[0] if node.args else None
        if name is None and isinstance(node.func, ast.Attribute) and "softmax" in node.func.attr.lower():
            if node.func.attr == "softmax" and not _is_module_attribute(node.func.value):
                return node.func.value  # x.softmax(dim=-1)
            return node.args[0] if node.args else None  # self.softmax(x), nn.Softmax(dim=-1)(x) via an attribute
        if isinstance(node.func, ast.Call) and self.source.resolve(node.func) == "torch.nn.Softmax":
            return node.args[0] if node.args else None  # nn.Softmax(dim=-1)(x)
        return None


def _softmax_scopes(source: PythonFile, returning: Optional[Dict[str, Kind]] = None) -> List[ast.AST]:
    """The module and the functions whose own statements call something softmax-like, or one of ``returning`` (the
    file's functions returning scores or probabilities): only there can a flow find probabilities (each flow stays out
    of nested functions). Most functions of a file that mentions ``softmax`` call none, and following every statement
    of each was most of this rule's time."""
    scopes: Dict[int, ast.AST] = {}
    for call, name in source.calls():
        func = call.func
        if not (
            name in _SOFTMAXES
            or (isinstance(func, ast.Name) and "softmax" in func.id)
            or (isinstance(func, ast.Attribute) and "softmax" in func.attr.lower())
            or isinstance(func, ast.Call)  # nn.Softmax(dim=-1)(x)
            or (returning and _callee(source, call) in returning)
        ):
            continue
        scope = source.scope_of(call)
        while not isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
            scope = source.scope_of(scope)
        scopes.setdefault(id(scope), scope)
    return sorted(scopes.values(), key=lambda s: getattr(s, "lineno", 0))


def _returning(scopes: List[ast.AST], flows: List["_Flow"]) -> Dict[str, Kind]:
    """The file's functions and methods, by name, whose ``return`` gives scores or probabilities (probabilities
    preferred), from the flows through ``scopes``: a call of one in another function starts a flow there
    (``attention_probs = attn.get_attention_scores(query, key, mask)``, then ``torch.bmm(attention_probs, value)``).
    Only functions that call a softmax are followed: a function returning bare scores is a ``q @ k`` too common to
    follow everywhere."""
    found: Dict[str, Kind] = {}
    for scope, flow in zip(scopes, flows):
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        kinds = sorted(flow.returned, key=lambda k: k[0] != PROBS)
        if kinds and not flow.found:  # a function doing all of attention itself returns its output, not scores
            found.setdefault(scope.name, kinds[0])
    return found


def _callee(source: PythonFile, call: ast.AST) -> Optional[str]:
    """The name of the file's own function or method ``call`` calls (``self.f(...)``, ``attn.f(...)``, ``f(...)``
    for a ``def f`` of the file), or None."""
    if not isinstance(call, ast.Call):
        return None
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name) and source.binding(func.id, func) == LOCAL:
        return func.id
    return None


def _is_baddbmm(source: PythonFile, node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        source.resolve(node) == "torch.baddbmm"
        or (isinstance(node.func, ast.Attribute) and node.func.attr in ("baddbmm", "baddbmm_"))
    )


def _is_metadata(node: ast.AST) -> bool:
    """``attn.shape``, ``attn.size(-1)``, ``attn.dtype``: facts about a tensor, not its values."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("shape", "dtype", "device", "ndim", "is_cuda")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("size", "dim")


def _is_module_attribute(node: ast.AST) -> bool:
    """``self.something`` / ``self``: ``self.softmax(x)`` is a module called on ``x``, not a method of ``self``."""
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _names(target: ast.AST) -> List[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for element in target.elts for n in _names(element)]
    return []
