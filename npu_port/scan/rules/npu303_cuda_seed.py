"""NPU303: ``torch.cuda.manual_seed`` / ``manual_seed_all`` seed CUDA's generators only."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import call_text, cuda_calls, guarded_finding

SEEDING = ("manual_seed", "manual_seed_all", "seed", "seed_all")


@register_rule
class CudaSeed(Rule):
    """``torch.cuda.manual_seed(s)`` (and ``manual_seed_all``, ``seed``, ``seed_all``) seed CUDA's generators only.

    Without CUDA the seed is queued for a CUDA that never starts: nothing fails, but the NPU's generator is never
    seeded, so runs are not reproducible. ``npu-port run`` seeds the target's generator instead. The change,
    ``npu_port.device.manual_seed(s)`` (``torch.manual_seed``: every device's generator), also reseeds the CPU
    generator, which changes the random stream on CUDA too — an unsafe fix: ``npu-port fix --unsafe-fixes`` writes
    ``torch.manual_seed(s)`` (``torch.seed()`` for ``seed()`` / ``seed_all()``); usually a ``torch.manual_seed`` call
    beside it already does the job and this line can go.

    Example::

        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)  # NPU303
    """

    code = "NPU303"
    name = "cuda-seed"
    message = "`torch.cuda.manual_seed` seeds CUDA only: the NPU generator stays unseeded"
    severity = "handled"
    targets = ("npu",)
    fix = "unsafe"
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("cuda",)  # every form names cuda: torch.cuda.* or a "cuda" device
    fix_imports = ("torch",)
    fix_replaces = tuple(f"torch.cuda.{name}" for name in SEEDING)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, name in cuda_calls(source):
            if name in SEEDING:
                yield guarded_finding(
                    source,
                    self,
                    call,
                    f"{call_text(name)} seeds CUDA only (a no-op without it): use `torch.manual_seed()` or "
                    "`npu_port.device.manual_seed()` (npu-port run seeds the target)",
                )

    def rewrite(self, node: Any, finding: Finding) -> Optional[Any]:
        """``torch.cuda.manual_seed(s)`` / ``manual_seed_all(s)`` -> ``torch.manual_seed(s)``; ``seed()`` /
        ``seed_all()`` -> ``torch.seed()``: every device's generator, the CPU's too (why it is unsafe)."""
        import libcst as cst

        # what the call resolves to, as the finding names it (the spelling may be an alias), as NPU302 does
        seeding = next((s for s in SEEDING if call_text(s) in finding.message), None)
        if seeding is None or not isinstance(node, cst.Call):
            return None
        if seeding.startswith("manual_seed"):
            return node.with_changes(func=cst.parse_expression("torch.manual_seed"))
        return node.with_changes(func=cst.parse_expression("torch.seed"))
