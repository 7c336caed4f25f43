"""npu_port._patching, the one patching mechanism, and every feature that patches through it.

The promises: the owner's own entry comes back exactly (inherited and absent names are deleted again); users share one
counted patch; a release under a later foreign patch leaves the foreign one in place and says so; our own patches may be
released in any order and still end exact; nothing is remembered once nothing is active.
"""

from __future__ import annotations

import threading
import types
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_port
from npu_port import _patching
from npu_port._patching import PatchLeftInPlace


class Base:
    def method(self):
        return "base"


class Child(Base):
    def own(self):
        return "own"


ORIGINAL_OWN = vars(Child)["own"]


@pytest.fixture(autouse=True)
def nothing_left_behind():
    before = _patching.active()
    yield
    assert _patching.active() == before
    assert vars(Child)["own"] is ORIGINAL_OWN and "method" not in vars(Child) and "absent" not in vars(Child)


def test_an_own_attribute_comes_back_as_the_identical_object():
    patch = _patching.replace(Child, "own", lambda self: "ours", key="t")
    assert Child().own() == "ours" and patch.live
    assert _patching.release(patch) is True
    assert vars(Child)["own"] is ORIGINAL_OWN


def test_an_inherited_attribute_is_deleted_again_so_the_base_resolves_as_before():
    patch = _patching.replace(Child, "method", lambda self: "ours")
    assert Child().method() == "ours"
    _patching.release(patch)
    assert "method" not in vars(Child) and Child().method() == "base"


def test_an_absent_attribute_is_deleted_again():
    patch = _patching.replace(Child, "absent", 1)
    assert Child.absent == 1
    _patching.release(patch)
    assert not hasattr(Child, "absent")


def test_a_module_global_comes_back():
    module = types.ModuleType("fake_module")
    module.value = original = object()
    patch = _patching.replace(module, "value", "ours")
    _patching.release(patch)
    assert module.value is original


def test_users_share_one_patch_and_the_last_release_undoes_it():
    made = []

    def make(current):
        made.append(current)
        return lambda self: "ours"

    first = _patching.acquire(Child, "own", make, key="shared")
    second = _patching.acquire(Child, "own", make, key="shared")
    assert first is second and first.users == 2 and made == [ORIGINAL_OWN]
    _patching.release(first)
    assert Child().own() == "ours"  # one user still holds it
    _patching.release(second)
    assert vars(Child)["own"] is ORIGINAL_OWN
    assert _patching.find(Child, "own", "shared") is None  # forgotten: nothing kept once nothing is active


def test_make_returning_none_patches_nothing():
    assert _patching.acquire(Child, "own", lambda current: None, key="none") is None
    assert vars(Child)["own"] is ORIGINAL_OWN and _patching.active(lambda k: k == "none") == []


def test_a_foreign_patch_made_after_ours_stays_and_we_say_so():
    patch = _patching.replace(Child, "own", lambda self: "ours", key="t")

    def theirs(self):
        return "theirs"

    Child.own = theirs
    try:
        with pytest.warns(
            PatchLeftInPlace, match=r"tests\.core\.test_patching\.Child\.own was replaced by someone else"
        ):
            assert _patching.release(patch) is False
        assert vars(Child)["own"] is theirs
        assert _patching.active() == []  # ours is forgotten all the same
    finally:
        Child.own = ORIGINAL_OWN


def test_acquire_does_not_join_or_rewrap_a_patch_someone_replaced():
    patch = _patching.acquire(Child, "own", lambda current: lambda self: "ours", key="k")
    Child.own = theirs = lambda self: "theirs"
    try:
        assert _patching.acquire(Child, "own", lambda current: lambda self: "again", key="k") is None
        assert vars(Child)["own"] is theirs and patch.users == 1
        with pytest.warns(PatchLeftInPlace):
            _patching.release(patch)
    finally:
        Child.own = ORIGINAL_OWN


def _returning(value):
    return lambda self: value


@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, 4), data=st.data())
def test_our_patches_released_in_any_order_end_exact(depth, data):
    patches = [_patching.replace(Child, "own", _returning(i), key=("t", i)) for i in range(depth)]
    order = data.draw(st.permutations(range(depth)))
    alive = set(range(depth))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of ours is "foreign": no warning may be raised
        for index in order:
            _patching.release(patches[index])
            alive.discard(index)
            expected = max(alive) if alive else None
            assert Child().own() == (expected if alive else "own")
    assert vars(Child)["own"] is ORIGINAL_OWN


def test_release_twice_is_harmless():
    patch = _patching.replace(Child, "own", lambda self: "ours")
    assert _patching.release(patch) and _patching.release(patch)
    assert vars(Child)["own"] is ORIGINAL_OWN


def test_one_lock_keeps_concurrent_users_counted():
    def make(current):
        return lambda self: "ours"

    held = []

    def take():
        for _ in range(200):
            held.append(_patching.acquire(Child, "own", make, key="threads"))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(p) for p in held}) == 1 and held[0].users == 800
    for patch in held:
        _patching.release(patch)
    assert vars(Child)["own"] is ORIGINAL_OWN


# ---- every mechanism, under a later foreign patch ----------------------------------------------------------------


def test_the_cuda_redirect_leaves_a_later_foreign_patch_in_place():

    original = torch.cuda.is_available
    redirect = npu_port.redirect_cuda("cpu").install()
    ours = torch.cuda.is_available

    def theirs():
        return False

    torch.cuda.is_available = theirs
    try:
        with pytest.warns(PatchLeftInPlace, match=r"torch\.cuda\.is_available was replaced"):
            redirect.uninstall()
        assert torch.cuda.is_available is theirs  # before, the ledger overwrote it with the original
        assert ours is not original
    finally:
        torch.cuda.is_available = original
    assert torch.cuda.Stream.__module__.startswith("torch")  # the rest came back
    assert torch.Tensor.cuda is torch._C.TensorBase.cuda


def test_a_redirect_uninstalled_under_safe_math_stops_redirecting_and_both_end_exact():
    from npu_port.fallbacks.safe_math import force_safe_math

    autocast = torch.amp.autocast_mode.autocast
    original = vars(autocast)["__init__"]
    redirect = npu_port.redirect_cuda("cpu").install()
    handle = force_safe_math()  # wraps the redirect's autocast.__init__
    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchLeftInPlace)
        redirect.uninstall()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("ignore")
            context = torch.autocast("cuda")
        assert context.device == "cuda"  # no longer redirected to the CPU, though safe math still calls our wrapper
        handle.restore()
    assert vars(autocast)["__init__"] is original and _patching.active() == []


def test_safe_math_leaves_a_later_foreign_autocast_init_in_place():
    from npu_port.fallbacks.safe_math import force_safe_math

    autocast = torch.amp.autocast_mode.autocast
    original = vars(autocast)["__init__"]
    handle = force_safe_math()

    def theirs(self, *args, **kwargs):
        original(self, *args, **kwargs)

    autocast.__init__ = theirs
    try:
        with pytest.warns(PatchLeftInPlace, match=r"autocast\.__init__ was replaced"):
            handle.restore()
        assert vars(autocast)["__init__"] is theirs
    finally:
        autocast.__init__ = original


def test_the_set_processor_watch_leaves_a_later_foreign_wrapper_in_place():
    from diffusers.models.attention_processor import Attention

    from npu_port.integrations.diffusers import watch

    module = Attention(query_dim=8, heads=1, dim_head=8)
    original = vars(Attention)["set_processor"]
    stop = watch.watch(module, lambda m: None)

    def theirs(self, processor):
        return original(self, processor)

    Attention.set_processor = theirs
    try:
        with pytest.warns(PatchLeftInPlace, match=r"Attention\.set_processor was replaced"):
            stop()
        assert vars(Attention)["set_processor"] is theirs and watch.wrapped_classes() == []
    finally:
        Attention.set_processor = original


def test_the_watch_patches_the_defining_class_of_an_inherited_set_processor():
    from diffusers.models.attention_processor import Attention

    from npu_port.integrations.diffusers import watch

    class MyAttention(Attention):  # inherits set_processor
        pass

    module = MyAttention(query_dim=8, heads=1, dim_head=8)
    original = vars(Attention)["set_processor"]
    stop = watch.watch(module, lambda m: None)
    assert "set_processor" not in vars(MyAttention) and vars(Attention)["set_processor"] is not original
    stop()
    assert vars(Attention)["set_processor"] is original and "set_processor" not in vars(MyAttention)


def test_legacy_patches_and_the_xformers_hook_leave_later_foreign_patches_in_place():
    from diffusers import ModelMixin

    from npu_port.integrations.legacy_attention import hook_enable_xformers, patch_legacy_attention

    from ..fixtures.legacy_attention import LegacyCrossAttention

    original = vars(LegacyCrossAttention)["_attention"]
    patch = patch_legacy_attention(LegacyCrossAttention)
    LegacyCrossAttention._attention = theirs = lambda self, *a, **k: original(self, *a, **k)
    try:
        with pytest.warns(PatchLeftInPlace, match=r"LegacyCrossAttention\._attention was replaced"):
            patch.restore()
        assert vars(LegacyCrossAttention)["_attention"] is theirs
    finally:
        LegacyCrossAttention._attention = original

    enable = vars(ModelMixin)["enable_xformers_memory_efficient_attention"]
    hook = hook_enable_xformers("sdpa")
    ModelMixin.enable_xformers_memory_efficient_attention = mine = lambda self, attention_op=None: None
    try:
        with pytest.warns(PatchLeftInPlace, match=r"ModelMixin\.enable_xformers_memory_efficient_attention"):
            hook.restore()
        assert vars(ModelMixin)["enable_xformers_memory_efficient_attention"] is mine
        for name in ("disable_xformers_memory_efficient_attention", "set_use_memory_efficient_attention_xformers"):
            assert not hasattr(getattr(ModelMixin, name), "__npu_port_original__")  # the others came back
    finally:
        ModelMixin.enable_xformers_memory_efficient_attention = enable


def test_diffusers_global_patches_leave_a_later_foreign_global_in_place():
    from npu_port.integrations.diffusers.patches import ROUTED_FUNCTIONAL, PatchLease, active_patches

    module = types.ModuleType("user_processors")
    exec(
        "import torch.nn.functional as F\ndef attend(q, k, v):\n    return F.scaled_dot_product_attention(q, k, v)\n",
        module.__dict__,
    )
    lease = PatchLease(None)
    lease.cover(module)
    assert module.F is ROUTED_FUNCTIONAL and ("user_processors", "F") in active_patches()
    module.F = theirs = types.ModuleType("their_functional")
    with pytest.warns(PatchLeftInPlace, match=r"user_processors\.F was replaced"):
        lease.release()
    assert module.F is theirs and active_patches() == []


MECHANISMS = (
    "npu_port/device/redirect/ledger.py",
    "npu_port/integrations/diffusers/watch.py",
    "npu_port/integrations/diffusers/patches.py",
    "npu_port/integrations/legacy_attention/patch.py",
    "npu_port/integrations/legacy_attention/xformers_hook.py",
    "npu_port/fallbacks/safe_math.py",
)


@pytest.mark.parametrize("path", MECHANISMS)
def test_every_mechanism_patches_through_the_one_module_under_its_lock(path):
    import pathlib

    text = (pathlib.Path(__file__).resolve().parents[2] / path).read_text()
    assert "_patching" in text
    assert "RLock" not in text and "threading.Lock" not in text
