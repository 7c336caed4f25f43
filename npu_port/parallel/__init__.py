"""Several devices for one generation: context parallelism (Ulysses, ring, both) through diffusers' ``_cp_plan``
hooks with npu-port's attention backend, CFG parallelism, and the launcher — all on torch.distributed and torchrun.

* :mod:`.layout` — the layout (Ulysses x ring x CFG) and its one-line errors;
* :mod:`.sequence` — Ulysses / ring attention with masks and the log-sum-exp;
* :mod:`.backend` — the ``"npu_port"`` diffusers attention backend (registered while used);
* :mod:`.cfg` — one guidance half per rank;
* :mod:`.session` — joining the process group and parallelizing a pipeline (the Python API);
* :mod:`.traffic` — bytes sent, for the scaling benchmark.
"""

from .layout import ParallelLayout
from .session import ParallelHandle, ParallelSession, start
from .traffic import TRAFFIC

__all__ = ["TRAFFIC", "ParallelHandle", "ParallelLayout", "ParallelSession", "start"]
