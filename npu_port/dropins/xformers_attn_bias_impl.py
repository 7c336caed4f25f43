"""npu-port's stand-in for ``xformers.ops.fmha.attn_bias``: the attention-bias classes CUDA projects pass as
``attn_bias`` to ``memory_efficient_attention``, with xformers' semantics.

- :class:`LowerTriangularMask` is causal aligned *top-left* (query ``i`` sees keys ``j <= i``), as xformers
  materialises it with ``triu(diagonal=1)``; :class:`LowerTriangularFromBottomRightMask` is the bottom-right one.
- :class:`BlockDiagonalMask` (from sequence lengths) is for packed batches: ``B = 1`` and the tokens of every
  sequence laid end to end; each sequence attends only to its own keys. :class:`BlockDiagonalCausalMask` makes each
  block causal top-left, :class:`BlockDiagonalCausalFromBottomRightMask` bottom-right.
- :class:`LocalAttentionFromBottomRightMask` is a sliding window aligned bottom-right.

``materialize(shape)`` gives the additive ``0`` / ``-inf`` tensor, as in xformers. Each class also knows how to
attend (``_attend``) so that no mask is built where ``npu_port.attention`` has a cheaper form (``is_causal``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..attn.masks import additive_from_keep
from ..errors import AttentionInputError
from ._attention import attend_bshd, attend_dense, attend_packed, band_keep, packed_keep

Device = Union[str, torch.device]


class AttentionBias:
    """Base class of the biases. Subclasses say which keys a query sees with ``_band()``: ``(left, right,
    bottom_right)`` as in :func:`npu_port.dropins._attention.band_keep` (-1 = unbounded)."""

    HOLDS_DENSE_TENSOR = False

    def _band(self) -> Tuple[int, int, bool]:
        raise NotImplementedError(f"{type(self).__name__} does not describe its mask")

    def _keep(self, q_len: int, key_len: int, device: torch.device) -> Tensor:
        left, right, bottom_right = self._band()
        keep = band_keep(q_len, key_len, left, right, bottom_right=bottom_right, device=device)
        return keep if keep is not None else torch.ones(q_len, key_len, dtype=torch.bool, device=device)

    def materialize(self, shape: Tuple[int, ...], dtype: torch.dtype = torch.float32, device: Device = "cpu") -> Tensor:
        """The bias as an additive tensor of ``shape`` (``[..., q_len, key_len]``): 0 where kept, -inf where not."""
        keep = self._keep(shape[-2], shape[-1], torch.device(device))
        return additive_from_keep(keep, dtype).expand(tuple(shape))

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, p: float, scale: Optional[float]) -> Tensor:
        """BMHK attention under this bias."""
        left, right, bottom_right = self._band()
        return attend_dense(
            query, key, value, left=left, right=right, bottom_right=bottom_right, dropout_p=p, scale=scale
        )


class LowerTriangularMask(AttentionBias):
    """Causal, top-left: query ``i`` sees keys ``j <= i``."""

    def _band(self) -> Tuple[int, int, bool]:
        return -1, 0, False

    def add_bias(self, bias: Tensor) -> "LowerTriangularMaskWithTensorBias":
        return LowerTriangularMaskWithTensorBias(bias)


class LowerTriangularMaskWithTensorBias(LowerTriangularMask):
    """:class:`LowerTriangularMask` plus an additive tensor (broadcastable to ``(B, H, q_len, key_len)``)."""

    HOLDS_DENSE_TENSOR = True

    def __init__(self, bias: Tensor) -> None:
        self._bias = bias

    def materialize(self, shape: Tuple[int, ...], dtype: torch.dtype = torch.float32, device: Device = "cpu") -> Tensor:
        return super().materialize(shape, dtype=dtype, device=device) + self._bias.to(dtype=dtype, device=device)

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, p: float, scale: Optional[float]) -> Tensor:
        keep = self._keep(query.shape[1], key.shape[1], query.device)
        bias = self._bias.to(query.dtype).masked_fill(~keep, float("-inf"))
        return attend_bshd(query, key, value, bias, dropout_p=p, scale=scale)


class LowerTriangularFromBottomRightMask(AttentionBias):
    """Causal, bottom-right: query ``i`` sees keys ``j <= i + key_len - q_len`` (same as
    :class:`LowerTriangularMask` when the lengths are equal)."""

    def _band(self) -> Tuple[int, int, bool]:
        return -1, 0, True


@dataclass
class LocalAttentionFromBottomRightMask(AttentionBias):
    """Query ``i`` sees keys ``j`` with ``i - window_left <= j - (key_len - q_len) <= i + window_right``."""

    window_left: int
    window_right: int

    def __post_init__(self) -> None:
        if self.window_left < 0 or self.window_right < 0:
            raise ValueError(
                f"window_left and window_right must be >= 0, got {self.window_left} and {self.window_right}"
            )

    def _band(self) -> Tuple[int, int, bool]:
        return self.window_left, self.window_right, True


@dataclass
class _SeqLenInfo:
    """How a packed dimension divides into sequences: ``seqstart_py = [0, len_0, len_0 + len_1, ...]``."""

    seqstart: Tensor
    max_seqlen: int
    min_seqlen: int
    seqstart_py: List[int]

    @classmethod
    def from_seqlens(cls, seqlens: Iterable[int], *, device: Optional[Device] = None) -> "_SeqLenInfo":
        lengths = [int(n) for n in seqlens]
        starts = [0]
        for n in lengths:
            starts.append(starts[-1] + n)
        seqstart = torch.tensor(starts, dtype=torch.int32, device=device)
        return cls(seqstart, max(lengths, default=-1), min(lengths, default=-1), starts)

    def intervals(self) -> Iterable[Tuple[int, int]]:
        yield from zip(self.seqstart_py, self.seqstart_py[1:])

    def to(self, device: Device) -> "_SeqLenInfo":
        return _SeqLenInfo(self.seqstart.to(device), self.max_seqlen, self.min_seqlen, self.seqstart_py)

    def split(self, x: Tensor, batch_sizes: Optional[Sequence[int]] = None) -> List[Tensor]:
        """``(1, total, ...)`` -> one ``(batch_size, len, ...)`` tensor per group of sequences."""
        if x.shape[0] != 1 or x.shape[1] != self.seqstart_py[-1]:
            raise ValueError(
                f"expected a (1, {self.seqstart_py[-1]}, ...) tensor of packed sequences, got shape {tuple(x.shape)}"
            )
        batch_sizes = batch_sizes if batch_sizes is not None else [1] * (len(self.seqstart_py) - 1)
        chunks, first = [], 0
        for size in batch_sizes:
            chunks.append(self.seqstart_py[first + size] - self.seqstart_py[first])
            first += size
        return [t.reshape((size, -1) + tuple(t.shape[2:])) for size, t in zip(batch_sizes, x.split(chunks, dim=1))]


@dataclass
class BlockDiagonalMask(AttentionBias):
    """Packed sequences (``B = 1``): sequence ``b``'s queries see only sequence ``b``'s keys, all of them."""

    q_seqinfo: _SeqLenInfo
    k_seqinfo: _SeqLenInfo
    _batch_sizes: Optional[Sequence[int]] = None

    def _band(self) -> Tuple[int, int, bool]:
        return -1, -1, False

    @classmethod
    def from_seqlens(
        cls, q_seqlen: Sequence[int], kv_seqlen: Optional[Sequence[int]] = None, *, device: Optional[Device] = None
    ) -> "BlockDiagonalMask":
        """From the query (and key/value, default the same) length of each sequence."""
        if kv_seqlen is not None and len(kv_seqlen) != len(q_seqlen):
            raise ValueError(f"q_seqlen has {len(q_seqlen)} sequences but kv_seqlen has {len(kv_seqlen)}")
        q_seqinfo = _SeqLenInfo.from_seqlens(q_seqlen, device=device)
        same = kv_seqlen is None or list(kv_seqlen) == list(q_seqlen)
        k_seqinfo = q_seqinfo if same else _SeqLenInfo.from_seqlens(kv_seqlen, device=device)
        return cls(q_seqinfo=q_seqinfo, k_seqinfo=k_seqinfo)

    @classmethod
    def from_tensor_list(cls, tensors: Sequence[Tensor]) -> Tuple["BlockDiagonalMask", Tensor]:
        """``[B_i, M_i, ...]`` tensors -> the mask and the tensors packed into ``(1, sum(B_i * M_i), ...)``."""
        seqlens = [t.shape[1] for t in tensors for _ in range(t.shape[0])]
        mask = cls.from_seqlens(seqlens)
        mask._batch_sizes = [t.shape[0] for t in tensors]
        return mask, torch.cat([t.reshape((1, -1) + tuple(t.shape[2:])) for t in tensors], dim=1)

    def split_queries(self, tensor: Tensor) -> List[Tensor]:
        return self.q_seqinfo.split(tensor, self._batch_sizes)

    def split_kv(self, tensor: Tensor) -> List[Tensor]:
        return self.k_seqinfo.split(tensor, self._batch_sizes)

    def split(self, tensor: Tensor) -> List[Tensor]:
        """The inverse of :meth:`from_tensor_list`."""
        return self.q_seqinfo.split(tensor, self._batch_sizes)

    def make_causal(self) -> "BlockDiagonalCausalMask":
        return BlockDiagonalCausalMask(self.q_seqinfo, self.k_seqinfo, self._batch_sizes)

    def make_causal_from_bottomright(self) -> "BlockDiagonalCausalFromBottomRightMask":
        return BlockDiagonalCausalFromBottomRightMask(self.q_seqinfo, self.k_seqinfo, self._batch_sizes)

    def _keep(self, q_len: int, key_len: int, device: torch.device) -> Tensor:
        self._check_totals(q_len, key_len)
        left, right, bottom_right = self._band()
        q_starts, k_starts = self.q_seqinfo.seqstart_py, self.k_seqinfo.seqstart_py
        return packed_keep(q_starts, k_starts, q_len, key_len, left, right, bottom_right=bottom_right, device=device)

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, p: float, scale: Optional[float]) -> Tensor:
        if query.shape[0] != 1:
            raise AttentionInputError(
                f"{type(self).__name__} is for packed sequences: batch must be 1 (all sequences laid end to end "
                f"along dim 1), got query of shape {tuple(query.shape)}"
            )
        self._check_totals(query.shape[1], key.shape[1])
        left, right, bottom_right = self._band()
        out = attend_packed(
            query[0],
            key[0],
            value[0],
            self.q_seqinfo.seqstart_py,
            self.k_seqinfo.seqstart_py,
            left=left,
            right=right,
            bottom_right=bottom_right,
            dropout_p=p,
            scale=scale,
        )
        return out[None]

    def _check_totals(self, q_len: int, key_len: int) -> None:
        q_total, k_total = self.q_seqinfo.seqstart_py[-1], self.k_seqinfo.seqstart_py[-1]
        if (q_len, key_len) != (q_total, k_total):
            raise AttentionInputError(
                f"{type(self).__name__} covers {q_total} query and {k_total} key tokens, but the inputs have "
                f"{q_len} and {key_len}"
            )


@dataclass
class BlockDiagonalCausalMask(BlockDiagonalMask):
    """:class:`BlockDiagonalMask` with each block causal, top-left (query ``i`` of a sequence sees its keys
    ``j <= i``)."""

    def _band(self) -> Tuple[int, int, bool]:
        return -1, 0, False


@dataclass
class BlockDiagonalCausalFromBottomRightMask(BlockDiagonalMask):
    """:class:`BlockDiagonalMask` with each block causal, bottom-right."""

    def _band(self) -> Tuple[int, int, bool]:
        return -1, 0, True
