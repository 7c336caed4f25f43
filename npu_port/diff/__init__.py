"""``npu-port diff``: record two runs module by module and find where their outputs first part.

- :func:`capture` (``capture.py``): hooks on every module and on npu-port's attention router, streamed to a dump;
- :class:`Dump` (``dump.py``): the dump format (JSON index, JSON-lines records, safetensors for full tensors);
- :func:`compare_dumps` (``compare.py``): per module and step, error against per-dtype tolerances, the first
  divergence and whether it is the origin (by the errors, or by re-running side B's module: ``rerun.py``);
- :func:`report_text` (``text.py``) and :func:`write_plot` (``plot.py``, matplotlib): the report read by a person;
- :func:`bisect` (``bisect.py``): which setting parts two runs, and on which modules; :class:`PipelineRunner`
  (``runner.py``) runs a loaded pipeline for it.
"""

from .bisect import BisectResult, Scope, bisect
from .capture import Capture, capture
from .compare import DiffReport, compare_dumps
from .dump import Dump, DumpError
from .plot import write_plot
from .runner import PipelineRunner
from .text import report_text

__all__ = [
    "BisectResult",
    "Capture",
    "DiffReport",
    "Dump",
    "DumpError",
    "PipelineRunner",
    "Scope",
    "bisect",
    "capture",
    "compare_dumps",
    "report_text",
    "write_plot",
]
