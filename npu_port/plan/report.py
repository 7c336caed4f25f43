"""A plan as text: one row per signature, then why each signature runs where it does, then the summary line."""

from __future__ import annotations

from typing import List, Sequence

from .assess import Plan, SignaturePlan

_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_bytes(size: int) -> str:
    """``1536`` -> ``1.5 KiB``; below 1 KiB in bytes."""
    for unit, scale in _UNITS:
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def shape_text(shape: Sequence[int]) -> str:
    return "x".join(str(size) for size in shape)


def _kernel_cell(item: SignaturePlan) -> str:
    if item.kernel is None:
        return "none can run it"
    if item.measured:
        return f"{item.kernel} (auto measures {len(item.runnable)})"
    return item.kernel


def _row(index: int, item: SignaturePlan) -> List[str]:
    sig = item.signature
    kv = shape_text(sig.key) if sig.key[-1] == sig.value[-1] else f"{shape_text(sig.key)} v:{sig.value[-1]}"
    flags = [name for name, on in (("causal", sig.causal), ("lse", sig.lse), ("grad", sig.grad)) if on]
    if sig.dropout_p:
        flags.append(f"dropout {sig.dropout_p:g}")
    if not sig.default_scale:
        flags.append(f"scale {sig.scale:.4g}")
    return [
        str(index),
        str(item.count),
        shape_text(sig.query),
        kv,
        sig.dtype,
        sig.mask.describe() if sig.mask is not None else "-",
        ",".join(flags) or "-",
        ",".join(item.components) or "-",
        "yes" if sig.routed else "no",
        _kernel_cell(item),
        "yes" if item.fused else "no",
        format_bytes(item.bytes["total"]),
    ]


HEADER = ["#", "calls", "query", "key/value", "dtype", "mask", "flags", "from", "routed", "kernel", "fused", "memory"]
#: Columns aligned to the right (numbers).
_RIGHT = {0, 1, 11}


def table(rows: List[List[str]]) -> List[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(w) if i in _RIGHT else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    ]


#: op-plugin's rule for torch_npu's SDPA (torch_npu 2.13 op docs; the sdpa kernel's ``fused`` follows it).
SDPA_ON_NPU = (
    "torch_npu sends SDPA to FlashAttentionScore only with a bool mask or none, heads <= 2048, head dim <= 512, query "
    "heads a multiple of key heads, on 910B or newer; otherwise it computes the whole score matrix"
)


def _status(item: SignaturePlan, plan: Plan) -> str:
    """What happens to the signature's calls on the target, in a few words."""
    if item.kernel is None:
        return f"no candidate of strategy {plan.strategy} can run it on {plan.target.describe()}"
    if item.measured:
        return (
            f"auto measures {', '.join(item.runnable)} at run time and keeps the fastest correct one; counted as "
            f"{item.kernel}, the first in its order ({'fused' if item.fused else 'not fused'})"
        )
    return f"{item.kernel}, {'fused' if item.fused else 'not fused'}"


def _reason_lines(index: int, item: SignaturePlan, plan: Plan, verbose: bool) -> List[str]:
    sig = item.signature
    head = f"#{index} {_status(item, plan)}"
    if not sig.routed:
        where = ", ".join(item.sites) or "an unknown place"
        head += (
            f"; not routed: a direct F.scaled_dot_product_attention ({where}) that no npu-port integration routes, "
            f"so on {plan.target.device_type} the device's own SDPA runs it (judged as the sdpa kernel)"
        )
    if item.kernel == "sdpa" and not item.fused and plan.target.device_type == "npu":
        head += f"; {SDPA_ON_NPU}"
    lines = [head]
    shown = item.every_kernel if verbose and item.every_kernel is not None else item.reasons
    for name, reasons in shown.items():
        if name == item.kernel:
            continue
        if not reasons:
            candidate = name in item.reasons
            if not candidate:
                why = "not a candidate of this strategy"
            elif item.measured:
                why = "measured too"
            else:
                why = f"comes after {item.kernel}"
            lines.append(f"    {name}: could run it ({why})")
            continue
        for reason in reasons:
            lines.append(f"    {name} [{reason.code}] {reason}")
    return lines


def format_plan(plan: Plan, verbose: bool = False) -> str:
    """The whole report: a header line, the table, the reasons, the largest call, and the summary line last."""
    dtype = f", {plan.dtype}" if plan.dtype else ""
    model = f"{plan.model} " if plan.model else ""
    lines = [
        f"plan: {model}on {plan.target.describe()}, strategy {plan.strategy} ({plan.select}: "
        f"{', '.join(plan.candidates)}){dtype}",
        f"recorded on this machine: {plan.calls} attention calls in {len(plan.signatures)} signatures",
    ]
    if plan.signatures:
        lines.append("")
        lines += table([HEADER] + [_row(i, item) for i, item in enumerate(plan.signatures, 1)])
        reasons = [line for i, item in enumerate(plan.signatures, 1) for line in _reason_lines(i, item, plan, verbose)]
        if reasons:
            lines += ["", "why:"] + [f"  {line}" for line in reasons]
        largest = max(plan.signatures, key=lambda item: item.bytes["total"])
        index = plan.signatures.index(largest) + 1
        lines += [
            "",
            f"largest call: #{index}, {format_bytes(largest.bytes['total'])} (inputs "
            f"{format_bytes(largest.bytes['inputs'])}, output {format_bytes(largest.bytes['output'])}, kernel "
            f"{format_bytes(largest.bytes['kernel'])})",
        ]
    for message, count in plan.unreadable.items():
        lines.append(f"not recorded: {count} SDPA call(s) npu-port cannot read ({message})")
    for decline in plan.declines:
        lines.append(f"not routed: {decline['message']}")
    if plan.unrunnable:
        lines.append(
            f"{plan.unrunnable} call(s) would fail on {plan.target.describe()} with strategy {plan.strategy}: no "
            "candidate can run them (see why above)"
        )
    lines.append(plan.summary())
    return "\n".join(lines)
