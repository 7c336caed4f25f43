"""NPU318: a ``torch.backends.cuda.matmul`` precision flag set (``allow_tf32 = True``): CUDA-only."""

from __future__ import annotations

import ast
from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule

PREFIX = "torch.backends.cuda.matmul."
#: The flags of ``torch.backends.cuda.matmul`` (torch 2.13).
FLAGS = (
    "allow_tf32",
    "fp32_precision",  # torch 2.9's spelling: "tf32" / "ieee"
    "allow_fp16_reduced_precision_reduction",
    "allow_bf16_reduced_precision_reduction",
)


@register_rule
class CudaTf32Flag(Rule):
    """An assignment to a ``torch.backends.cuda.matmul`` flag: ``allow_tf32``, ``fp32_precision``,
    ``allow_fp16_reduced_precision_reduction``, ``allow_bf16_reduced_precision_reduction``.

    The flag is read by CUDA's matmuls only: on an NPU it does nothing. With ``allow_tf32 = True`` CUDA computes
    float32 matmuls in TF32, so a project's CUDA outputs (and the tolerances it was tuned with) differ slightly from
    the NPU's full float32 ones. torch_npu's analogue is ``torch.npu.matmul.allow_hf32`` (HF32 on Ascend). The
    ``torch.backends.cudnn`` flags are left alone: ``benchmark`` and ``deterministic`` are read on other devices too.

    Example::

        torch.backends.cuda.matmul.allow_tf32 = True  # NPU318
    """

    code = "NPU318"
    name = "cuda-tf32-flag"
    message = "a `torch.backends.cuda.matmul` flag does nothing on an NPU"
    severity = "info"
    targets = ("npu", "cpu")
    fix = "manual"
    triggers = ("allow_tf32", "fp32_precision", "_reduced_precision_reduction")

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for node in source.of(ast.Assign, ast.AugAssign, ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]  # type: ignore[attr-defined]
            for target in targets:
                if not (isinstance(target, ast.Attribute) and target.attr in FLAGS):
                    continue
                qualified = source.resolve(target)
                if qualified and qualified.startswith(PREFIX):
                    flag = qualified[len(PREFIX) :]
                    tf32 = flag in ("allow_tf32", "fp32_precision")
                    analogue = " (torch_npu's analogue: `torch.npu.matmul.allow_hf32`)" if tf32 else ""
                    yield source.finding(
                        self,
                        target,
                        f"`{qualified}` does nothing on an NPU: CUDA's matmuls follow it, so CUDA's outputs differ "
                        f"slightly from the NPU's{analogue}",
                    )
