"""Routing processors that compute attention through ``attn.get_attention_scores`` and ``torch.bmm``.

diffusers' own ``AttnProcessor`` (what ``set_default_attn_processor`` installs), the sliced processors of
``set_attention_slice`` / ``enable_attention_slicing``, ``AttnAddedKVProcessor``, ``CustomDiffusionAttnProcessor``,
``IPAdapterAttnProcessor`` — and the user processors written after them — compute the attention core as two
statements::

    attention_probs = attn.get_attention_scores(query, key, attention_mask)   # baddbmm + softmax: the whole matrix
    hidden_states = torch.bmm(attention_probs, value)

No patch of a module global reaches that: ``get_attention_scores`` returns probabilities, which the caller multiplies
by the values itself. So the processor's ``__call__`` is recompiled with each such pair replaced by one call that
does both — :func:`attend_scores`, which inside a module routed by a strategy sends the folded ``(batch*heads, seq,
dim)`` call to the route's attention function (:mod:`npu_port.integrations.folded`), and anywhere else runs the two
original statements. Everything else in the processor is its own code, unchanged, with its line numbers; in a sliced
processor's loop each slice is one routed call, so the strategy's kernel sees one slice at a time and slicing keeps
its memory promise.

A pair is rewritten only when that is exact: two consecutive statements, a plain name bound to the probabilities and
read nowhere but in the ``bmm`` (a processor that keeps the probabilities — attention maps for prompt-to-prompt, say —
is left as it is, with the reason), and ``torch`` the real torch module. At run time a module whose class overrides
``get_attention_scores`` (a project's own, storing maps) keeps its own code for that call, counted as declined.

:func:`rewrite_call` only builds the function; :mod:`.patches` installs it on the class, counted and reversibly.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
import threading
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch import Tensor

from ...upstream.diffusers import attention as upstream
from ..folded import UNFIT, attend
from .routing import current_route

#: The name the rewritten code calls (a closure variable of the rewritten function: no module global is added).
HELPER = "__npu_port_attend_scores__"
SCORES = "get_attention_scores"

_lock = threading.Lock()
#: original function -> (rewritten function or None, why not): one parse per function.
_REWRITES: Dict[Any, Tuple[Optional[types.FunctionType], str]] = {}


def diffusers_scores(attn: Any) -> bool:
    """Whether ``attn``'s ``get_attention_scores`` — as the processor would call it, so an override set on the
    instance counts — is diffusers' own (so the routed call computes what it would)."""
    return upstream.is_diffusers_function(getattr(attn, SCORES, None))


def _routed_attention(route: Any) -> Callable[..., Tensor]:
    def attention_fn(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor], *, scale: Any) -> Tensor:
        return route.attend("scores", query, key, value, attn_mask, scale=scale)

    return attention_fn


def attend_scores(attn: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor] = None):
    """``torch.bmm(attn.get_attention_scores(query, key, attention_mask), value)``, routed inside a targeted module.

    Outside one (no active route) it is exactly those two calls. Inside one, the folded call goes to the route's
    attention function with ``attn.scale`` and the module's upcast flags, in the value's dtype, as the original
    returns it; a call the folded forms cannot express, or a module with its own ``get_attention_scores``, runs the
    original and is counted as declined (``explain`` shows why).
    """
    route = current_route()
    if route is not None:
        if not diffusers_scores(attn):
            route.decline(f"{type(attn).__name__}.{SCORES} is the project's own: its code runs, not routed")
        else:
            out = attend(attn, query, key, value, attention_mask, _routed_attention(route))
            if out is not UNFIT:
                return out.to(value.dtype)
            route.decline(f"{SCORES} call outside the folded (batch*heads, seq, dim) forms: diffusers' code runs")
    return torch.bmm(attn.get_attention_scores(query, key, attention_mask), value)


# ---- finding the pairs ---------------------------------------------------------------------------------------------


def _scores_call(statement: ast.stmt) -> Optional[Tuple[str, ast.Call]]:
    """``NAME = <expr>.get_attention_scores(q, k[, mask])``: (NAME, the call)."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
        return None
    target, call = statement.targets[0], statement.value
    if not (isinstance(target, ast.Name) and isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
        return None
    if call.func.attr != SCORES or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    keywords = [k.arg for k in call.keywords]
    if any(k is None for k in keywords) or not 2 <= len(call.args) + len(keywords) <= 3:
        return None
    allowed = ("query", "key", "attention_mask")[len(call.args) :]
    if not set(keywords) <= set(allowed):
        return None
    return target.id, call


def _bmm_of(statement: ast.stmt, probs: str, torch_names: List[str]) -> Optional[Tuple[str, ast.expr]]:
    """``NAME = torch.bmm(probs, value)``: (NAME, the value expression)."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
        return None
    target, call = statement.targets[0], statement.value
    if not (isinstance(target, ast.Name) and isinstance(call, ast.Call) and not call.keywords):
        return None
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "bmm" and isinstance(func.value, ast.Name)):
        return None
    if func.value.id not in torch_names or len(call.args) != 2:
        return None
    first, second = call.args
    if not (isinstance(first, ast.Name) and first.id == probs) or isinstance(second, ast.Starred):
        return None
    return target.id, second


def _statement_lists(node: ast.AST) -> Iterator[List[ast.stmt]]:
    """Every statement list under ``node`` (bodies, else / finally blocks, handlers, match cases), outside nested
    functions and classes."""
    for field in ("body", "orelse", "finalbody"):
        statements = getattr(node, field, None)
        if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
            yield statements
            for statement in statements:
                if not _is_scope(statement):
                    yield from _statement_lists(statement)
    for holder in list(getattr(node, "handlers", None) or []) + list(getattr(node, "cases", None) or []):
        yield from _statement_lists(holder)


class _Pair:
    """One ``probs = X.get_attention_scores(...)`` statement and the ``result = torch.bmm(probs, value)`` after it."""

    __slots__ = ("statements", "index", "probs", "call", "result", "value")

    @property
    def target(self) -> ast.AST:
        """The name the scores statement binds (its own store of ``probs``)."""
        statement = self.statements[self.index]
        assert isinstance(statement, ast.Assign)
        return statement.targets[0]

    def __init__(
        self, statements: List[ast.stmt], index: int, probs: str, call: ast.Call, result: str, value: ast.expr
    ) -> None:
        self.statements, self.index, self.probs, self.call = statements, index, probs, call
        self.result, self.value = result, value

    @property
    def bmm_read(self) -> ast.AST:
        statement = self.statements[self.index + 1]
        assert isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call)
        return statement.value.args[0]

    def replacement(self) -> ast.stmt:
        """``result = HELPER(X, query, key, value, mask)`` at the line of the scores statement."""
        call = self.call
        assert isinstance(call.func, ast.Attribute)
        arguments = dict(zip(("query", "key", "attention_mask"), call.args))
        arguments.update({k.arg: k.value for k in call.keywords if k.arg})
        mask = arguments.get("attention_mask", ast.Constant(None))
        helper = ast.Name(HELPER, ast.Load())
        routed = ast.Call(helper, [call.func.value, arguments["query"], arguments["key"], self.value, mask], [])
        return ast.copy_location(ast.Assign([ast.Name(self.result, ast.Store())], routed), self.statements[self.index])


def _pairs(function: ast.FunctionDef, torch_names: List[str]) -> Tuple[List[_Pair], List[str]]:
    """The exact pairs in ``function``, and why the other ``get_attention_scores`` -> ``bmm`` pairs are not exact:
    the probabilities' name must be used (read, bound or deleted) nowhere but in the pairs' own statements unless
    the ``bmm`` rebinds that very name (as the sliced processors do), and never in the ``bmm``'s value operand."""
    found: List[_Pair] = []
    for statements in _statement_lists(function):
        for index in range(len(statements) - 1):
            scores = _scores_call(statements[index])
            bmm = _bmm_of(statements[index + 1], scores[0], torch_names) if scores else None
            if scores is not None and bmm is not None:
                found.append(_Pair(statements, index, scores[0], scores[1], bmm[0], bmm[1]))
    own = {id(pair.bmm_read) for pair in found} | {id(pair.target) for pair in found}
    exact: List[_Pair] = []
    kept: List[str] = []
    for pair in found:
        line = pair.statements[pair.index].lineno
        in_value = [n for n in ast.walk(pair.value) if isinstance(n, ast.Name) and n.id == pair.probs]
        other_uses = [
            node
            for node in ast.walk(function)
            if isinstance(node, ast.Name) and node.id == pair.probs and id(node) not in own
        ]
        if in_value:  # the routed call computes the value before the scores: it must not read them
            kept.append(f"line {line}: the bmm's value operand reads {pair.probs!r} (the probabilities)")
        elif pair.result != pair.probs and other_uses:  # read, rebound or deleted elsewhere (`del probs`)
            use = other_uses[0]
            how = {ast.Load: "read", ast.Store: "assigned", ast.Del: "deleted"}.get(type(use.ctx), "used")
            kept.append(f"line {line}: {pair.probs!r} (the probabilities) is also {how} at line {use.lineno}")
        else:
            exact.append(pair)
    return exact, kept


def _is_scope(statement: ast.stmt) -> bool:
    return isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))


def _source(fn: types.FunctionType) -> str:
    return "".join(linecache.getlines(fn.__code__.co_filename, fn.__globals__))


def _function_node(fn: types.FunctionType, source: str) -> Optional[ast.FunctionDef]:
    """The ``def`` of ``fn`` in its file's syntax tree (line numbers as in the file), or None."""
    if not source:
        return None
    try:
        tree = ast.parse(source, fn.__code__.co_filename)
    except (SyntaxError, ValueError):
        return None
    first = fn.__code__.co_firstlineno
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == fn.__name__:
            lines = [node.lineno] + [d.lineno for d in node.decorator_list]
            if first in lines:
                return node
    return None


def _strip_annotations(node: ast.FunctionDef) -> None:
    """Annotations and defaults are not evaluated again (names only imported for type checking, or a class body's
    names, would fail there); the rewritten function carries the original's ``__annotations__`` and defaults."""
    arguments = node.args
    for arg in arguments.posonlyargs + arguments.args + arguments.kwonlyargs:
        arg.annotation = None
    for arg in (arguments.vararg, arguments.kwarg):
        if arg is not None:
            arg.annotation = None
    node.returns = None
    node.decorator_list = []
    arguments.defaults = []  # defaults are not evaluated again either: the function gets the loaded ones
    arguments.kw_defaults = [None] * len(arguments.kwonlyargs)


def _same_code(fn: types.FunctionType, source: str) -> bool:
    """Whether ``source`` (the file as it is on disk), compiled, holds exactly the code that was loaded for ``fn``: a
    file edited since its import must not have its new text grafted onto the running program. The whole file is
    compiled so that the function gets the same context (class body, future imports) as when it was loaded."""
    try:
        module = compile(source, fn.__code__.co_filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    loaded = fn.__code__
    stack = [module]
    while stack:
        code = stack.pop()
        if code.co_name == loaded.co_name and code.co_firstlineno == loaded.co_firstlineno:
            return _code_key(code) == _code_key(loaded)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return False


def _code_key(code: types.CodeType) -> Tuple[Any, ...]:
    """What must match between two compilations of one function: bytecode, constants (nested code compared the same
    way), names and locals — not line numbers or the file name."""
    consts = tuple(_code_key(c) if isinstance(c, types.CodeType) else (type(c), repr(c)) for c in code.co_consts)
    return (code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)


def _mangled(fn: types.FunctionType) -> List[str]:
    """Private ``__name`` attributes, which the class body mangles and a recompiled function would not."""
    names = [n for n in fn.__code__.co_names if n.startswith("_") and "__" in n and not n.endswith("__")]
    owner = fn.__qualname__.rsplit(".", 2)[0] if "." in fn.__qualname__ else ""
    return [n for n in names if owner and n.startswith(f"_{owner.lstrip('_')}__")]


def _build(fn: types.FunctionType) -> Tuple[Optional[types.FunctionType], str]:
    if fn.__code__.co_freevars:
        return None, f"its {fn.__qualname__} is a closure (uses {', '.join(fn.__code__.co_freevars)}): not rewritten"
    if SCORES not in fn.__code__.co_names:
        return None, "no get_attention_scores call"
    if _mangled(fn):
        return None, f"{fn.__qualname__} uses private (name-mangled) attributes {_mangled(fn)}: not rewritten"
    source = _source(fn)
    node = _function_node(fn, source)
    if node is None:
        return None, f"the source of {fn.__qualname__} is not available: not rewritten"
    if not _same_code(fn, source):
        return None, f"the source of {fn.__qualname__} on disk differs from the code loaded: not rewritten"
    torch_names = [name for name, value in fn.__globals__.items() if value is torch]
    exact, kept = _pairs(node, torch_names)
    if not exact:
        why = "; ".join(kept) or "get_attention_scores is not followed by torch.bmm(probs, value)"
        return None, f"attention computed through get_attention_scores, not routable: {why}"
    replaced = [pair.statements[pair.index].lineno for pair in exact]
    for pair in sorted(exact, key=lambda p: -p.index):  # from the end, so earlier indices stay valid
        pair.statements[pair.index : pair.index + 2] = [pair.replacement()]
    _strip_annotations(node)
    factory = ast.FunctionDef(
        name="__npu_port_factory__",
        args=ast.arguments([], [ast.arg(HELPER)], None, [], [], None, []),
        body=[node, ast.Return(ast.Name(node.name, ast.Load()))],
        decorator_list=[],
        returns=None,
        type_params=[],
    )
    module = ast.Module([factory], type_ignores=[])
    ast.fix_missing_locations(ast.copy_location(factory, node))
    namespace: Dict[str, Any] = {}
    exec(compile(module, fn.__code__.co_filename, "exec"), fn.__globals__, namespace)  # noqa: S102 - our own AST
    routed = namespace["__npu_port_factory__"](attend_scores)
    routed.__defaults__ = fn.__defaults__
    routed.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(routed, fn)  # name, qualname, doc, annotations, __wrapped__ (inspect.signature)
    routed.__npu_port_original__ = fn  # type: ignore[attr-defined]
    lines = ", ".join(str(line) for line in replaced)
    return routed, f"get_attention_scores -> bmm at line {lines} routed"


def rewrite_call(fn: Any) -> Tuple[Optional[types.FunctionType], str]:
    """``fn`` (a processor's ``__call__``) with every exact scores -> bmm pair routed, and what was done; or
    ``(None, why not)``. Built once per function."""
    fn = inspect.unwrap(fn, stop=lambda f: not hasattr(f, "__npu_port_original__")) if fn is not None else fn
    fn = getattr(fn, "__npu_port_original__", fn)
    if not isinstance(fn, types.FunctionType):
        return None, "no Python __call__ to read"
    with _lock:
        found = _REWRITES.get(fn)
        if found is None:
            try:
                found = _build(fn)
            except Exception as exc:  # whatever the rewrite cannot handle leaves the processor as it is
                found = (None, f"{fn.__qualname__} could not be rewritten ({type(exc).__name__}: {exc}): not routed")
            _REWRITES[fn] = found
        return found
