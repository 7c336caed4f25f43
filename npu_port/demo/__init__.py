"""The Gradio demo (``scripts/gradio_demo_npu.py``, ``python -m npu_port.demo``): one loaded pipeline, a strategy
picker, timings and peak memory per image, and a side-by-side strategy comparison with max |diff| and PSNR.

:mod:`.app` holds the UI (:func:`~.app.build_demo`) and the small pure helpers it uses (request checking,
formatting, the strategy list), which tests call without a browser. Gradio is imported only when the UI is built:
``import npu_port.demo`` works without it.
"""

from .app import build_demo, require_gradio

__all__ = ["build_demo", "require_gradio"]
