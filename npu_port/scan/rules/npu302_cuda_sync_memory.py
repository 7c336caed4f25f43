"""NPU302: ``torch.cuda`` synchronise / cache / memory-statistics calls, which have ``npu_port.device`` helpers."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import HELPERS, call_text, classify, cuda_calls, guarded_finding


@register_rule
class CudaSyncMemory(Rule):
    """``torch.cuda.synchronize()``, ``empty_cache()``, ``memory_allocated()``, ``max_memory_allocated()``,
    ``reset_peak_memory_stats()`` and ``mem_get_info()`` speak to CUDA only.

    Without CUDA, ``synchronize``, ``reset_peak_memory_stats`` and ``mem_get_info`` raise; ``empty_cache`` and the
    counters do nothing and answer 0 — on an NPU that means timings that do not wait for the device and memory
    reports that are always empty. ``npu-port run``'s redirect answers them for the target; ``npu-port fix``
    rewrites each to its ``npu_port.device`` helper (the same call on CUDA) under ``--target npu-port``. By default
    (torch >= 2.6) it writes torch's own: ``torch.accelerator.synchronize()``, and the memory calls on
    ``torch.get_device_module()`` (the CUDA module on CUDA, torch_npu's on an NPU; ``torch.accelerator``'s memory
    functions need torch 2.9), each but ``mem_get_info`` guarded by ``torch.accelerator.is_available()`` with what
    a CPU has to say — ``None`` for the actions, ``0`` for the counters — where the original raised or answered 0.
    ``mem_get_info`` has no CPU answer: it raises there, as before.

    Example::

        torch.cuda.synchronize()             # NPU302 -> npu_port.device.synchronize()
        peak = torch.cuda.max_memory_allocated()  # NPU302 -> npu_port.device.max_memory_allocated()
    """

    code = "NPU302"
    name = "cuda-sync-memory"
    message = "`torch.cuda` synchronise/memory call: use its npu_port.device helper"
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "safe"
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("cuda",)
    fix_imports = ("npu_port",)
    fix_replaces = tuple(f"torch.cuda.{name}" for name in HELPERS)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, name in cuda_calls(source):
            helper = HELPERS.get(name)
            if helper is not None:
                does = "raises" if classify(name) == "raises" else "does nothing for the NPU"
                yield guarded_finding(
                    source,
                    self,
                    call,
                    f"{call_text(name)} {does} without CUDA: use `{helper}()` (npu-port run redirects it)",
                )

    def rewrite(self, node: Any, finding: Finding) -> Optional[Any]:
        """``torch.cuda.synchronize(...)`` -> ``npu_port.device.synchronize(...)`` (the same arguments: a device,
        an index, or none — the current device, as torch.cuda's). The helper is the one the finding names, which the
        scan chose from the resolved name: the call's own spelling may be an alias (``from torch.cuda import
        synchronize as sync``; ``from torch.cuda import empty_cache as synchronize`` is no synchronize)."""
        import libcst as cst

        from ..targets import AVAILABLE, CPU_ANSWER, expression

        helper = next((h for h in HELPERS.values() if f"`{h}()`" in finding.message), None)
        if helper is None or not (isinstance(node, cst.Call) and isinstance(node.func, (cst.Name, cst.Attribute))):
            return None
        name = helper.rsplit(".", 1)[1]
        call = node.with_changes(func=cst.parse_expression(expression(name, self.target)))
        if self.target != "torch" or name not in CPU_ANSWER:
            return call
        return cst.IfExp(  # parenthesised: it stands wherever the call stood
            test=cst.parse_expression(AVAILABLE),
            body=call.with_changes(lpar=[], rpar=[]),
            orelse=cst.parse_expression(CPU_ANSWER[name]),
            lpar=node.lpar or [cst.LeftParen()],
            rpar=node.rpar or [cst.RightParen()],
        )
