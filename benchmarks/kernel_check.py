"""Check every attention kernel that can run on this device: parity with a float64 reference, NaN-safety, speed.

This is what to run on real hardware (an Ascend NPU, a new GPU) to see which kernels work there and which is
fastest, before trusting any of them with a model:

    python benchmarks/kernel_check.py --device npu            # or cuda, cpu; --dtypes float16,bfloat16
    python benchmarks/kernel_check.py --device cuda --json results.json

For each case (diffusion self- and cross-attention, a causal decoder step with GQA, key padding with a fully masked
batch item) and each kernel: whether it runs (else its reasons), the largest difference from the ``math`` kernel run
in float64 on the CPU, whether any NaN appeared, and the median time of a few synchronised runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from typing import Dict, List

import torch

import npu_port
from npu_port import masks
from npu_port.attn import AttentionCall
from npu_port.device.timing import repeat, spread

#: name -> (batch, heads, kv_heads, q_len, key_len, head_dim, causal, mask kind)
CASES: Dict[str, tuple] = {
    "sd-self-attn-4096x64": (2, 8, 8, 4096, 4096, 64, False, None),
    "sd-cross-attn-77": (2, 8, 8, 4096, 77, 64, False, None),
    "dit-key-padding": (2, 16, 16, 1024, 1024, 72, False, "key_padding"),
    "decoder-causal-gqa": (1, 32, 8, 512, 512, 128, True, None),
    "fully-masked-rows": (1, 4, 4, 256, 256, 64, False, "empty_rows"),
}
#: Largest difference from the float64 reference accepted per dtype (outputs are O(1)).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def _inputs(case: tuple, dtype: torch.dtype, device: torch.device):
    batch, heads, kv_heads, q_len, key_len, dim, causal, kind = case
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(batch, heads, q_len, dim, generator=gen)
    key = torch.randn(batch, kv_heads, key_len, dim, generator=gen)
    value = torch.randn(batch, kv_heads, key_len, dim, generator=gen)
    mask = None
    if kind == "key_padding":
        padding = torch.ones(batch, key_len, dtype=torch.long)
        padding[0, key_len // 2 :] = 0
        padding[-1] = 0  # a batch item with no valid key: all its rows must come back as zeros
        mask = masks.keep_from_key_padding(padding)
    elif kind == "empty_rows":
        mask = torch.rand(1, 1, q_len, key_len, generator=gen) > 0.5
        mask[..., ::7, :] = False
    tensors = [t.to(device=device, dtype=dtype) for t in (query, key, value)]
    return tensors, (mask.to(device) if mask is not None else None), causal, heads != kv_heads


def check(device: torch.device, dtypes: List[torch.dtype], repeats: int) -> List[dict]:
    rows = []
    for name, case in CASES.items():
        for dtype in dtypes:
            (query, key, value), mask, causal, gqa = _inputs(case, dtype, device)
            kwargs = dict(is_causal=causal, enable_gqa=gqa)
            with torch.no_grad():
                reference = npu_port.attention(
                    query.cpu().double(),
                    key.cpu().double(),
                    value.cpu().double(),
                    mask.cpu() if mask is not None else None,
                    kernel="math",
                    **kwargs,
                )
                call = AttentionCall.from_arguments(query, key, value, mask, **kwargs)
                for kernel in npu_port.kernels():
                    row = {"case": name, "dtype": str(dtype).replace("torch.", ""), "kernel": kernel.name}
                    reasons = kernel.reasons(call)
                    if reasons:
                        row["refused"] = [str(r) for r in reasons]
                        rows.append(row)
                        continue
                    try:
                        out = npu_port.attention(query, key, value, mask, kernel=kernel, **kwargs)
                        row["max_abs_diff"] = (out.cpu().double() - reference).abs().max().item()
                        row["nan"] = bool(torch.isnan(out).any())
                        row["ok"] = not row["nan"] and row["max_abs_diff"] <= TOLERANCE[dtype]
                        run = functools.partial(npu_port.attention, query, key, value, mask, kernel=kernel, **kwargs)
                        row["seconds"] = spread(repeat(run, device, repeats, warmup=1)).median
                    except Exception as exc:  # a kernel that breaks on this device is a finding, not a crash
                        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                        row["ok"] = False
                    rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", default="float16,bfloat16,float32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "npu":
        import torch_npu  # noqa: F401  (registers the npu device)
    dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    rows = check(device, dtypes, args.repeats)
    failures = 0
    for row in rows:
        label = f"{row['case']:<22} {row['dtype']:<9} {row['kernel']:<16}"
        if "refused" in row:
            print(f"{label} refused: {'; '.join(row['refused'])}")
        elif "error" in row:
            failures += 1
            print(f"{label} ERROR: {row['error']}")
        else:
            failures += not row["ok"]
            status = "ok" if row["ok"] else "MISMATCH"
            print(f"{label} {status:<8} max|diff| {row['max_abs_diff']:.2e}  {row['seconds'] * 1e3:9.2f} ms")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"device": str(device), "torch": torch.__version__, "rows": rows}, fh, indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
