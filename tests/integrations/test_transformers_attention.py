"""transformers models through npu-port's router: parity with transformers' own ``sdpa`` and ``eager`` (float64); the
interface entry put back exactly (counted, stacked, any order); configs never touched; a user's implementation
honoured (``eager`` and its attention weights, ``set_attn_implementation``); gradient checkpointing routed with the
same gradients; models built from an applied model's config and copies on transformers' own path; a pipeline's text
encoders routed and restored with its handle; and what cannot be routed declined, never raised."""

from __future__ import annotations

import copy
import itertools
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_port
from npu_port.attn.call import AttentionCall
from npu_port.attn.kernels.base import Kernel
from npu_port.errors import KernelUnavailableError
from npu_port.integrations import transformers_attention as ta
from npu_port.integrations.diffusers.routing import Route
from npu_port.reasons import Reason
from npu_port.strategy.spec import Strategy
from npu_port.upstream import UpstreamDeclinedWarning, forget_declines
from tests.infer.conftest import _module_cache, model_cache  # noqa: F401  (the tiny pipelines, built once)
from tests.versions import at_least

#: Every test here runs T5 / UMT5 through transformers' AttentionInterface (and its sdpa's position-bias mask), which
#: they use from transformers 5.15.0 on; the oldest lanes deselect the file (and it must import there to be read).
TRANSFORMERS_MIN = "5.15.0"
pytestmark = pytest.mark.transformers_min(TRANSFORMERS_MIN)
transformers = pytest.importorskip("transformers")

if at_least("transformers", TRANSFORMERS_MIN):
    from npu_port.integrations.diffusers.tiny_flux import tiny_t5_encoder
    from npu_port.integrations.diffusers.tiny_text2image import tiny_clip_text_encoder

ENCODERS = {
    "clip": lambda: tiny_clip_text_encoder(100, 99, 98),
    "t5": lambda: tiny_t5_encoder(100),
    "umt5": lambda: tiny_t5_encoder(100, umt5=True),
}


def _layers(model):
    config = model.config
    return getattr(config, "num_hidden_layers", None) or config.num_layers


def _entry():
    return transformers.AttentionInterface()["sdpa"]


def _inputs(seed=0, batch=3):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 98, (batch, 11), generator=gen)
    mask = torch.ones(batch, 11, dtype=torch.long)
    mask[1, 7:] = 0  # padding: the mask builder's mask reaches the router
    mask[2 % batch, 4:] = 0
    return ids, mask


def _encode(model, ids, mask, **kwargs):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, **kwargs)


@pytest.fixture(autouse=True)
def _fresh_declines():
    forget_declines()
    yield
    forget_declines()


@pytest.mark.parametrize("family, strategy", list(itertools.product(ENCODERS, ["vanilla", "sdpa", "chunked"])))
def test_encoders_match_transformers_own_sdpa_and_eager_in_float64(family, strategy):
    model = ENCODERS[family]().double().eval()
    ids, mask = _inputs()
    real = mask.bool()
    expected = {}
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        expected[implementation] = _encode(model, ids, mask).last_hidden_state
    original = _entry()
    with npu_port.attention_strategy(strategy, target=model) as handle:
        assert model.config._attn_implementation == "sdpa"  # the config is never changed
        assert _entry() is ta.routed_sdpa
        got = _encode(model, ids, mask).last_hidden_state
        assert handle.applied.calls == {"transformers": _layers(model)}
        assert sum(handle.calls.values()) == _layers(model)
    assert model.config._attn_implementation == "sdpa" and _entry() is original and ta.routed_modules() == 0
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected["sdpa"], rtol=0, atol=1e-12)
    # eager: on every real token (padded queries differ by design), to its float32 softmax's precision
    torch.testing.assert_close(got[real], expected["eager"][real], rtol=0, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 2),
    kv_heads=st.integers(1, 2),
    groups=st.sampled_from([1, 2]),
    q_len=st.integers(1, 5),
    extra_kv=st.integers(0, 3),
    mask_kind=st.sampled_from([None, "bool", "float"]),
    is_causal=st.booleans(),
    scale=st.sampled_from([None, 1.0, 0.3]),
    positional=st.integers(3, 6),  # scale and enable_gqa are keyword-only in torch
    seed=st.integers(0, 2**16),
)
def test_every_sdpa_argument_form_reaches_the_route_as_torch_would_read_it(
    batch, kv_heads, groups, q_len, extra_kv, mask_kind, is_causal, scale, positional, seed
):
    """Whatever mix of positional and keyword arguments transformers' code uses for SDPA, the route gets what torch
    would have computed with (float64, against torch's own SDPA)."""
    gen = torch.Generator().manual_seed(seed)
    heads, kv_len, dim = kv_heads * groups, q_len + extra_kv, 4
    query = torch.randn(batch, heads, q_len, dim, generator=gen, dtype=torch.float64)
    key = torch.randn(batch, kv_heads, kv_len, dim, generator=gen, dtype=torch.float64)
    value = torch.randn(batch, kv_heads, kv_len, dim, generator=gen, dtype=torch.float64)
    mask = None
    if mask_kind is not None and not is_causal:
        keep = torch.rand(batch, 1, q_len, kv_len, generator=gen) > 0.3
        keep[..., 0] = True  # every query keeps a key: no fully masked row
        mask = keep if mask_kind == "bool" else torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, -1e9)
    values = [query, key, value, mask, 0.0, is_causal, scale, groups > 1]
    names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    args, kwargs = values[:positional], dict(zip(names[positional:], values[positional:]))
    expected = torch.nn.functional.scaled_dot_product_attention(*args, **kwargs)
    route = Route(npu_port.attention)
    with ta.SdpaToRoute(route) as mode:
        got = torch.nn.functional.scaled_dot_product_attention(*args, **kwargs)
    assert mode.routed == 1 and route.tally.calls == {"transformers": 1}
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_registration_is_counted_and_puts_back_the_entry_that_was_there():
    model_a, model_b = ENCODERS["t5"](), ENCODERS["t5"]()
    original = _entry()
    first = npu_port.set_attention_strategy("sdpa", target=model_a)
    second = npu_port.set_attention_strategy("sdpa", target=model_b)
    assert _entry() is ta.routed_sdpa and ta.routed_sdpa.original is original
    first.restore()
    assert ta.registered() and _entry() is ta.routed_sdpa
    second.restore()
    second.restore()  # idempotent: not counted twice
    assert not ta.registered() and _entry() is original and ta.routed_modules() == 0


def test_an_entry_someone_registered_since_is_left_in_place_and_still_works():
    model = ENCODERS["clip"]().eval()
    ids, mask = _inputs()
    original = _entry()
    expected = _encode(model, ids, mask).last_hidden_state
    handle = npu_port.set_attention_strategy("sdpa", target=model)
    seen = []

    def theirs(module, *args, **kwargs):  # wraps whatever was there when it was registered: ours
        seen.append(type(module).__name__)
        return ta.routed_sdpa(module, *args, **kwargs)

    transformers.AttentionInterface.register("sdpa", theirs)
    try:
        handle.restore()
        assert _entry() is theirs  # not ours to remove
        got = _encode(model, ids, mask).last_hidden_state  # ours, reached through theirs, runs the original
        assert seen == ["CLIPAttention"] * _layers(model) and not handle.calls
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    finally:
        transformers.AttentionInterface.register("sdpa", original)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_stacked_applications_route_the_innermost_and_undo_in_any_order(order):
    model = ENCODERS["clip"]()
    ids, mask = _inputs()
    handles = [npu_port.set_attention_strategy(s, target=model) for s in ("sdpa", "vanilla")]
    _encode(model, ids, mask)
    assert handles[1].calls and not handles[0].calls  # the innermost application routes
    handles[order[0]].restore()
    _encode(model, ids, mask)  # the remaining application routes now
    assert sum(handles[order[1]].calls.values()) == _layers(model) * (2 if order[1] == 1 else 1)
    handles[order[1]].restore()
    assert model.config._attn_implementation == "sdpa" and ta.routed_modules() == 0 and not ta.registered()


def test_a_users_eager_is_honoured_with_its_attention_weights_and_reported():
    model = ENCODERS["clip"]().eval()
    model.set_attn_implementation("eager")
    ids, mask = _inputs()
    expected = _encode(model, ids, mask, output_attentions=True)
    with npu_port.attention_strategy("sdpa", target=model) as handle:
        got = _encode(model, ids, mask, output_attentions=True)
        assert model.config._attn_implementation == "eager" and not handle.calls
        assert len(got.attentions) == _layers(model)
        explanation = handle.explain()
        state = handle.report()["text_models"][0]
    assert (
        "CLIPTextModel, attention implementation eager (not routed: attention implementation 'eager' kept as set "
        "(npu-port routes 'sdpa'; model.set_attn_implementation('sdpa') routes it))"
    ) in explanation
    assert state["routed"] is False and state["now"] == "eager"
    for a, b in zip(got.attentions, expected.attentions):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state, rtol=0, atol=0)


def test_set_attn_implementation_while_applied_is_honoured_both_ways():
    model = ENCODERS["t5"]().eval()
    ids, mask = _inputs()
    with npu_port.attention_strategy("sdpa", target=model) as handle:
        model.set_attn_implementation("eager")
        _encode(model, ids, mask)
        assert not handle.calls and model.config._attn_implementation == "eager"
        model.set_attn_implementation("sdpa")
        _encode(model, ids, mask)
        assert handle.calls == {"sdpa": _layers(model)}
        assert handle.report()["text_models"][0]["routed"] is True


@pytest.mark.parametrize("family", list(ENCODERS))
def test_a_model_built_from_an_applied_models_config_runs_on_transformers_path(family):
    model = ENCODERS[family]().eval()
    ids, mask = _inputs()
    with npu_port.attention_strategy("sdpa", target=model) as handle:
        twin = type(model)(model.config).eval()
        twin.load_state_dict(model.state_dict())
        got = _encode(twin, ids, mask).last_hidden_state
        assert not handle.calls  # not the model the strategy was applied to
        routed = _encode(model, ids, mask).last_hidden_state
        assert handle.calls == {"sdpa": _layers(model)}
    torch.testing.assert_close(got, routed, rtol=1e-6, atol=1e-6)


def test_a_copy_made_while_routed_runs_on_transformers_path():
    model = ENCODERS["clip"]().eval()
    ids, mask = _inputs()
    with npu_port.attention_strategy("sdpa", target=model) as handle:
        twin = copy.deepcopy(model)
        got = _encode(twin, ids, mask).last_hidden_state
        assert not handle.calls
    torch.testing.assert_close(got, _encode(model, ids, mask).last_hidden_state, rtol=1e-6, atol=1e-6)


def _train_step(model, ids, mask, checkpointing):
    model.zero_grad(set_to_none=True)
    # transformers 5.x renamed the switches (the old names warn); the newest that this version has
    if checkpointing and hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
    model.train()
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    (out.float() ** 2).mean().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["clip", "t5"])
@pytest.mark.parametrize("strategy", ["sdpa", "vanilla", "auto"])
def test_gradient_checkpointing_routes_the_recompute_with_the_same_gradients(family, strategy):
    model = ENCODERS[family]().double()
    for module in model.modules():  # no dropout (T5's attention keeps its rate as a float), so runs compare
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        elif isinstance(getattr(module, "dropout", None), float):
            module.dropout = 0.0
    ids, mask = _inputs()
    expected = _train_step(model, ids, mask, checkpointing=False)
    with npu_port.attention_strategy(strategy, target=model, cache=False) as handle:
        plain = _train_step(model, ids, mask, checkpointing=False)
        routed_plain = sum(handle.calls.values())
        checkpointed = _train_step(model, ids, mask, checkpointing=True)
        routed = sum(handle.calls.values()) - routed_plain
    assert routed_plain == _layers(model) and routed == 2 * _layers(model)  # the forward, then the recompute
    assert expected.keys() == plain.keys() == checkpointed.keys() and expected
    for name in expected:
        torch.testing.assert_close(plain[name], expected[name], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["clip", "t5"])
def test_a_fullgraph_compile_of_a_routed_encoder_traces_transformers_own_sdpa(family):
    """torch.compile cannot trace the router (Python): under a compile the entry is transformers' own sdpa, so a
    ``fullgraph=True`` compile (transformers' generate compiles so with a static cache) runs and gives the eager
    output; eager calls around it are still routed."""
    model = ENCODERS[family]().eval()
    ids, mask = _inputs()
    with torch.no_grad():
        expected = _encode(model, ids, mask).last_hidden_state
        with npu_port.attention_strategy("sdpa", target=model) as handle:
            torch._dynamo.reset()
            compiled = torch.compile(model, backend="eager", fullgraph=True)
            got = compiled(input_ids=ids, attention_mask=mask).last_hidden_state
            compiled_calls = sum(handle.calls.values())
            eager = _encode(model, ids, mask).last_hidden_state
            eager_calls = sum(handle.calls.values()) - compiled_calls
        torch._dynamo.reset()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(eager, expected, rtol=1e-5, atol=1e-6)
    assert compiled_calls == 0 and eager_calls == _layers(model)


@pytest.mark.usefixtures("model_cache")
def test_a_pipelines_text_encoders_are_routed_and_restored_with_the_handle():
    from npu_port.infer.models import load_pipeline

    pipe = load_pipeline("tiny-flux", torch.device("cpu"), torch.float32, progress_bar=False).pipe
    encoders = {"text_encoder": pipe.text_encoder, "text_encoder_2": pipe.text_encoder_2}
    before = {name: model.config._attn_implementation for name, model in encoders.items()}
    processors = dict(pipe.transformer.attn_processors)
    original = _entry()
    with npu_port.attention_strategy("sdpa", target=pipe) as handle:
        assert {name: m.config._attn_implementation for name, m in encoders.items()} == before
        pipe.encode_prompt("a cat", prompt_2="a cat", device=torch.device("cpu"))
        by_module = handle.applied.calls_by_module
        assert by_module["text_encoder"] == _layers(pipe.text_encoder)
        assert by_module["text_encoder_2"] == _layers(pipe.text_encoder_2)
        explanation = handle.explain()
        assert "text_encoder: CLIPTextModel, attention implementation sdpa (routed)" in explanation
        assert "text_encoder_2: T5EncoderModel, attention implementation sdpa (routed)" in explanation
    assert {name: model.config._attn_implementation for name, model in encoders.items()} == before
    assert pipe.transformer.attn_processors == processors and _entry() is original and ta.routed_modules() == 0


class _NoBias(Kernel):
    """Runs every call without a float bias (as the Ascend kernels without pse support): refuses the rest."""

    name = "test_no_bias"
    summary = "refuses float biases (test)"
    priority = 1
    default_selection = False

    def call_reasons(self, call: AttentionCall):
        if call.mask is not None and call.mask.bias is not None:
            return [Reason("mask", "a float bias: this kernel takes bool masks only")]
        return []

    def run(self, call: AttentionCall):
        return torch.nn.functional.scaled_dot_product_attention(
            call.query, call.key, call.value, call.keep_mask(), scale=call.scale
        )


def test_a_call_the_strategy_cannot_run_is_the_routers_error_with_the_reasons():
    npu_port.register_kernel(_NoBias)
    model = ENCODERS["t5"]().eval()
    ids, mask = _inputs()
    try:
        strategy = Strategy(name="no-bias", description="test", candidates=("test_no_bias",), select="fixed")
        with npu_port.attention_strategy(strategy, target=model):
            with pytest.raises(KernelUnavailableError) as caught:
                _encode(model, ids, mask)
    finally:
        from npu_port.attn import registry

        registry.unregister_kernel(_NoBias)
    message = str(caught.value)
    assert message.startswith("attention kernel 'test_no_bias' cannot run this call (")
    assert message.endswith(
        "\n  - a float bias: this kernel takes bool masks only\nkernels that can run it: math, sdpa, chunked"
    )
    assert caught.value.codes == ["mask"] and model.config._attn_implementation == "sdpa"


def test_custom_processor_on_a_transformers_model_is_refused():
    model = ENCODERS["t5"]()

    class Processor:
        def __call__(self, *args, **kwargs):  # pragma: no cover - never installed
            raise AssertionError

    with pytest.raises(TypeError) as caught:
        npu_port.set_attention_strategy(Processor, target=model)
    assert str(caught.value) == (
        "custom-processor installs diffusers attention processors; T5EncoderModel is a transformers model, whose "
        "attention is an implementation, not a processor: give a kernel strategy (sdpa, npu, ...)"
    )
    assert model.config._attn_implementation == "sdpa" and not ta.registered()


class _OwnCodeConfig(transformers.PretrainedConfig):
    model_type = "npu_port_own_code_test"


class _OwnCode(transformers.PreTrainedModel):
    """A transformers model whose attention is its own code (this module never imports ALL_ATTENTION_FUNCTIONS)."""

    config_class = _OwnCodeConfig

    def __init__(self, config):
        super().__init__(config)
        self.proj = torch.nn.Linear(4, 4)
        self.post_init()

    def forward(self, x):
        q = self.proj(x)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q)


def test_a_model_whose_attention_is_its_own_code_is_declined_and_said_so():
    model = _OwnCode(_OwnCodeConfig())
    x = torch.randn(1, 1, 3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UpstreamDeclinedWarning)  # not a library's missing piece: no warning
        with npu_port.attention_strategy("sdpa", target=model) as handle:
            model(x)
            assert not handle.calls
            assert "its attention is its own code, not transformers' AttentionInterface" in handle.explain()
            assert handle.applied.own_code == ["_OwnCode (_OwnCode)"]


def test_a_call_transformers_no_longer_makes_through_sdpa_is_counted_as_declined(monkeypatch):
    model = ENCODERS["clip"]().eval()
    ids, mask = _inputs()

    def eager_only(module, query, key, value, attention_mask, scaling=None, **kwargs):  # an sdpa without SDPA
        scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        return torch.matmul(scores.softmax(-1), value).transpose(1, 2).contiguous(), None

    original = _entry()
    transformers.AttentionInterface.register("sdpa", eager_only)
    try:
        with npu_port.attention_strategy("sdpa", target=model) as handle:
            _encode(model, ids, mask)
            assert not handle.calls
            assert handle.applied.declined == {ta.NO_SDPA_CALL: _layers(model)}
    finally:
        transformers.AttentionInterface.register("sdpa", original)
