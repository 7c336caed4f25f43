"""Which computes a call of the flash_attn drop-in: the ``flash_attn_npu`` package (flash-attn-npu's flash-attn 2
API, fused kernels for Ascend 910B / 910C), or npu-port's emulation through ``npu_port.attention``.

flash-attn-npu (PyPI ``flash-attn-npu``, MinghuasLab, not an Ascend project) implements flash-attn's own functions
with flash-attn's semantics — bottom-right causal, sliding windows, softcap, dropout, ALiBi, the softmax log-sum-exp,
packed (varlen) batches without a host loop — so where it can run a call it is the better engine: the emulation
builds a mask for every window and cannot compute softcap, ALiBi or the log-sum-exp at all. Where it cannot — tensors
off the NPU, float32, head dims above 256, chips it does not support (910A; 950 and 310P, where its import raises),
limits of its own (int32 offsets, no window with an appended KV cache) — the emulation runs as before, and the reason
is recorded (:data:`ROUTES`, listed by ``npu-port run``'s summary and report, and logged at debug level).

Its import has side effects: ``import flash_attn_npu`` imports torch_npu, asks the device for its name and raises
``RuntimeError("Unsupported Ascend device: ...")`` on anything but a 910. So it is imported at most once, on the
first call whose tensors are on an NPU, through :func:`npu_port._optional.probe` (``find_spec`` first, then the
import inside a try that turns any failure into a reason); never at npu-port's import, never for CPU or GPU tensors.
The outcome — the module, or the :class:`~npu_port.reasons.Reason` it cannot be used — is kept (:func:`package`);
:func:`forget` drops it.

Reasons are checked against flash-attn-npu 0.4.2.post1's documentation and argument checks (its README
"Constraints", ``flash_attn_npu/flash_attn_npu_interface.py``, ``csrc/ascend910/flash_attn_npu/flash_api.cpp``):
float16 / bfloat16 only, one dtype; head dim 1..256, the same for q, k and v; query heads a multiple of key heads;
``0 <= dropout_p < 1``; ``softcap >= 0``; ALiBi slopes float32 on the NPU, ``(heads,)`` or ``(batch, heads)``;
``cu_seqlens`` and ``cache_seqlens`` int32 on the NPU (its kernels read them as int32 without converting); in
``flash_attn_with_kvcache`` no rotary embedding, no ``cache_leftpad``, no window while appending keys, appended keys
only with a head dim that is a multiple of 16, ``num_splits > 1`` only with a paged cache. Reason codes: ``device``,
``chip``, ``package-missing``, ``package-broken``, ``dtype``, ``head-dim``, ``heads``, ``empty-batch``, ``dropout``,
``softcap``, ``alibi``, ``offsets``, ``block-table``, ``rotary``, ``cache-leftpad``, ``window-append``,
``num-splits``, ``layout``.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, Dict, Iterable, Iterator, Optional, Sequence, Set, Tuple, Union

from .._optional import forget as forget_probe
from .._optional import probe
from ..device.chips import CHIPS, current_chip
from ..hits import HitLog
from ..reasons import Reason

logger = logging.getLogger("npu_port.dropins")

#: The import name of flash-attn-npu's flash-attn 2 API.
PACKAGE = "flash_attn_npu"
#: The device types whose tensors flash_attn_npu takes (tests add "cpu" with a stand-in package).
DEVICE_TYPES: Tuple[str, ...] = ("npu",)
#: The chips where its flash-attn 2 API imports and runs (npu_port.device.chips: 910B, 910C).
V2_CHIPS = tuple(name for name, chip in CHIPS.items() if chip.flash_attn_npu_v2)
#: Its head-dim limit (``flash_api.cpp``: "FlashAttention only supports head dimension in [1, 256]").
MAX_HEAD_DIM = 256

Decision = Tuple[Optional[ModuleType], Optional[Reason]]


class Routes:
    """What served each call that reached the routing: flash_attn_npu (counted per drop-in function) or npu-port's
    emulation (counted per reason code, with the first message of each code), each with the first places that made
    such a call, in the project or in a library (:class:`~npu_port.hits.HitLog`)."""

    def __init__(self) -> None:
        self.delegated = HitLog()
        self.emulated = HitLog()
        self.reasons: Dict[str, str] = {}
        self._logged: Set[Tuple[str, str]] = set()

    def hit(self, function: str) -> None:
        self.delegated.hit(function)

    def decline(self, function: str, reason: Reason) -> None:
        self.emulated.hit(reason.code)
        self.reasons.setdefault(reason.code, str(reason))
        if (function, reason.code) not in self._logged:  # once per function and code: a loop would flood the log
            self._logged.add((function, reason.code))
            logger.debug("npu-port: %s runs on npu-port's emulation, not flash_attn_npu: %s", function, reason)

    def summary(self) -> Dict[str, Any]:
        """``{"flash_attn_npu": {function: {"count", "where"}}, "emulation": {code: {"count", "reason", "where"}}}``
        (JSON-ready: places as ``"file:line"``, first-come)."""

        def places(hit: Dict[str, Any]) -> list:  # the project's and the libraries' (the report's by_rule splits them)
            found = [*hit["where"], *(place for item in hit["libraries"].values() for place in item["where"])]
            return [f"{filename}:{line}" for _, (filename, line) in sorted(found, key=lambda item: item[0])]

        delegated = {
            kind: {"count": hit["count"], "where": places(hit)} for kind, hit in self.delegated.snapshot().items()
        }
        emulated = {
            code: {"count": hit["count"], "reason": self.reasons.get(code, ""), "where": places(hit)}
            for code, hit in self.emulated.snapshot().items()
        }
        return {"flash_attn_npu": delegated, "emulation": emulated}

    def clear(self) -> None:
        self.delegated.clear()
        self.emulated.clear()
        self.reasons.clear()
        self._logged.clear()


#: The record of one process (``npu_port.activate`` clears it when a run starts).
ROUTES = Routes()

_found: Optional[Union[ModuleType, Reason]] = None


def package() -> Union[ModuleType, Reason]:
    """The ``flash_attn_npu`` module, or why it cannot be used here; found once, then kept.

    The chip is asked first (from torch_npu, already loaded when NPU tensors exist): the package's own import lets
    every "Ascend910..." through, 910A included, which its README does not list (910B / 910C / 950), and raises on
    950 and 310P.
    """
    global _found
    if _found is None:
        _found = _find()
    return _found


def _find() -> Union[ModuleType, Reason]:
    chip = current_chip()
    if chip is not None and chip.name not in V2_CHIPS:
        return Reason(
            "chip",
            f"flash_attn_npu's flash-attn 2 API runs on Ascend {' / '.join(V2_CHIPS)} only, not on this "
            f"{chip.name} ({chip.product})",
        )
    status = probe(PACKAGE)
    return status.module if status.ok else status.reason


def forget() -> None:
    """Look for the package again at the next NPU call (after installing it, or in tests)."""
    global _found
    _found = None
    forget_probe(PACKAGE)


def _choose(function: str, problem: Optional[Reason], on_device: bool) -> Decision:
    """Record and return the decision: the package when the call is within its limits (``problem`` None) and it is
    usable here, else the reason. For NPU tensors the package's own absence comes first: the call's limits only
    matter where it is installed."""
    reason = problem
    if on_device:
        usable = package()
        if isinstance(usable, Reason):
            reason = usable
        elif problem is None:
            ROUTES.hit(function)
            return usable, None
    assert reason is not None
    ROUTES.decline(function, reason)
    return None, reason


def _name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _device_reason(tensors: Iterable[Tuple[str, Any]]) -> Optional[Reason]:
    for label, tensor in tensors:
        if tensor is not None and tensor.device.type not in DEVICE_TYPES:
            return Reason("device", f"flash_attn_npu runs on Ascend NPUs only; {label} is on {tensor.device.type}")
    return None


def _tensor_reasons(q: Any, k: Any, v: Any) -> Optional[Reason]:
    """dtype, head dim and head counts of ``q``, ``k``, ``v``: heads on the second-last axis, head dim last, in
    every layout (``(B, S, H, D)``, packed ``(T, H, D)``, a paged cache ``(blocks, page, H, D)``)."""
    import torch

    dtypes = (q.dtype, k.dtype, v.dtype)
    if len(set(dtypes)) != 1 or q.dtype not in (torch.float16, torch.bfloat16):
        return Reason(
            "dtype",
            f"flash_attn_npu takes float16 or bfloat16, one dtype for q, k and v; got {', '.join(map(_name, dtypes))}",
        )
    dims = (q.shape[-1], k.shape[-1], v.shape[-1])
    if len(set(dims)) != 1:
        return Reason(
            "head-dim", f"q, k and v have head dims {dims[0]}, {dims[1]}, {dims[2]}; flash_attn_npu needs one head dim"
        )
    if not 1 <= dims[0] <= MAX_HEAD_DIM:
        return Reason("head-dim", f"head_dim {dims[0]} is outside flash_attn_npu's range [1, {MAX_HEAD_DIM}]")
    heads, kv_heads = q.shape[-2], k.shape[-2]
    if kv_heads == 0 or heads % kv_heads:
        return Reason(
            "heads", f"{heads} query heads are not a multiple of {kv_heads} key/value heads (flash_attn_npu's limit)"
        )
    return None


def _option_reasons(dropout_p: float, softcap: float, alibi_slopes: Any, batch: int, heads: int) -> Optional[Reason]:
    import torch

    if not 0.0 <= dropout_p < 1.0:
        return Reason("dropout", f"dropout_p={dropout_p!r}: flash_attn_npu needs 0 <= dropout_p < 1")
    if softcap < 0:
        return Reason("softcap", f"softcap={softcap!r}: flash_attn_npu needs softcap >= 0 (0 = off)")
    if alibi_slopes is not None:
        shape = tuple(alibi_slopes.shape)
        if (
            alibi_slopes.dtype != torch.float32
            or alibi_slopes.device.type not in DEVICE_TYPES
            or shape not in ((heads,), (batch, heads))
            or alibi_slopes.stride(-1) != 1
        ):
            return Reason(
                "alibi",
                f"alibi_slopes {_name(alibi_slopes.dtype)} {list(shape)} on {alibi_slopes.device.type}: flash_attn_npu "
                f"needs float32 slopes on the NPU, shaped ({heads},) or ({batch}, {heads}), contiguous",
            )
    return None


def _int32_reason(label: str, tensor: Any) -> Optional[Reason]:
    import torch

    if tensor is not None and tensor.dtype != torch.int32:
        return Reason(
            "offsets", f"{label} is {_name(tensor.dtype)}; flash_attn_npu reads it as int32 (it does not convert)"
        )
    return None


def dense(function: str, q: Any, k: Any, v: Any, *, dropout_p: float, softcap: float, alibi_slopes: Any) -> Decision:
    """The decision for a ``(batch, seqlen, heads, head_dim)`` call (flash_attn_func and its packed forms)."""
    off_device = _device_reason((("q", q), ("k", k), ("v", v)))

    def problems() -> Iterator[Optional[Reason]]:
        yield off_device
        yield _tensor_reasons(q, k, v)
        if q.shape[0] == 0:
            yield Reason("empty-batch", "batch size 0: flash_attn_npu needs at least one sequence")
        yield _option_reasons(dropout_p, softcap, alibi_slopes, q.shape[0], q.shape[2])

    return _choose(function, _first(problems()), off_device is None)


def varlen(
    function: str,
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    *,
    dropout_p: float,
    softcap: float,
    alibi_slopes: Any,
    block_table: Any = None,
) -> Decision:
    """The decision for a packed ``(total, heads, head_dim)`` call with ``cu_seqlens`` (the varlen functions; with a
    ``block_table``, ``k`` and ``v`` are a paged cache ``(blocks, page, heads, head_dim)``)."""
    off_device = _device_reason((("q", q), ("k", k), ("v", v)))
    batch = cu_seqlens_q.shape[0] - 1

    def problems() -> Iterator[Optional[Reason]]:
        yield off_device
        yield _device_reason((("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)))
        yield _tensor_reasons(q, k, v)
        if batch < 1:
            yield Reason("empty-batch", "cu_seqlens_q describes no sequence: flash_attn_npu needs at least one")
        yield _int32_reason("cu_seqlens_q", cu_seqlens_q)
        yield _int32_reason("cu_seqlens_k", cu_seqlens_k)
        yield _block_table_reason(block_table)
        yield _option_reasons(dropout_p, softcap, alibi_slopes, batch, q.shape[1])

    return _choose(function, _first(problems()), off_device is None)


def kvcache(
    function: str,
    q: Any,
    k_cache: Any,
    v_cache: Any,
    *,
    k: Any,
    v: Any,
    cache_seqlens: Any,
    rotary_cos: Any,
    cache_leftpad: Any,
    block_table: Any,
    causal: bool,
    window_size: Sequence[int],
    softcap: float,
    alibi_slopes: Any,
    num_splits: int,
) -> Decision:
    """The decision for ``flash_attn_with_kvcache`` (``k`` / ``v``: keys and values to append, or None)."""
    import torch

    off_device = _device_reason((("q", q), ("k_cache", k_cache), ("v_cache", v_cache)))
    seqlens = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None

    def problems() -> Iterator[Optional[Reason]]:
        yield off_device
        yield _device_reason((("k", k), ("v", v), ("cache_seqlens", seqlens)))
        yield _tensor_reasons(q, k_cache, v_cache)
        appended = [t.dtype for t in (k, v) if t is not None]
        if any(dtype != q.dtype for dtype in appended):
            yield Reason(
                "dtype", f"k / v to append are {', '.join(map(_name, appended))}; flash_attn_npu needs {_name(q.dtype)}"
            )
        if q.shape[0] == 0:
            yield Reason("empty-batch", "batch size 0: flash_attn_npu needs at least one sequence")
        if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
            yield Reason("layout", "k_cache and v_cache need a contiguous last dimension for flash_attn_npu")
        yield _int32_reason("cache_seqlens", seqlens)
        if rotary_cos is not None:
            yield Reason("rotary", "flash_attn_npu does not apply rotary embeddings (rotary_cos / rotary_sin)")
        if cache_leftpad is not None:
            yield Reason("cache-leftpad", "flash_attn_npu does not support cache_leftpad")
        if k is not None:
            left, right = (int(w) for w in window_size)
            right = 0 if causal else right
            if (left >= 0 or right >= 0) and not (left < 0 and right == 0):
                yield Reason(
                    "window-append", "flash_attn_npu does not take a sliding window while appending k / v to the cache"
                )
            if q.shape[-1] % 16:
                yield Reason(
                    "head-dim",
                    f"flash_attn_npu appends k / v only with a head dim that is a multiple of 16, not {q.shape[-1]}",
                )
        if num_splits > 1 and block_table is None:
            yield Reason(
                "num-splits", f"num_splits={num_splits} > 1 needs a paged cache (block_table) in flash_attn_npu"
            )
        yield _block_table_reason(block_table)
        yield _option_reasons(0.0, softcap, alibi_slopes, q.shape[0], q.shape[2])

    return _choose(function, _first(problems()), off_device is None)


def _first(reasons: Iterable[Optional[Reason]]) -> Optional[Reason]:
    """The first reason (the checks run lazily, in order, up to it)."""
    return next((reason for reason in reasons if reason is not None), None)


def _block_table_reason(block_table: Any) -> Optional[Reason]:
    import torch

    if block_table is None:
        return None
    if block_table.dtype != torch.int32 or block_table.device.type not in DEVICE_TYPES or block_table.stride(-1) != 1:
        return Reason(
            "block-table",
            f"block_table {_name(block_table.dtype)} on {block_table.device.type}: flash_attn_npu needs an int32 "
            "table on the NPU with a contiguous last dimension",
        )
    return None
