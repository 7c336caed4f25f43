"""``npu_port.fuse_ops``: what it refuses and how it says so, the first-call check, per-call fallbacks, and restore.

The tensors are on the CPU; the torch_npu emulator computes the documented ops (tests/emulators/), and the fuse
package's device rule is widened to CPU tensors where a test runs the fused form (the ``npu`` fixture)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import re
import sys
import warnings

import pytest
import torch
from diffusers.models import embeddings
from diffusers.models.activations import GEGLU
from diffusers.models.normalization import AdaLayerNormZero, RMSNorm
from diffusers.models.transformers import transformer_flux
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import npu_port
from npu_port.errors import FuseCheckError, FuseError
from npu_port.fuse import backend
from npu_port.fuse.check import RTOL, FuseWarning, compare
from npu_port.fuse.plan import Refusal
from npu_port.reasons import Reason

from ..emulators import torch_npu_fused_ops as emu
from ..fakes import mindiesd_fake

VALID = "rms_norm, rope, geglu_exact, geglu_tanh, adaln"
NO_TORCH_NPU = (
    "torch_npu is not installed; install it on an Ascend machine with CANN: pip install torch-npu "
    "(torch-npu must match your torch version: the same major.minor)"
)


class Norms(nn.Module):
    """One diffusers RMSNorm, one torch RMSNorm, one of each without weight."""

    def __init__(self):
        super().__init__()
        self.diffusers_norm = RMSNorm(16, eps=1e-6)
        self.torch_norm = nn.RMSNorm(16, eps=1e-6)
        self.bare_diffusers = RMSNorm(16, eps=1e-6, elementwise_affine=False)
        self.bare_torch = nn.RMSNorm(16, elementwise_affine=False)
        with torch.no_grad():
            for norm in (self.diffusers_norm, self.torch_norm):
                norm.weight.copy_(torch.linspace(0.5, 1.5, 16))

    def forward(self, x):
        return self.bare_torch(self.bare_diffusers(self.torch_norm(self.diffusers_norm(x))))


def _x(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _forward_is_the_class_one(module):
    return "forward" not in vars(module) and module.forward.__func__ is type(module).forward


# ---------------------------------------------------------------------------------------------------------------
# bad requests: one clear error, nothing touched


@pytest.mark.parametrize(
    "ops, message",
    [
        (["rms_norm", "flash"], f"unknown fused op 'flash'; valid ops: {VALID}"),
        (["rmsnorm", "RoPE"], f"unknown fused ops 'rmsnorm', 'RoPE'; valid ops: {VALID}"),
        ("rms_norm", f"ops must be a list of op names ({VALID}); got 'rms_norm'"),
        ([], f"ops must name at least one op; valid ops: {VALID}"),
        (
            ["geglu_exact", "geglu_tanh"],
            "geglu_exact and geglu_tanh exclude each other (exact erf GELU, or the tanh approximation); pick one",
        ),
    ],
)
def test_bad_op_lists_are_one_clear_error_before_the_model_is_touched(npu, ops, message):
    model = Norms()
    with pytest.raises(FuseError) as caught:
        npu_port.fuse_ops(model, ops=ops)
    assert str(caught.value) == message
    assert all(_forward_is_the_class_one(m) for m in model.modules())


def test_a_target_that_is_no_model_is_refused(npu):
    with pytest.raises(FuseError) as caught:
        npu_port.fuse_ops("my-model", ops=["rms_norm"])
    assert str(caught.value) == "fuse_ops expects a torch.nn.Module or a diffusers pipeline; got builtins.str"


# ---------------------------------------------------------------------------------------------------------------
# what this machine lacks: refused with the reason, never skipped silently


def test_without_torch_npu_the_ops_that_need_it_are_refused_and_warned(no_torch_npu):
    model = Norms()
    with pytest.warns(FuseWarning) as warned:
        handle = npu_port.fuse_ops(model, ops=["rms_norm", "geglu_tanh"])
    assert str(warned[0].message) == (
        f"npu-port fuse_ops: not fused (handle.explain() has the rest):\n  - rms_norm: {NO_TORCH_NPU}"
    )  # geglu_tanh: no GEGLU in this model, a note, not a refusal
    assert handle.refused == [Refusal("rms_norm", "", Reason("package-missing", NO_TORCH_NPU), scope="op")]
    assert handle.refused[0].reason.code == "package-missing"
    assert handle.sites == [] and handle.counts() == {"rms_norm": 0, "geglu_tanh": 0}
    assert "geglu_tanh: no diffusers GEGLU in this model" in handle.notes
    assert all(_forward_is_the_class_one(m) for m in model.modules())
    handle.restore()


def test_strict_makes_a_refused_op_an_error_before_anything_is_patched(no_torch_npu):
    model = Norms()
    with pytest.raises(FuseError) as caught:
        npu_port.fuse_ops(model, ops=["rms_norm"], strict=True)
    assert str(caught.value) == f"fuse_ops refused (strict=True; nothing was changed):\n  - rms_norm: {NO_TORCH_NPU}"


def test_adaln_without_mindiesd_is_refused_with_how_to_get_it(npu, monkeypatch):
    monkeypatch.delitem(sys.modules, "mindiesd", raising=False)
    with pytest.warns(FuseWarning):
        handle = npu_port.fuse_ops(AdaLayerNormZero(16), ops=["adaln"])
    ((refusal,),) = [handle.refused]
    assert refusal.scope == "op" and refusal.reason.code == "package-missing"
    assert str(refusal.reason) == (
        "mindiesd (MindIE-SD) is not installed; adaln needs it: install MindIE-SD on an Ascend machine with CANN "
        "(pip install mindiesd), matching your CANN and torch_npu"
    )
    handle.restore()


class FakeMindieFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``import mindiesd`` from the fake, and records whether it was imported."""

    def __init__(self):
        self.imported = 0

    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name == "mindiesd" else None

    def create_module(self, spec):
        self.imported += 1
        return mindiesd_fake.build_module()

    def exec_module(self, module):
        pass


@pytest.fixture
def installed_mindiesd(monkeypatch):
    """mindiesd installed but not imported yet."""
    monkeypatch.delitem(sys.modules, "mindiesd", raising=False)
    finder = FakeMindieFinder()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    yield finder
    sys.modules.pop("mindiesd", None)


def test_mindiesd_is_imported_first_when_torch_npu_is_not_imported_yet(installed_mindiesd, no_torch_npu, monkeypatch):
    monkeypatch.setattr(backend, "DEVICE_TYPES", ("npu", "cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FuseWarning)
        handle = npu_port.fuse_ops(AdaLayerNormZero(16), ops=["adaln"])
    assert installed_mindiesd.imported == 1 and sys.modules["mindiesd"].NPU_PORT_FAKE
    assert "torch_npu" not in sys.modules  # adaln alone never probes (imports) torch_npu
    assert handle.counts() == {"adaln": 1}
    handle.restore()


def test_a_late_mindiesd_import_is_refused_as_an_import_order_problem_and_not_made(installed_mindiesd, npu):
    """torch_npu came first: importing mindiesd now would register its ops too late (EZ1001)."""
    with pytest.warns(FuseWarning, match="EZ1001"):
        handle = npu_port.fuse_ops(AdaLayerNormZero(16), ops=["adaln"])
    ((refusal,),) = [handle.refused]
    assert refusal.reason.code == "import-order" and str(refusal.reason) == backend.IMPORT_ORDER
    assert installed_mindiesd.imported == 0 and "mindiesd" not in sys.modules
    with pytest.raises(FuseError, match=re.escape("put `import mindiesd` first in your script")):
        npu_port.fuse_ops(AdaLayerNormZero(16), ops=["adaln"], strict=True)
    handle.restore()


# ---------------------------------------------------------------------------------------------------------------
# modules an op cannot take keep their forward, listed


def test_rms_norm_layers_without_weight_keep_their_forward_and_are_reported(npu):
    model = Norms()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FuseWarning)  # some sites were fused: reported, not warned
        handle = npu_port.fuse_ops(model, ops=["rms_norm"])
    assert [site.where for site in handle.sites] == ["diffusers_norm", "torch_norm"]
    assert [(r.where, r.reason.code) for r in handle.refused] == [
        ("bare_diffusers", "no-weight"),
        ("bare_torch", "no-weight"),
    ]
    assert _forward_is_the_class_one(model.bare_diffusers) and _forward_is_the_class_one(model.bare_torch)
    assert "forward" in vars(model.diffusers_norm) and "forward" in vars(model.torch_norm)
    handle.restore()


# ---------------------------------------------------------------------------------------------------------------
# restore: the very objects come back


def test_restore_puts_back_every_forward_and_function_global(npu, mindiesd):
    from npu_port.integrations.diffusers.tiny_flux import tiny_flux_transformer

    model = tiny_flux_transformer()
    shared, flux_global = embeddings.apply_rotary_emb, transformer_flux.apply_rotary_emb
    assert shared is flux_global
    before = {name: dict(vars(m)) for name, m in model.named_modules()}
    handle = npu_port.fuse_ops(model, ops=["rms_norm", "rope", "adaln"])
    assert handle.counts() == {"rms_norm": 6, "rope": 1, "adaln": 4}
    assert embeddings.apply_rotary_emb is not shared and transformer_flux.apply_rotary_emb is not shared
    handle.restore()
    assert embeddings.apply_rotary_emb is shared and transformer_flux.apply_rotary_emb is shared
    for name, module in model.named_modules():
        assert _forward_is_the_class_one(module), name
        assert vars(module).keys() == before[name].keys(), name
    handle.restore()  # idempotent
    assert "restored" in handle.explain()


def test_a_forward_someone_set_on_the_instance_comes_back_and_is_what_the_fused_form_stands_in_for(npu):
    norm = RMSNorm(16, eps=1e-6)
    calls = []

    def hooked(hidden_states):  # what accelerate's hooks do: an instance-level forward
        calls.append(1)
        return RMSNorm.forward(norm, hidden_states)

    norm.forward = hooked
    with npu_port.fuse_ops(norm, ops=["rms_norm"]):
        norm(_x(2, 16))  # the first call runs the reference: the instance forward
        assert calls == [1]
        assert vars(norm)["forward"] is not hooked
    assert vars(norm)["forward"] is hooked


def test_two_handles_share_the_rope_function_and_it_goes_back_with_the_last(npu):
    from npu_port.integrations.diffusers.tiny_flux import tiny_flux_transformer

    shared = embeddings.apply_rotary_emb
    first = npu_port.fuse_ops(tiny_flux_transformer(), ops=["rope"])
    second = npu_port.fuse_ops(tiny_flux_transformer(seed=1), ops=["rope"])
    assert first.sites[0] is second.sites[0]
    first.restore()
    assert embeddings.apply_rotary_emb is not shared  # still held by the second
    second.restore()
    assert embeddings.apply_rotary_emb is shared and transformer_flux.apply_rotary_emb is shared


def test_fusing_a_module_twice_is_refused_for_the_second_handle(npu):
    norm = RMSNorm(16, eps=1e-6)
    with npu_port.fuse_ops(norm, ops=["rms_norm"]) as first:
        with pytest.warns(FuseWarning):
            second = npu_port.fuse_ops(norm, ops=["rms_norm"])
        assert [r.reason.code for r in second.refused] == ["already-fused"]
        second.restore()
        assert first.sites[0].state == "installed" and "forward" in vars(norm)
    assert _forward_is_the_class_one(norm)


# ---------------------------------------------------------------------------------------------------------------
# the first-call check


def _ignores_gamma(x, gamma, epsilon=1e-6):
    """A deliberately wrong op: normalises but forgets gamma."""
    return emu.npu_rms_norm(x, torch.ones_like(gamma), epsilon)


def test_a_wrong_op_is_refused_on_its_first_call_and_the_original_put_back(npu, monkeypatch):
    monkeypatch.setattr(npu, "npu_rms_norm", _ignores_gamma)
    norm = Norms().diffusers_norm
    x = _x(3, 16)
    expected = RMSNorm.forward(norm, x)
    handle = npu_port.fuse_ops(norm, ops=["rms_norm"])
    with pytest.warns(FuseWarning, match="rms_norm at RMSNorm refused, the original is back") as warned:
        out = norm(x)
    assert torch.equal(out, expected)  # the first call returns the original's result
    (site,) = handle.sites
    assert site.state == "refused" and site.reason.code == "check-mismatch"
    assert str(site.reason).startswith("first-call check failed: differs from the original by up to 0.956 in float32")
    assert "in float32 (allowed: 1e-05 x (|original| +" in str(warned[0].message)
    assert _forward_is_the_class_one(norm)  # put back at once, not at restore
    assert [(r.scope, r.reason.code) for r in handle.refused] == [("check", "check-mismatch")]
    assert torch.equal(norm(x), expected)
    handle.restore()
    assert _forward_is_the_class_one(norm)


def test_strict_raises_on_a_failed_check_after_putting_the_original_back(npu, monkeypatch):
    monkeypatch.setattr(npu, "npu_rms_norm", _ignores_gamma)
    norm = Norms().torch_norm
    handle = npu_port.fuse_ops(norm, ops=["rms_norm"], strict=True)
    with pytest.raises(FuseCheckError, match="rms_norm at RMSNorm refused, the original is back: first-call"):
        norm(_x(3, 16))
    assert _forward_is_the_class_one(norm)
    handle.restore()


def test_an_op_that_raises_on_its_first_call_is_refused_with_what_it_raised(npu, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("EZ1001: opType RmsNorm is not supported\nsecond line")

    monkeypatch.setattr(npu, "npu_rms_norm", broken)
    norm = Norms().diffusers_norm
    handle = npu_port.fuse_ops(norm, ops=["rms_norm"])
    with pytest.warns(FuseWarning):
        norm(_x(2, 16))
    (site,) = handle.sites
    assert site.reason.code == "check-error"
    assert str(site.reason) == (
        "first-call check failed: the fused op raised RuntimeError: EZ1001: opType RmsNorm is not supported"
    )
    handle.restore()


def test_nan_is_never_within_tolerance(npu, monkeypatch):
    monkeypatch.setattr(npu, "npu_rms_norm", lambda x, g, epsilon=1e-6: (torch.full_like(x, float("nan")), None))
    norm = Norms().torch_norm
    handle = npu_port.fuse_ops(norm, ops=["rms_norm"])
    with pytest.warns(FuseWarning):
        norm(_x(2, 16))
    assert str(handle.sites[0].reason) == (
        "first-call check failed: NaN in the fused result (NaN is never within tolerance)"
    )
    handle.restore()


def test_a_refused_geglu_keeps_the_gelu_asked_for_through_torch(npu, monkeypatch):
    """Putting diffusers' forward back would switch GELU silently: geglu_* keep their torch path instead."""
    from diffusers.models import activations

    monkeypatch.setattr(activations, "is_torch_npu_available", lambda: True)  # diffusers' NPU branch, as on an NPU
    monkeypatch.setattr(activations, "torch_npu", npu, raising=False)
    monkeypatch.setattr(npu, "npu_geglu", lambda x, dim=-1, approximate=1: emu.npu_geglu(x, dim, 1))  # always tanh
    geglu = GEGLU(8, 16)
    x = _x(2, 4, 8, seed=3) * 3
    handle = npu_port.fuse_ops(geglu, ops=["geglu_exact"])
    with pytest.warns(FuseWarning, match="geglu_exact at GEGLU refused, the torch path stays"):
        first = geglu(x)
    value, gate = geglu.proj(x).chunk(2, dim=-1)
    exact = value * torch.nn.functional.gelu(gate)
    assert torch.equal(first, exact) and torch.equal(geglu(x), exact)
    assert "forward" in vars(geglu)  # still ours, computing exact GELU
    handle.restore()
    assert _forward_is_the_class_one(geglu)


# ---------------------------------------------------------------------------------------------------------------
# calls the op's limits rule out run the original, counted with the reason


def test_calls_outside_the_ops_limits_run_the_original_and_are_counted(npu, monkeypatch):
    norm = Norms().diffusers_norm
    with npu_port.fuse_ops(norm, ops=["rms_norm"]) as handle:
        x64 = _x(2, 16).double()
        assert torch.equal(norm(x64), RMSNorm.forward(norm, x64))
        monkeypatch.setattr(backend, "DEVICE_TYPES", ("npu",))
        x = _x(2, 16)
        assert torch.equal(norm(x), RMSNorm.forward(norm, x))
        (site,) = handle.sites
        assert site.state == "installed" and site.fused_calls == 0
        assert dict(site.fallbacks) == {
            "input dtype float64: the op takes float16, bfloat16 or float32": 1,
            "tensor on cpu: the fused op takes npu tensors": 1,
        }
        assert "calls: 0 fused, 1 original (input dtype float64" in handle.explain()


# ---------------------------------------------------------------------------------------------------------------
# the tolerance


def test_compare_uses_a_relative_tolerance_scaled_by_the_tensors_magnitude():
    ref = torch.tensor([1.0, -2.0, 0.0, 4.0])
    allowed = RTOL[torch.float32] * (0.0 + 4.0)  # at the zero element: rtol * max |ref|
    assert compare(ref + torch.tensor([0, 0, 0.99 * allowed, 0]), ref)[0] is None
    problem, error = compare(ref + torch.tensor([0, 0, 1.01 * allowed, 0]), ref)
    assert problem.startswith("differs from the original by up to 4.04e-05 in float32") and error > allowed
    assert RTOL[torch.bfloat16] == 4 * 2.0**-7 and RTOL[torch.float16] == 4 * 2.0**-10


@pytest.mark.parametrize(
    "got, ref, problem",
    [
        (torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]), "NaN in the fused result"),
        (torch.tensor([1.0, 2.0]), torch.tensor([1.0, float("nan")]), "NaN in the original's result"),
        (
            torch.tensor([1.0, float("inf")]),
            torch.tensor([1.0, float("-inf")]),
            "infinities differ from the original's",
        ),
        (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]).double(), "dtype float32 where the original gives float64"),
        ((torch.ones(2), torch.ones(2)), (torch.ones(2),), "returned 2 values where the original returns 1"),
        ((torch.ones(2), torch.ones(3)), (torch.ones(2), torch.ones(2)), "shape (3,) where the original gives (2,)"),
    ],
)
def test_compare_states_the_problem(got, ref, problem):
    assert compare(got, ref)[0].startswith(problem)


def test_compare_accepts_matching_infinities():
    assert compare(torch.tensor([1.0, float("inf")]), torch.tensor([1.0, float("inf")]))[0] is None


@settings(max_examples=40)
@given(
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    size=st.integers(1, 50),
    seed=st.integers(0, 10_000),
    fraction=st.floats(0.0, 0.9),
)
def test_perturbations_inside_the_tolerance_pass_and_twice_outside_fail(dtype, size, seed, fraction):
    ref64 = torch.randn(size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.1
    ref = ref64.to(dtype)
    magnitude = ref.double().abs()
    bound = RTOL[dtype] * (magnitude + magnitude.max())
    inside = (ref.double() + fraction * bound).to(dtype)
    assert compare(inside, ref)[0] is None  # rounding to dtype moves it half an ulp: inside the last tenth
    outside = (ref.double() + 3 * bound).to(dtype)
    assert compare(outside, ref)[0] is not None


# ---------------------------------------------------------------------------------------------------------------
# Wan's RoPE: placed through its attention module, only while the processor is Wan's own


def _wan_attention():
    from diffusers.models.transformers.transformer_wan import WanAttention, WanAttnProcessor

    torch.manual_seed(0)
    attn = WanAttention(dim=32, heads=2, dim_head=16, processor=WanAttnProcessor())
    angles = torch.arange(6.0)[:, None] * torch.linspace(0.1, 1.0, 8)
    tables = tuple(t.repeat_interleave(2, -1).view(1, 6, 1, 16) for t in (angles.cos(), angles.sin()))
    return attn, _x(1, 6, 32), tables


def test_wan_rope_runs_the_original_once_the_processor_is_not_wans_own(npu):
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    class MyProcessor(WanAttnProcessor):
        pass

    attn, hidden, tables = _wan_attention()
    with npu_port.fuse_ops(attn, ops=["rope"]) as handle:
        attn.set_processor(MyProcessor())
        expected = MyProcessor()(attn, hidden, None, None, tables)
        assert torch.equal(attn(hidden, None, None, tables), expected)
        assert dict(handle.sites[0].fallbacks) == {"processor is MyProcessor, not Wan's own: its RoPE is not known": 1}


def test_wan_rope_refuses_itself_if_the_processor_stops_normalising_q_and_k_once_each(npu, monkeypatch):
    """Where the rotation is placed depends on Wan's processor calling norm_q and norm_k once: if a diffusers
    release changes that, the first-call check catches it and the original stays."""
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    call = WanAttnProcessor.__call__

    def normalises_q_twice(self, attn, hidden_states, *args, **kwargs):
        attn.norm_q(attn.to_q(hidden_states))
        return call(self, attn, hidden_states, *args, **kwargs)

    monkeypatch.setattr(WanAttnProcessor, "__call__", normalises_q_twice)
    attn, hidden, tables = _wan_attention()
    handle = npu_port.fuse_ops(attn, ops=["rope"])
    with pytest.warns(FuseWarning):
        attn(hidden, None, None, tables)
    (site,) = handle.sites
    assert site.reason.code == "check-error"
    assert str(site.reason) == (
        "first-call check failed: the fused op raised RuntimeError: npu-port rope at WanAttention: expected norm_q "
        "and norm_k to run once each, saw 3 norm calls; Wan's processor changed — fuse_ops cannot place the rotation"
    )
    assert _forward_is_the_class_one(attn)
    handle.restore()


def test_a_deep_copy_of_a_fused_module_is_the_original_on_its_own_weights(npu):
    import copy

    norm = Norms().diffusers_norm
    with npu_port.fuse_ops(norm, ops=["rms_norm"]):
        clone = copy.deepcopy(norm)
    with torch.no_grad():
        clone.weight.mul_(2)
    x = _x(2, 16)
    assert vars(clone)["forward"].__self__ is clone and vars(clone)["forward"].__func__ is RMSNorm.forward
    assert torch.equal(clone(x), RMSNorm.forward(clone, x))
    assert not torch.equal(clone(x), norm(x))
