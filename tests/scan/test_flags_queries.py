"""What the round-2 device findings say and at which severity: the matmul precision flags (NPU318, info), the GPU
autocast queries (NPU319, deprecated), the memory / architecture queries (NPU304: handled where npu-port run answers
them, info where it does not) and a device variable compared with "cuda" (NPU390 at runtime: npu-port run rewrites
only ``.type`` checks)."""

from __future__ import annotations

from npu_port.scan.engine import scan

SOURCE = (
    "import torch\n"
    "torch.backends.cuda.matmul.allow_tf32 = True\n"
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False\n"
    "dtype = torch.get_autocast_gpu_dtype()\n"
    "reserved = torch.cuda.max_memory_reserved()\n"
    "arches = torch.cuda.get_arch_list()\n"
    "def clear(device):\n"
    "    if device == 'cuda':\n"
    "        pass\n"
    "    if device.type == 'cuda':\n"
    "        pass\n"
)

EXPECTED = [
    (
        2,
        "NPU318",
        "info",
        "`torch.backends.cuda.matmul.allow_tf32` does nothing on an NPU: CUDA's matmuls follow it, so CUDA's outputs "
        "differ slightly from the NPU's (torch_npu's analogue: `torch.npu.matmul.allow_hf32`)",
    ),
    (
        3,
        "NPU318",
        "info",
        "`torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction` does nothing on an NPU: CUDA's matmuls "
        "follow it, so CUDA's outputs differ slightly from the NPU's",
    ),
    (
        4,
        "NPU319",
        "deprecated",
        "`torch.get_autocast_gpu_dtype()` is deprecated and speaks of CUDA's autocast, not the NPU's: use "
        "`torch.get_autocast_dtype(device_type, ...)`",
    ),
    (
        5,
        "NPU304",
        "handled",
        "`torch.cuda.max_memory_reserved()` answers 0 without CUDA, not the NPU's figure; npu-port run answers it for "
        "the target, elsewhere ask the target's module (`torch.get_device_module(device)`)",
    ),
    (
        6,
        "NPU304",
        "info",
        "`torch.cuda.get_arch_list()` answers [] without CUDA, not the NPU's figure; ask the target's module "
        "(`torch.get_device_module(device)`)",
    ),
    (
        8,
        "NPU390",
        "runtime",
        'a device compared with `"cuda"` is not equal to the target\'s (`npu`, `cpu`): the CUDA branch is skipped '
        "there; compare with the device the project runs on",
    ),
    (
        10,
        "NPU390",
        "handled",
        "a device-type check that expects CUDA fails or takes another path on the target",
    ),
]


def test_each_finding_says_what_breaks_at_its_severity(tmp_path):
    path = tmp_path / "flags.py"
    path.write_text(SOURCE, encoding="utf-8")
    found = sorted((f.line, f.code, f.severity, f.message) for f in scan([str(path)]).findings)
    assert found == EXPECTED
