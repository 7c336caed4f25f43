"""Generate an image with a diffusers pipeline on this machine's device (NPU, GPU or CPU) and an attention strategy;
write the image and a JSON report (device, versions, strategy requested and resolved, time per step, peak memory).

    python scripts/inference_npu.py                                   # tiny built-in model, random weights
    python scripts/inference_npu.py --model ./sd-pipeline --prompt "a red fox" --profile ascend-910b
    python scripts/inference_npu.py --compare vanilla,sdpa,chunked,auto

The same as ``npu-port infer``; ``--help`` lists every option.
"""

import sys

from npu_port.cli.infer_cmd import main

if __name__ == "__main__":
    sys.exit(main())
