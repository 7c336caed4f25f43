"""Shared helpers of the device family (NPU300-NPU399): what each ``torch.cuda.*`` call does without CUDA, and how
to recognise a CUDA device literal in a device position.

The table below was checked by calling each name on torch 2.13.0+cpu (no CUDA build): ``benign`` answers without
CUDA (``is_available()`` -> False, ``device_count()`` -> 0, the memory counters -> 0, ``manual_seed`` queues the
seed), ``warns`` warns and runs disabled (the ``torch.cuda.amp`` classes), ``raises`` raises (``synchronize`` and
``current_device`` an AssertionError "Torch not compiled with CUDA enabled", ``set_device`` and
``reset_peak_memory_stats`` an AttributeError of torch._C, ``Event`` / ``Stream`` / ``CUDAGraph`` a RuntimeError,
the nvml queries ModuleNotFoundError). ``REDIRECTED`` is what ``npu-port run``'s CUDA redirect answers
(npu_port/device/redirect/cuda_api.py: its stand-ins, plus ``torch.cuda.nvtx`` and the legacy tensor types).
"""

from __future__ import annotations

import ast
import operator
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple

from ..context import LOCAL

if TYPE_CHECKING:
    from ..context import PythonFile

#: The CUDA legacy tensor types (the redirect's LEGACY_TENSOR_TYPES, copied: importing it would import torch, and the
#: scan must not). tests/scan/test_device.py checks the two lists agree.
LEGACY_TENSOR_TYPES = ("FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
                       "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor")  # fmt: skip

BENIGN = "benign"
WARNS = "warns"
RAISES = "raises"

#: ``torch.cuda`` attribute (after ``torch.cuda.``) -> what calling it does on a torch without CUDA (torch 2.13).
CUDA_API: Dict[str, str] = {
    # benign: answers, does nothing, or queues the work for a CUDA init that never comes
    "is_available": BENIGN,  # False
    "device_count": BENIGN,  # 0
    "is_initialized": BENIGN,  # False
    "is_bf16_supported": BENIGN,  # False
    "is_tf32_supported": BENIGN,  # False
    "get_arch_list": BENIGN,  # []
    "get_gencode_flags": BENIGN,  # ""
    "manual_seed": BENIGN,  # queued
    "manual_seed_all": BENIGN,
    "seed": BENIGN,
    "seed_all": BENIGN,
    "get_rng_state_all": BENIGN,  # []
    "set_rng_state": BENIGN,  # queued
    "set_rng_state_all": BENIGN,
    "empty_cache": BENIGN,
    "memory_allocated": BENIGN,  # 0
    "max_memory_allocated": BENIGN,
    "memory_reserved": BENIGN,
    "max_memory_reserved": BENIGN,
    "memory_cached": BENIGN,  # 0, with a rename warning
    "max_memory_cached": BENIGN,
    "memory_stats": BENIGN,  # {}
    "list_gpu_processes": BENIGN,  # a string saying pynvml is missing
    "set_stream": BENIGN,  # with None
    "stream": BENIGN,  # with None: a null context
    "make_graphed_callables": BENIGN,  # until the callables run
    # warns and runs disabled
    "amp.autocast": WARNS,  # deprecation, then "CUDA is not available ... Disabling autocast"
    "amp.GradScaler": WARNS,  # "GradScaler is enabled, but CUDA is not available. Disabling."
    "amp.custom_fwd": WARNS,  # deprecation warning; casts for the "cuda" autocast, which is off
    "amp.custom_bwd": WARNS,
    # raises
    "synchronize": RAISES,
    "set_device": RAISES,  # AttributeError: torch._C has no _cuda_setDevice (a negative index is ignored)
    "current_device": RAISES,
    "get_device_name": RAISES,
    "get_device_properties": RAISES,
    "get_device_capability": RAISES,
    "initial_seed": RAISES,
    "get_rng_state": RAISES,
    "reset_peak_memory_stats": RAISES,
    "reset_max_memory_allocated": RAISES,
    "reset_max_memory_cached": RAISES,
    "reset_accumulated_memory_stats": RAISES,
    "memory_summary": RAISES,  # KeyError on the empty stats
    "mem_get_info": RAISES,
    "set_per_process_memory_fraction": RAISES,
    "get_per_process_memory_fraction": RAISES,
    "ipc_collect": RAISES,
    "init": RAISES,
    "Event": RAISES,
    "Stream": RAISES,
    "ExternalStream": RAISES,
    "current_stream": RAISES,
    "default_stream": RAISES,
    "device": RAISES,  # torch.cuda.device(0) on enter (a negative index is ignored)
    "device_of": RAISES,
    "CUDAGraph": RAISES,
    "graph": RAISES,
    "is_current_stream_capturing": RAISES,
    "nvtx.range_push": RAISES,
    "nvtx.range_pop": RAISES,
    "nvtx.range": RAISES,
    "nvtx.mark": RAISES,
    "utilization": RAISES,  # nvml
    "temperature": RAISES,
    "power_draw": RAISES,
    "clock_rate": RAISES,
    "memory_usage": RAISES,
    "device_memory_used": RAISES,
    "get_allocator_backend": RAISES,
    "caching_allocator_alloc": RAISES,
    "caching_allocator_delete": RAISES,
    "memory_snapshot": RAISES,
    "memory._record_memory_history": RAISES,
    "memory._dump_snapshot": RAISES,
    "set_sync_debug_mode": RAISES,
    "get_sync_debug_mode": RAISES,
    "can_device_access_peer": RAISES,
    "cudart": RAISES,
    **{name: RAISES for name in LEGACY_TENSOR_TYPES},  # TypeError: type torch.cuda.FloatTensor not available
}

#: What ``npu-port run``'s CUDA redirect answers (cuda_api.py's stand-ins, nvtx, the legacy tensor types).
REDIRECTED = frozenset(
    (
        "synchronize", "empty_cache", "ipc_collect", "init", "memory_allocated", "max_memory_allocated",
        "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "reset_max_memory_allocated",
        "reset_max_memory_cached", "reset_accumulated_memory_stats", "memory_stats", "memory_summary", "mem_get_info",
        "set_per_process_memory_fraction", "get_device_name", "get_device_properties", "get_device_capability",
        "device_count", "current_device", "set_device", "is_bf16_supported", "manual_seed", "manual_seed_all", "seed",
        "seed_all", "initial_seed", "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
        "Event", "Stream", "stream", "current_stream", "default_stream", "device",
        "nvtx.range_push", "nvtx.range_pop", "nvtx.range", "nvtx.mark",
        "amp.autocast", "amp.GradScaler",
        *LEGACY_TENSOR_TYPES,
    )
)  # fmt: skip

#: ``torch.cuda`` calls ``npu-port fix`` rewrites to an ``npu_port.device`` helper of the same behaviour on CUDA.
HELPERS = {
    "synchronize": "npu_port.device.synchronize",
    "empty_cache": "npu_port.device.empty_cache",
    "memory_allocated": "npu_port.device.memory_allocated",
    "max_memory_allocated": "npu_port.device.max_memory_allocated",
    "reset_peak_memory_stats": "npu_port.device.reset_peak_memory_stats",
    "mem_get_info": "npu_port.device.mem_get_info",
}


def cuda_api_name(qualified: Optional[str]) -> Optional[str]:
    """``"synchronize"`` for ``torch.cuda.synchronize``; None for anything not under ``torch.cuda``. The memory
    functions are the same objects under ``torch.cuda.memory`` (``torch.cuda.memory.empty_cache``)."""
    if qualified and qualified.startswith("torch.cuda."):
        name = qualified[len("torch.cuda.") :]
        if name.startswith("memory.") and name[len("memory.") :] in CUDA_API:
            return name[len("memory.") :]
        return name
    return None


def classify(name: str) -> Optional[str]:
    """What ``torch.cuda.<name>`` does without CUDA: :data:`BENIGN`, :data:`WARNS`, :data:`RAISES` or None
    (not in the table: not reported)."""
    return CUDA_API.get(name)


# ---- device literals ------------------------------------------------------------------------------------------------


def _cuda_text(text: str) -> bool:
    """``"cuda"`` or ``"cuda:N"`` (N digits or, for a template, anything)."""
    return text == "cuda" or text.startswith("cuda:")


def is_cuda_literal(node: Optional[ast.AST]) -> bool:
    """A string naming a CUDA device: ``"cuda"``, ``"cuda:0"``, ``f"cuda:{rank}"``, ``"cuda:" + str(rank)``,
    ``"cuda:{}".format(rank)``, ``"cuda:%d" % rank``, and either branch of ``"cuda" if ... else "cpu"``."""
    return bool(cuda_literal_parts(node))


def cuda_literal_parts(node: Optional[ast.AST]) -> List[ast.AST]:
    """The parts of ``node`` that name a CUDA device (:func:`is_cuda_literal`'s forms): ``node`` itself, or the
    branches of a conditional expression that do."""
    if isinstance(node, ast.IfExp):
        return cuda_literal_parts(node.body) + cuda_literal_parts(node.orelse)
    return [node] if node is not None and _names_cuda(node) else []


def _names_cuda(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _cuda_text(node.value)
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return isinstance(first, ast.Constant) and isinstance(first.value, str) and _cuda_text(first.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left = node.left
        return isinstance(left, ast.Constant) and isinstance(left.value, str) and left.value.startswith("cuda:")
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and isinstance(node.func.value, ast.Constant)
        and isinstance(node.func.value.value, str)
    ):
        return node.func.value.value.startswith("cuda:")
    return False


def live_cuda_literal(source: "PythonFile", node: Optional[ast.AST]) -> bool:
    """A CUDA device literal (:func:`is_cuda_literal`) with a part that runs without CUDA: ``"cuda" if
    torch.cuda.is_available() else "cpu"`` is not one (its ``"cuda"`` is only chosen where CUDA is)."""
    return any(not cuda_guarded(source, part) for part in cuda_literal_parts(node))


def literal_part(source: "PythonFile", node: ast.AST) -> ast.AST:
    """The part of a CUDA device literal whose guard decides the finding's: one that runs without CUDA when there is
    one (the finding is not guarded), else the first (``"cuda" if torch.cuda.is_available() else "cpu"``: guarded by
    that test)."""
    parts = cuda_literal_parts(node)
    return next((part for part in parts if not cuda_guarded(source, part)), parts[0] if parts else node)


def is_device_name(name: str) -> bool:
    """A variable, attribute, keyword or parameter holding a device: ``device``, ``self.device``, ``vae_device``,
    ``DEVICE``, ``execution_device``, ``device_map`` (transformers / accelerate: a device name puts every weight
    there)."""
    name = name.lower()
    return name in ("device", "device_map") or name.endswith("_device")


def keyword(call: ast.Call, name: str) -> Optional[ast.AST]:
    for item in call.keywords:
        if item.arg == name:
            return item.value
    return None


def argument(call: ast.Call, position: int, name: str) -> Optional[ast.AST]:
    """The argument at ``position`` (if no ``*args`` precedes it) or given as ``name=``."""
    if len(call.args) > position and not any(isinstance(a, ast.Starred) for a in call.args[: position + 1]):
        return call.args[position]
    return keyword(call, name)


# ---- call helpers ---------------------------------------------------------------------------------------------------


def cuda_calls(source: "PythonFile") -> Iterator[Tuple[ast.Call, str]]:
    """Every call of a ``torch.cuda`` function, however imported, with its name under ``torch.cuda``."""
    for call, qualified in source.calls():
        name = cuda_api_name(qualified)
        if name is not None:
            yield call, name


def call_text(name: str) -> str:
    return f"`torch.cuda.{name}()`"


AUTOCAST = frozenset(("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"))
GRAD_SCALER = frozenset(("torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.GradScaler"))
GENERATOR = frozenset(("torch.Generator", "torch._C.Generator"))


def at_import_time(source: "PythonFile", node: ast.AST) -> bool:
    """Whether ``node`` runs when the module is imported: at module or class level, in a comprehension there, or in
    a function's default arguments or decorators.

    :meth:`PythonFile.at_import_time` misses default arguments: it compares the defaults with the child it came
    from, which is the ``ast.arguments`` node, never a default. This one walks the same way and checks that node.
    """
    from ..context import _is_main_guard

    child, parent = node, source.parents.get(node)
    while parent is not None:
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_arguments = child is parent.args  # reached through a default (annotations are not evaluated here)
            in_decorators = not isinstance(parent, ast.Lambda) and child in parent.decorator_list
            if not (in_arguments or in_decorators):
                return False
        if isinstance(parent, ast.If) and _is_main_guard(parent.test):
            return False
        child, parent = parent, source.parents.get(parent)
    return True


# ---- what a torch.cuda availability test decides -------------------------------------------------------------------
#
# ``torch.cuda.is_available()`` is False and ``device_count()`` 0 without CUDA. The CUDA side of a choice the project
# makes with them (the body of ``if torch.cuda.is_available():``, the right of ``is_available() and ...``, what follows
# ``if not is_available(): return``) never runs on an NPU or a CPU — nor under ``npu-port run`` unless
# ``--cuda-available`` makes the test True, and then the redirect answers it. The rules about what npu-port run handles
# report such code at severity ``guarded``, naming the test (:func:`guarded_finding`): the guard may be all that keeps
# the program running, and the user sees every CUDA-only line. A test whose False answer stops the program (``assert``,
# ``raise``) is NPU315's, and the code after it is reported as usual: porting the program means porting it.

AVAILABILITY = ("is_available", "device_count")

_COMPARISONS = {
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


def availability_call(source: "PythonFile", node: ast.AST) -> Optional[str]:
    """``"is_available"`` / ``"device_count"`` for a call of ``torch.cuda.is_available()`` / ``device_count()``
    (however imported); None for anything else."""
    if isinstance(node, ast.Call):
        name = cuda_api_name(source.resolve(node))
        if name in AVAILABILITY:
            return name
    return None


def cuda_when(source: "PythonFile", test: ast.AST, truthy: bool = True, _depth: int = 0) -> Optional[bool]:
    """What ``test`` being truthy (``truthy=False``: falsy) says about CUDA: True (it is available), False (it is
    not), None (nothing). Understands the availability calls, ``not``, ``and`` / ``or``, ``device_count()`` compared
    with a number, and a name assigned one of these once (``use_cuda = torch.cuda.is_available()``)."""
    if _depth > 10:
        return None
    if availability_call(source, test) is not None:
        return truthy  # is_available() is True, device_count() non-zero, exactly where CUDA is
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return cuda_when(source, test.operand, not truthy, _depth + 1)
    if isinstance(test, ast.BoolOp):
        parts = [cuda_when(source, value, truthy, _depth + 1) for value in test.values]
        if isinstance(test.op, ast.And) == truthy:  # `a and b` truthy, `a or b` falsy: every part was
            known = {part for part in parts if part is not None}
            return known.pop() if len(known) == 1 else None
        return parts[0] if len(set(parts)) == 1 else None  # one part was, which is unknown: all must agree
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and type(test.ops[0]) in _COMPARISONS
        and availability_call(source, test.left) == "device_count"
        and isinstance(test.comparators[0], ast.Constant)
        and type(test.comparators[0].value) is int
    ):
        compare, bound = _COMPARISONS[type(test.ops[0])], test.comparators[0].value
        holds = [compare(count, bound) == truthy for count in range(max(bound, 0) + 3)]  # counts 0, 1, ... past it
        if not holds[0]:
            return True
        return False if not any(holds[1:]) else None
    if isinstance(test, ast.Name):
        value = single_value(source, test)
        if value is not None:
            return cuda_when(source, value, truthy, _depth + 1)
    return None


def single_value(source: "PythonFile", name: ast.Name) -> Optional[ast.AST]:
    """The value of ``name`` where the scope that binds it does so once, by ``name = value``; None when it binds it
    otherwise (a parameter, a loop, an import, twice) or nowhere."""
    table = source.cached("single_values", lambda: _assignments(source))
    scope: Optional[ast.AST] = source.scope_of(name)
    start = scope
    while scope is not None:
        if isinstance(scope, ast.ClassDef) and scope is not start:  # a class body is not seen from its methods
            scope = source.scope_of(scope)
            continue
        values = table.get((scope, name.id))
        if values is not None:
            return values[0] if len(values) == 1 and values[0] is not None else None
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = scope.args
            every = arguments.posonlyargs + arguments.args + arguments.kwonlyargs + [arguments.vararg, arguments.kwarg]
            if any(a is not None and a.arg == name.id for a in every):
                return None
        scope = source.scope_of(scope) if scope is not source.tree else None
    return None


def _assignments(source: "PythonFile") -> Dict[Tuple[ast.AST, str], List[Optional[ast.AST]]]:
    """``{(scope, name): [value, ...]}`` for every name a scope stores; None stands for a binding that is not a plain
    ``name = value`` (``for name in``, ``name += 1``, ``a = b = value`` included, which are rare enough to give up)."""
    table: Dict[Tuple[ast.AST, str], List[Optional[ast.AST]]] = {}
    for node in source.of(ast.Name):
        if isinstance(node.ctx, ast.Store):  # type: ignore[attr-defined]
            parent = source.parents.get(node)
            plain = (isinstance(parent, ast.Assign) and len(parent.targets) == 1 and parent.targets[0] is node) or (
                isinstance(parent, ast.AnnAssign) and parent.target is node
            )
            value = parent.value if plain else None  # type: ignore[union-attr]
            table.setdefault((source.scope_of(node), node.id), []).append(value)  # type: ignore[attr-defined]
    for node in source.of(ast.Import, ast.ImportFrom):
        for alias in node.names:  # type: ignore[attr-defined]
            bound = alias.asname or alias.name.split(".")[0]
            table.setdefault((source.scope_of(node), bound), []).append(None)
    return table


def _ending(body: List[ast.stmt], source: "PythonFile") -> Optional[str]:
    """How ``body`` ends: ``"stops"`` (it raises or exits the program), ``"leaves"`` (``return`` / ``continue`` /
    ``break``: the code after it is not reached) or None."""
    if not body:
        return None
    last = body[-1]
    if isinstance(last, ast.Raise):
        return "stops"
    if isinstance(last, (ast.Return, ast.Continue, ast.Break)):
        return "leaves"
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        call = last.value
        if source.resolve(call) in ("sys.exit", "os._exit", "os.abort"):
            return "stops"
        func = call.func
        if isinstance(func, ast.Name) and func.id in ("exit", "quit") and source.binding(func.id, call) is None:
            return "stops"
    return None


def cuda_guarded(source: "PythonFile", node: ast.AST) -> bool:
    """Whether ``node`` is the CUDA side of a choice between CUDA and another path (:func:`cuda_guard`)."""
    return cuda_guard(source, node) is not None


def cuda_guard(source: "PythonFile", node: ast.AST) -> Optional[ast.AST]:
    """The test that makes ``node`` the CUDA side of a choice between CUDA and another path, taken only where
    ``torch.cuda`` says CUDA is available: the body of ``if torch.cuda.is_available():`` (or the ``else`` of ``if not
    ...``), the chosen branch of ``X if torch.cuda.is_available() else Y``, the right of ``torch.cuda.is_available()
    and``, the code after ``if not torch.cuda.is_available(): return`` in the same block; None when there is none.

    Code after ``assert torch.cuda.is_available()`` or beside ``else: raise`` is not guarded: there is no other path,
    the program requires CUDA (NPU315), and porting it means porting that code too."""
    child, parent = node, source.parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.If):
            if (
                any(s is child for s in parent.body)
                and _ending(parent.orelse, source) != "stops"
                and cuda_when(source, parent.test, True) is True
            ):
                return parent.test
            if (
                any(s is child for s in parent.orelse)
                and _ending(parent.body, source) != "stops"
                and cuda_when(source, parent.test, False) is True
            ):
                return parent.test
        elif isinstance(parent, ast.IfExp):
            if child is parent.body and cuda_when(source, parent.test, True) is True:
                return parent.test
            if child is parent.orelse and cuda_when(source, parent.test, False) is True:
                return parent.test
        elif isinstance(parent, ast.BoolOp):
            before = parent.values[: next((i for i, v in enumerate(parent.values) if v is child), 0)]
            reached_when = isinstance(parent.op, ast.And)  # `a and b`: b runs when a was truthy; `a or b`: falsy
            for value in before:
                if cuda_when(source, value, reached_when) is True:
                    return value
        if isinstance(child, ast.stmt):
            test = _after_a_cuda_return(source, parent, child)
            if test is not None:
                return test
        child, parent = parent, source.parents.get(parent)
    return None


def _after_a_cuda_return(source: "PythonFile", parent: ast.AST, statement: ast.stmt) -> Optional[ast.AST]:
    """The test of a statement before ``statement`` in its block that returns (or continues, breaks) unless CUDA is
    available (``if not torch.cuda.is_available(): return 0``); None when there is none."""
    blocks: Dict[int, Tuple[int, Dict[int, int], Optional[ast.AST]]] = source.cached("cuda_returns", dict)
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if not isinstance(block, list) or not block:
            continue
        if id(block) not in blocks:  # once a block: the first statement that leaves unless CUDA is there
            first = next(
                (
                    i
                    for i, earlier in enumerate(block)
                    if isinstance(earlier, ast.If)
                    and _ending(earlier.body, source) == "leaves"
                    and cuda_when(source, earlier.test, False) is True
                ),
                len(block),
            )
            test = block[first].test if first < len(block) else None  # type: ignore[attr-defined]
            blocks[id(block)] = (first, {id(s): i for i, s in enumerate(block)}, test)
        first, positions, test = blocks[id(block)]
        if id(statement) in positions:
            return test if first < positions[id(statement)] else None
    return None


def guard_note(source: "PythonFile", node: ast.AST) -> Optional[str]:
    """`` (guarded by `torch.cuda.is_available()` on line 12)`` when ``node`` is on the CUDA side of an availability
    test (:func:`cuda_guard`): what a ``guarded`` finding adds to its message; None when it is not."""
    test = cuda_guard(source, node)
    if test is None:
        return None
    text = " ".join(ast.unparse(test).split())
    if len(text) > 60:
        text = text[:57] + "..."
    return f" (guarded by `{text}` on line {test.lineno})"  # type: ignore[attr-defined]


def guarded_finding(
    source: "PythonFile",
    rule: Any,
    node: ast.AST,
    message: Optional[str] = None,
    at: Optional[ast.AST] = None,
    **kw: Any,
) -> Any:
    """``source.finding(rule, node, message, ...)``, at severity ``guarded`` with the guard named in the message when
    ``node`` (or ``at``, where the CUDA-only part is: :func:`literal_part`) runs only where CUDA is available — the
    guard may be all that keeps the program running without CUDA: the line is shown, below the ones that break. The
    fix kind stays: a safe rewrite is as good there."""
    note = guard_note(source, node if at is None else at)
    if note is None:
        return source.finding(rule, node, message, **kw)
    text = message or rule.message
    at = _first_colon(text)  # "... raises without CUDA (guarded by ...): use ..." reads as one sentence
    text = text[:at] + note + text[at:]
    return source.finding(rule, node, text, **{**kw, "severity": "guarded"})


def _first_colon(text: str) -> int:
    """Where the first ``": "`` or ``"; "`` outside backticks is in ``text`` (its length when there is none): the end
    of what breaks, before what to do."""
    quoted = False
    for index, char in enumerate(text):
        if char == "`":
            quoted = not quoted
        elif char in ":;" and not quoted and text[index + 1 : index + 2] in (" ", ""):
            return index
    return len(text)


def cuda_branch_note(source: "PythonFile", node: ast.AST) -> str:
    """For a rule that reports what breaks even under ``npu-port run``: a note, when ``node`` is on the CUDA side of
    an availability test, that only ``--cuda-available`` (what NPU306 suggests for that test) takes it."""
    return (
        " (on the CUDA side of an availability test: reached under npu-port run --cuda-available)"
        if cuda_guarded(source, node)
        else ""
    )


def live_cuda_calls(source: "PythonFile") -> List[Tuple[ast.Call, str]]:
    """:func:`cuda_calls` less those that run only where CUDA is available (:func:`cuda_guarded`); once per file."""
    return source.cached(
        "live_cuda_calls", lambda: [(c, n) for c, n in cuda_calls(source) if not cuda_guarded(source, c)]
    )


def _divides_by(source: "PythonFile", node: ast.AST) -> Optional[str]:
    """How ``node`` (a device count) is used as a divisor or a size: ``"divisor"``, ``"size"`` (an argument of
    ``min``), or None."""
    parent = source.parents.get(node)
    division = (ast.Mod, ast.Div, ast.FloorDiv)
    if isinstance(parent, ast.BinOp) and parent.right is node and isinstance(parent.op, division):
        return "divisor"
    if isinstance(parent, ast.AugAssign) and parent.value is node and isinstance(parent.op, division):
        return "divisor"
    if (
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Name)
        and source.binding(parent.func.id, parent) is None
    ):
        if parent.func.id == "divmod" and len(parent.args) == 2 and parent.args[1] is node:
            return "divisor"
        if parent.func.id == "min" and any(a is node for a in parent.args):
            return "size"
    return None


def cuda_requirement(source: "PythonFile", call: ast.Call) -> Optional[str]:
    """Why the program stops without CUDA at this ``is_available()`` / ``device_count()`` call, as a message; None
    when it does not (it only picks a path: NPU306). The call is the test of an ``assert``, the test of an ``if``
    whose branch taken without CUDA raises or exits, or a device count used as a divisor or a ``min`` bound (also
    through a name assigned it once in the same scope)."""
    name = availability_call(source, call)
    if name is None:
        return None
    shown = f"`torch.cuda.{name}()`"
    remedy = (
        "use `npu_port.device.device_count()` (npu-port run answers the target's count)"
        if name == "device_count"
        else "check `npu_port.get_device()` instead, or run it with `npu-port run --cuda-available`"
    )
    test, parent = call, source.parents.get(call)
    while isinstance(parent, (ast.UnaryOp, ast.BoolOp, ast.Compare)):
        test, parent = parent, source.parents.get(parent)
    if isinstance(parent, ast.Assert) and parent.test is test and cuda_when(source, test, True) is True:
        return f"`assert` on {shown} stops the program without CUDA (an AssertionError on an NPU): {remedy}"
    if isinstance(parent, ast.If) and parent.test is test:
        if (_ending(parent.body, source) == "stops" and cuda_when(source, test, True) is False) or (
            _ending(parent.orelse, source) == "stops" and cuda_when(source, test, False) is False
        ):
            return f"this `if` on {shown} raises / exits without CUDA (on an NPU too): {remedy}"
    if name != "device_count":
        return None
    use = _divides_by(source, call)
    through = ""
    assigned = source.parents.get(call)
    if use is None and isinstance(assigned, ast.Assign) and len(assigned.targets) == 1:
        target = assigned.targets[0]
        if isinstance(target, ast.Name):
            scope = source.scope_of(call)
            for node in source.nodes:
                if (
                    isinstance(node, ast.Name)
                    and node.id == target.id
                    and isinstance(node.ctx, ast.Load)
                    and source.scope_of(node) is scope
                    and single_value(source, node) is call
                ):
                    use = _divides_by(source, node)
                    if use is not None:
                        through = f" (as `{target.id}`)"
                        break
    if use == "divisor":
        return f"{shown} is 0 on an NPU and is divided by here{through}: ZeroDivisionError; {remedy}"
    if use == "size":
        return f"{shown} is 0 on an NPU and bounds a size here{through}: a size of 0; {remedy}"
    return None


# ---- a value that reaches a call through the file's own function ----------------------------------------------------


def parameter_sources(source: "PythonFile", value: Optional[ast.AST]) -> List[Tuple[ast.AST, str, str]]:
    """Where ``value`` comes from when it is a parameter of the function it is used in, one level up and in this
    file only: ``(node, "default", function)`` for its default, ``(node, "argument", function)`` for what each call
    of that function in the file passes to it (``build_mesh("cuda")`` for a module function or a nested one,
    ``self.build_mesh("cuda")`` / ``cls.build_mesh(...)`` inside the class for a method). Empty when ``value`` is
    not such a parameter, or the function assigns it again."""
    if not isinstance(value, ast.Name):
        return []
    function = source.scope_of(value)
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    arguments = function.args
    positional = arguments.posonlyargs + arguments.args
    names = [a.arg for a in positional + arguments.kwonlyargs]
    table = source.cached("single_values", lambda: _assignments(source))
    if value.id not in names or (function, value.id) in table:
        return []
    found: List[Tuple[ast.AST, str, str]] = []
    if value.id in [a.arg for a in positional]:
        index = [a.arg for a in positional].index(value.id)
        first_default = len(positional) - len(arguments.defaults)
        if index >= first_default:
            found.append((arguments.defaults[index - first_default], "default", function.name))
    else:
        index = None
        kw = [a.arg for a in arguments.kwonlyargs].index(value.id)
        if arguments.kw_defaults[kw] is not None:
            found.append((arguments.kw_defaults[kw], "default", function.name))  # type: ignore[arg-type]
    owner = source.parents.get(function)
    method = isinstance(owner, ast.ClassDef) and not any(
        isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list
    )
    if index is not None and method:
        index -= 1  # `self` / `cls` is not passed
    for call, _ in source.calls():
        func = call.func
        if isinstance(owner, ast.ClassDef):
            ours = (
                isinstance(func, ast.Attribute)
                and func.attr == function.name
                and isinstance(func.value, ast.Name)
                and func.value.id in ("self", "cls", owner.name)
                and _inside(source, call, owner)
            )
        else:
            ours = (
                isinstance(func, ast.Name)
                and func.id == function.name
                and source.binding(func.id, call) == LOCAL
                and _inside(source, call, owner)
            )
        if not ours:
            continue
        passed = keyword(call, value.id)
        if passed is None and index is not None and 0 <= index < len(call.args):
            if not any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
                passed = call.args[index]
        if passed is not None:
            found.append((passed, "argument", function.name))
    return found


def _inside(source: "PythonFile", node: ast.AST, owner: Optional[ast.AST]) -> bool:
    parent = source.parents.get(node)
    while parent is not None and parent is not owner:
        parent = source.parents.get(parent)
    return parent is owner


# ---- rewrites shared by NPU307 / NPU308: a CUDA device argument taken out of a libcst call ------------------------


def without_device(call: Any, keyword: str) -> Optional[List[Any]]:
    """The libcst arguments of ``call`` less its device — a first positional string (``torch.autocast("cuda",
    ...)``) or ``keyword=`` — or None when it has none. The argument before a removed last one takes its comma, so
    a trailing comma and the whitespace before the closing parenthesis stay as they were."""
    import libcst as cst

    args = list(call.args)
    for index, arg in enumerate(args):
        first_string = index == 0 and arg.keyword is None and isinstance(arg.value, cst.SimpleString)
        if first_string or (arg.keyword is not None and arg.keyword.value == keyword):
            removed = args.pop(index)
            if index == len(args) and args:
                args[-1] = args[-1].with_changes(comma=removed.comma)
            return args
    return None
