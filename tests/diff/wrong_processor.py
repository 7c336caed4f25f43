"""A custom attention processor that is right everywhere but on modules marked ``bisect_wrong``: there it scales
the attention output by 1.01 — a port that is wrong for one module only, for the bisect tests."""

from __future__ import annotations

from diffusers.models.attention_processor import AttnProcessor2_0

#: The attribute that marks the module this processor gets wrong.
MARK = "bisect_wrong"


class OneWrongProcessor:
    def __init__(self):
        self.inner = AttnProcessor2_0()

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **kwargs):
        out = self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, temb)
        return out * 1.01 if getattr(attn, MARK, False) else out
