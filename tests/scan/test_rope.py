"""NPU410's scope: which function and class names say RoPE (a word of the identifier, in snake or camel case)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npu_port.scan.rules._rope import ROPE_WORDS, is_rope_name


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("rope_params", True),
        ("apply_rotary_emb", True),
        ("precompute_freqs_cis", True),
        ("WanRotaryPosEmbed", True),
        ("FluxRoPE", True),
        ("RoPE3D", True),
        ("ropes", True),
        ("property", False),
        ("europe", False),
        ("tropes", False),
        ("frequency", False),
        ("EmbedND", False),
        ("sinusoidal_embedding_1d", False),
    ],
)
def test_rope_names(name, says):
    assert is_rope_name(name) is says


LOWER = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8)


@given(LOWER, st.sampled_from(ROPE_WORDS), LOWER)
def test_a_rope_word_between_underscores_or_in_camel_case_says_rope(prefix, word, suffix):
    assert is_rope_name(f"{prefix}_{word}_{suffix}")
    assert is_rope_name(f"{prefix.capitalize()}{word.capitalize()}{suffix.capitalize()}")


@given(st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", max_size=30))
def test_a_name_without_the_words_never_says_rope(name):
    if not any(word in name.lower() for word in ROPE_WORDS):
        assert not is_rope_name(name)
