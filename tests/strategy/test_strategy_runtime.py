"""Strategies at run time: fixed / first / measure selection, auto's parity gate, budgets, time limit and disk
cache, and the process-wide effects of set_attention_strategy (environment, diffusers, default kernel), undone
exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings

import pytest
import torch
from hypothesis import given, settings

import npu_port
from npu_port.attn import get_kernel
from npu_port.attn import select as kernel_select
from npu_port.attn.call import AttentionCall
from npu_port.attn.kernels.base import Kernel
from npu_port.errors import KernelUnavailableError, NoKernelError, StrategyError
from npu_port.strategy.cache import FORMAT
from npu_port.strategy.decision import PICKED, REFUSED, REJECTED, SKIPPED, bucket_key
from npu_port.strategy.measure import measure
from npu_port.strategy.process import STATE
from npu_port.strategy.registry import get_strategy, unregister_strategy
from npu_port.strategy.router import StrategyRouter

from ..conftest import emulated_torch_npu
from ..reference import assert_close_to_reference, reference_attention
from ..strategies import attention_cases


def qkv(b=1, h=2, s=16, d=8, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s, d, generator=gen, dtype=torch.float32).to(dtype) for _ in range(3)]


def router(name, **overrides):
    return StrategyRouter(get_strategy(name).with_overrides(**overrides))


# ---- fixed and first --------------------------------------------------------------------------------------------


def test_fixed_strategy_runs_its_kernel_and_refuses_what_it_cannot_run():
    r = router("vanilla")
    q, k, v = qkv()
    out = r(q, k, v)
    assert torch.equal(out, npu_port.attention(q, k, v, kernel="math"))
    assert r.calls == {"math": 1}
    bias = torch.full((16, 16), 0.5, requires_grad=True)
    with emulated_torch_npu():
        npu = router("npu")
        with pytest.raises(NoKernelError) as info:
            npu(q, k, v, bias)  # a bias that needs a gradient: both Ascend ops refuse it — an error, not a reroute
    text = str(info.value)
    assert text.startswith("no attention kernel can run this call (")
    assert "  npu_fused_infer:\n    - dtype float32 is not supported by npu_fused_infer" in text
    assert "  npu_fusion:\n    - float mask (1, 1, 16, 16) is a bias that requires grad" in text


def test_fixed_strategy_error_is_the_kernel_error():
    with emulated_torch_npu():
        r = StrategyRouter(npu_port.register_strategy("test-fixed-npu", kernel="npu_fusion", description="t"))
    try:
        q, k, v = qkv()
        with emulated_torch_npu(), pytest.raises(KernelUnavailableError) as info:
            r(q, k, v, torch.full((16, 16), 0.5, requires_grad=True))
        assert info.value.kernel == "npu_fusion" and "sdpa" in info.value.runnable
        assert [reason.code for reason in info.value.reasons] == ["mask"]
    finally:
        unregister_strategy("test-fixed-npu")


def test_first_strategy_picks_the_first_runnable_candidate_and_records_why_not_the_others():
    q, k, v = qkv(d=16, dtype=torch.float16)
    with emulated_torch_npu():
        r = router("npu")
        out = r(q, k, v, is_causal=True)
        out_with_grad = r(*[t.clone().requires_grad_() for t in (q, k, v)], is_causal=True)
    assert set(r.calls) == {"npu_fused_infer", "npu_fusion"}  # the inference op has no backward
    ref = reference_attention(q, k, v, is_causal=True)
    assert_close_to_reference(out, ref, torch.float16)
    assert_close_to_reference(out_with_grad.detach(), ref, torch.float16)
    grad_bucket = [d for d in r.decisions.values() if "grad=yes" in d.bucket][0]
    assert [c.status for c in grad_bucket.candidates] == [REFUSED, PICKED]
    assert "no backward" in grad_bucket.candidates[0].reasons[0]


def test_compute_dtype_lets_half_only_kernels_run_float32_calls():
    q, k, v = qkv(s=24, d=16)
    with emulated_torch_npu():
        r = router("npu", compute_dtype="float16")
        out = r(q, k, v)
    assert out.dtype == torch.float32
    assert list(r.calls) == ["npu_fused_infer@float16"]
    assert_close_to_reference(out, reference_attention(q, k, v), torch.float16)


def test_unavailable_strategy_fails_when_applied_with_every_reason():
    with pytest.raises(StrategyError) as info:
        npu_port.set_attention_strategy("xformers")
    assert str(info.value) == (
        "strategy 'xformers' cannot run on this machine:\n"
        "  xformers: xformers is not installed; pip install xformers (a build matching your torch and CUDA)\n"
        "run `npu-port strategies` to see which strategies are available here"
    )
    assert not STATE.active


# ---- auto -------------------------------------------------------------------------------------------------------


class _Scaled(Kernel):
    """A wrong kernel: SDPA times a factor (fast and wrong, like a silently broken backend)."""

    name = "wrong"

    def __init__(self, factor=1.01, delay=0.0, fail=None):
        super().__init__()
        self.factor, self.delay, self.fail = factor, delay, fail

    def run(self, call):
        if self.fail:
            raise RuntimeError(self.fail)
        time.sleep(self.delay)
        return get_kernel("sdpa").run(call) * self.factor


def _measure(call, candidates, **kw):
    args = dict(budget_bytes=None, warmup=1, repeats=3, probe_seconds=2.0, parity_rows=8)
    args.update(kw)
    return measure(call, bucket_key(call), candidates, **args)


def test_auto_rejects_kernels_that_disagree_give_nan_or_fail():
    q, k, v = qkv()
    call = AttentionCall.from_arguments(q, k, v)
    nan = _Scaled(factor=float("nan"))
    nan.name = "nan"
    broken = _Scaled(fail="CUDA error: invalid argument\nmore")
    broken.name = "broken"
    decision = _measure(call, [_Scaled(1.5), nan, broken, get_kernel("math")])
    by_name = {c.kernel: c for c in decision.candidates}
    assert decision.kernel == "math"
    assert by_name["wrong"].status == REJECTED
    assert by_name["wrong"].reasons[0].startswith("disagrees with the math kernel: max error ")
    assert by_name["nan"].reasons == ["disagrees with the math kernel: NaN or inf in the output > 0e+00"]
    assert by_name["broken"].reasons == ["failed: RuntimeError: CUDA error: invalid argument"]


def test_auto_picks_the_fastest_correct_candidate():
    q, k, v = qkv()
    call = AttentionCall.from_arguments(q, k, v)
    slow = _Scaled(1.0, delay=0.02)
    slow.name = "slow"
    decision = _measure(call, [slow, get_kernel("sdpa")])
    assert decision.kernel == "sdpa"
    statuses = {c.kernel: c.status for c in decision.candidates}
    assert statuses == {"sdpa": PICKED, "slow": "ok"}
    times = {c.kernel: c.median_s for c in decision.candidates}
    assert times["slow"] > 0.02 > times["sdpa"]


def test_auto_respects_its_time_budget():
    q, k, v = qkv()
    call = AttentionCall.from_arguments(q, k, v)
    slow = _Scaled(1.0, delay=0.15)
    slow.name = "slow"
    started = time.perf_counter()
    decision = _measure(call, [slow, get_kernel("sdpa"), get_kernel("math")], probe_seconds=0.2)
    assert time.perf_counter() - started < 1.0  # slow: parity run + warm-up + one timed run, then the budget is spent
    statuses = {c.kernel: c.status for c in decision.candidates}
    assert statuses["slow"] == PICKED and statuses["sdpa"] == SKIPPED and statuses["math"] == SKIPPED
    assert decision.candidates[-1].reasons == ["probe time budget (0.2 s) spent"]


class _Counted(_Scaled):
    """A correct kernel that sleeps and counts its runs."""

    def __init__(self, name, delay):
        super().__init__(factor=1.0, delay=delay)
        self.name, self.runs = name, 0

    def run(self, call):
        self.runs += 1
        return super().run(call)


def test_auto_starts_no_round_that_would_overrun_its_budget_and_judges_by_first_runs():
    q, k, v = qkv()
    call = AttentionCall.from_arguments(q, k, v)
    fast, slow = _Counted("fast", 0.04), _Counted("slow", 0.08)
    decision = _measure(call, [slow, fast], probe_seconds=0.3, warmup=2, repeats=5)
    assert (slow.runs, fast.runs) == (2, 2)  # parity + first run each take 0.24 s: a 0.12 s round would not fit
    by_name = {c.kernel: c for c in decision.candidates}
    assert decision.kernel == "fast" and by_name["fast"].runs == by_name["slow"].runs == 1
    assert by_name["slow"].median_s >= 0.08 and by_name["fast"].median_s >= 0.04


def test_a_lone_survivor_is_not_run_again():
    q, k, v = qkv()
    call = AttentionCall.from_arguments(q, k, v)
    only = _Counted("only", 0.0)
    decision = _measure(call, [only, _Scaled(1.5)], warmup=2, repeats=5)
    assert decision.kernel == "only" and only.runs == 2  # the parity slice and one run on the real inputs
    assert decision.candidates[0].runs == 1


def test_auto_refuses_candidates_over_the_memory_budget_and_falls_to_chunked():
    q, k, v = qkv(b=1, h=2, s=512, d=8)
    r = router("auto", candidates=["math", "chunked"], memory_budget="1MiB", cache=False)
    out = r(q, k, v)
    decision = next(iter(r.decisions.values()))
    assert decision.kernel == "chunked"
    math = [c for c in decision.candidates if c.kernel == "math"][0]
    assert math.reasons == ["would materialise 4 MiB of scores, over the 1 MiB memory budget"]
    assert_close_to_reference(out, reference_attention(q, k, v), torch.float32)


def test_auto_explain_shows_every_candidate_and_the_winner():
    q, k, v = qkv()
    with npu_port.attention_strategy("auto") as handle:
        npu_port.attention(q, k, v)
        npu_port.attention(q, k, v)
    text = handle.explain()
    assert handle.name in ("sdpa", "math", "chunked")
    assert "bucket cpu float32 B=1 H=2/2 Sq=16 Skv=16 D=8/8 mask=none causal=no dropout=no grad=no" in text
    for kernel in ("sdpa", "chunked", "math"):
        assert f" {kernel} " in text and "parity" in text
    assert "xformers         refused: xformers is not installed" in text
    assert f"-> {handle.name}" in text
    assert f"calls: {handle.name} 2" in text


@settings(max_examples=25, deadline=None)
@given(case=attention_cases(dtypes=(torch.float32,), max_len=12, head_dims=(8, 16)))
def test_auto_output_matches_the_float64_reference(case):
    r = router("auto", cache=False, repeats=1, warmup=0)
    with torch.no_grad():
        out = r(case.query, case.key, case.value, case.attn_mask, **case.kwargs())
    assert_close_to_reference(out, reference_attention_for(case), case.dtype)


def reference_attention_for(case):
    q, k, v = case.query, case.key, case.value
    ref = reference_attention(
        q.reshape(-1, *q.shape[-3:]),
        k.reshape(-1, *k.shape[-3:]),
        v.reshape(-1, *v.shape[-3:]),
        case.keep,
        case.bias,
        case.is_causal,
        case.scale,
    )
    return ref.reshape(*q.shape[:-1], v.shape[-1])


def test_decisions_are_cached_per_bucket():
    r = router("auto", cache=False, repeats=1)
    q, k, v = qkv()
    for _ in range(3):
        r(q, k, v)
    r(*qkv(s=8))
    assert r.probes == 2 and len(r.decisions) == 2


SECOND_PROCESS = """
import json, torch, npu_port
from npu_port.strategy import measure
real = measure._time_once  # steady timings (sdpa fastest), so that no noise makes the first decision provisional
measure._time_once = lambda kernel, call: (real(kernel, call)[0], 1e-3 if kernel.name == "sdpa" else 2e-3)
handle = npu_port.set_attention_strategy("auto")
q = torch.randn(1, 2, 40, 16)
npu_port.attention(q, q, q)
cache = next(iter(handle.router.caches.values()))
print(json.dumps({"probes": handle.router.probes, "loads": cache.loads, "path": str(cache.path),
                  "explain": handle.explain(), "name": handle.name}))
handle.restore()
"""


@pytest.mark.e2e
@pytest.mark.slow
def test_a_second_process_reuses_the_disk_cache_without_probing(tmp_path):
    env = {**os.environ, "NPU_PORT_CACHE_DIR": str(tmp_path)}
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", SECOND_PROCESS], env=env, capture_output=True, text=True, check=True, timeout=120
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert (first["probes"], first["loads"]) == (1, 0)
    assert (second["probes"], second["loads"]) == (0, 1)
    assert second["name"] == first["name"]
    assert "[from the disk cache]" in second["explain"] and "[measured in" in first["explain"]
    saved = json.loads(open(first["path"]).read())
    assert saved["environment"]["torch"] == torch.__version__
    assert saved["environment"]["device"].startswith("cpu: ")
    assert list(saved["decisions"]) == [
        "cpu float32 B=1 H=2/2 Sq=40 Skv=40 D=16/16 mask=none causal=no dropout=no grad=no"
    ]


def test_a_corrupt_cache_file_is_ignored_and_rewritten():
    r = router("auto", repeats=1)
    q, k, v = qkv()
    call = AttentionCall.from_arguments(q, k, v)
    cache = r.cache_for(call)
    cache.path.parent.mkdir(parents=True, exist_ok=True)
    cache.path.write_text("{not json")
    r(q, k, v)
    assert r.probes == 1 and json.loads(cache.path.read_text())["format"] == FORMAT


# ---- process-wide application -----------------------------------------------------------------------------------


def test_process_wide_strategy_sets_env_and_default_kernel_and_restores_exactly(monkeypatch):
    monkeypatch.setenv("DIFFUSERS_ATTN_BACKEND", "native")
    monkeypatch.delenv("DIFFUSERS_ATTENTION_TYPE", raising=False)
    selector_before = kernel_select._selector
    q, k, v = qkv()
    handle = npu_port.set_attention_strategy("vanilla")
    assert os.environ["DIFFUSERS_ATTN_BACKEND"] == "_native_math"
    assert os.environ["DIFFUSERS_ATTENTION_TYPE"] == "vanilla"
    npu_port.attention(q, k, v)
    assert handle.calls == {"math": 1}
    inner = npu_port.set_attention_strategy("chunked")
    assert os.environ["DIFFUSERS_ATTENTION_TYPE"] == "vanilla"  # chunked sets no variable: the outer one stays
    npu_port.attention(q, k, v)
    assert inner.calls == {"chunked": 1}
    handle.restore()  # out of order: the inner strategy stays active
    npu_port.attention(q, k, v)
    assert inner.calls == {"chunked": 2}
    assert os.environ["DIFFUSERS_ATTN_BACKEND"] == "native" and "DIFFUSERS_ATTENTION_TYPE" not in os.environ
    inner.restore()
    inner.restore()  # idempotent
    assert kernel_select._selector is selector_before
    assert not STATE.active


def test_diffusers_runtime_backend_follows_and_is_restored():
    from diffusers.models import attention_dispatch as dispatch

    registry = dispatch._AttentionBackendRegistry
    before = registry._active_backend
    with npu_port.attention_strategy("vanilla") as handle:
        assert registry._active_backend == dispatch.AttentionBackendName._NATIVE_MATH
        assert any("AttnProcessor2_0" in note for note in handle.notes)
    assert registry._active_backend is before


def test_diffusers_refusal_is_reported_not_silent():
    from diffusers.models import attention_dispatch as dispatch

    before = dispatch._AttentionBackendRegistry._active_backend
    npu_port.register_strategy(
        "test-env-npu", kernel="sdpa", description="t", env={"DIFFUSERS_ATTN_BACKEND": "_native_npu"}
    )
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with npu_port.attention_strategy("test-env-npu") as handle:
                assert dispatch._AttentionBackendRegistry._active_backend is before  # left as it was
                assert os.environ["DIFFUSERS_ATTN_BACKEND"] == "_native_npu"  # child processes still get it
    finally:
        unregister_strategy("test-env-npu")
    prefix = "DIFFUSERS_ATTN_BACKEND=_native_npu: diffusers is already imported and refused it at run time ("
    assert [str(w.message)[: len(prefix)] for w in caught] == [prefix]
    assert caught[0].category is npu_port.strategy.process.StrategyNotAppliedWarning
    assert handle.notes[0].startswith(prefix)


def test_custom_processor_needs_a_target_and_a_class():
    with pytest.raises(StrategyError, match="custom-processor installs a processor on diffusers Attention modules"):
        npu_port.set_attention_strategy("custom-processor")
    with pytest.raises(StrategyError, match="custom-processor needs the processor class"):
        npu_port.set_attention_strategy("custom-processor", target=torch.nn.Linear(1, 1))


def test_a_variable_set_between_two_applications_survives_the_second_restore(monkeypatch):
    monkeypatch.delenv("DIFFUSERS_ATTN_BACKEND", raising=False)
    npu_port.set_attention_strategy("vanilla").restore()
    monkeypatch.setenv("DIFFUSERS_ATTN_BACKEND", "native")
    npu_port.set_attention_strategy("vanilla").restore()
    assert os.environ["DIFFUSERS_ATTN_BACKEND"] == "native"
