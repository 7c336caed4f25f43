"""A call that autograd runs twice — its forward, then under gradient checkpointing its recompute in the backward —
runs the same kernel through the same code both times, on every strategy.

torch's non-reentrant checkpoint (diffusers' and transformers' default) compares the tensors the forward and the
recompute saved for backward and raises ``CheckpointError`` when they differ; the reentrant one compares nothing, so a
recompute that took another path gives the gradients of another function, silently. Both are checked here against
training without checkpointing, with a fresh router whose very first call is inside the checkpointed block, and
directly: every call of one signature saves the same tensors (first call, later calls, after the prepared-runner table
started over, masked or not, NaN in the inputs or not).

Strategies run in float64 where their kernels take it; the Ascend kernels through the emulator of the documented ops
(float32), flash_attn and xformers through their stand-ins.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import npu_port
from npu_port.attn.call import AttentionCall
from npu_port.errors import KernelUnavailableError, NoKernelError
from npu_port.strategy import measure as measure_module
from npu_port.strategy import router as router_module
from npu_port.strategy.registry import get_strategy
from npu_port.strategy.router import StrategyRouter

from ..conftest import all_stand_ins

#: every built-in strategy and profile that routes attention (custom-processor installs a processor instead)
STRATEGIES = [name for name in npu_port.list_strategies() if name != "custom-processor"]
#: the widest dtype each strategy's kernels take on the CPU (flash_attn's stand-in: half precision only)
DTYPES = {"npu": torch.float32, "xformers": torch.float32, "flash": torch.float16}
#: how close two runs of one computation must be, per dtype (float64: only summation order may differ)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3}
#: forms of a call: mask, causal, NaN in the inputs
FORMS = ["none", "causal", "bool", "bias", "nan"]

B, H, S, D = 2, 2, 8, 16


@pytest.fixture(autouse=True)
def stand_ins():
    with all_stand_ins():
        yield


def dtype_of(strategy: str) -> torch.dtype:
    return DTYPES.get(strategy, torch.float64)


def masks(form: str, dtype: torch.dtype) -> Tuple[Optional[torch.Tensor], bool]:
    """(attn_mask, is_causal) of a form: a key-padding bool mask with one batch item's keys all masked for one row
    block, or an additive bias (ALiBi-like, no gradient: a fixed positional bias)."""
    if form == "causal":
        return None, True
    if form == "bool":
        keep = torch.ones(B, 1, S, S, dtype=torch.bool)
        keep[0, :, :, S // 2 :] = False
        keep[1, :, :2] = False  # two query rows with no key: zeros, on every kernel
        return keep, False
    if form == "bias":
        positions = torch.arange(S, dtype=dtype)
        return -(positions[None, :] - positions[:, None]).abs()[None, None].expand(1, H, S, S) * 0.1, False
    return None, False


def refused_by_design(strategy: str, query, key, value, attn_mask, is_causal, dropout_p=0.0) -> bool:
    """Whether the strategy refuses the call by design (flash_attn takes no masks), checked to be that refusal and
    nothing else; the test then has nothing to train."""
    call = AttentionCall.from_arguments(query, key, value, attn_mask, dropout_p, is_causal)
    router = StrategyRouter(get_strategy(strategy))
    if router.strategy.select == "measure":
        return False
    try:
        router.select(call)
    except (KernelUnavailableError, NoKernelError) as exc:
        assert strategy == "flash" and attn_mask is not None, exc
        assert str(exc).startswith("attention kernel 'flash_attn' cannot run this call"), exc
        return True
    return False


class Block(torch.nn.Module):
    """Two self-attention layers, each optionally checkpointed; attention through ``attend`` (a router)."""

    def __init__(self, dtype: torch.dtype, width: int = H * D, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.qkv = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(width, 3 * width, generator=gen, dtype=dtype) / width**0.5) for _ in "ab"]
        )
        self.out = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(width, width, generator=gen, dtype=dtype) / width**0.5) for _ in "ab"]
        )

    def layer(self, attend, index, x, attn_mask, is_causal, dropout_p):
        q, k, v = (x @ self.qkv[index]).chunk(3, dim=-1)
        q, k, v = (t.reshape(B, S, H, D).transpose(1, 2) for t in (q, k, v))
        o = attend(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p)
        return x + o.transpose(1, 2).reshape(B, S, H * D) @ self.out[index]

    def forward(self, attend, x, attn_mask=None, is_causal=False, dropout_p=0.0, reentrant=None):
        for index in range(2):
            args = (attend, index, x, attn_mask, is_causal, dropout_p)
            x = self.layer(*args) if reentrant is None else checkpoint(self.layer, *args, use_reentrant=reentrant)
        return x


def gradients(block: Block, attend, x, *, seed: int = 0, **kwargs) -> Tuple[torch.Tensor, dict]:
    """(loss, gradients of the parameters and of the input) of one training step."""
    block.zero_grad()
    x = x.detach().requires_grad_()
    torch.manual_seed(seed)  # dropout's masks
    loss = block(attend, x, **kwargs).square().nansum()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in block.named_parameters()}
    grads["input"] = x.grad.clone()
    return loss.detach(), grads


def assert_same_gradients(got: dict, want: dict, dtype: torch.dtype) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(
            got[name], want[name], atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype], equal_nan=True, msg=name
        )


def inputs(dtype: torch.dtype, nan: bool = False, seed: int = 1) -> torch.Tensor:
    x = torch.randn(B, S, H * D, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    if nan:
        x[1, 3, 5] = float("nan")  # one token of one batch item: NaN reaches that item's rows, not the other's
    return x


# ---- training with checkpointing gives the gradients of training without -------------------------------------


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_checkpointed_training_gives_the_gradients_of_plain_training(strategy, form, reentrant):
    dtype = dtype_of(strategy)
    attn_mask, is_causal = masks(form, dtype)
    x = inputs(dtype, nan=form == "nan")
    q = torch.randn(B, H, S, D, dtype=dtype, requires_grad=True)
    if refused_by_design(strategy, q, q, q, attn_mask, is_causal):
        return
    block = Block(dtype)
    router = StrategyRouter(get_strategy(strategy))  # fresh: its very first call is inside a checkpointed block
    kwargs = dict(attn_mask=attn_mask, is_causal=is_causal)
    loss, checkpointed = gradients(block, router, x, reentrant=reentrant, **kwargs)
    plain_loss, plain = gradients(block, router, x, **kwargs)
    torch.testing.assert_close(loss, plain_loss, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype], equal_nan=True)
    assert_same_gradients(checkpointed, plain, dtype)
    if form == "nan":  # the NaN reached batch item 1 and nothing of item 0
        assert torch.isnan(checkpointed["input"][1]).any() and not torch.isnan(checkpointed["input"][0]).any()
    else:
        assert all(not torch.isnan(g).any() for g in checkpointed.values())
    if router.strategy.select != "measure":
        assert len(router.calls) == 1, router.calls  # one kernel ran every call: forward, recompute, plain


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("strategy", ["auto", "sdpa", "vanilla", "chunked", "npu", "cpu-fallback"])
def test_dropout_draws_the_same_masks_in_the_forward_and_its_recompute(strategy, reentrant):
    """auto measures the first call of a shape by running the candidates with the call's dropout; the recompute
    measures nothing. Both must draw what plain training draws, and under reentrant checkpointing the forward (no
    autograd) and the recompute (autograd) must run one kernel, or the masks come from two implementations."""
    dtype = dtype_of(strategy)
    block = Block(dtype)
    router = StrategyRouter(get_strategy(strategy))
    x = inputs(dtype)
    loss, checkpointed = gradients(block, router, x, reentrant=reentrant, dropout_p=0.3)
    plain_loss, plain = gradients(block, router, x, dropout_p=0.3)
    torch.testing.assert_close(loss, plain_loss, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    assert_same_gradients(checkpointed, plain, dtype)
    assert len(router.calls) == 1, router.calls
    other_seed, _ = gradients(block, router, x, seed=1, dropout_p=0.3)
    assert not torch.allclose(other_seed, plain_loss)  # dropout really dropped something


# ---- every call of one signature saves the same tensors ------------------------------------------------------


def saved_by(fn: Callable[[], torch.Tensor]) -> Tuple[torch.Tensor, List[tuple]]:
    """fn's output, and what its autograd graph saved for backward, in order: what non-reentrant checkpointing
    compares between a forward and its recompute (shape, dtype, device)."""
    saved: List[tuple] = []

    def pack(tensor):
        saved.append((tuple(tensor.shape), tensor.dtype, tensor.device))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fn()
    return out, saved


@pytest.mark.parametrize("form", FORMS + ["inf"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_call_of_a_signature_saves_the_same_tensors(strategy, form):
    dtype = dtype_of(strategy)
    attn_mask, is_causal = masks(form, dtype)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, generator=gen, dtype=dtype).requires_grad_() for _ in range(3))
    if refused_by_design(strategy, q, k, v, attn_mask, is_causal):
        return
    if form in ("nan", "inf"):
        with torch.no_grad():
            k[0, 1, 2, 3] = float("nan") if form == "nan" else float("inf")
            if form == "inf":  # +inf, and a value of -inf only: the quick check asks, and no NaN is in the inputs
                k[0, 1, 2, 3] = 0.0
                q[0, 0, 0, 0] = float("inf")
                v.fill_(float("-inf"))
    router = StrategyRouter(get_strategy(strategy))

    def call():
        return router(q, k, v, attn_mask=attn_mask, is_causal=is_causal)

    first_out, first = saved_by(call)
    later_out, later = saved_by(call)
    router._prepared.clear()  # the table of prepared runners started over (MAX_PREPARED shapes came in between)
    cleared_out, cleared = saved_by(call)
    assert first == later == cleared
    assert torch.equal(first_out.isnan(), later_out.isnan()) and torch.equal(first_out.isnan(), cleared_out.isnan())
    torch.testing.assert_close(later_out, first_out, equal_nan=True, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    torch.testing.assert_close(cleared_out, first_out, equal_nan=True, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_the_nan_checks_record_nothing_and_fill_only_where_a_nan_is():
    """The contract's checks read detached tensors: a clean call saves what SDPA alone saves; +inf with a key head
    of -inf (the quick check's sum of maxima is NaN, so it asks) adds no fill, since no NaN is in the inputs; a NaN
    adds the fills, and they reach exactly the rows and heads the formula says."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(3))
    _, sdpa_alone = saved_by(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
    router = StrategyRouter(get_strategy("sdpa"))
    for _ in range(2):  # the first call and the prepared runner
        out, saved = saved_by(lambda: router(q, k, v))
        assert saved == sdpa_alone and "MaskedFill" not in out.grad_fn.name()
    with torch.no_grad():
        infinite_q, infinite_k = q.clone(), k.clone()
        infinite_q[0, 0, 0, 0] = float("inf")
        infinite_k.fill_(float("-inf"))
    for name in ("sdpa", "vanilla", "chunked"):
        out = StrategyRouter(get_strategy(name))(infinite_q.requires_grad_(), infinite_k.requires_grad_(), v)
        assert "MaskedFill" not in out.grad_fn.name(), name
    with torch.no_grad():
        nan_key = k.clone()
        nan_key[0, 1, 2, 3] = float("nan")
    out = router(q, nan_key.requires_grad_(), v)
    assert "MaskedFill" in out.grad_fn.name()
    assert torch.isnan(out[0, 1]).all() and not torch.isnan(out[0, 0]).any()


# ---- the cases that used to fail, one by one ---------------------------------------------------------------------


def test_a_recompute_after_the_prepared_table_started_over_takes_the_forwards_path(monkeypatch):
    """The forward of a shape ran its prepared runner; before the backward, other shapes filled the table and it
    started over, so the recompute is that shape's first call again. It must save what the forward saved."""
    monkeypatch.setattr(router_module, "MAX_PREPARED", 1)
    router = StrategyRouter(get_strategy("sdpa"))
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(1, 2, 6, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(1, 2, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    router(a, a, a)  # prepares a's signature

    def block(a, b):
        return router(a, a, a).sum() + router(b, b, b).sum()  # a: the prepared runner; b: the table starts over

    checkpoint(block, a, b, use_reentrant=False).backward()
    want_a, want_b = torch.autograd.grad(block(a, b), (a, b))
    assert torch.allclose(a.grad, want_a) and torch.allclose(b.grad, want_b)


def test_an_unmeasured_call_that_needs_gradients_keeps_its_kernel_for_its_recompute(monkeypatch):
    """auto cannot measure a call with NaN in its inputs and runs it on the first candidate that can; a later
    clean call of the same bucket would be measured and might pick another kernel, which the NaN call's recompute
    would then run. A call that needs gradients therefore keeps its pick for the bucket (provisionally)."""
    real = measure_module._time_once

    def math_is_fastest(kernel, call):  # were the bucket measured, math would win it clearly
        out, _ = real(kernel, call)
        return out, (1e-4 if kernel.name == "math" else 1e-2)

    monkeypatch.setattr(measure_module, "_time_once", math_is_fastest)
    router = StrategyRouter(get_strategy("auto"))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(3))
    with torch.no_grad():
        nan_q = q.clone()
        nan_q[0, 0, 1, 2] = float("nan")
    nan_q.requires_grad_()
    forward = checkpoint(router, nan_q, k, v, use_reentrant=False)  # unmeasured: the first runnable candidate
    clean = router(q, k, v)  # same bucket, clean inputs
    (forward.nansum() + clean.sum()).backward()  # the recompute of the NaN call: no CheckpointError
    assert list(router.calls) == ["sdpa"], router.calls
    (decision,) = router.decisions.values()
    assert decision.provisional and decision.source == "unmeasured"
    text = "\n".join(router.explain_lines())
    assert "provisional" in text and "autograd may recompute" in text
    # a call that needs no gradients is still measured on the bucket's next call
    fresh = StrategyRouter(get_strategy("auto"))
    with torch.no_grad():
        fresh(nan_q, k, v)
        fresh(q, k, v)
    assert fresh.calls == {"sdpa": 1, "math": 1}
    (decision,) = fresh.decisions.values()
    assert decision.kernel == "math" and not decision.provisional


def test_measuring_leaves_the_random_state_as_it_found_it():
    router = StrategyRouter(get_strategy("auto"))
    q = torch.randn(1, 2, 6, 8, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(3)
    router(q, q, q, dropout_p=0.5)  # measures, running every candidate with dropout
    after_measuring = torch.rand(4)
    torch.manual_seed(3)
    router(q, q, q, dropout_p=0.5)  # decided: runs once
    assert torch.equal(torch.rand(4), after_measuring)


def test_a_dropout_call_without_autograd_is_chosen_for_as_its_training_twin():
    """Under reentrant checkpointing a dropout call's forward has no autograd and its recompute has: one bucket."""
    router = StrategyRouter(get_strategy("auto"))
    q = torch.randn(1, 2, 6, 8, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        router(q, q, q, dropout_p=0.1)
    router(q, q, q, dropout_p=0.1)
    (bucket,) = router.decisions
    assert "dropout=yes grad=yes" in bucket and router.probes == 1
    with torch.no_grad():  # without dropout, inference keeps a bucket of its own
        router(q, q, q)
    assert any("dropout=no grad=no" in bucket for bucket in router.decisions)


def test_chunked_cuts_a_grad_call_and_its_recompute_alike_when_free_memory_changes(monkeypatch):
    from npu_port.attn.kernels import chunked

    readings = [64 << 20, 4 << 20]  # plenty free at the forward, little in the backward (the last reading stays)
    monkeypatch.setattr(
        chunked, "free_memory_bytes", lambda device: readings.pop(0) if len(readings) > 1 else readings[0]
    )
    router = StrategyRouter(get_strategy("chunked"))
    monkeypatch.setattr(router.kernels[0], "_grad_budgets", {})  # (the default instance is shared by the process)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 512, 16, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(3))
    out = checkpoint(router, q, k, v, use_reentrant=False)
    out.sum().backward()  # no CheckpointError: the recompute was cut into the forward's blocks
    want = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(q, k, v).sum(), (q, k, v))
    for got, expected in zip((q.grad, k.grad, v.grad), want):
        torch.testing.assert_close(got, expected)
