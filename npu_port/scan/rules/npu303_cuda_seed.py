"""NPU303: ``torch.cuda.manual_seed`` / ``manual_seed_all`` seed CUDA's generators only."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import call_text, live_cuda_calls

SEEDING = ("manual_seed", "manual_seed_all", "seed", "seed_all")


@register_rule
class CudaSeed(Rule):
    """``torch.cuda.manual_seed(s)`` (and ``manual_seed_all``, ``seed``, ``seed_all``) seed CUDA's generators only.

    Without CUDA the seed is queued for a CUDA that never starts: nothing fails, but the NPU's generator is never
    seeded, so runs are not reproducible. ``npu-port run`` seeds the target's generator instead. The change,
    ``npu_port.device.manual_seed(s)`` (``torch.manual_seed``: every device's generator), also reseeds the CPU
    generator, which changes the random stream on CUDA too — an unsafe fix, which ``npu-port fix`` does not make yet
    (it lists the finding); usually a ``torch.manual_seed`` call beside it already does the job and this line can go.

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

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, name in live_cuda_calls(source):
            if name in SEEDING:
                yield source.finding(
                    self,
                    call,
                    f"{call_text(name)} seeds CUDA only (a no-op without it): use `torch.manual_seed()` or "
                    "`npu_port.device.manual_seed()` (npu-port run seeds the target)",
                )
