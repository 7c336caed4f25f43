"""Attention on this machine: the NPU's chip, torch's SDPA switches, and every npu-port kernel with the reasons it
cannot run.

The SDPA switches are process-wide (``torch.backends.cuda.enable_*_sdp``); in a fresh process they read torch's
defaults, so this mostly documents which SDPA kernels exist for the device at hand. The kernel list is the same one
``npu-port kernels`` prints: a kernel that cannot run says why, and a package that is installed but broken warns,
because it looks available to other libraries (diffusers, transformers) that then fail at the first call.
"""

from __future__ import annotations

from typing import Dict, List

from .facts import Facts, needs_torch
from .finding import Finding

#: torch.backends.cuda switch -> SDPA backend name (each read only if this torch has the switch).
_SDPA_SWITCHES = {
    "flash": "flash_sdp_enabled",
    "mem_efficient": "mem_efficient_sdp_enabled",
    "math": "math_sdp_enabled",
    "cudnn": "cudnn_sdp_enabled",
}
#: Which SDPA backends have kernels for each device type (math runs everywhere).
_SDPA_KERNELS = {"cuda": ("flash", "mem_efficient", "cudnn", "math"), "cpu": ("flash", "math")}


@needs_torch
def check_sdpa_backends(facts: Facts) -> List[Finding]:
    from ..device.detect import backend_status

    cuda_backends = facts.torch.backends.cuda
    enabled: Dict[str, bool] = {
        name: bool(getattr(cuda_backends, switch)())
        for name, switch in _SDPA_SWITCHES.items()
        if hasattr(cuda_backends, switch)
    }
    on_cuda = backend_status("cuda").available
    device = "cuda" if on_cuda else "cpu"
    kernels = list(_SDPA_KERNELS[device])
    details = {"enabled": enabled, "device": device}
    if on_cuda and hasattr(cuda_backends, "is_flash_attention_available"):
        details["flash_attention_available"] = bool(cuda_backends.is_flash_attention_available())
        if not details["flash_attention_available"]:
            kernels.remove("flash")
    usable = [name for name in kernels if enabled.get(name, False)]
    switches = ", ".join(f"{name}={'on' if on else 'off'}" for name, on in enabled.items())
    if not usable:
        return [
            Finding(
                "sdpa-backends",
                "SDPA backends",
                "warn",
                f"every SDPA backend that runs on {device} is switched off ({switches}): SDPA calls will fail",
                "torch.backends.cuda.enable_math_sdp(True) (or remove the code that disables it)",
                details,
            )
        ]
    npu_note = "; on npu, SDPA is torch_npu's own implementation" if facts.npu_usable else ""
    return [
        Finding(
            "sdpa-backends",
            "SDPA backends",
            "info",
            f"SDPA switches: {switches}; on {device} SDPA can run {', '.join(usable)}{npu_note}",
            None,
            details,
        )
    ]


@needs_torch
def check_attention_kernels(facts: Facts) -> List[Finding]:
    from ..attn.report import kernels_report

    return [_kernel_finding(entry) for entry in kernels_report()["kernels"]]


def _kernel_finding(entry: dict) -> Finding:
    name = entry["name"]
    details = {"reasons": entry["reasons"], "devices": entry["devices"]}
    if entry["available"]:
        return Finding(
            f"kernel-{name}", f"kernel {name}", "ok", f"{name}: available ({entry['summary']})", None, details
        )
    reasons = "; ".join(reason["message"] for reason in entry["reasons"])
    codes = [reason["code"] for reason in entry["reasons"]]
    if "package-broken" in codes:
        return Finding(
            f"kernel-{name}",
            f"kernel {name}",
            "warn",
            f"{name}: its package is installed but broken: {reasons}",
            "make the package importable (see its finding above) or uninstall it",
            details,
            code="package-broken",
        )
    summary = f"{name}: unavailable: {reasons}"
    return Finding(f"kernel-{name}", f"kernel {name}", "info", summary, None, details, code=codes[0])


#: The strategy that bounds attention memory where no fused kernel exists (strategies/chunked.yaml).
CHUNKED_FIX = (
    'for memory, the chunked strategy never holds the whole score matrix: npu_port.set_attention_strategy("chunked", '
    "target=pipe); else lower the resolution, frame count or batch; fused attention needs a 910B or newer"
)


@needs_torch
def check_npu_chip(facts: Facts) -> List[Finding]:
    """Whether NPU 0's chip has fused attention (:mod:`npu_port.device.chips`).

    On 910A and 310P (Atlas 300I Duo / Pro) FlashAttentionScore does not exist: torch_npu's SDPA always takes its
    math path and ``npu_fusion_attention`` is unavailable, so every attention call materialises the (B, H, Sq, Skv)
    scores. Nothing npu-port can pass changes that, hence a warning with what to do instead.
    """
    if not facts.npu_usable:
        return [Finding("npu-chip", "NPU chip", "info", "no NPU is usable here: the chip was not checked", None)]
    from ..device.chips import current_chip

    chip = current_chip()
    name = _device_name()
    details = {"device_name": name, "chip": chip.name if chip else None}
    if chip is None:
        return [
            Finding(
                "npu-chip",
                "NPU chip",
                "info",
                f"NPU 0 ({name}) is not a chip npu-port's table knows: whether it has fused attention is not judged",
                None,
                details,
            )
        ]
    details["fused_attention"] = chip.fused_attention
    if chip.fused_attention:
        return [
            Finding(
                "npu-chip",
                "NPU chip",
                "ok",
                f"NPU 0 is {name} ({chip.name}): fused attention available (npu_fusion_attention, "
                "npu_fused_infer_attention_score, SDPA's FlashAttentionScore path)",
                None,
                details,
            )
        ]
    return [
        Finding(
            "npu-chip",
            "NPU chip",
            "warn",
            f"NPU 0 is {name} ({chip.name}, {chip.product}): no fused attention on this chip, so every attention call "
            "builds the whole score matrix (SDPA always runs the math path; npu_fusion_attention is unavailable)",
            CHUNKED_FIX,
            details,
            code="chip",
        )
    ]


def _device_name() -> str:
    import torch

    try:
        return str(torch.npu.get_device_name(0))
    except Exception as exc:  # noqa: BLE001 - a driver that cannot name its device: say so, judge nothing more
        return f"unnamed NPU ({type(exc).__name__})"
