"""``chunked``: exact attention under a memory budget, never materialising the full score tensor.

The answer to "Tried to allocate 112.5 GiB" (ControlVideo: CFG batch 2 x 8 heads x 61440² float16 scores). The
queries are processed in blocks sized so that one block's scores fit ``max_bytes``; when even a thin block of
queries over all keys does not fit, keys are split too and the blocks are merged with an online softmax
(each key block normalised on its own, then combined by log-sum-exp weights, so float16 partial sums cannot
overflow). Causal blocks skip the keys they cannot see. With autograd on, each query block is checkpointed: the
backward recomputes one block at a time, so training stays within the budget too.

The numerics are the ``math`` kernel's (products in float32 unless ``upcast=False``, float32 softmax), so the two
agree to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ...device import free_memory_bytes
from ...errors import KernelRuntimeError
from ...reasons import Reason
from ..call import AttentionCall
from ..masks import causal_keep
from ..registry import register_kernel
from ._matmul import fold_kv, fold_query, fold_scores, scaled_scores, unfold_scores
from ._softmax import masked_softmax, upcast_dtype
from .base import FromStrategy, Kernel, Option, check_bool, check_positive_int_or_none, fp32_softmax

MiB = 1 << 20
#: Budget caps when ``max_bytes`` is not given: large enough for efficient products, small enough to leave room.
DEFAULT_CAP_BYTES = {"cpu": 128 * MiB}
DEFAULT_CAP_OTHER = 2048 * MiB
#: The default budget never goes below this, however little memory is free.
MIN_BUDGET = MiB
#: Share of the free memory the default budget may take.
FREE_MEMORY_SHARE = 0.25
#: Below this many query rows per block (or keys per block) products get inefficient; prefer splitting keys.
MIN_BLOCK = 32


@dataclass(frozen=True)
class ChunkPlan:
    """How a call is cut: rows and keys per block, and the budget the blocks were sized for."""

    query_block: int
    key_block: int
    budget_bytes: int
    bytes_per_score: int

    @property
    def block_bytes(self) -> int:
        """Estimated working memory of one block (scores and the temporaries derived from them)."""
        return self.query_block * self.key_block * self.bytes_per_score

    def describe(self) -> str:
        return (
            f"{self.query_block} queries x {self.key_block} keys per block, ~{self.block_bytes / MiB:.1f} MiB "
            f"of a {self.budget_bytes / MiB:.0f} MiB budget"
        )


def default_budget(device: torch.device) -> int:
    """A quarter of the free memory on ``device``, capped (128 MiB on cpu, 2 GiB on accelerators)."""
    cap = DEFAULT_CAP_BYTES.get(device.type, DEFAULT_CAP_OTHER)
    free = free_memory_bytes(device)
    if free is None:
        return cap
    return max(MIN_BUDGET, min(cap, int(free * FREE_MEMORY_SHARE)))


def _bytes_per_score(call: AttentionCall, upcast: bool) -> int:
    """Bytes of working memory per (query, key) score element of one block, for *all* batch x heads."""
    product = upcast_dtype(call.dtype) if upcast else call.dtype
    size = torch.empty((), dtype=product).element_size()
    per = size  # the scores from the product
    if size < 4:
        per += 4 + size  # their float32 copy for the softmax, and the probabilities cast back for the product with V
    if call.needs_grad:
        per += 8  # out-of-place softmax, and the recomputed block kept for its backward
    if call.mask is not None or call.is_causal:
        per += 1  # the block's keep-mask
    if call.mask is not None and call.mask.bias is not None:
        per += 4  # the block's bias in float32
    if call.dropout_p > 0:
        per += 5  # dropout's mask and the dropped probabilities
    return per * call.batch * call.heads


def _block(t: Optional[Tensor], rows: slice, cols: slice) -> Optional[Tensor]:
    """Slice a broadcastable 4-D mask tensor to a block, leaving size-1 (broadcast) dimensions alone."""
    if t is None:
        return None
    return t[:, :, rows if t.shape[2] != 1 else slice(None), cols if t.shape[3] != 1 else slice(None)]


@register_kernel
class ChunkedKernel(Kernel):
    """Exact attention in blocks sized to a memory budget (query blocks, then key blocks + online softmax)."""

    name = "chunked"
    summary = "exact attention in query/key blocks under a memory budget (online softmax); never O(Sq*Skv) memory"
    priority = 20
    default_selection = True
    listing_order = 30
    supports_lse = True
    STRATEGY_OPTIONS = {
        "max_bytes": FromStrategy("memory_budget"),
        "upcast": FromStrategy("dtype_policy", fp32_softmax),
    }
    OPTIONS = {
        "max_bytes": Option(
            None,
            check_positive_int_or_none("max_bytes"),
            "working-memory budget for one block in bytes; default: a quarter of the free device memory, "
            "capped at 128 MiB on cpu and 2 GiB on accelerators",
        ),
        "query_block": Option(None, check_positive_int_or_none("query_block"), "force this many queries per block"),
        "key_block": Option(None, check_positive_int_or_none("key_block"), "force this many keys per block"),
        "upcast": Option(
            True,
            check_bool("upcast"),
            "multiply half-precision inputs in float32 (default: scores are never rounded to float16/bfloat16); "
            "False keeps the products in the input dtype, faster on accelerators",
        ),
    }

    def __init__(self, **options) -> None:
        super().__init__(**options)
        #: the default budget of calls that need gradients, per device: read once (see :meth:`budget`)
        self._grad_budgets: Dict[torch.device, int] = {}

    # ---- planning -----------------------------------------------------------------------------------------------

    def budget(self, call: AttentionCall) -> int:
        """The working-memory budget ``call`` is cut for: ``max_bytes``, else :func:`default_budget`.

        The default reads the free memory, which changes from call to call — and between a forward and its recompute:
        under gradient checkpointing autograd runs a call again in the backward, when other tensors are alive, and the
        recompute must cut the same blocks (each block is a checkpoint of its own, and torch compares what the forward
        and the recompute saved). So for calls that need gradients the default is read once per device and kept by
        this kernel instance: their blocks are then a function of the call's shape alone."""
        given = self._options["max_bytes"]
        if given:
            return given
        if not call.needs_grad:
            return default_budget(call.device)
        kept = self._grad_budgets.get(call.device)
        if kept is None:
            kept = self._grad_budgets.setdefault(call.device, default_budget(call.device))
        return kept

    def plan(self, call: AttentionCall) -> Optional[ChunkPlan]:
        """The blocks for ``call``, or None when the budget cannot hold even one query against one key."""
        budget = self.budget(call)
        per_score = _bytes_per_score(call, self._options["upcast"])
        elements = budget // per_score
        q_len, key_len = max(call.q_len, 1), max(call.key_len, 1)
        forced_q, forced_k = self._options["query_block"], self._options["key_block"]
        if forced_q or forced_k:
            query_block = min(forced_q or max(1, elements // (forced_k or key_len)), q_len)
            key_block = min(forced_k or key_len, key_len)
            return ChunkPlan(query_block, key_block, budget, per_score)
        if elements < 1:
            return None
        rows = elements // key_len
        if rows >= min(q_len, MIN_BLOCK):
            return ChunkPlan(min(q_len, rows), key_len, budget, per_score)
        query_block = min(q_len, MIN_BLOCK)
        while query_block > 1 and elements // query_block < min(key_len, MIN_BLOCK):
            query_block //= 2
        key_block = min(key_len, elements // query_block)
        return ChunkPlan(query_block, key_block, budget, per_score)

    def call_reasons(self, call: AttentionCall) -> List[Reason]:
        if self._options["max_bytes"] is None and _bytes_per_score(call, self._options["upcast"]) <= MIN_BUDGET:
            return []  # the default budget is never below MIN_BUDGET: no need to ask the device for free memory
        if self.plan(call) is None:
            return [self._budget_reason(call)]
        return []

    def _budget_reason(self, call: AttentionCall) -> Reason:
        need = _bytes_per_score(call, self._options["upcast"])
        return Reason(
            "budget",
            f"max_bytes={self._options['max_bytes']} cannot hold one query x one key for all "
            f"{call.batch} x {call.heads} batch x heads ({need} bytes); raise max_bytes",
        )

    # ---- running ------------------------------------------------------------------------------------------------

    def run(self, call: AttentionCall) -> Tensor:
        return self._run(call, want_lse=False)[0]

    def run_lse(self, call: AttentionCall) -> Tuple[Tensor, Tensor]:
        """The output and the running log-sum-exp the online softmax keeps anyway (every block then takes the online
        path, which is exact for one key block too)."""
        out, lse = self._run(call, want_lse=True)
        assert lse is not None
        return out, lse

    def _run(self, call: AttentionCall, want_lse: bool) -> Tuple[Tensor, Optional[Tensor]]:
        plan = self.plan(call)
        if plan is None:  # free memory shrank since reasons() was asked
            raise KernelRuntimeError(f"chunked kernel: {self._budget_reason(call)}")
        product = upcast_dtype(call.dtype) if self._options["upcast"] else call.dtype
        blocks = _Blocks(call, plan, product, want_lse)
        out = torch.empty(
            (call.batch, call.heads, call.q_len, call.value_dim), dtype=call.value.dtype, device=call.device
        )
        lse = torch.empty((call.batch, call.heads, call.q_len), dtype=torch.float32, device=call.device)
        for start in range(0, call.q_len, plan.query_block):
            stop = min(start + plan.query_block, call.q_len)
            query = call.query[:, :, start:stop]
            if call.needs_grad:  # recompute this block in the backward instead of keeping its scores
                block = checkpoint(
                    blocks.query_block, query, start, blocks.bias, use_reentrant=False, preserve_rng_state=True
                )
            else:
                block = blocks.query_block(query, start, blocks.bias)
            if want_lse:
                block, block_lse = block
                lse[:, :, start:stop] = block_lse
            out[:, :, start:stop] = block
        return out, (lse if want_lse else None)


def _finite_or_zero(t: Tensor) -> Tensor:
    """Row maxima used as exponent shifts: -inf (a row with no key yet) becomes 0 so ``exp`` never sees inf - inf."""
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))


class _Blocks:
    """One call's block computations; key and value are folded (and upcast) once, not per block."""

    def __init__(self, call: AttentionCall, plan: ChunkPlan, product: torch.dtype, want_lse: bool = False) -> None:
        self.call = call
        self.want_lse = want_lse  # query_block then returns (out, lse)
        self.plan = plan
        self.product = product  # dtype of the two matrix products
        self.compute = upcast_dtype(product)  # dtype of the softmax and the online accumulators
        self.key3 = fold_kv(call.key).to(product)
        self.value3 = fold_kv(call.value).to(product)
        self.bias = call.mask.bias if call.mask is not None else None
        self.keep = call.mask.keep if call.mask is not None else None
        self._buffer: Optional[Tensor] = None  # score buffer reused by every block when autograd is off

    def query_block(self, query: Tensor, start: int, bias: Optional[Tensor]) -> Tensor:
        """Attention of one block of queries against all the keys it can see (``bias`` passed for checkpoint)."""
        call = self.call
        stop = start + query.shape[2]
        key_limit = min(call.key_len, stop) if call.is_causal else call.key_len  # top-left causal: keys j <= i
        query3 = fold_query(query, call.kv_heads).to(self.product)
        if self.want_lse:
            out, run_max, run_sum = self._attend_online(query3, bias, start, stop, key_limit)
            return out.to(call.value.dtype), (run_max + torch.log(run_sum)).squeeze(-1).float()
        if self.plan.key_block >= key_limit:
            out = self._attend(query3, bias, start, stop, 0, key_limit)
        else:
            out = self._attend_online(query3, bias, start, stop, key_limit)[0]
        return out.to(call.value.dtype)

    def _masks(self, bias: Optional[Tensor], start: int, stop: int, k0: int, k1: int):
        rows, cols = slice(start, stop), slice(k0, k1)
        bias_block, keep_block = _block(bias, rows, cols), _block(self.keep, rows, cols)
        if self.call.is_causal:
            causal = causal_keep(stop - start, k1 - k0, self.call.device, q_start=start, key_start=k0)
            keep_block = causal if keep_block is None else keep_block & causal
        return bias_block, keep_block

    def _scores(self, query3: Tensor, k0: int, k1: int) -> Tensor:
        call = self.call
        out = None
        if not call.needs_grad:
            size = query3.shape[0] * query3.shape[1] * (k1 - k0)
            if self._buffer is None:
                capacity = call.batch * call.heads * self.plan.query_block * min(self.plan.key_block, call.key_len)
                self._buffer = torch.empty(capacity, dtype=self.product, device=call.device)
            out = self._buffer[:size].view(query3.shape[0], query3.shape[1], k1 - k0)
        scores3 = scaled_scores(query3, self.key3[:, k0:k1], call.scale, out=out)
        return unfold_scores(scores3, call.batch, call.heads)

    def _apply(self, probs: Tensor, k0: int, k1: int) -> Tensor:
        call = self.call
        if call.dropout_p > 0:
            probs = F.dropout(probs, p=call.dropout_p, training=True)
        probs3 = fold_scores(probs.to(self.product), call.kv_heads)
        return unfold_scores(torch.bmm(probs3, self.value3[:, k0:k1]), call.batch, call.heads)

    def _attend(self, query3: Tensor, bias: Optional[Tensor], start: int, stop: int, k0: int, k1: int) -> Tensor:
        """One query block against keys ``k0:k1`` in one go: the math kernel's formulation on a slice."""
        bias_block, keep_block = self._masks(bias, start, stop, k0, k1)
        probs = masked_softmax(self._scores(query3, k0, k1), bias_block, keep_block, inplace=not self.call.needs_grad)
        return self._apply(probs, k0, k1)

    def _attend_online(self, query3: Tensor, bias: Optional[Tensor], start: int, stop: int, key_limit: int) -> Tensor:
        """One query block against key blocks merged with an online (log-sum-exp) softmax.

        Each key block's probabilities are normalised within the block before the product with V (bounded by
        max|V|, so half precision cannot overflow), then blocks are combined with weights ``l_b * exp(m_b - m)``.
        The running maxima are detached: the result does not depend on them, and the gradient through the sums is
        exact without them.
        """
        call, compute = self.call, self.compute
        inplace = not call.needs_grad  # the block's buffers are ours alone when autograd is off
        rows = stop - start
        run_max = torch.full((call.batch, call.heads, rows, 1), float("-inf"), dtype=compute, device=call.device)
        run_sum = torch.zeros((call.batch, call.heads, rows, 1), dtype=compute, device=call.device)
        acc = torch.zeros((call.batch, call.heads, rows, call.value_dim), dtype=compute, device=call.device)
        for k0 in range(0, key_limit, self.plan.key_block):
            k1 = min(k0 + self.plan.key_block, key_limit)
            bias_block, keep_block = self._masks(bias, start, stop, k0, k1)
            scores = self._scores(query3, k0, k1).to(compute)
            if bias_block is not None:
                bias_block = bias_block.to(compute)
                scores = scores.add_(bias_block) if inplace else scores + bias_block
            if keep_block is not None:
                masked = ~keep_block
                scores = (
                    scores.masked_fill_(masked, float("-inf")) if inplace else scores.masked_fill(masked, float("-inf"))
                )
            block_max = scores.amax(dim=-1, keepdim=True).detach()  # -inf where the block has no key for a row
            shift = _finite_or_zero(block_max)
            probs = scores.sub_(shift).exp_() if inplace else torch.exp(scores - shift)
            del scores
            block_sum = probs.sum(dim=-1, keepdim=True)
            divisor = torch.where(block_sum > 0, block_sum, torch.ones_like(block_sum))
            probs = probs.div_(divisor) if inplace else probs / divisor
            block_out = self._apply(probs, k0, k1).to(compute)
            del probs
            new_max = torch.maximum(run_max, block_max)
            reference = _finite_or_zero(new_max)
            old_weight = run_sum * torch.exp(run_max - reference)
            new_weight = block_sum * torch.exp(block_max - reference)
            total = old_weight + new_weight
            acc = (acc * old_weight + block_out * new_weight) / torch.where(total > 0, total, torch.ones_like(total))
            run_max, run_sum = new_max, total
        return acc, run_max, run_sum
