"""transformers models through npu-port's router: parity with transformers' own ``sdpa`` and ``eager`` (float64), the
attention interface and configs put back exactly (counted, stacked, any order), a pipeline's text encoders routed and
restored with its handle, and the errors for what cannot be routed."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_port
from npu_port.attn.call import AttentionCall
from npu_port.attn.kernels.base import Kernel
from npu_port.errors import KernelUnavailableError
from npu_port.integrations import transformers_attention as ta
from npu_port.integrations.diffusers.routing import Route, active_route
from npu_port.reasons import Reason
from npu_port.strategy.spec import Strategy
from tests.infer.conftest import _module_cache, model_cache  # noqa: F401  (the tiny pipelines, built once)
from tests.versions import at_least

#: Every test here runs T5 / UMT5 through transformers' AttentionInterface (and its sdpa's position-bias mask), which
#: they use from transformers 5.15.0 on; the oldest lanes deselect the file (and it must import there to be read).
TRANSFORMERS_MIN = "5.15.0"
pytestmark = pytest.mark.transformers_min(TRANSFORMERS_MIN)

if at_least("transformers", TRANSFORMERS_MIN):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    from npu_port.integrations.diffusers.tiny_flux import tiny_t5_encoder
    from npu_port.integrations.diffusers.tiny_text2image import tiny_clip_text_encoder

ENCODERS = {
    "clip": lambda: tiny_clip_text_encoder(100, 99, 98),
    "t5": lambda: tiny_t5_encoder(100),
    "umt5": lambda: tiny_t5_encoder(100, umt5=True),
}


def _tables():
    return dict(AttentionInterface._global_mapping), dict(AttentionMaskInterface._global_mapping)


def _inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 98, (3, 11), generator=gen)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0  # padding: the mask builder's bool mask reaches the router
    mask[2, 4:] = 0
    return ids, mask


def _encode(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize("family, strategy", list(itertools.product(ENCODERS, ["vanilla", "sdpa", "chunked"])))
def test_encoders_match_transformers_own_sdpa_and_eager_in_float64(family, strategy):
    model = ENCODERS[family]().double().eval()
    ids, mask = _inputs()
    real = mask.bool()
    expected = {}
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        expected[implementation] = _encode(model, ids, mask)
    before = _tables()
    with npu_port.attention_strategy(strategy, target=model) as handle:
        assert model.config._attn_implementation == "npu_port"
        got = _encode(model, ids, mask)
        layers = model.config.num_hidden_layers if family == "clip" else model.config.num_layers
        assert handle.applied.calls == {"transformers": layers}
        assert sum(handle.calls.values()) == layers
    assert model.config._attn_implementation == "sdpa" and _tables() == before
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected["sdpa"], rtol=0, atol=1e-12)
    # eager: on every real token (padded queries differ by design), to its float32 softmax's precision
    torch.testing.assert_close(got[real], expected["eager"][real], rtol=0, atol=1e-6)


class _Module(torch.nn.Module):
    def __init__(self, groups, causal):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = causal


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 2),
    kv_heads=st.integers(1, 2),
    groups=st.sampled_from([1, 2]),
    q_len=st.integers(1, 5),
    extra_kv=st.integers(0, 3),
    mask_kind=st.sampled_from([None, "bool", "float"]),
    bias=st.booleans(),
    is_causal=st.sampled_from([None, True, False]),
    module_causal=st.booleans(),
    scaling=st.sampled_from([None, 1.0, 0.3]),
    seed=st.integers(0, 2**16),
)
def test_each_argument_combination_matches_sdpa_attention_forward(
    batch, kv_heads, groups, q_len, extra_kv, mask_kind, bias, is_causal, module_causal, scaling, seed
):
    gen = torch.Generator().manual_seed(seed)
    heads, kv_len, dim = kv_heads * groups, q_len + extra_kv, 4
    query = torch.randn(batch, heads, q_len, dim, generator=gen, dtype=torch.float64)
    key = torch.randn(batch, kv_heads, kv_len, dim, generator=gen, dtype=torch.float64)
    value = torch.randn(batch, kv_heads, kv_len, dim, generator=gen, dtype=torch.float64)
    mask = None
    if mask_kind is not None:
        keep = torch.rand(batch, 1, q_len, kv_len, generator=gen) > 0.3
        keep[..., 0] = True  # every query keeps a key: no fully masked row
        mask = keep if mask_kind == "bool" else torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, -1e9)
    position_bias = torch.randn(1, heads, q_len, kv_len, generator=gen, dtype=torch.float64) if bias else None
    module = _Module(groups, module_causal)
    arguments = dict(scaling=scaling, is_causal=is_causal, position_bias=position_bias)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, **arguments)
    route = Route(npu_port.attention)
    with active_route(route):
        got, weights = ta.npu_port_attention_forward(module, query, key, value, mask, **arguments)
    assert weights is None and got.shape == expected.shape == (batch, q_len, heads, dim) and got.is_contiguous()
    assert route.tally.calls == {"transformers": 1}
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_registration_is_counted_and_puts_back_an_entry_that_was_there():
    model_a, model_b = ENCODERS["t5"](), ENCODERS["t5"]()
    mine = object()
    AttentionInterface._global_mapping["npu_port"] = mine  # someone's entry under the same name
    try:
        before = _tables()
        first = npu_port.set_attention_strategy("sdpa", target=model_a)
        second = npu_port.set_attention_strategy("sdpa", target=model_b)
        assert AttentionInterface._global_mapping["npu_port"] is ta.npu_port_attention_forward
        first.restore()
        assert ta.registered() and AttentionInterface._global_mapping["npu_port"] is ta.npu_port_attention_forward
        second.restore()
        second.restore()  # idempotent: not counted twice
        assert not ta.registered() and _tables() == before
        assert AttentionInterface._global_mapping["npu_port"] is mine and "npu_port" not in AttentionMaskInterface()
    finally:
        AttentionInterface._global_mapping.pop("npu_port", None)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_stacked_applications_put_each_config_back_in_any_order(order):
    model = ENCODERS["clip"]()
    model.set_attn_implementation("eager")
    ids, mask = _inputs()
    handles = [npu_port.set_attention_strategy(s, target=model) for s in ("sdpa", "vanilla")]
    _encode(model, ids, mask)
    assert handles[1].calls and not handles[0].calls  # the innermost application routes
    handles[order[0]].restore()
    assert model.config._attn_implementation == "npu_port"
    _encode(model, ids, mask)  # the remaining application still routes
    assert sum(handles[order[1]].calls.values()) == 2 * model.config.num_hidden_layers - (order[1] == 0) * 2
    handles[order[1]].restore()
    assert model.config._attn_implementation == "eager" and ta.held_configs() == 0 and not ta.registered()


def test_a_config_changed_since_is_left_as_it_was_set():
    model = ENCODERS["t5"]()
    handle = npu_port.set_attention_strategy("sdpa", target=model)
    model.set_attn_implementation("eager")
    handle.restore()
    assert model.config._attn_implementation == "eager" and handle.applied.left_alone == ["T5Config"]
    assert ta.held_configs() == 0


@pytest.mark.usefixtures("model_cache")
def test_a_pipelines_text_encoders_are_routed_and_restored_with_the_handle():
    from npu_port.infer.models import load_pipeline

    pipe = load_pipeline("tiny-flux", torch.device("cpu"), torch.float32, progress_bar=False).pipe
    encoders = {"text_encoder": pipe.text_encoder, "text_encoder_2": pipe.text_encoder_2}
    before = {name: model.config._attn_implementation for name, model in encoders.items()}
    processors = dict(pipe.transformer.attn_processors)
    tables = _tables()
    with npu_port.attention_strategy("sdpa", target=pipe) as handle:
        assert {m.config._attn_implementation for m in encoders.values()} == {"npu_port"}
        pipe.encode_prompt("a cat", prompt_2="a cat", device=torch.device("cpu"))
        by_module = handle.applied.calls_by_module
        assert by_module["text_encoder"] == pipe.text_encoder.config.num_hidden_layers
        assert by_module["text_encoder_2"] == pipe.text_encoder_2.config.num_layers
        assert "text_encoder: CLIPTextModel, sdpa -> npu_port" in handle.explain()
        assert "text_encoder_2: T5EncoderModel, sdpa -> npu_port" in handle.explain()
    assert {name: model.config._attn_implementation for name, model in encoders.items()} == before
    assert pipe.transformer.attn_processors == processors and _tables() == tables and ta.held_configs() == 0


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


def test_a_copy_made_while_routed_says_why_it_cannot_run():
    model = ENCODERS["clip"]().eval()
    ids, mask = _inputs()
    with npu_port.attention_strategy("sdpa", target=model):
        twin = copy.deepcopy(model)
        with pytest.raises(ta.NotRoutedError) as caught:
            _encode(twin, ids, mask)
    assert str(caught.value) == (
        "CLIPAttention runs attention implementation 'npu_port' outside a model npu-port routes (a copy of a model "
        "made while a strategy was applied to it, or a part of it called on its own), so no strategy is there to "
        "run it; call the model the strategy was applied to, or set another implementation: "
        "model.set_attn_implementation('sdpa')"
    )


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
