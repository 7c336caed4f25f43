"""auto's disk cache never trusts what it reads: a corrupt file or entry, an unknown kernel, or a kernel that cannot
run the call now is a cache miss — measured again, said in explain() and in a logged warning naming the file and
the entry, then overwritten. The cache key holds the state of every package a candidate kernel needs."""

from __future__ import annotations

import json
import logging
import sys
from typing import ClassVar, Optional

import pytest
import torch

import npu_port
from npu_port import _optional
from npu_port.attn import get_kernel
from npu_port.attn.call import AttentionCall
from npu_port.attn.kernels.base import Kernel
from npu_port.attn.registry import _DEFAULTS, _KERNELS
from npu_port.strategy.cache import environment, kernel_packages
from npu_port.strategy.decision import bucket_key
from npu_port.strategy.registry import get_strategy
from npu_port.strategy.router import StrategyRouter, configured_kernels

from ..conftest import fake_xformers


def qkv(seed=0, s=12):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, s, 8, generator=gen) for _ in range(3)]


def auto_router(**overrides):
    return StrategyRouter(get_strategy("auto").with_overrides(repeats=1, warmup=0, **overrides))


def stored_file(router, q, k, v):
    """A valid cache file for (q, k, v) made by a first router; returns (path, bucket, its JSON). The entry is marked
    settled: on a busy machine the first router's pick may be provisional, which a later router ignores before any
    other check — the tests that mutate the entry test those other checks."""
    router(q, k, v)
    cache = next(iter(router.caches.values()))
    bucket = bucket_key(AttentionCall.from_arguments(q, k, v))
    data = json.loads(cache.path.read_text())
    data["decisions"][bucket]["provisional"] = False
    return cache.path, bucket, data


def rerun(path, data_or_bytes, q, k, v, caplog):
    """Write the file as given, run a fresh auto router on it, and return the router (after one call)."""
    if isinstance(data_or_bytes, bytes):
        path.write_bytes(data_or_bytes)
    else:
        path.write_text(json.dumps(data_or_bytes))
    router = auto_router()
    with caplog.at_level(logging.WARNING, logger="npu_port.strategy"):
        out = router(q, k, v)
    assert torch.allclose(out, npu_port.attention(q, k, v, kernel="math"), atol=1e-5)
    return router


def assert_measured_again_and_said(router, path, bucket, caplog, problem):
    assert router.probes == 1
    decision = router.decisions[bucket]
    assert decision.source == "measured"
    explain = "\n".join(router.explain_lines())
    line = f"disk cache entry {bucket!r} in {path} ignored: {problem}; measuring again (it will be overwritten)"
    assert line in explain
    assert [r.getMessage() for r in caplog.records if r.name == "npu_port.strategy"] == [line]
    saved = json.loads(path.read_text())["decisions"][bucket]  # overwritten with the new measurement
    assert saved["kernel"] == decision.kernel and saved["source"] == "measured"


@pytest.mark.parametrize(
    "entry, problem",
    [
        ("sdpa", "malformed entry (expected a JSON object, found str)"),
        (["sdpa"], "malformed entry (expected a JSON object, found list)"),
        ({"kernel": "sdpa"}, "malformed entry (no bucket named)"),
    ],
)
def test_a_malformed_entry_is_a_cache_miss_measured_again_and_said(entry, problem, caplog):
    q, k, v = qkv()
    path, bucket, data = stored_file(auto_router(), q, k, v)
    data["decisions"][bucket] = entry
    router = rerun(path, data, q, k, v, caplog)
    assert_measured_again_and_said(router, path, bucket, caplog, problem)


def test_a_candidate_with_a_bad_field_is_malformed_and_explain_still_works(caplog):
    q, k, v = qkv()
    path, bucket, data = stored_file(auto_router(), q, k, v)
    data["decisions"][bucket]["candidates"][0]["median_s"] = "fast"
    router = rerun(path, data, q, k, v, caplog)
    problem = "malformed entry (candidate 0: median_s must be a number or null, found str)"
    assert_measured_again_and_said(router, path, bucket, caplog, problem)


def test_a_cached_kernel_whose_package_is_gone_is_measured_again(caplog):
    q, k, v = qkv()
    path, bucket, data = stored_file(auto_router(), q, k, v)
    data["decisions"][bucket]["kernel"] = "xformers"  # as if xformers had won here and was uninstalled since
    router = rerun(path, data, q, k, v, caplog)
    reason = str(get_kernel("xformers").availability()[0])
    assert reason.startswith("xformers is not installed")
    assert_measured_again_and_said(
        router, path, bucket, caplog, f"kernel 'xformers' cannot run this call now: {reason}"
    )
    assert router.decisions[bucket].kernel != "xformers"


def test_a_cached_kernel_that_is_no_candidate_is_measured_again(caplog):
    q, k, v = qkv()
    path, bucket, data = stored_file(auto_router(), q, k, v)
    data["decisions"][bucket]["kernel"] = "warp_drive"
    router = rerun(path, data, q, k, v, caplog)
    valid = "npu_fused_infer, npu_fusion, flash_attn, xformers, sdpa, chunked, math"
    problem = f"kernel 'warp_drive' is not a candidate of strategy 'auto' (candidates: {valid})"
    assert_measured_again_and_said(router, path, bucket, caplog, problem)


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"\xff\xfe not utf-8 {", "cannot be read as JSON (UnicodeDecodeError: "),
        (b"{not json", "cannot be read as JSON (JSONDecodeError: "),
        (b'{"format": 1, "decisions": ["x"]}', "is not an npu-port decision cache (no 'decisions' object)"),
    ],
)
def test_a_corrupt_file_is_said_once_measured_again_and_rewritten(content, problem, caplog):
    q, k, v = qkv()
    path, bucket, _ = stored_file(auto_router(), q, k, v)
    router = rerun(path, content, q, k, v, caplog)
    router(*qkv(s=5))  # a second bucket: the file problem is not said again
    messages = [r.getMessage() for r in caplog.records if r.name == "npu_port.strategy"]
    assert len(messages) == 1 and messages[0].startswith(f"disk cache file {path} {problem}")
    assert messages[0].endswith(": ignored; measuring again (it will be rewritten)")
    assert messages[0] in "\n".join(router.explain_lines())
    assert router.probes == 2
    assert len(json.loads(path.read_text())["decisions"]) == 2


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("provisional", "yes", "provisional must be true or false, found str"),
        ("why", 3, "why must be a string, found int"),
        ("low_s", "fast", "candidate 0: low_s must be a number or null, found str"),
        ("high_s", True, "candidate 0: high_s must be a number or null, found bool"),
        ("low_s", 9.0, "candidate 0: low_s <= median_s <= high_s does not hold: [9.0, {median}, {high}]"),
    ],
)
def test_a_bad_spread_or_provisional_field_is_malformed(field, value, problem, caplog):
    q, k, v = qkv()
    path, bucket, data = stored_file(auto_router(), q, k, v)
    entry = data["decisions"][bucket]
    target = entry if field in ("provisional", "why") else entry["candidates"][0]
    target[field] = value
    router = rerun(path, data, q, k, v, caplog)
    first = entry["candidates"][0]
    problem = problem.format(median=first["median_s"], high=first["high_s"])
    assert_measured_again_and_said(router, path, bucket, caplog, f"malformed entry ({problem})")


def test_a_good_entry_is_still_used_without_measuring():
    q, k, v = qkv()
    path, bucket, data = stored_file(auto_router(), q, k, v)
    data["decisions"][bucket]["provisional"] = False  # a settled entry, whatever this machine's noise made of it
    path.write_text(json.dumps(data))
    router = auto_router()
    router(q, k, v)
    cache = next(iter(router.caches.values()))
    assert router.probes == 0 and cache.loads == 1 and not cache.ignored
    assert router.decisions[bucket].source == "disk cache"


# ---- the cache key ------------------------------------------------------------------------------------------------


def test_the_key_names_every_candidate_kernels_package_with_its_state():
    kernels = configured_kernels(get_strategy("auto"))
    assert kernel_packages(kernels) == ["flash_attn", "torch_npu", "xformers"]
    found = environment(torch.device("cpu"), kernel_packages(kernels))
    assert found["torch"] == torch.__version__
    assert found["xformers"] == found["flash_attn"] == "absent"
    with fake_xformers():
        assert environment(torch.device("cpu"), ["xformers"])["xformers"] == "0.0.33+npu-port-fake"


def test_installing_a_kernels_package_changes_the_cache_file():
    q, k, v = qkv()
    plain = auto_router()
    plain(q, k, v)
    with fake_xformers():
        with_xformers = auto_router()
        with_xformers(q, k, v)
    assert with_xformers.probes == 1  # measured afresh, not read from the file made without xformers
    paths = {next(iter(r.caches.values())).path for r in (plain, with_xformers)}
    assert len(paths) == 2


def test_the_entry_format_is_part_of_the_key_so_installs_of_two_formats_keep_separate_files(tmp_path, monkeypatch):
    from npu_port.strategy import cache

    def path():
        return cache.DecisionCache(torch.device("cpu"), {"candidates": ["sdpa"]}, root=tmp_path).path

    now = path()
    monkeypatch.setattr(cache, "FORMAT", cache.FORMAT - 1)
    assert path() != now


class BrokenPackageKernel(Kernel):
    """A third-party kernel whose package is installed but cannot be imported."""

    name = "broken_package_test_kernel"
    package: ClassVar[Optional[str]] = "npu_port_test_broken_pkg"

    def run(self, call):  # pragma: no cover - never runnable
        raise AssertionError


def test_a_registered_kernels_broken_package_is_in_the_key_as_broken(tmp_path, monkeypatch):
    (tmp_path / "npu_port_test_broken_pkg").mkdir()
    (tmp_path / "npu_port_test_broken_pkg" / "__init__.py").write_text("raise ImportError('libfoo.so missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _optional.forget("npu_port_test_broken_pkg")
    npu_port.register_kernel(BrokenPackageKernel)
    try:
        strategy = get_strategy("auto").with_overrides(candidates=[BrokenPackageKernel.name, "math"])
        router = StrategyRouter(strategy)
        router(*qkv())
        cache = next(iter(router.caches.values()))
        assert cache.environment["npu_port_test_broken_pkg"] == "broken"
        assert json.loads(cache.path.read_text())["environment"]["npu_port_test_broken_pkg"] == "broken"
    finally:
        _KERNELS.pop(BrokenPackageKernel.name, None)
        _DEFAULTS.pop(BrokenPackageKernel.name, None)
        _optional.forget("npu_port_test_broken_pkg")
        sys.modules.pop("npu_port_test_broken_pkg", None)


def test_the_public_handle_explains_the_cache_miss(caplog):
    q, k, v = qkv()
    path, bucket, data = stored_file(auto_router(), q, k, v)
    data["decisions"][bucket] = "sdpa"
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="npu_port.strategy"):
        with npu_port.attention_strategy("auto", repeats=1, warmup=0) as handle:
            npu_port.attention(q, k, v)
            explanation = handle.explain()
    line = (
        f"disk cache entry {bucket!r} in {path} ignored: malformed entry (expected a JSON object, found str); "
        "measuring again (it will be overwritten)"
    )
    assert f"\n  {line}\n" in explanation and "[measured in " in explanation
    assert [r.getMessage() for r in caplog.records] == [line]
    assert isinstance(json.loads(path.read_text())["decisions"][bucket], dict)


def test_processes_writing_at_once_keep_each_others_decisions():
    """The read-merge-write runs under a lock: eight writers (threads here; torchrun's ranks in practice) putting
    different buckets into one file all survive."""
    import threading

    from npu_port.strategy.cache import DecisionCache
    from npu_port.strategy.decision import Decision

    router = auto_router()
    q, k, v = qkv()
    router(q, k, v)
    template = next(iter(router.caches.values()))
    packages = kernel_packages(router.kernels)
    caches = [DecisionCache(torch.device("cpu"), template.fingerprint, packages=packages) for _ in range(8)]
    assert len({c.path for c in caches}) == 1 and caches[0].path == template.path
    errors = []

    def put(index):
        try:
            for round_ in range(5):
                caches[index].put(Decision(bucket=f"bucket-{index}-{round_}", kernel="sdpa", select="measure"))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stored = json.loads(template.path.read_text())["decisions"]
    assert {f"bucket-{i}-{r}" for i in range(8) for r in range(5)} <= set(stored)
