"""The flash_attn drop-in hands its calls to ``flash_attn_npu`` (flash-attn-npu's flash-attn 2 API) where that package
can run them, with the arguments unchanged, and computes the rest itself, recording why.

Runs against the stand-in of tests/fakes/flash_attn_npu_fake.py (written from flash-attn-npu 0.4.2.post1's documented
API, computing in float64), served by an import hook on an emulated NPU whose device name each test picks; npu-port's
routing takes CPU tensors as NPU tensors meanwhile (there is no NPU here)."""

from __future__ import annotations

import inspect
import math
import subprocess
import sys
import textwrap
from typing import Any, Dict, Tuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_port
from npu_port.dropins import flash_attn_impl as fa
from npu_port.dropins import flash_attn_npu as route
from npu_port.errors import AttentionInputError, DropInError

from ..fakes import flash_attn_npu_fake as fake
from ..reference import assert_close_to_reference
from .test_dropins import _cu, flash_keep, reference_bshd, reference_packed

#: flash-attn-npu 0.4.2.post1's signatures, from flash_attn_npu/flash_attn_npu_interface.py (names and defaults).
REAL_SIGNATURES = {
    "flash_attn_qkvpacked_func": "qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), "
    "softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False",
    "flash_attn_kvpacked_func": "q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), "
    "softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False",
    "flash_attn_func": "q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, "
    "alibi_slopes=None, deterministic=False, return_attn_probs=False",
    "flash_attn_varlen_qkvpacked_func": "qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False, "
    "window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False",
    "flash_attn_varlen_kvpacked_func": "q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, "
    "softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False, "
    "return_attn_probs=False",
    "flash_attn_varlen_func": "q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, "
    "softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False, "
    "return_attn_probs=False, block_table=None",
    "flash_attn_with_kvcache": "q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, "
    "cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False, "
    "window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0, "
    "scheduler_metadata=None, return_softmax_lse=False",
    "get_scheduler_metadata": "batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, "
    "cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None, page_size=None, causal=False, "
    "window_size=(-1, -1), softcap=0.0, softmax_scale=None, alibi_slopes_batch_stride=0, num_splits=0",
}
DELEGATED = [name for name in REAL_SIGNATURES if name != "get_scheduler_metadata"]


def _parameters(function) -> str:
    return ", ".join(
        p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
        for p in inspect.signature(function).parameters.values()
    )


def _randn(*shape: int, dtype=torch.float16, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_the_stand_in_has_the_packages_signatures_and_takes_every_argument_the_drop_in_passes():
    with fake.installed():
        import flash_attn_npu

        assert flash_attn_npu.__version__ == "0.4.2.post1"
        assert {name: _parameters(getattr(flash_attn_npu, name)) for name in REAL_SIGNATURES} == REAL_SIGNATURES
    for name in DELEGATED:  # the drop-in passes its own arguments by name: each must be one the package takes
        ours = set(inspect.signature(getattr(fa, name)).parameters)
        theirs = {part.split("=")[0] for part in REAL_SIGNATURES[name].split(", ")}
        assert ours <= theirs, name


# ---- delegation: the call, unchanged --------------------------------------------------------------------------------


def _call_for(name: str) -> Tuple[tuple, Dict[str, Any]]:
    """Arguments for ``name`` that flash_attn_npu takes, every option set away from its default."""
    slopes = torch.rand(4, generator=torch.Generator().manual_seed(9))
    options = dict(
        dropout_p=0.25,
        softmax_scale=0.3,
        causal=True,
        window_size=(3, 0),
        softcap=30.0,
        alibi_slopes=slopes,
        deterministic=True,
        return_attn_probs=True,
    )
    q, k, v = _randn(2, 5, 4, 16), _randn(2, 7, 2, 16, seed=1), _randn(2, 7, 2, 16, seed=2)
    cu_q, cu_k = _cu([2, 3]), _cu([3, 4])
    packed_q, packed_k, packed_v = (
        q[:, :, :2].reshape(10, 2, 16)[:5],
        k.reshape(14, 2, 16)[:7],
        v.reshape(14, 2, 16)[:7],
    )
    if name == "flash_attn_func":
        return (q, k, v), options
    if name == "flash_attn_kvpacked_func":
        return (q, torch.stack([k, v], dim=2)), options
    if name == "flash_attn_qkvpacked_func":
        return (torch.stack([q[:, :, :2], q[:, :, 2:], q.flip(1)[:, :, :2]], dim=2),), dict(
            options, alibi_slopes=slopes[:2]
        )
    if name == "flash_attn_varlen_func":
        return (packed_q, packed_k, packed_v, cu_q, cu_k, 3, 4), dict(options, alibi_slopes=slopes[:2])
    if name == "flash_attn_varlen_kvpacked_func":
        kv = torch.stack([packed_k, packed_v], dim=1)
        return (packed_q, kv, cu_q, cu_k, 3, 4), dict(options, alibi_slopes=slopes[:2])
    if name == "flash_attn_varlen_qkvpacked_func":
        qkv = torch.stack([packed_q, packed_k[:5], packed_v[:5]], dim=1)
        return (qkv, cu_q, 3), dict(options, alibi_slopes=slopes[:2])
    assert name == "flash_attn_with_kvcache"
    k_cache, v_cache = _randn(2, 8, 2, 16, seed=3), _randn(2, 8, 2, 16, seed=4)
    return (q[:, :1], k_cache, v_cache), dict(
        k=k[:, :1],
        v=v[:, :1],
        cache_seqlens=torch.tensor([3, 5], dtype=torch.int32),
        cache_batch_idx=torch.tensor([1, 0], dtype=torch.int32),
        softmax_scale=0.3,
        causal=True,
        softcap=10.0,
        alibi_slopes=slopes,
        return_softmax_lse=True,
    )


@pytest.mark.parametrize("name", DELEGATED)
def test_each_function_hands_its_call_to_flash_attn_npu_unchanged(name):
    args, kwargs = _call_for(name)
    with fake.installed() as (recorder, _):
        line = sys._getframe().f_lineno + 1
        result = getattr(fa, name)(*args, **kwargs)
        summary = route.ROUTES.summary()
    ((called, arguments),) = recorder.calls
    assert called == name
    signature = inspect.signature(getattr(fa, name)).bind(*args, **kwargs)
    assert all(arguments[key] is value for key, value in signature.arguments.items())  # the very objects passed
    assert result is recorder.results[0]
    assert summary == {"flash_attn_npu": {name: {"count": 1, "where": [f"{__file__}:{line}"]}}, "emulation": {}}


def test_what_the_emulation_lacks_comes_back_from_flash_attn_npu():
    """softcap, ALiBi and the log-sum-exp: refused by the emulation, computed by the package (checked against the
    documented formulas, written out here)."""
    q, k, v = _randn(1, 3, 2, 16), _randn(1, 5, 2, 16, seed=1), _randn(1, 5, 2, 16, seed=2)
    slopes = torch.tensor([0.5, 0.25])
    with pytest.raises(DropInError):
        fa.flash_attn_func(q, k, v, softcap=5.0)  # CPU: the emulation
    with fake.installed():
        out, lse, s_dmask = fa.flash_attn_func(
            q, k, v, causal=True, softcap=5.0, alibi_slopes=slopes, return_attn_probs=True
        )
    scores = torch.einsum("qhd,khd->hqk", q[0].double(), k[0].double()) / 4.0
    scores = 5.0 * torch.tanh(scores / 5.0)
    rows, cols = torch.arange(3)[:, None] + 2, torch.arange(5)[None, :]  # bottom-right: query i sits at i + 5 - 3
    scores = scores - slopes.double()[:, None, None] * (rows - cols).abs()
    scores = scores.masked_fill(cols > rows, -math.inf)
    expected = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v[0].double())
    assert_close_to_reference(out[0], expected, torch.float16)
    assert torch.allclose(lse[0].double(), torch.logsumexp(scores, dim=-1), atol=1e-5)
    assert s_dmask.shape == (0,)  # only with dropout, as in the package


@st.composite
def half_cases(draw):
    dtype = draw(st.sampled_from((torch.float16, torch.bfloat16)))
    batch, kv_heads, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from((1, 2, 3)))
    q_len, key_len, dim = draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.sampled_from((8, 16, 24)))
    seed = draw(st.integers(0, 2**31 - 1))
    q = _randn(batch, q_len, kv_heads * group, dim, dtype=dtype, seed=seed)
    k = _randn(batch, key_len, kv_heads, dim, dtype=dtype, seed=seed + 1)
    v = _randn(batch, key_len, kv_heads, dim, dtype=dtype, seed=seed + 2)
    window = draw(st.one_of(st.just((-1, -1)), st.tuples(st.integers(-1, 5), st.integers(-1, 5))))
    return q, k, v, draw(st.booleans()), window, draw(st.one_of(st.none(), st.floats(0.1, 1.0)))


@settings(max_examples=60)
@given(case=half_cases())
def test_flash_attn_npu_and_the_emulation_give_the_same_result(case):
    """Both follow flash-attn's semantics (bottom-right causal and windows, zeros for rows without keys): the
    package's result and the emulation's are each within the dtype's tolerance of the float64 reference."""
    q, k, v, causal, window, scale = case
    ref = reference_bshd(q, k, v, flash_keep(q.shape[1], k.shape[1], causal, window, k.shape[1]), scale=scale)
    emulated = fa.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window)
    with fake.installed() as (recorder, _):
        delegated = fa.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window)
    assert [name for name, _ in recorder.calls] == ["flash_attn_func"]
    assert_close_to_reference(delegated, ref, q.dtype)
    assert_close_to_reference(emulated, ref, q.dtype)


@settings(max_examples=30)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=3),
    causal=st.booleans(),
    dtype=st.sampled_from((torch.float16, torch.bfloat16)),
)
def test_varlen_offsets_reach_flash_attn_npu_as_given_and_agree_with_the_emulation(lengths, causal, dtype):
    q_lens, k_lens = [a for a, _ in lengths], [b for _, b in lengths]
    q, k = _randn(sum(q_lens), 4, 16, dtype=dtype), _randn(sum(k_lens), 2, 16, dtype=dtype, seed=1)
    v = _randn(sum(k_lens), 2, 16, dtype=dtype, seed=2)
    cu_q, cu_k = _cu(q_lens), _cu(k_lens)
    ref = reference_packed(q, k, v, q_lens, k_lens, lambda sq, sk: flash_keep(sq, sk, causal))
    emulated = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal=causal)
    with fake.installed() as (recorder, _):
        delegated = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal=causal)
    ((_, arguments),) = recorder.calls
    assert arguments["cu_seqlens_q"] is cu_q and arguments["cu_seqlens_k"] is cu_k
    assert (arguments["max_seqlen_q"], arguments["max_seqlen_k"]) == (max(q_lens), max(k_lens))
    assert_close_to_reference(delegated, ref, dtype)
    assert_close_to_reference(emulated, ref, dtype)


def test_a_paged_kv_cache_goes_to_flash_attn_npu():
    """The emulation refuses paged caches; the package reads them (pages in block_table order)."""
    q, pages = _randn(1, 1, 2, 16), _randn(3, 4, 2, 16, seed=1)
    values = _randn(3, 4, 2, 16, seed=2)
    table = torch.tensor([[2, 0]], dtype=torch.int32)
    with pytest.raises(DropInError, match=r"block_table=\.\.\.\) is not supported"):
        fa.flash_attn_with_kvcache(q, pages, values, cache_seqlens=6, block_table=table)
    with fake.installed() as (recorder, _):
        out = fa.flash_attn_with_kvcache(q, pages, values, cache_seqlens=6, block_table=table)
    assert recorder.calls[0][1]["block_table"] is table
    keys, vals = torch.cat([pages[2], pages[0]])[:6], torch.cat([values[2], values[0]])[:6]
    assert_close_to_reference(out, reference_bshd(q, keys[None], vals[None]), torch.float16)


# ---- falling back: the reason, and the emulation's result -----------------------------------------------------------

H16 = torch.float16
CU = _cu([3, 4])
#: case -> (function, args, kwargs, reason code, exact reason). Each runs on the emulation instead.
FALLBACKS = {
    "float32": (
        "flash_attn_func",
        (_randn(1, 4, 2, 16, dtype=torch.float32),) * 3,
        {},
        "dtype",
        "flash_attn_npu takes float16 or bfloat16, one dtype for q, k and v; got float32, float32, float32",
    ),
    "head dim 320": (
        "flash_attn_func",
        (_randn(1, 4, 2, 320),) * 3,
        {"causal": True},
        "head-dim",
        "head_dim 320 is outside flash_attn_npu's range [1, 256]",
    ),
    "value head dim": (
        "flash_attn_func",
        (_randn(1, 4, 2, 16), _randn(1, 4, 2, 16), _randn(1, 4, 2, 8)),
        {},
        "head-dim",
        "q, k and v have head dims 16, 16, 8; flash_attn_npu needs one head dim",
    ),
    "int64 offsets": (
        "flash_attn_varlen_func",
        (_randn(7, 2, 16), _randn(7, 2, 16), _randn(7, 2, 16), CU.long(), CU.long(), 4, 4),
        {"causal": True},
        "offsets",
        "cu_seqlens_q is int64; flash_attn_npu reads it as int32 (it does not convert)",
    ),
    "window while appending": (
        "flash_attn_with_kvcache",
        (_randn(1, 1, 2, 16), torch.zeros(1, 6, 2, 16, dtype=H16), torch.zeros(1, 6, 2, 16, dtype=H16)),
        {"k": _randn(1, 1, 2, 16), "v": _randn(1, 1, 2, 16), "cache_seqlens": 2, "window_size": (1, 0)},
        "window-append",
        "flash_attn_npu does not take a sliding window while appending k / v to the cache",
    ),
    "append with head dim 8": (
        "flash_attn_with_kvcache",
        (_randn(1, 1, 2, 8), torch.zeros(1, 6, 2, 8, dtype=H16), torch.zeros(1, 6, 2, 8, dtype=H16)),
        {"k": _randn(1, 1, 2, 8), "v": _randn(1, 1, 2, 8), "cache_seqlens": 2},
        "head-dim",
        "flash_attn_npu appends k / v only with a head dim that is a multiple of 16, not 8",
    ),
    "int64 cache lengths": (
        "flash_attn_with_kvcache",
        (_randn(1, 1, 2, 16), _randn(1, 6, 2, 16), _randn(1, 6, 2, 16)),
        {"cache_seqlens": torch.tensor([4])},
        "offsets",
        "cache_seqlens is int64; flash_attn_npu reads it as int32 (it does not convert)",
    ),
    "num_splits without pages": (
        "flash_attn_with_kvcache",
        (_randn(1, 1, 2, 16), _randn(1, 6, 2, 16), _randn(1, 6, 2, 16)),
        {"num_splits": 2},
        "num-splits",
        "num_splits=2 > 1 needs a paged cache (block_table) in flash_attn_npu",
    ),
}


@pytest.mark.parametrize("case", list(FALLBACKS))
def test_calls_outside_its_limits_run_on_the_emulation_with_the_reason(case):
    name, args, kwargs, code, reason = FALLBACKS[case]
    function = getattr(fa, name)

    def fresh(value):  # the kv-cache calls write into their caches: each run gets its own copies
        return value.clone() if torch.is_tensor(value) else value

    expected = function(*map(fresh, args), **{key: fresh(value) for key, value in kwargs.items()})
    args, kwargs = tuple(map(fresh, args)), {key: fresh(value) for key, value in kwargs.items()}
    with fake.installed() as (recorder, _):
        line = sys._getframe().f_lineno + 1
        out = function(*args, **kwargs)
        summary = route.ROUTES.summary()
    assert recorder.imports == 1 and recorder.calls == []  # the package was imported, and not called
    assert summary == {
        "flash_attn_npu": {},
        "emulation": {code: {"count": 1, "reason": reason, "where": [f"{__file__}:{line}"]}},
    }
    assert torch.equal(out, expected)  # what the emulation computes without the package


@pytest.mark.parametrize(
    "kwargs, code, reason",
    [
        (
            {"softcap": 30.0, "alibi_slopes": torch.ones(2, dtype=H16)},
            "alibi",
            "alibi_slopes float16 [2] on cpu: flash_attn_npu needs float32 slopes on the NPU, shaped (2,) or (1, 2), "
            "contiguous",
        ),
        ({"softcap": -1.0}, "softcap", "softcap=-1.0: flash_attn_npu needs softcap >= 0 (0 = off)"),
    ],
)
def test_a_feature_only_the_package_has_still_raises_when_it_declines_and_says_why(kwargs, code, reason):
    q = _randn(1, 4, 2, 16)
    with fake.installed():
        with pytest.raises(DropInError) as info:
            fa.flash_attn_func(q, q, q, **kwargs)
        assert route.ROUTES.reasons == {code: reason}
    argument = "alibi_slopes=..." if "alibi_slopes" in kwargs else f"softcap={kwargs['softcap']!r}"
    assert str(info.value).startswith(f"flash_attn_func({argument}) is not supported by npu-port's flash_attn drop-in")
    assert str(info.value).endswith(f"(an installed flash-attn takes precedence over the drop-in). flash_attn_npu did "
                                    f"not take this call: {reason}.")  # fmt: skip


@pytest.mark.parametrize(
    "q, k, v, code, reason",
    [
        (
            _randn(1, 4, 3, 16),
            _randn(1, 4, 2, 16),
            _randn(1, 4, 2, 16),
            "heads",
            "3 query heads are not a multiple of 2 key/value heads (flash_attn_npu's limit)",
        ),
        (
            _randn(1, 4, 2, 16),
            _randn(1, 4, 2, 16, dtype=torch.bfloat16),
            _randn(1, 4, 2, 16),
            "dtype",
            "flash_attn_npu takes float16 or bfloat16, one dtype for q, k and v; got float16, bfloat16, float16",
        ),
    ],
)
def test_inputs_neither_can_take_fall_back_and_the_emulation_says_what_is_wrong(q, k, v, code, reason):
    with fake.installed() as (recorder, _):
        with pytest.raises(AttentionInputError):
            fa.flash_attn_func(q, k, v)
        assert route.ROUTES.reasons == {code: reason}
    assert recorder.calls == []


# ---- where the package is not used at all ---------------------------------------------------------------------------


def test_cpu_tensors_never_look_for_the_package():
    q = _randn(1, 4, 2, 16)
    with fake.installed(cpu=False) as (recorder, finder):
        out = fa.flash_attn_func(q, q, q, causal=True)
        assert route.ROUTES.reasons == {"device": "flash_attn_npu runs on Ascend NPUs only; q is on cpu"}
        assert "flash_attn_npu" not in sys.modules
    assert finder.asked == 0 and recorder.imports == 0 and recorder.calls == []
    assert_close_to_reference(out, reference_bshd(q, q, q, flash_keep(4, 4, True)), H16)


@pytest.mark.parametrize(
    "device_name, chip",
    [
        ("Ascend910A", "910A (Ascend 910 (first generation, Atlas 800 training 9000))"),
        ("Ascend950PR", "950 (Ascend 950 (950PR / 950DT))"),
        ("Ascend310P3", "310P (Atlas 300I Duo / 300I Pro (Ascend 310P))"),
    ],
)
def test_chips_without_its_flash_attn_2_api_are_refused_before_importing_it(device_name, chip):
    """910A passes the package's own import check ("Ascend910" in the name) but is not a chip it was built for; 950
    and 310P would raise in the import. npu-port's chip table answers first."""
    q = _randn(1, 4, 2, 16)
    with fake.installed(device_name) as (recorder, finder):
        fa.flash_attn_func(q, q, q)
        fa.flash_attn_func(q, q, q)
        assert route.ROUTES.summary()["emulation"]["chip"]["count"] == 2
        assert route.ROUTES.reasons == {
            "chip": f"flash_attn_npu's flash-attn 2 API runs on Ascend 910B / 910C only, not on this {chip}"
        }
    assert finder.asked == 0 and recorder.imports == 0


@pytest.mark.parametrize("device_name", ["Ascend910B3", "Ascend910_9392"])
def test_910b_and_910c_use_it(device_name):
    q = _randn(1, 4, 2, 16)
    with fake.installed(device_name) as (recorder, _):
        fa.flash_attn_func(q, q, q)
    assert [name for name, _ in recorder.calls] == ["flash_attn_func"]


def test_an_import_that_raises_is_caught_reported_and_not_tried_again():
    """Where npu-port's chip table does not know the chip, the package's import finds out: its RuntimeError becomes
    the reason, once; every call runs on the emulation."""
    q = _randn(1, 4, 2, 16)
    with fake.installed("Ascend310P3", chip_visible=False) as (recorder, finder):
        first = fa.flash_attn_func(q, q, q, causal=True)
        asked = finder.asked
        fa.flash_attn_func(q, q, q, causal=True)
        summary = route.ROUTES.summary()["emulation"]
        assert "flash_attn_npu" not in sys.modules
    assert recorder.imports == 1 and asked > 0 and finder.asked == asked  # looked for once, imported once
    assert summary["package-broken"]["count"] == 2
    assert summary["package-broken"]["reason"] == (
        "flash_attn_npu is installed but cannot be imported (RuntimeError: Unsupported Ascend device: Ascend310P3); "
        'its flash-attn 2 API imports only on Ascend 910B / 910C ("Unsupported Ascend device" elsewhere), after '
        "torch_npu imports (source CANN's set_env.sh first); otherwise rebuild it for this torch_npu and CANN"
    )
    assert_close_to_reference(first, reference_bshd(q, q, q, flash_keep(4, 4, True)), H16)


def test_without_the_package_an_npu_call_says_how_to_get_it():
    q = _randn(1, 4, 2, 16)
    saved = route.DEVICE_TYPES
    route.DEVICE_TYPES = saved + ("cpu",)
    route.forget()
    route.ROUTES.clear()
    try:
        with pytest.raises(DropInError) as info:
            fa.flash_attn_func(q, q, q, return_attn_probs=True)
        reasons = dict(route.ROUTES.reasons)
    finally:
        route.DEVICE_TYPES = saved
        route.forget()
    missing = (
        "flash_attn_npu is not installed; pip install flash-attn-npu --no-build-isolation on an Ascend 910B / 910C "
        "machine (needs CANN >= 8.5.0 and torch_npu matching torch)"
    )
    assert reasons == {"package-missing": missing}
    assert str(info.value).endswith(f"flash_attn_npu did not take this call: {missing}.")


# ---- npu-port run's summary, and nothing at import -----------------------------------------------------------------


def test_the_run_summary_says_which_computed_the_calls():
    q = _randn(1, 4, 2, 16)
    with fake.installed():
        activation = npu_port.activate("cpu")
        try:
            import flash_attn

            line = sys._getframe().f_lineno + 1
            flash_attn.flash_attn_func(q, q, q)
            flash_attn.flash_attn_func(q.float(), q.float(), q.float())
            summary = activation.summary()
            text = activation.format_summary()
        finally:
            activation.deactivate()
    dtype = "flash_attn_npu takes float16 or bfloat16, one dtype for q, k and v; got float32, float32, float32"
    assert summary["flash_attn_npu"] == {
        "flash_attn_npu": {"flash_attn_func": {"count": 1, "where": [f"{__file__}:{line}"]}},
        "emulation": {"dtype": {"count": 1, "reason": dtype, "where": [f"{__file__}:{line + 1}"]}},
    }
    assert (
        "\n  flash_attn drop-in calls: 1 by flash_attn_npu, 1 by npu-port's emulation\n"
        f"    emulated, dtype x1: {dtype}\n"
    ) in text
    assert summary["by_rule"]["NPU110"]["count"] == 2  # both calls were handled by the drop-in


def test_a_run_off_the_npu_counts_its_calls_in_the_report_only():
    q = _randn(1, 4, 2, 16)
    activation = npu_port.activate("cpu")
    try:
        import flash_attn

        flash_attn.flash_attn_func(q, q, q)
        summary, text = activation.summary(), activation.format_summary()
    finally:
        activation.deactivate()
    assert summary["flash_attn_npu"]["flash_attn_npu"] == {}
    assert summary["flash_attn_npu"]["emulation"]["device"]["count"] == 1
    assert "flash_attn drop-in calls" not in text  # on a CPU the emulation is the only choice: nothing to say


@pytest.mark.e2e
@pytest.mark.slow
def test_importing_npu_port_and_calling_the_drop_in_on_cpu_never_imports_the_package(tmp_path):
    package = tmp_path / "site" / "flash_attn_npu"
    package.mkdir(parents=True)
    marker = tmp_path / "imported"
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise RuntimeError('imported')\n")
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path / "site")!r})
        import torch
        import npu_port
        from npu_port.dropins.install import install_dropins
        install_dropins()
        import flash_attn
        q = torch.randn(1, 4, 2, 16, dtype=torch.float16)
        assert flash_attn.flash_attn_func(q, q, q, causal=True).shape == q.shape
        assert "flash_attn_npu" not in sys.modules and "torch_npu" not in sys.modules
        from npu_port.dropins.flash_attn_npu import ROUTES
        print(sorted(ROUTES.reasons))
        """
    )
    ran = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == "['device']\n" and not marker.exists()
