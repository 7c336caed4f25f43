"""The problem sizes the bench runs: where attention strategies differ in practice, named so results compare.

- ``seq256``, ``seq512``, ``seq1024``: the sequence lengths the Ascend attention guides tabulate for a
  768-wide, 12-head encoder layer (BERT-base / ViT-B: head_dim 64). Batch 1: the latency of one sequence, which is
  what an inference server sees; these are the shapes where launch overhead, not arithmetic, can decide the winner.
- ``sd-64x64``: Stable Diffusion 1.5 at 512x512 — a 64x64 latent, so 4096 tokens in the first down block's
  self-attention (320 channels over 8 heads: head_dim 40), batch 2 because classifier-free guidance runs the
  conditional and unconditional passes as one batch. The materialising (``math``) kernel needs 2 GiB of scores here.
- ``video-15x4096``: ControlVideo's FullyFrameAttention — 15 frames of that same 4096-token latent attending to one
  another at once: 61440 tokens, same batch, heads and head_dim. Its score tensor (2 x 8 x 61440² = 112.5 GiB in
  float16, twice that with float32 products) is the out-of-memory report that started this project: a
  materialising kernel must be *refused* here, never tried. Too slow for a CPU (minutes per call even fused), so the
  CPU default leaves it out; ``--shapes all`` or ``--shapes video-15x4096`` asks for it.

``custom:B,H,S,D`` (or ``custom:BxHxSxD``) adds any self-attention size, e.g. to bench a model's own layer or to
keep a test fast. Parsing lives here so the CLI and the benchmark scripts accept the same words. A custom size whose
query, key and value alone cannot fit in this machine's memory is refused here, naming that limit, before anything
is measured: torch would otherwise fail deep inside (``Storage size calculation overflowed``) after the other shapes
ran.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from . import BenchError


@dataclass(frozen=True)
class Shape:
    """One self-attention problem: (B, H, Sq, D) queries over Skv keys."""

    name: str
    batch: int
    heads: int
    seq: int
    head_dim: int
    kv_seq: Optional[int] = None  # None: self-attention (Skv = Sq)
    causal: bool = False
    about: str = ""

    @property
    def key_len(self) -> int:
        return self.kv_seq if self.kv_seq is not None else self.seq

    @property
    def flops(self) -> int:
        """Forward flops: two matmuls of 2·B·H·Sq·Skv·D each; a causal mask halves the useful work."""
        total = 4 * self.batch * self.heads * self.seq * self.key_len * self.head_dim
        return total // 2 if self.causal else total

    def describe(self) -> str:
        dims = f"B={self.batch} H={self.heads} S={self.seq} D={self.head_dim}"
        if self.kv_seq is not None:
            dims += f" Skv={self.kv_seq}"
        return dims + (" causal" if self.causal else "")


SHAPES: Dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("seq256", 1, 12, 256, 64, about="encoder layer, hidden 768 / 12 heads (Ascend attention guides)"),
        Shape("seq512", 1, 12, 512, 64, about="encoder layer, hidden 768 / 12 heads (Ascend attention guides)"),
        Shape("seq1024", 1, 12, 1024, 64, about="encoder layer, hidden 768 / 12 heads (Ascend attention guides)"),
        Shape("sd-64x64", 2, 8, 4096, 40, about="SD1.5 512x512, first down block self-attention, CFG batch 2"),
        Shape("video-15x4096", 2, 8, 15 * 4096, 40, about="ControlVideo FullyFrameAttention: 15 frames x 4096 tokens"),
    )
}

#: Shapes left out of the default set on a device type, with the reason printed when they are.
TOO_SLOW: Dict[str, Dict[str, str]] = {
    "cpu": {
        "video-15x4096": (
            "left out on cpu by default: even a fused kernel needs minutes per call at 61440 tokens "
            "(~9.7 TFLOP per forward); ask for it with --shapes all or --shapes video-15x4096"
        ),
    },
}

CUSTOM = re.compile(r"^custom:(\d+)[,x](\d+)[,x](\d+)[,x](\d+)$")
#: One entry of a comma-separated list; ``custom:1,2,64,16`` keeps its commas.
_ENTRY = re.compile(r"custom:[^,]*(?:,\d+){0,3}|[^,]+")
CUSTOM_HELP = "custom:B,H,S,D (batch, heads, sequence length, head dim; e.g. custom:1,8,1024,64)"


def valid_shape_words() -> str:
    return ", ".join(list(SHAPES) + ["default", "all", CUSTOM_HELP])


def custom_shape(text: str) -> Shape:
    """``custom:B,H,S,D`` as a :class:`Shape`, or :class:`BenchError` saying what the syntax is."""
    match = CUSTOM.match(text.strip())
    if match is None or not all(int(n) > 0 for n in match.groups()):
        raise BenchError(f"bad custom shape {text!r}: write {CUSTOM_HELP}, four positive integers")
    batch, heads, seq, dim = (int(n) for n in match.groups())
    shape = Shape(f"custom-{batch}x{heads}x{seq}x{dim}", batch, heads, seq, dim, about="given on the command line")
    need, limit = input_bytes(shape), host_memory()
    if need > (limit or MAX_TENSOR_BYTES):
        where = f"this machine has {_gib(limit)} of memory" if limit else "more than one tensor can hold"
        raise BenchError(
            f"custom shape {text!r}: its query, key and value need {_gib(need)} (float32, made in host memory first); "
            f"{where}: make B*H*S*D smaller"
        )
    return shape


#: The inputs are drawn as float32 on the host (:func:`npu_port.bench.reference.make_call`), then moved.
INPUT_ITEM_BYTES = 4
#: torch's sizes are 64-bit: the most bytes any one tensor can have, where the machine's memory is not known.
MAX_TENSOR_BYTES = 2**63 - 1


def input_bytes(shape: Shape) -> int:
    """The bytes of a shape's query, key and value as the bench first makes them."""
    return (shape.seq + 2 * shape.key_len) * shape.batch * shape.heads * shape.head_dim * INPUT_ITEM_BYTES


def host_memory() -> Optional[int]:
    """This machine's physical memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB"


def default_shapes(device_type: str) -> Tuple[List[Shape], List[Tuple[str, str]]]:
    """The shapes run when none are named on ``device_type``, and those left out with the reason."""
    left_out = TOO_SLOW.get(device_type, {})
    return [s for n, s in SHAPES.items() if n not in left_out], list(left_out.items())


def parse_shapes(text: Optional[str], device_type: str) -> Tuple[List[Shape], List[Tuple[str, str]]]:
    """The shapes a ``--shapes`` value names, in order, and the (name, reason) of any default shape left out.

    ``None`` or ``default``: the device's default set; ``all``: every named shape; names and ``custom:B,H,S,D``
    entries can be mixed. An unknown word is an error listing the valid ones.
    """
    if text is None or not text.strip():
        return default_shapes(device_type)
    chosen: Dict[str, Shape] = {}
    skipped: List[Tuple[str, str]] = []
    for entry in (e.strip() for e in _ENTRY.findall(text)):
        if not entry:
            continue
        if entry == "default":
            shapes, left_out = default_shapes(device_type)
            chosen.update((s.name, s) for s in shapes)
            skipped += left_out
        elif entry == "all":
            chosen.update(SHAPES)
        elif entry.startswith("custom:"):
            shape = custom_shape(entry)
            chosen[shape.name] = shape
        elif entry in SHAPES:
            chosen[entry] = SHAPES[entry]
        else:
            raise BenchError(f"unknown bench shape {entry!r}; valid shapes: {valid_shape_words()}")
    if not chosen:
        raise BenchError(f"--shapes names no shape; valid shapes: {valid_shape_words()}")
    skipped = [(name, why) for name, why in dict(skipped).items() if name not in chosen]
    return list(chosen.values()), skipped
