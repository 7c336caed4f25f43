"""Recommended Ascend settings for diffusion inference, and Ascend variables set to values torch_npu refuses.

The recommendations are the ascend-910b profile's (from the Ascend PyTorch guides): the level-2 task queue,
expandable allocator segments, precompiled binary kernels, and the original dtypes kept. On a usable NPU a missing
one is a warning; elsewhere it is only information. Values are validated by the device layer's option checker
(:mod:`npu_port.device.npu_options`), so the doctor and ``apply_npu_options`` agree on what is valid; an invalid
value is an error because torch_npu fails on it late (or silently ignores it).
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

from .facts import Facts
from .finding import Finding

#: Variable -> (recommended value, why), as the ascend-910b profile sets them.
RECOMMENDED_ENV: Dict[str, Tuple[str, str]] = {
    "TASK_QUEUE_ENABLE": ("2", "the level-2 operator launch pipeline (binary kernels only)"),
    "PYTORCH_NPU_ALLOC_CONF": ("expandable_segments:True", "expandable segments, less allocator fragmentation"),
}
#: How to set every recommendation at once: the profile that carries them, through the device layer's checker.
APPLY_ALL = 'import npu_port; npu_port.apply_npu_options("ascend-910b")'


def check_npu_settings(facts: Facts) -> List[Finding]:
    problems = _validation_problems(facts)
    findings = [_recommended_env(facts, name, problems.pop(name, None)) for name in RECOMMENDED_ENV]
    findings += [_jit_compile(facts), _precision_mode(facts)]
    findings += [
        Finding(f"setting-{name}", name, status, summary, fix, {"value": facts.environ.get(name)})
        for name, (status, summary, fix) in problems.items()
    ]
    findings.append(
        Finding(
            "settings-profile",
            "all recommended settings",
            "info",
            "the ascend-910b profile carries all of these; apply_npu_options checks and sets them (only on an NPU)",
            APPLY_ALL,
        )
    )
    return findings


def _missing_status(facts: Facts) -> str:
    return "warn" if facts.npu_usable else "info"


def _recommended_env(facts: Facts, name: str, problem: Optional[Tuple[str, str, str]]) -> Finding:
    recommended, why = RECOMMENDED_ENV[name]
    value = facts.environ.get(name)
    details = {"value": value, "recommended": recommended}
    if problem is not None:
        status, summary, fix = problem
        return Finding(f"setting-{name}", name, status, summary, fix, details)
    if value == recommended or (value and recommended in value.split(",")):
        return Finding(f"setting-{name}", name, "ok", f"{name}={value} ({why})", None, details)
    shown = "unset" if value is None else f"{value!r}"
    where = "" if facts.npu_usable else " (matters on an NPU only)"
    return Finding(
        f"setting-{name}",
        name,
        _missing_status(facts),
        f"{name} is {shown}; {recommended} is recommended: {why}{where}",
        f"export {name}={recommended}",
        details,
    )


def _jit_compile(facts: Facts) -> Finding:
    fix = "torch_npu.npu.set_compile_mode(jit_compile=False), early in the script"
    if not facts.npu_usable:
        return Finding(
            "setting-jit-compile",
            "binary kernels",
            "info",
            "on an NPU, set_compile_mode(jit_compile=False) selects precompiled kernels (the first image otherwise "
            "compiles operators for minutes)",
            fix,
        )
    import torch_npu

    if torch_npu.npu.is_jit_compile_false():
        return Finding(
            "setting-jit-compile", "binary kernels", "ok", "precompiled binary kernels are the default here", None
        )
    return Finding(
        "setting-jit-compile",
        "binary kernels",
        "warn",
        "operators are compiled online by default on this chip: the first image takes minutes",
        fix,
    )


def _precision_mode(facts: Facts) -> Finding:
    return Finding(
        "setting-precision-mode",
        "ACL_PRECISION_MODE",
        "info",
        "ACL_PRECISION_MODE=must_keep_origin_dtype keeps float32 ops in float32 (a per-process option, unreadable "
        "here; the default is allow_fp32_to_fp16 on Atlas training chips)",
        'torch_npu.npu.set_option({"ACL_PRECISION_MODE": "must_keep_origin_dtype"})',
    )


def _validation_problems(facts: Facts) -> Dict[str, Tuple[str, str, str]]:
    """Ascend variables set here that the option checker refuses (error) or warns about: {name: (status, summary, fix)}.

    Each variable is checked on its own so that every bad one is reported, not just the first. Without the checker
    (torch cannot be imported, so the device layer cannot load), nothing is reported here.
    """
    checker = _option_checker(facts)
    if checker is None:
        return {}
    apply_npu_options, known, option_error = checker
    problems: Dict[str, Tuple[str, str, str]] = {}
    for name in known:
        value = facts.environ.get(name)
        if value is None:
            continue
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            try:
                report = apply_npu_options({"env": {name: value}}, dry_run=True)
            except option_error as exc:
                problems[name] = ("error", str(exc), f"fix or unset {name}")
                continue
        if report.warnings:
            problems[name] = ("warn", "; ".join(report.warnings), f"unset {name} unless you mean it")
    return problems


def _option_checker(facts: Facts) -> Optional[Tuple[Any, Any, Any]]:
    if facts.torch is None:
        return None
    try:
        from ..device.npu_options import ENV_VARIABLES, apply_npu_options
    except ImportError:
        return None
    from ..errors import NpuOptionError

    return apply_npu_options, tuple(ENV_VARIABLES), NpuOptionError
