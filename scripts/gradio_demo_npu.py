"""A local web demo of a diffusers pipeline on this machine's device (NPU, GPU or CPU): pick an attention strategy,
generate, see the time per step, the strategy auto resolved to and the peak memory; compare strategies side by side
with max |diff| and PSNR against the first.

    python scripts/gradio_demo_npu.py                                   # tiny built-in model, http://127.0.0.1:7860
    python scripts/gradio_demo_npu.py --model ./sd-pipeline --dtype float16 --strategy sdpa --port 0

Needs gradio: from a checkout, pip install -e ".[demo]". ``--help`` lists every option.
"""

import sys

from npu_port.demo.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
