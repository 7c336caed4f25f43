"""Bad input to ``npu_port.attention`` fails with one clear message, never a traceback from inside torch."""

from __future__ import annotations

import pytest
import torch

import npu_port
from npu_port.attn import AttentionCall
from npu_port.errors import AttentionInputError

Q = torch.randn(2, 4, 3, 8)
K = torch.randn(2, 4, 5, 8)


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((Q.tolist(), K, K), {}, "query must be a torch.Tensor, got list"),
        (
            (Q.long(), K.long(), K.long()),
            {},
            "query has dtype int64; attention needs float16, bfloat16, float32 or float64",
        ),
        (
            (Q, K.half(), K),
            {},
            "query, key and value must share one dtype; got query float32, key float16, value float32",
        ),
        (
            (Q[0, 0, 0], K, K),
            {},
            "query must have at least 3 dimensions (..., heads, seq_len, head_dim), got shape (8,)",
        ),
        (
            (Q, K[0], K[0]),
            {},
            "query, key and value must have the same number of dimensions (..., heads, seq_len, head_dim); got 4, 3, 3",
        ),
        (
            (Q, K[:1], K[:1]),
            {},
            "query, key and value must have the same batch dimensions; got query (2, 4, 3, 8), key (1, 4, 5, 8), value (1, 4, 5, 8)",
        ),
        (
            (Q, K, K[:, :, :4]),
            {},
            "key and value must have the same heads and sequence length; got key (2, 4, 5, 8), value (2, 4, 4, 8)",
        ),
        ((Q, K[..., :4], K), {}, "query and key must have the same head_dim (last dimension); got 8 and 4"),
        (
            (Q, K[:, :2], K[:, :2]),
            {},
            "query has 4 heads but key/value have 2; pass enable_gqa=True to share key/value heads across query heads (grouped-query attention)",
        ),
        (
            (Q, K[:, :3], K[:, :3]),
            {"enable_gqa": True},
            "enable_gqa needs the query heads (4) to be a multiple of the key/value heads (3)",
        ),
        ((Q, K, K), {"dropout_p": 1.5}, "dropout_p must be a number in [0, 1], got 1.5"),
        ((Q, K, K), {"dropout_p": True}, "dropout_p must be a number in [0, 1], got True"),
        ((Q, K, K), {"scale": float("nan")}, "scale must be None or a finite number, got nan"),
        ((Q, K, K), {"is_causal": 1}, "is_causal must be True or False, got 1"),
        ((Q, K, K), {"enable_gqa": "yes"}, "enable_gqa must be True or False, got 'yes'"),
        ((Q, K, K, [[True]]), {}, "attn_mask must be a torch.Tensor or None, got list"),
        (
            (Q, K, K, torch.ones(2, 1, 1, 1, 5, dtype=torch.bool)),
            {},
            "attn_mask of shape (2, 1, 1, 1, 5) does not broadcast to the scores' shape (2, 4, 3, 5) (batch, heads, q_len, key_len); masks broadcast from the right, as in torch.nn.functional.scaled_dot_product_attention",
        ),
    ],
)
def test_bad_input_message(args, kwargs, message):
    with pytest.raises(AttentionInputError) as info:
        npu_port.attention(*args, **kwargs)
    assert str(info.value) == message


def test_input_errors_are_value_errors_like_torch_raises():
    with pytest.raises(ValueError):
        npu_port.attention(Q, K, K, dropout_p=-0.1)


def test_call_description_names_everything_a_kernel_decides_on():
    call = AttentionCall.from_arguments(
        Q.half(), K[:, :2].half(), K[:, :2].half(), torch.ones(3, 5, dtype=torch.bool), is_causal=True, enable_gqa=True
    )
    assert call.describe() == (
        "query (2, 4, 3, 8) float16 on cpu, key (2, 2, 5, 8), value (2, 2, 5, 8), bool mask (1, 1, 3, 5), "
        "is_causal=True, dropout_p=0, scale=0.3536"
    )
    assert (call.group, call.heads, call.kv_heads, call.q_len, call.key_len) == (2, 4, 2, 3, 5)
