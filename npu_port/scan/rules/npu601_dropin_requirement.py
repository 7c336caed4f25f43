"""NPU601: flash-attn or xformers pinned in a requirements file."""

from __future__ import annotations

from typing import Iterator

from ..context import TextFile
from ..rule import Finding, Rule, register_rule
from ._misc import DEPENDENCY_FILES, DROP_IN_PACKAGES, dependencies


@register_rule
class DropInRequirement(Rule):
    """``flash-attn`` or ``xformers`` in a requirements file (a name with a version, ``name @ url``, a prebuilt wheel's
    URL, ``git+https://github.com/...``), a conda environment file (its dependencies or their ``pip:`` list) or a
    pyproject.toml (``[project]`` dependencies and optional dependencies).

    Without CUDA pip cannot build either (flash-attn's setup.py needs nvcc; xformers' wheels are CUDA builds), so
    ``pip install -r requirements.txt`` fails on an NPU or a CPU machine. The code that imports them works as it is
    under ``npu-port run``: its drop-ins serve ``import flash_attn`` and ``import xformers.ops``. Leave the pin out on
    the target (an environment marker, or a separate requirements file for CUDA machines).

    Example::

        flash-attn==2.5.8 --no-build-isolation     # NPU601
        xformers>=0.0.20                           # NPU601
    """

    code = "NPU601"
    name = "dropin-requirement"
    message = "pinned CUDA-only package that npu-port serves with a drop-in"
    severity = "handled"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    handled_by = "the flash_attn and xformers drop-ins (npu-port run)"
    triggers = ("flash-attn", "flash_attn", "flash-attention", "xformers", "Flash-Attn", "Flash_Attn")
    file_patterns = DEPENDENCY_FILES

    def check_text(self, source: TextFile) -> Iterator[Finding]:
        for number, package, _, _ in dependencies(source.path, source.lines):
            if package not in DROP_IN_PACKAGES:
                continue
            module = DROP_IN_PACKAGES[package]
            yield source.finding(
                self,
                number,
                f"`{package}` does not install without CUDA: leave it out on the target; npu-port run's drop-in "
                f"serves `import {module}`",
            )
