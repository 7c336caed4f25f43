"""Context parallelism on gloo ranks against one process: a tiny Flux-style and a tiny Wan transformer (4 heads x
64), Ulysses, ring and both, with and without key masks, give this process's output within 1e-5 (float32); the
bytes each rank sends are the analytic figure for the layout; ``restore()`` gives back the single-process model, and
``close()`` in the caller's process group ends only the mesh's subgroups. On 2 ranks, also: a strategy whose kernel
cannot return the log-sum-exp (enough for Ulysses alone, refused by ring), a key mask made under inference mode,
``anything=True`` refused with a ring, and both transformers of a Wan 2.2-style pipeline split and restored.

2 ranks (Ulysses 2, ring 2) run in the default suite, 4 ranks (Ulysses 4, ring 4, Ulysses 2 x ring 2) are marked
slow; each rank count is one spawn running every case (:func:`.workers.context_parallel`).
"""

from __future__ import annotations

import pytest
import torch

from . import models, workers
from .conftest import shared_ranks

pytestmark = pytest.mark.e2e

#: float32 parity with one process (the issue's bar).
ATOL = 1e-5
LAYOUTS = {2: [(2, 1), (1, 2)], 4: [(4, 1), (1, 4), (2, 2)]}
#: (ulysses, ring) under CFG parallelism on 4 ranks: each guidance half split over 2.
GUIDED = [(2, 1), (1, 2)]


def _cases(nproc):
    marks = [pytest.mark.slow] if nproc == 4 else []
    return [
        pytest.param(nproc, kind, ulysses, ring, mask, marks=marks, id=f"{nproc}ranks-{kind}-u{ulysses}r{ring}-{mask}")
        for kind in models.MASKS
        for ulysses, ring in LAYOUTS[nproc]
        for mask in models.MASKS[kind]
    ]


def _layouts(nproc):
    marks = [pytest.mark.slow] if nproc == 4 else []
    return [
        pytest.param(nproc, kind, ulysses, ring, marks=marks, id=f"{nproc}ranks-{kind}-u{ulysses}r{ring}")
        for kind in models.MASKS
        for ulysses, ring in LAYOUTS[nproc]
    ]


CASES = _cases(2) + _cases(4)
MODEL_LAYOUTS = _layouts(2) + _layouts(4)
#: The layouts :func:`.workers.flux_cases` and :func:`.workers.two_transformers` run on (the 2-rank spawn only).
CASE_LAYOUTS = [pytest.param(2, u, r, id=f"2ranks-u{u}r{r}") for u, r in LAYOUTS[2]]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return shared_ranks(tmp_path_factory, "cp2", 2, workers.context_parallel, list(models.MASKS), LAYOUTS[2], (), True)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    return shared_ranks(tmp_path_factory, "cp4", 4, workers.context_parallel, list(models.MASKS), LAYOUTS[4], GUIDED)


def _ranks(request, nproc):
    return request.getfixturevalue({2: "two_ranks", 4: "four_ranks"}[nproc])


@pytest.fixture(scope="module")
def one_process():
    """Every output on this process, with no process group: the reference."""
    outputs = {}
    for kind, masks in models.MASKS.items():
        model = models.build(kind)
        outputs.update({(kind, mask): models.run(model, kind, mask) for mask in masks})
    return outputs


def analytic_traffic(kind, ulysses, ring, mask):
    """The bytes (and collective calls) one rank sends in one forward, from the shapes (float32, batch 1, 4 heads x
    64): per context-parallel attention call, Ulysses exchanges 4 tensors (q, k, v, out) of ``S_local * H * D * 4``
    bytes of which ``(U - 1) / U`` leave the rank; ring all-gathers K and V of its block (``S / R`` keys, ``H / U``
    heads) to ``R - 1`` peers; a key mask (bool, sent as one byte per key) is gathered once per forward."""
    ranks = ulysses * ring
    if kind == "flux":
        sequence = models.FLUX_TEXT + models.FLUX_IMAGE[0] * models.FLUX_IMAGE[1]  # joint attention: text + image
        calls = 2  # one double-stream and one single-stream block
        masked_keys = mask == "text"
    else:
        _, frames, height, width = models.WAN_LATENT
        sequence = frames * (height // 2) * (width // 2)
        calls = 2  # the self-attention of two blocks; the cross-attention (attn2) is not context-parallel
        masked_keys = mask == "video"
    heads, dim, element = models.HEADS, models.HEAD_DIM, 4
    local = sequence // ranks
    sent, counted = {}, {}
    if ulysses > 1:
        sent["all_to_all"] = calls * 4 * (local * heads * dim * element * (ulysses - 1) // ulysses)
        counted["all_to_all"] = calls * 4
    gathered, gathers = 0, 0
    if ring > 1:
        gathered += calls * 2 * (sequence // ring) * (heads // ulysses) * dim * element * (ring - 1)
        gathers += calls
    if masked_keys:
        gathered += local * (ranks - 1)
        gathers += 1
    if gathers:
        sent["all_gather"], counted["all_gather"] = gathered, gathers
    return {"bytes": sent, "calls": counted}


@pytest.mark.parametrize("nproc, kind, ulysses, ring, mask", CASES)
def test_every_rank_gives_the_single_process_output(request, one_process, nproc, kind, ulysses, ring, mask):
    expected = one_process[kind, mask]
    for rank, result in enumerate(_ranks(request, nproc)):
        out = result["parallel"][kind, ulysses, ring, mask]["out"]
        assert out.shape == expected.shape
        diff = (out - expected).abs().max().item()
        assert diff <= ATOL, f"rank {rank}: max |parallel - one process| = {diff:.3g}"


@pytest.mark.parametrize("nproc, kind, ulysses, ring, mask", CASES)
def test_bytes_sent_are_the_analytic_figure(request, nproc, kind, ulysses, ring, mask):
    expected = analytic_traffic(kind, ulysses, ring, mask)
    for rank, result in enumerate(_ranks(request, nproc)):
        assert result["parallel"][kind, ulysses, ring, mask]["traffic"] == expected, f"rank {rank}"


@pytest.mark.parametrize("nproc, kind, ulysses, ring", MODEL_LAYOUTS)
def test_the_masks_matter(request, one_process, nproc, kind, ulysses, ring):
    """A mask that was dropped would give the unmasked output: each mask moves the output far beyond ATOL, on one
    process and on every rank."""
    for mask in models.MASKS[kind][1:]:
        assert (one_process[kind, mask] - one_process[kind, "none"]).abs().max() > 1e-3
        for result in _ranks(request, nproc):
            outputs = result["parallel"]
            moved = (outputs[kind, ulysses, ring, mask]["out"] - outputs[kind, ulysses, ring, "none"]["out"]).abs()
            assert moved.max() > 1e-3, mask


@pytest.mark.parametrize("nproc, kind, ulysses, ring", MODEL_LAYOUTS)
def test_restore_gives_back_the_single_process_model(request, nproc, kind, ulysses, ring):
    for rank, result in enumerate(_ranks(request, nproc)):
        state = result["state"]
        before = state[kind, "before"]
        assert before["hooks"] == {} and not before["registered"] and not before["enum_member"]
        during = state[kind, ulysses, ring, "parallel"]
        assert {backend for _, backend, _ in during["processors"]} == {"npu_port"}, during["processors"]
        assert during["hooks"] and during["registered"] and during["enum_member"] and during["model_parallel_config"]
        assert state[kind, ulysses, ring, "restored"] == before, f"rank {rank}"
        for mask in models.MASKS[kind]:
            again = result["restored"][kind, ulysses, ring, mask]
            assert torch.equal(again, result["alone"][kind, mask]), f"rank {rank}, mask {mask}"


@pytest.mark.parametrize("nproc, kind, ulysses, ring", MODEL_LAYOUTS)
def test_close_in_the_callers_group_ends_only_the_mesh_subgroups(request, nproc, kind, ulysses, ring):
    """The harness made the process group, so ``close()`` leaves it (the WORLD group still all-reduces) and ends
    only the groups its mesh made."""
    for rank, result in enumerate(_ranks(request, nproc)):
        groups = result["groups"][kind, ulysses, ring]
        assert groups["before"] == 1 and groups["during"] > 1, f"rank {rank}: {groups}"
        assert groups["after"] == groups["before"], f"rank {rank}: mesh subgroups left after close(): {groups}"
        assert groups["owns_group"] is False and groups["world all_reduce"] == nproc
        assert groups["second close"] is None, f"rank {rank}: a second close() raised {groups['second close']}"


def _within(out, expected, where):
    assert not isinstance(out, dict), f"{where}: {out}"
    diff = (out - expected).abs().max().item()
    assert diff <= ATOL, f"{where}: max |parallel - one process| = {diff:.3g}"


#: Why SDPA pinned to its math backend cannot give ring attention the log-sum-exp (the kernel's own reason).
NO_LSE = (
    "  - return_lse=True: sdpa cannot return the log-sum-exp here (it comes from the flash backend, and the pinned "
    "backends are math); use math or chunked\n"
)


@pytest.mark.parametrize("nproc, ulysses, ring", CASE_LAYOUTS)
def test_a_kernel_without_log_sum_exp_runs_ulysses_alone_and_ring_refuses_it(
    request, one_process, nproc, ulysses, ring
):
    """Ulysses alone attends to the whole sequence in one call, so the strategy's kernel needs no log-sum-exp;
    ring merges partial results by it, and the kernel's reason says why it cannot."""
    for rank, result in enumerate(_ranks(request, nproc)):
        cases = result["flux cases"][ulysses, ring]
        for mask, out in cases["no lse"].items():
            if ring == 1:
                _within(out, one_process["flux", mask], f"rank {rank}, mask {mask}")
            else:
                assert out["error"].startswith("KernelUnavailableError: attention kernel 'sdpa' cannot run this call")
                assert NO_LSE in out["error"], out["error"]
        if ring == 1:
            assert list(cases["no lse kernels"]) == ["sdpa"]  # the strategy's kernel ran every call


@pytest.mark.parametrize("nproc, ulysses, ring", CASE_LAYOUTS)
def test_a_key_mask_made_under_inference_mode(request, one_process, nproc, ulysses, ring):
    """Inference tensors have no version counter to key the gathered-mask cache on: the mask is gathered anyway."""
    for rank, result in enumerate(_ranks(request, nproc)):
        _within(result["flux cases"][ulysses, ring]["inference mode"], one_process["flux", "text"], f"rank {rank}")


@pytest.mark.parametrize("nproc, ulysses, ring", [p for p in CASE_LAYOUTS if p.values[2] > 1])
def test_anything_with_a_ring_is_refused_and_leaves_the_model_as_it_was(request, nproc, ulysses, ring):
    for result in _ranks(request, nproc):
        cases = result["flux cases"][ulysses, ring]
        assert cases["anything"] == {
            "error": "ParallelError: ulysses_anything works with ring 1 only (diffusers' rule); give ring=1 or "
            "anything=False"
        }
        assert cases["anything left"] is True


@pytest.mark.parametrize("nproc, ulysses, ring", CASE_LAYOUTS)
def test_a_processor_replaced_after_parallelize_stops_the_forward(request, nproc, ulysses, ring):
    """It would attend to this rank's part of the sequence only: a wrong result, so the forward is refused."""
    for result in _ranks(request, nproc):
        assert result["flux cases"][ulysses, ring]["replaced processor"] == {
            "error": "ParallelError: transformer_blocks.0.attn: its attention processor FluxAttnProcessor does not use "
            "npu-port's backend (replaced after parallelize, or a processor that takes no dispatcher backend); under "
            "context parallelism it would see this rank's part of the sequence only. Set processors before "
            "parallelize, or restore() first"
        }


@pytest.mark.parametrize("nproc, ulysses, ring", CASE_LAYOUTS)
def test_both_transformers_of_a_wan_2_2_pipeline_are_split_and_restored(request, nproc, ulysses, ring):
    """Wan 2.2 denoises with ``transformer`` then ``transformer_2``: each sees this rank's part of the sequence,
    gives its single-process output, and is given back as it was."""
    _, frames, height, width = models.WAN_LATENT
    tokens = frames * (height // 2) * (width // 2)
    for rank, result in enumerate(_ranks(request, nproc)):
        for name, found in result["two transformers"][ulysses, ring].items():
            where = f"rank {rank}, {name}"
            assert found["alone seen"] == {tokens} and found["seen"] == {tokens // nproc}, where
            assert {backend for _, backend, _ in found["parallel state"]["processors"]} == {"npu_port"}, where
            _within(found["out"], found["alone"], where)
            assert found["restored"] == found["before"], where
        pair = result["two transformers"][ulysses, ring]
        assert (pair["transformer"]["alone"] - pair["transformer_2"]["alone"]).abs().max() > 1e-3  # two models


@pytest.mark.slow
@pytest.mark.parametrize("ulysses, ring", GUIDED, ids=[f"u{u}r{r}" for u, r in GUIDED])
def test_cfg_parallel_on_top_of_context_parallel_gives_the_single_process_latents(four_ranks, ulysses, ring):
    expected = models.flux_guidance(models.build("flux"))
    for rank, result in enumerate(four_ranks):
        guided = result["guided"][ulysses, ring]
        diff = (guided["out"] - expected).abs().max().item()
        assert diff <= ATOL, f"rank {rank}: max |cfg x context parallel - one process| = {diff:.3g}"
        assert guided["exchanges"] == 2  # one per step
        assert torch.equal(guided["restored"], guided["alone"]), f"rank {rank}"
