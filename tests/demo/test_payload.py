"""What a call to the demo's API may contain (``npu_port.demo.payload``) and who may join its queue
(``npu_port.demo.admission``): pure checks, no gradio, no model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npu_port.demo import admission, payload
from npu_port.demo.choices import StrategyChoices
from npu_port.errors import InferenceError

CHOICES = StrategyChoices(["auto", "sdpa", "vanilla"], {"flash": "flash_attn: flash_attn is not installed"})
FIELDS = [
    payload.Field("prompt", payload.TEXT),
    payload.Field("steps", payload.RANGE, 1, 50),
    payload.Field("seed", payload.NUMBER),
    payload.Field("strategy", payload.CHOICE),
    payload.Field("strategies", payload.CHOICES),
]
GOOD = ["a red fox", 2, 0, "sdpa", ["vanilla", "sdpa"]]

#: Every JSON value a caller can send (what a raw POST or gradio_client can put in ``data``).
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def _refusal(field: payload.Field, value) -> str:
    with pytest.raises(payload.MalformedCall) as caught:
        payload.check_value(field, value, CHOICES)
    return str(caught.value)


def test_a_call_the_page_can_make_passes_and_keeps_its_values():
    assert payload.check_call("compare", FIELDS, GOOD, CHOICES) == GOOD
    assert payload.check_call("compare", FIELDS, [None, 50.0, None, "auto", []], CHOICES)[1] == 50.0


@pytest.mark.parametrize(
    "index, value, message",
    [
        (0, 5, "prompt must be text, got int 5"),
        (0, ["a"], "prompt must be text, got list ['a']"),
        (1, "abc", "steps must be a number from 1 to 50, got str 'abc'"),
        (1, 51, "steps must be a number from 1 to 50, got int 51"),
        (1, 0.5, "steps must be a number from 1 to 50, got float 0.5"),
        (1, None, "steps must be a number from 1 to 50, got NoneType None"),
        (1, True, "steps must be a number from 1 to 50, got bool True"),
        (2, "7", "seed must be a number (or empty), got str '7'"),
        (2, {"a": 1}, "seed must be a number (or empty), got dict {'a': 1}"),
        (2, float("inf"), "seed must be a number (or empty), got float inf"),
        (3, ["x"], "strategy must be a strategy name, one of: auto, sdpa, vanilla; got list ['x']"),
        (3, "nope", "strategy: unknown strategy 'nope'; choose one of: auto, sdpa, vanilla"),
        (
            3,
            "flash",
            "strategy: strategy 'flash' cannot run here (flash_attn: flash_attn is not installed); choose one of: "
            "auto, sdpa, vanilla",
        ),
        (4, "sdpa", "strategies must be a list of strategy names (from: auto, sdpa, vanilla), got str 'sdpa'"),
        (4, ["sdpa", 3], "strategies must be a strategy name, one of: auto, sdpa, vanilla; got int 3"),
        (4, ["sdpa", "nope"], "strategies: unknown strategy 'nope'; choose one of: auto, sdpa, vanilla"),
        (2, float("nan"), "seed must be a number (or empty), got float nan"),
    ],
)
def test_each_malformed_value_is_named_with_what_the_field_takes(index, value, message):
    values = list(GOOD)
    values[index] = value
    with pytest.raises(payload.MalformedCall) as caught:
        payload.check_call("compare", FIELDS, values, CHOICES)
    assert str(caught.value) == message
    assert isinstance(caught.value, InferenceError)  # the demo's main and the CLI print it as one line


def test_a_long_value_is_cut_in_the_message():
    message = _refusal(FIELDS[2], "9" * 100)
    assert message == "seed must be a number (or empty), got str '" + "9" * 36 + "..."
    assert "\n" not in _refusal(FIELDS[0], ["line\n" * 50])


def test_the_wrong_number_of_values_is_refused_with_the_fields_in_order():
    with pytest.raises(payload.MalformedCall) as caught:
        payload.check_call("compare", FIELDS, GOOD[:3], CHOICES)
    assert str(caught.value) == "compare takes 5 values (prompt, steps, seed, strategy, strategies), got 3"
    with pytest.raises(payload.MalformedCall, match=r"^compare takes 5 values \(.*\), got 6$"):
        payload.check_call("compare", FIELDS, [*GOOD, 1], CHOICES)
    with pytest.raises(payload.MalformedCall) as caught:
        payload.check_call("compare", FIELDS, {"prompt": "x"}, CHOICES)
    assert str(caught.value) == (
        "compare takes a list of 5 values (prompt, steps, seed, strategy, strategies), got dict {'prompt': 'x'}"
    )


def _widget_could_send(field: payload.Field, value) -> bool:
    """What the page's widget of ``field`` sends, written independently of the module under test."""
    number = type(value) in (int, float) and math.isfinite(value)
    if field.kind == payload.TEXT:
        return value is None or type(value) is str
    if field.kind == payload.NUMBER:
        return value is None or number
    if field.kind == payload.RANGE:
        return number and field.low <= value <= field.high
    if field.kind == payload.CHOICE:
        return type(value) is str and value in CHOICES.names
    return type(value) is list and all(type(item) is str and item in CHOICES.names for item in value)


@given(st.sampled_from(FIELDS), JSON | st.sampled_from(["auto", "flash", ["sdpa", "auto"], 1, 50, 50.5]))
def test_any_value_passes_exactly_when_the_widget_could_send_it(field, value):
    if _widget_could_send(field, value):
        payload.check_value(field, value, CHOICES)
    else:
        message = _refusal(field, value)
        assert message.startswith(f"{field.name}") and "\n" not in message
        assert len(message) < 200


# ------------------------------------------------------------------------------------------- who may join


def test_queue_limits_are_whole_numbers_and_a_client_cannot_hold_the_whole_queue():
    assert admission.QueueLimits() == admission.QueueLimits(admission.DEFAULT_MAX_QUEUE, admission.DEFAULT_PER_CLIENT)
    assert admission.QueueLimits(1, 1).per_client == 1
    for limits, message in (
        ((0, 1), "--max-queue must be a whole number >= 1, got 0"),
        ((5, 0), "--per-client must be a whole number >= 1, got 0"),
        ((5, -2), "--per-client must be a whole number >= 1, got -2"),
        ((5, True), "--per-client must be a whole number >= 1, got True"),
        ((2.5, 1), "--max-queue must be a whole number >= 1, got 2.5"),
        (
            (3, 4),
            "--per-client 4 is more than --max-queue 3: one client could fill the queue; lower --per-client or raise "
            "--max-queue",
        ),
    ):
        with pytest.raises(InferenceError) as caught:
            admission.QueueLimits(*limits)
        assert str(caught.value) == message


def test_the_door_refuses_a_clients_request_beyond_its_limit_and_no_one_elses():
    held = {"a": 2, "b": 1}
    door = admission.Admission(admission.QueueLimits(5, 2), {"compare": FIELDS}, lambda session: held.get(session, 0))
    refusal = door.check("compare", "a", GOOD)
    assert refusal == admission.Refusal(
        429,
        "this client already has 2 requests waiting or running, the most one client may have (--per-client 2); wait "
        "for one to finish",
    )
    assert door.check("compare", "b", GOOD) is None
    assert door.check("compare", "new", GOOD) is None
    assert door.check("compare", None, GOOD) is None  # gradio gives such a call a session of its own
    held["a"] = 1  # one of a's requests finished
    assert door.check("compare", "a", GOOD) is None


def test_the_door_refuses_a_call_of_the_wrong_shape_before_it_waits():
    door = admission.Admission(admission.QueueLimits(), {"compare": FIELDS}, lambda session: 0)
    assert door.check("compare", "a", GOOD[:2]) == admission.Refusal(
        400, "compare takes 5 values (prompt, steps, seed, strategy, strategies), got 2"
    )
    assert door.check(None, "a", GOOD) == admission.Refusal(400, "no such endpoint; the demo's endpoints: compare")
    assert door.check("", "a", [1]) is None  # an event that is not the demo's: gradio's own rules
