"""A strategy at run time: for each attention call, which kernel runs it.

``fixed`` runs its one kernel and refuses (with the reasons) a call it cannot run — never a silent fallback.
``first`` takes the first candidate that can run the call, and records the others' reasons. ``measure`` (auto)
decides once per shape bucket (see :mod:`.measure`), from memory, else the disk cache, else by measuring; a
provisional decision (timing noise left it open) is kept in memory for this router, and a provisional entry in the
disk cache is measured more (its runs pooled with this process's: :func:`.measure.pool`) rather than trusted. Every
decision kept is noted for auto's one line per process (:mod:`.summary`).
The router is callable with SDPA's signature, which is how the diffusers integration and the flash_attn /
xformers drop-ins reach it; ``select`` is the hook ``npu_port.attention(kernel=None)`` uses.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, Union

import torch
from torch import Tensor

from ..attn import watch
from ..attn.api import run_call, run_call_lse
from ..attn.call import AttentionCall
from ..attn.contract import finish_unmasked
from ..attn.kernels.base import Kernel
from ..attn.masks import float_mask_facts
from ..attn.registry import get_kernel
from ..attn.select import runnable_kernels
from ..attn.target import Target
from ..attn.watch import WATCHERS
from ..device import free_memory_bytes
from ..errors import KernelUnavailableError, NoKernelError, StrategyError
from ..reasons import Reason
from .cache import DecisionCache, kernel_packages
from .cast import CastKernel
from .decision import OK, PICKED, REFUSED, CandidateResult, Decision, bucket_key, bucket_signature
from .measure import UNMEASURED, measure, pick, pool
from .spec import OPTIONS, Strategy
from .summary import SUMMARY

#: Signatures whose prepared runner is kept; past this many (shapes that keep changing) the table starts over.
MAX_PREPARED = 1024

#: auto's default memory budget when the strategy sets none: this share of the device's free memory.
FREE_MEMORY_SHARE = 0.25


def strategy_options_for(kernel: Union[str, Kernel, Type[Kernel]], strategy: Strategy) -> Dict[str, Any]:
    """The kernel options a strategy's options set, as the kernel declares them (``STRATEGY_OPTIONS``): e.g.
    ``memory_budget`` -> chunked's ``max_bytes``; a strategy option left at None sets nothing."""
    cls = kernel if isinstance(kernel, type) else type(get_kernel(kernel))
    options: Dict[str, Any] = {}
    for kernel_option, source in cls.STRATEGY_OPTIONS.items():
        if source.option not in OPTIONS:
            raise StrategyError(
                f"kernel {cls.name!r} maps its option {kernel_option!r} from strategy option {source.option!r}, which "
                f"does not exist; valid strategy options: {', '.join(OPTIONS)}"
            )
        value = strategy.option(source.option)
        if value is not None:
            options[kernel_option] = source.convert(value)
    return options


def _masked_value(kernel: Kernel) -> Optional[float]:
    """The ``masked_value`` a kernel judges float masks with (a cast kernel: its inner kernel's)."""
    inner = getattr(kernel, "inner", kernel)
    return inner.options.get("masked_value")


def configured_kernels(strategy: Strategy) -> List[Kernel]:
    """The candidate kernels with the strategy's options applied (each kernel's ``STRATEGY_OPTIONS``), then the
    strategy's ``kernel_options`` for that kernel."""
    return [
        get_kernel(name, **{**strategy_options_for(name, strategy), **strategy.kernel_options.get(name, {})})
        for name in strategy.candidates
    ]


#: The options in every fingerprint, in this order (the on-disk cache of earlier versions is keyed by it); an option
#: a candidate kernel maps from (STRATEGY_OPTIONS) is added after these.
FINGERPRINT_OPTIONS = ("memory_budget", "sdpa_backends", "dtype_policy", "compute_dtype", "margin")


def fingerprint(strategy: Strategy) -> Dict[str, Any]:
    """What about a strategy changes its decisions (the disk cache is keyed by it)."""
    names = list(FINGERPRINT_OPTIONS)
    for kernel in strategy.candidates:
        names += [source.option for source in type(get_kernel(kernel)).STRATEGY_OPTIONS.values()]
    return {
        "candidates": list(strategy.candidates),
        "options": {k: strategy.option(k) for k in dict.fromkeys(names)},
        "kernel_options": {k: dict(v) for k, v in sorted(strategy.kernel_options.items())},
    }


def _held_to_contract(runner: Callable[..., Tensor], kernel: Kernel, call: AttentionCall) -> Callable[..., Tensor]:
    """A prepared runner whose output keeps the inputs' NaN as every other path does (see npu_port.attn.contract).

    The output alone may be screened only where the kernel loses a NaN as a row of zeros and nothing else: not under
    ``is_causal`` with fewer queries than keys, where keys past the last query are never read at all."""
    zeros_hide_nan = kernel.zeros_hide_nan and not (call.is_causal and call.q_len < call.key_len)
    if call.needs_grad:  # (part of the signature: a runner serves tracked calls only, or untracked ones only)

        def run_tracked(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
            out = runner(query, key, value)
            return finish_unmasked(out, query, key, value, zeros_hide_nan=zeros_hide_nan, tracked=True)

        return run_tracked

    def run(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        return finish_unmasked(runner(query, key, value), query, key, value, zeros_hide_nan=zeros_hide_nan)

    return run


def _chosen_as_training(call: AttentionCall) -> bool:
    """Whether ``call`` is chosen for as the training call it may be: one with dropout that autograd does not track.

    Under reentrant gradient checkpointing (``use_reentrant=True``: torch's old default, still passed by much training
    code) the forward runs without autograd and its recompute in the backward with it: two calls of two buckets,
    which a strategy could send to two kernels. Without dropout two kernels differ by rounding; with dropout each
    draws its own mask from the restored random state, and the gradients would be those of another function than the
    forward computed. So a dropout call is always chosen for as one that needs gradients (the kernel then serves
    both). A dropout call at inference is rare, and takes a kernel with a backward the same way."""
    return call.dropout_p > 0 and not call.needs_grad


def _training_twin(call: AttentionCall) -> AttentionCall:
    """``call`` with a query autograd would track (no copy: a detached view that requires grad), for choosing only;
    read with grad mode on."""
    return replace(call, query=call.query.detach().requires_grad_())


class StrategyRouter:
    """Picks and runs kernels for one applied strategy; keeps every decision for ``explain()``."""

    def __init__(self, strategy: Strategy) -> None:
        if not strategy.candidates:
            raise StrategyError(
                f"strategy {strategy.name!r} names no kernel (custom-processor strategies route nothing)"
            )
        self.strategy = strategy
        self.kernels = configured_kernels(strategy)
        compute = strategy.option("compute_dtype")
        self.compute_dtype: Optional[torch.dtype] = getattr(torch, compute) if compute else None
        self.decisions: Dict[str, Decision] = {}
        self._chosen: Dict[Tuple[Any, ...], Kernel] = {}  # by bucket_signature: the per-call lookup
        self._prepared: Dict[Tuple[Any, ...], Tuple[Callable[..., Tensor], str]] = {}  # by raw signature, see __call__
        self.calls: Counter = Counter()
        self.caches: Dict[str, DecisionCache] = {}
        self.probes = 0
        self.unmeasured: Optional[Decision] = None  # the last call auto could not measure (NaN / inf inputs)
        #: by device type: the distinct ``masked_value`` options of the candidates whose choice depends on a float
        #: mask's values there (empty: none does); each kernel judges purity with its own, so the bucket must too
        self._masked_values: Dict[str, Tuple[Optional[float], ...]] = {}
        self._lock = threading.Lock()

    # ---- what the strategy can do here ------------------------------------------------------------------------

    def availability(self) -> Dict[str, List[Reason]]:
        """Candidate -> reasons it cannot run anything on this machine (empty list = available)."""
        return {k.name: list(k.availability()) for k in self.kernels}

    def check_available(self) -> None:
        """Fail now, with the reasons, if no candidate can ever run here (rather than at the first forward)."""
        found = self.availability()
        if all(found.values()):
            lines = [f"strategy {self.strategy.name!r} cannot run on this machine:"]
            for name, reasons in found.items():
                lines += [f"  {name}: {r}" for r in reasons]
            lines.append("run `npu-port strategies` to see which strategies are available here")
            raise StrategyError("\n".join(lines))

    # ---- choosing ---------------------------------------------------------------------------------------------

    def _forms(
        self, kernel: Kernel, call: AttentionCall, target: Optional[Target] = None
    ) -> Tuple[Kernel, List[Reason]]:
        """The kernel itself, or its compute_dtype form when only the dtype stood in the way (judged for ``target``
        when given: see :class:`~npu_port.attn.target.Target`)."""
        reasons = kernel.reasons(call, target)
        if reasons and self.compute_dtype is not None and call.dtype == torch.float32:
            if all(r.code == "dtype" for r in reasons):
                cast = CastKernel(kernel, self.compute_dtype)
                cast_reasons = cast.reasons(call, target)
                if not cast_reasons:
                    return cast, []
        return kernel, list(reasons)

    def candidate_forms(
        self, call: AttentionCall, target: Optional[Target] = None
    ) -> List[Tuple[Kernel, List[Reason]]]:
        """Each candidate in the strategy's order as it would take ``call`` (itself, or its compute_dtype form) with
        the reasons it cannot (empty: it can): what a plan made for another device reads, by the router's own rule."""
        return [self._forms(kernel, call, target) for kernel in self.kernels]

    def select(self, call: AttentionCall) -> Kernel:
        """The kernel for ``call`` (raises with every reason when none can run it)."""
        return self._select(call)[0]

    def _pure(self, call: AttentionCall) -> Union[None, bool, Tuple[bool, ...]]:
        """Whether ``call``'s float mask is a pure mask, when a candidate's choice depends on it on this device (a
        kernel that converts pure masks: see ``Kernel.reads_mask_values``); None otherwise. Each such kernel judges
        with its own ``masked_value`` (a strategy's ``kernel_options`` can give two kernels different ones), so with
        several values the answer is one per value. Read once per mask tensor and value (``float_mask_facts`` keeps
        it), so a model's layers that share a mask pay for one check."""
        mask = call.mask
        if mask is None or mask.bias is None:
            return None
        device_type = call.device.type
        values = self._masked_values.get(device_type)
        if values is None:
            values = self._masked_values[device_type] = tuple(
                dict.fromkeys(_masked_value(k) for k in self.kernels if k.reads_mask_values(device_type))
            )
        if not values:
            return None
        answers = tuple(float_mask_facts(mask, value).pure for value in values)
        return answers[0] if len(answers) == 1 else answers

    def bucket(self, call: AttentionCall) -> str:
        """The bucket ``call`` falls in for this router (its decisions are kept by it)."""
        if _chosen_as_training(call):
            with torch.enable_grad():
                return self.bucket(_training_twin(call))
        return bucket_key(call, self._pure(call))

    def _select(self, call: AttentionCall) -> Tuple[Kernel, bool]:
        """The kernel for ``call``, and whether it is settled for the bucket (False for a call auto could not
        measure: NaN or inf in its inputs, and no gradients wanted — used for that call only)."""
        if _chosen_as_training(call):
            with torch.enable_grad():
                return self._select(_training_twin(call))
        pure = self._pure(call)
        signature = bucket_signature(call, pure)
        kernel = self._chosen.get(signature)
        settled = True
        if kernel is None:
            kernel, settled = self._first_in_bucket(call, signature, pure)
        self.calls[kernel.name] += 1
        return kernel, settled

    def _first_in_bucket(
        self, call: AttentionCall, signature: Tuple[Any, ...], pure: Optional[bool]
    ) -> Tuple[Kernel, bool]:
        with self._lock:
            kernel = self._chosen.get(signature)
            if kernel is not None:
                return kernel, True
            bucket = bucket_key(call, pure)
            decision = self.decisions.get(bucket)
            if decision is None:
                decision = self._decide(call, bucket)
            kernel = self._kernel_named(decision.kernel, call)
            if decision.source == UNMEASURED and not decision.provisional:
                self.unmeasured = decision  # shown by explain(); the bucket is measured on its next call
                return kernel, False
            # (an unmeasured call that needs gradients keeps its pick, provisionally: see measure._unmeasured)
            self.decisions[bucket] = decision
            self._chosen[signature] = kernel
            if self.strategy.select == "measure":
                SUMMARY.note(self.strategy.name, decision)
        return kernel, True

    def _kernel_named(self, name: str, call: AttentionCall) -> Kernel:
        for kernel in self.kernels:
            form, reasons = self._forms(kernel, call)
            if form.name == name:
                return form
        raise StrategyError(f"cached decision names kernel {name!r}, which strategy {self.strategy.name!r} lacks")

    def _decide(self, call: AttentionCall, bucket: str) -> Decision:
        mode = self.strategy.select
        if mode == "measure":
            return self._measured(call, bucket)
        results: List[CandidateResult] = []
        for kernel in self.kernels:
            form, reasons = self._forms(kernel, call)
            if not reasons:
                results.append(CandidateResult(form.name, PICKED))
                for rest in self.kernels[len(results) :]:
                    results.append(
                        CandidateResult(
                            rest.name, "not tried", [Reason("not-tried", "an earlier candidate runs this call")]
                        )
                    )
                return Decision(bucket, form.name, mode, results, source="rule")
            results.append(CandidateResult(kernel.name, REFUSED, reasons))
        if mode == "fixed":
            kernel = self.kernels[0]
            raise KernelUnavailableError(kernel.name, call.describe(), kernel.reasons(call), runnable_kernels(call))
        raise NoKernelError(call.describe(), {r.kernel: r.reasons for r in results})

    def cache_for(self, call: AttentionCall) -> Optional[DecisionCache]:
        if not self.strategy.option("cache"):
            return None
        key = str(call.device)
        if key not in self.caches:
            self.caches[key] = DecisionCache(
                call.device, fingerprint(self.strategy), packages=kernel_packages(self.kernels)
            )
        return self.caches[key]

    def _stale(self, cached: Decision, call: AttentionCall) -> Optional[str]:
        """Why a stored decision cannot be used for ``call`` now (None: it can): its kernel is no candidate of this
        strategy (renamed, unregistered), or cannot run the call here any more (its package was removed or broke,
        the device went away) — the kernel's own reasons say which."""
        for kernel in self.kernels:
            form, reasons = self._forms(kernel, call)
            if form.name == cached.kernel:
                if reasons:
                    return f"kernel {cached.kernel!r} cannot run this call now: " + "; ".join(reasons)
                return None
        valid = ", ".join(dict.fromkeys(self._forms(k, call)[0].name for k in self.kernels))
        return f"kernel {cached.kernel!r} is not a candidate of strategy {self.strategy.name!r} (candidates: {valid})"

    def _untrusted(self, cached: Decision, call: AttentionCall) -> Optional[str]:
        """Why a stored decision is not to be used (None: it can be): :meth:`_stale`, or an entry that could not
        have been written by measuring — a candidate no strategy candidate's name, a kernel that is not the one its
        candidates mark picked, or timings that do not make it the winner by the rule that picked it (a slow kernel
        pinned by hand: :func:`~npu_port.strategy.measure.pick` on the recorded timings, in the strategy's order)."""
        problem = self._stale(cached, call)
        if problem is not None:
            return problem
        order = [self._forms(kernel, call)[0].name for kernel in self.kernels]
        unknown = [c.kernel for c in cached.candidates if c.kernel not in order]
        if unknown:
            return f"its candidate {unknown[0]!r} is not a candidate of strategy {self.strategy.name!r}"
        picked = [c.kernel for c in cached.candidates if c.status == PICKED]
        if picked != [cached.kernel]:
            return f"it names kernel {cached.kernel!r} but marks {' and '.join(map(repr, picked)) or 'none'} picked"
        timed = [c for c in cached.candidates if c.status in (PICKED, OK) and c.median_s is not None]
        timed.sort(key=lambda c: order.index(c.kernel))
        if not timed:
            return "it records no timings"
        spreads = [replace(c, low_s=c.median_s if c.low_s is None else c.low_s) for c in timed]
        spreads = [replace(c, high_s=c.median_s if c.high_s is None else c.high_s) for c in spreads]
        winner = pick(spreads, self.strategy.option("margin"))[0]
        if winner.kernel != cached.kernel:
            mine = next(c for c in timed if c.kernel == cached.kernel)
            return (
                f"its timings make {winner.kernel!r} the winner (median {winner.median_s * 1e3:.3g} ms), not the "
                f"recorded {cached.kernel!r} (median {mine.median_s * 1e3:.3g} ms)"
            )
        return None

    def _measured(self, call: AttentionCall, bucket: str) -> Decision:
        cache = self.cache_for(call)
        earlier: Optional[Decision] = None  # a provisional entry: measured more, its runs pooled with this one's
        if cache is not None:
            cached = cache.get(bucket)
            if cached is not None:
                problem = self._untrusted(cached, call)
                if problem is not None:
                    cache.ignore(bucket, problem)
                elif not cached.provisional:
                    cache.loaded()
                    return cached
                else:
                    earlier = cached
        budget = self.strategy.option("memory_budget")
        if budget is None:
            free = free_memory_bytes(call.device)
            budget = int(free * FREE_MEMORY_SHARE) if free else None
        forms: List[Kernel] = []
        for kernel in self.kernels:
            form, _ = self._forms(kernel, call)
            forms.append(form)
        self.probes += 1
        probe_seconds = self.strategy.option("probe_seconds")
        margin = self.strategy.option("margin")
        order = [form.name for form in forms]
        decision = measure(
            call,
            bucket,
            forms,
            budget_bytes=budget,
            warmup=self.strategy.option("warmup"),
            repeats=self.strategy.option("repeats"),
            probe_seconds=probe_seconds,
            parity_rows=self.strategy.option("parity_rows"),
            margin=margin,
        )
        if decision.source == UNMEASURED:
            return decision
        if earlier is not None:
            decision = pool(earlier, decision, order, margin, probe_seconds)
            cache.pooled += 1
        if cache is not None:

            def merge(stored: Decision, new: Decision) -> Decision:
                """What another process wrote since (or what this one pooled) joins this one's runs; an entry this
                router would not use (the one it ignored, say) is replaced, as said."""
                if self._untrusted(stored, call) is not None:
                    return new
                return pool(stored, new, order, margin, probe_seconds)

            cache.put(decision, merge=merge)
        return decision

    # ---- running ----------------------------------------------------------------------------------------------

    def __call__(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Optional[Tensor] = None,
        *,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: Optional[float] = None,
        enable_gqa: bool = False,
    ) -> Tensor:
        """Attention with SDPA's semantics, run by the kernel this strategy picks for the call's bucket.

        Unmasked calls whose exact signature was seen before go straight to what the chosen kernel's ``prepare``
        returned: the signature holds everything validation and the choice depend on (shapes, dtypes, devices, the
        scalar arguments with their types, whether gradients are needed), so a hit is a call already checked. This
        is the path a model's thousands of attention calls take; masked calls build an :class:`AttentionCall`.
        """
        if WATCHERS and not watch.inside():  # npu_port.diff is recording this run (attn/watch.py)
            return watch.observe(self, query, key, value, attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                 scale=scale, enable_gqa=enable_gqa)  # fmt: skip
        signature = None
        if attn_mask is None:
            try:
                signature = (
                    query.shape,
                    key.shape,
                    value.shape,
                    query.dtype,
                    key.dtype,
                    value.dtype,
                    query.device,
                    key.device,
                    value.device,
                    dropout_p,
                    is_causal,
                    scale,
                    enable_gqa,
                    type(dropout_p),
                    type(is_causal),
                    type(scale),
                    type(enable_gqa),
                    torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad),
                )
                prepared = self._prepared.get(signature)
            except (AttributeError, TypeError):  # not tensors, an unhashable scale: validation will say what
                signature = prepared = None
            if prepared is not None:
                self.calls[prepared[1]] += 1
                return prepared[0](query, key, value)
        call = AttentionCall.from_arguments(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        kernel, settled = self._select(call)
        if settled and signature is not None and query.dim() == 4 and not call.is_empty:
            runner = kernel.prepare(call)
            if runner is not None:
                if len(self._prepared) >= MAX_PREPARED:  # shapes that never repeat (growing sequences): start over
                    self._prepared.clear()
                prepared = _held_to_contract(runner, kernel, call)
                self._prepared[signature] = (prepared, kernel.name)
                # This call runs what every later call of its signature runs: the same ops, the same tensors saved
                # for backward. Gradient checkpointing runs a call twice (the forward, then its recompute in the
                # backward, which may be the first call of its signature or not, before or after the table started
                # over) and torch compares what the two saved: one path per signature makes them equal.
                return prepared(query, key, value)
        return run_call(call, kernel)

    def attention_lse(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Optional[Tensor] = None,
        *,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: Optional[float] = None,
        enable_gqa: bool = False,
    ) -> Tuple[Tensor, Tensor]:
        """``(out, lse)`` with ``npu_port.attention(..., return_lse=True)``'s semantics, run by the kernel this
        strategy picks among its candidates that return the log-sum-exp (lse calls are a bucket of their own):
        what ring attention asks of the strategy for each block of keys."""
        call = AttentionCall.from_arguments(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, True)
        kernel, _ = self._select(call)
        return run_call_lse(call, kernel)

    # ---- reporting --------------------------------------------------------------------------------------------

    def resolved(self) -> List[str]:
        """Kernels chosen so far, most used first."""
        return [name for name, _ in self.calls.most_common()] or list(
            dict.fromkeys(d.kernel for d in self.decisions.values())
        )

    def explain_lines(self) -> List[str]:
        s = self.strategy
        lines = [f"strategy {s.name} (select: {s.select}; candidates: {', '.join(s.candidates)})"]
        if s.source:
            lines.append(f"  defined in {s.source}")
        for cache in self.caches.values():
            pooled = f", {cache.pooled} provisional measured more" if cache.pooled else ""
            lines.append(f"  disk cache: {cache.path} ({cache.loads} decisions loaded, {cache.writes} written{pooled})")
            if cache.error:
                lines.append(f"  disk cache not written: {cache.error}")
            lines += [f"  {line}" for line in cache.ignored]
        if not self.decisions:
            lines.append("  no attention call yet: decisions are made per shape bucket at the first call")
        for decision in self.decisions.values():
            lines += ["  " + line for line in decision.explain_lines()]
        if self.unmeasured is not None and self.unmeasured.bucket not in self.decisions:
            lines += ["  " + line for line in self.unmeasured.explain_lines()]
        if self.calls:
            lines.append("  calls: " + ", ".join(f"{name} {count}" for name, count in self.calls.most_common()))
        return lines
