"""What a dump keeps of one tensor: its statistics and a fixed sample of its elements, small enough for every call
of every module.

Two runs are compared element by element on the sample: its positions depend only on the tensor's number of elements
(a generator seeded once per size), so the same module's output on two machines is sampled at the same positions, and
a tensor of at most :data:`SAMPLE` elements is kept whole. The statistics are read on the tensor's own device in
float32 (NPUs have no fast float64), then moved to the host in one transfer.

The hash identifies bit-equal tensors: over the tensor's bytes when they are at most :data:`HASH_FULL_BYTES`, else
over the sample and the statistics (marked ``sampled:``), so that hashing never copies a large tensor to the host.
"""

from __future__ import annotations

import functools
import hashlib
import math
from typing import Any, Dict, List

import torch

#: Elements sampled per tensor (all of them when there are fewer).
SAMPLE = 256
#: Tensors up to this many bytes are hashed whole; larger ones by their sample and statistics.
HASH_FULL_BYTES = 1 << 20
_SEED = 20261128


@functools.lru_cache(maxsize=256)
def sample_positions(numel: int, size: int = SAMPLE) -> torch.Tensor:
    """The flat positions sampled from a tensor of ``numel`` elements: all of them up to ``size``, else ``size``
    distinct positions in increasing order, the same in every process for the same ``numel``."""
    if numel <= size:
        return torch.arange(numel)
    generator = torch.Generator().manual_seed(_SEED + numel)
    return torch.randperm(numel, generator=generator)[:size].sort().values


def _as_real(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.is_complex():
        return torch.view_as_real(tensor)
    if tensor.dtype == torch.bool:
        return tensor.to(torch.uint8)
    return tensor


def tensor_stats(tensor: torch.Tensor, sample_size: int = SAMPLE) -> Dict[str, Any]:
    """Shape, dtype, number of elements, min / max / mean / std of the finite values, NaN and inf counts, the sample
    (floats; NaN and inf kept) and the hash. Reads the tensor; never changes it."""
    data = _as_real(tensor.detach())
    numel = data.numel()
    record: Dict[str, Any] = {"shape": list(tensor.shape), "dtype": str(tensor.dtype).replace("torch.", "")}
    record["numel"] = numel
    if numel == 0:
        record.update(min=None, max=None, mean=None, std=None, nan=0, inf=0, sample=[], hash=_hash_bytes(b""))
        return record
    flat = data.reshape(-1)
    values = flat.float() if flat.dtype != torch.float64 else flat
    positions = sample_positions(numel, sample_size).to(values.device)
    total = float(values.sum()) if values.device.type == "cpu" else math.nan
    if math.isfinite(total):  # a finite sum: no NaN or inf anywhere (the common case, in 3 passes instead of 12)
        summary = _all_finite(values, total)
    else:
        summary = _with_nonfinite(values)
    low, high, mean, std, nans, infs, finite_count = summary
    sample_list: List[float] = values.index_select(0, positions).double().cpu().tolist()
    record.update(
        min=low if finite_count else None,
        max=high if finite_count else None,
        mean=mean if finite_count else None,
        std=std if finite_count > 1 else (0.0 if finite_count else None),
        nan=int(nans),
        inf=int(infs),
        sample=sample_list,
    )
    if numel * tensor.element_size() <= HASH_FULL_BYTES:
        record["hash"] = _hash_bytes(_host_bytes(tensor.detach()))
    else:
        text = repr((record["shape"], record["dtype"], summary, sample_list)).encode()
        record["hash"] = "sampled:" + hashlib.blake2b(text, digest_size=16).hexdigest()
    return record


def _all_finite(values: torch.Tensor, total: float) -> List[float]:
    """:func:`_with_nonfinite`'s summary for a host tensor known to hold no NaN or inf (``total``: its sum)."""
    low, high = torch.aminmax(values)
    count = values.numel()
    std = float(values.std()) if count > 1 else 0.0
    return [float(low), float(high), total / count, std, 0.0, 0.0, float(count)]


def _with_nonfinite(values: torch.Tensor) -> List[float]:
    """``[min, max, mean, std, nan count, inf count, finite count]`` over the finite values, read on the tensor's
    device and moved to the host in one transfer."""
    nan = torch.isnan(values)
    inf = torch.isinf(values)
    finite = ~(nan | inf)
    count = finite.sum()
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    filled = torch.where(finite, values, zero)
    total = filled.sum()
    mean = total / count.clamp(min=1)
    var = (torch.where(finite, values - mean, zero) ** 2).sum() / (count - 1).clamp(min=1)
    big = torch.finfo(values.dtype).max
    low = torch.where(finite, values, torch.full_like(values, big)).min()
    high = torch.where(finite, values, torch.full_like(values, -big)).max()
    summary = torch.stack([low.double(), high.double(), mean.double(), var.sqrt().double(), nan.sum().double(),
                           inf.sum().double(), count.double()]).cpu().tolist()  # fmt: skip
    return summary


def _host_bytes(tensor: torch.Tensor) -> bytes:
    host = tensor.contiguous().cpu()
    if host.is_complex():
        host = torch.view_as_real(host)
    flat = host.reshape(-1)
    if flat.numel() and flat.stride(0) != 1:  # a one-element tensor expanded (stride 0) counts as contiguous
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _hash_bytes(data: bytes) -> str:
    return "blake2b:" + hashlib.blake2b(data, digest_size=16).hexdigest()
