"""Each piece of diffusers' hooks and context parallelism taken away, as a release that moved it would.

Every use is an explicit request — ``npu-port infer --nproc N --ulysses / --ring / --cfg-parallel``,
``npu_port.parallel.start(...)``, ``run_parallel`` — so a missing piece is an error raised before any work: no
process group joined, no environment changed, no model built, with a message naming diffusers, its version and the
piece. A plain (one-process) run of the tiny pipeline is untouched: the same image, no warning. Two things decline
instead of refusing: CFG parallelism without diffusers' cache-context pieces tells a step's two calls apart by their
order (one warning), and the error about a model without a plan cannot list the models that have one.
"""

from __future__ import annotations

import os
import re
import warnings

import numpy as np
import pytest
import torch

from npu_port.errors import ParallelError
from npu_port.upstream import UpstreamDeclinedWarning, UpstreamMissingError
from npu_port.upstream.diffusers import ADAPTER, dispatch
from npu_port.upstream.diffusers import parallel as upstream

from .diffusers_scenarios import load_tiny, pixels
from .removal import one_decline, remove, with_every_piece

pytest.importorskip("diffusers")

FEATURES = (
    upstream.HOOKS,
    upstream.CONTEXT_PARALLEL,
    upstream.ULYSSES_ANYTHING,
    upstream.CACHE_CONTEXT,
    upstream.PLANNED_MODELS,
)
pytestmark = with_every_piece(ADAPTER, FEATURES)
HOOK_PIECES = list(upstream.HOOK_PIECES)
SPLIT_PIECES = list(upstream.CONTEXT_PARALLEL_PIECES)
CONTEXT_PIECES = list(upstream.CACHE_CONTEXT_PIECES)
assert sorted(HOOK_PIECES + SPLIT_PIECES + CONTEXT_PIECES + ["ulysses_anything", "_import_structure"]) == sorted(
    p.name for p in ADAPTER.pieces() if p.feature in FEATURES
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny pipeline and its image in one process, every piece in place."""
    from npu_port.infer.run import GenerationRequest, generate

    loaded = load_tiny("tiny", tmp_path_factory)
    request = GenerationRequest(strategy="sdpa", steps=2, seed=0)
    return loaded, request, pixels(generate(loaded, request).image)


def _untouched(tiny):
    """The one-process run: the same image, and no decline."""
    from npu_port.infer.run import generate

    loaded, request, expected = tiny
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        image = pixels(generate(loaded, request).image)
    assert [w for w in caught if issubclass(w.category, UpstreamDeclinedWarning)] == []
    assert np.array_equal(image, expected)


def _refused_before_any_work(monkeypatch, name, **layout):
    import torch.distributed as dist

    from npu_port.parallel import start

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    environment = dict(os.environ)
    with pytest.raises(UpstreamMissingError) as raised:
        start(**layout)
    message = str(raised.value)
    assert name in message.split(" from diffusers")[0] and f"diffusers {ADAPTER.version()} does not have" in message
    assert not dist.is_initialized() and dict(os.environ) == environment
    return message


def _cli(monkeypatch, tmp_path, *flags):
    """``npu-port infer --model tiny-flux`` with ``flags`` in a fresh folder and cache: (exit code, stderr, whether
    the model was built)."""
    import contextlib
    import io

    from npu_port.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NPU_PORT_CACHE_DIR", str(tmp_path / "cache"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["infer", "--model", "tiny-flux", "--device", "cpu", "--steps", "1", *flags])
    built = (tmp_path / "cache").exists() and any((tmp_path / "cache").rglob("config.json"))
    return code, err.getvalue(), built


@pytest.mark.parametrize("name", HOOK_PIECES + SPLIT_PIECES)
def test_a_sequence_split_is_refused_before_any_work_and_one_process_is_untouched(tiny, monkeypatch, tmp_path, name):
    remove(monkeypatch, ADAPTER, name)
    feature = upstream.HOOKS if name in HOOK_PIECES else upstream.CONTEXT_PARALLEL
    message = _refused_before_any_work(monkeypatch, name, ulysses=2)
    assert message.startswith(f"{feature} needs ")
    code, err, built = _cli(monkeypatch, tmp_path, "--nproc", "2", "--ulysses", "2")
    assert code == 2 and f"npu-port: {feature} needs " in err and name in err and not built, err
    _untouched(tiny)


@pytest.mark.parametrize("name", HOOK_PIECES)
def test_without_hooks_cfg_parallelism_is_refused_before_any_work(monkeypatch, tmp_path, name):
    remove(monkeypatch, ADAPTER, name)
    _refused_before_any_work(monkeypatch, name, cfg_parallel=True)
    code, err, built = _cli(monkeypatch, tmp_path, "--nproc", "2", "--cfg-parallel", "--guidance-scale", "3")
    assert code == 2 and name in err and not built, err


@pytest.mark.parametrize("name", SPLIT_PIECES)
def test_cfg_parallelism_alone_needs_no_context_parallel_piece(monkeypatch, name):
    from npu_port.parallel import ParallelLayout
    from npu_port.parallel.layout import require

    remove(monkeypatch, ADAPTER, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        require(ParallelLayout(cfg=True))
    assert [w for w in caught if issubclass(w.category, UpstreamDeclinedWarning)] == []


def test_without_ulysses_anything_only_that_request_is_refused(tiny, monkeypatch, tmp_path):
    from npu_port.infer.multi import run_parallel
    from npu_port.infer.paths import CacheLocation
    from npu_port.infer.run import GenerationRequest
    from npu_port.parallel import ParallelLayout
    from npu_port.parallel.layout import require

    remove(monkeypatch, ADAPTER, "ulysses_anything")
    require(ParallelLayout(ulysses=2))  # a plain Ulysses split still can
    cache = CacheLocation(tmp_path / "cache")
    with pytest.raises(UpstreamMissingError, match=re.escape(f"{upstream.ULYSSES_ANYTHING} needs ulysses_anything")):
        run_parallel("tiny-flux", "cpu", "float32", GenerationRequest(steps=1), ParallelLayout(ulysses=2), cache,
                     False, anything=True)  # fmt: skip
    assert not (tmp_path / "cache").exists()  # nothing built
    code, err, built = _cli(monkeypatch, tmp_path, "--nproc", "2", "--ulysses", "2", "--ulysses-anything")
    assert code == 2 and "needs ulysses_anything" in err and not built, err
    _untouched(tiny)


# ---- CFG parallelism without cache contexts: the calls are told apart by their order ----------------------------


@pytest.fixture(scope="module")
def flux():
    from npu_port.integrations.diffusers.tiny import run_tiny, tiny_flux_transformer

    model = tiny_flux_transformer().eval()
    return model, run_tiny(model, batch_size=1)


def _two_calls_under_cache_contexts(monkeypatch, model, named=True):
    """Rank 0 of a CFG pair, the exchange faked in-process: the conditional call runs the model, the unconditional
    one is the partner's (here: the conditional result sent back). ``named``: each call under diffusers'
    ``cache_context`` ("cond", then "uncond"), as a pipeline of 0.35 onwards makes them."""
    import contextlib

    from npu_port.integrations.diffusers.tiny import output_of, tiny_inputs
    from npu_port.parallel import cfg
    from npu_port.parallel.session import ParallelHandle, _register_hook

    monkeypatch.setattr(cfg, "all_gather_stacked", lambda tensor, group, ranks: torch.stack([tensor, tensor]))
    hook = cfg.make_hook("alternate", None, 0)
    handle = ParallelHandle()
    _register_hook(model, hook, cfg.HOOK_NAME, handle)
    try:
        inputs = tiny_inputs(model, batch_size=1)
        with torch.no_grad():
            with model.cache_context("cond") if named else contextlib.nullcontext():
                first = output_of(model(**inputs))
            with model.cache_context("uncond") if named else contextlib.nullcontext():
                second = output_of(model(**inputs))
    finally:
        handle.restore()
    return hook, first, second


def test_with_every_piece_the_hook_reads_diffusers_cache_context(flux, monkeypatch):
    model, expected = flux
    seen = []
    monkeypatch.setattr(
        "npu_port.parallel.cfg.GuidanceSplitHook._branch",
        lambda self, context: seen.append(getattr(context, "name", context)) or len(seen) - 1,
    )
    _two_calls_under_cache_contexts(monkeypatch, model)
    assert seen == ["cond", "uncond"]


@pytest.mark.parametrize("name", CONTEXT_PIECES)
def test_without_cache_contexts_cfg_parallelism_declines_to_call_order(tiny, flux, monkeypatch, name):
    from npu_port.parallel import ParallelLayout
    from npu_port.parallel.layout import require

    model, expected = flux
    remove(monkeypatch, ADAPTER, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        require(ParallelLayout(cfg=True))  # not an error: declined
        # diffusers' own cache_context needs its StateManager: without it, the pipeline names no call (as before 0.35)
        hook, first, second = _two_calls_under_cache_contexts(monkeypatch, model, named=name != "StateManager")
    message = one_decline(caught, ADAPTER, name)
    assert message.startswith(f"{upstream.CACHE_CONTEXT}: diffusers {ADAPTER.version()} has no ")
    assert hook.contexts is None and str(hook.declined) == message and hook.split.exchanges == 1
    assert torch.equal(first, expected) and torch.equal(second, expected)  # cond ran here; uncond came "from rank 1"
    _untouched(tiny)


# ---- the list of models with a plan ----------------------------------------------------------------------------


def test_without_the_model_list_the_error_still_says_what_is_wrong(monkeypatch):
    from npu_port.parallel.layout import check_plan

    remove(monkeypatch, ADAPTER, "_import_structure")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ParallelError) as raised:
            check_plan(torch.nn.Linear(2, 2))
    one_decline(caught, ADAPTER, "_import_structure")
    assert str(raised.value) == (
        "Linear has no context-parallel plan (_cp_plan), so its sequence cannot be split; diffusers' list of models "
        "is not readable here. Use --cfg-parallel alone, or pass a cp_plan"
    )


def test_every_backend_piece_is_the_dispatch_modules():
    assert set(dispatch.BACKEND_PIECES) <= {p.name for p in ADAPTER.pieces()}
