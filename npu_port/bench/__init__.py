"""``npu-port bench``: every attention strategy on the shapes that matter, timed, checked and plotted.

A user with new hardware (an Ascend NPU, a Hopper GPU, a CPU) needs one command that says which strategy to use
there, and why the others cannot run. The parts, one job each:

- :mod:`.shapes` — the named problem sizes (the NPU guides' sequence lengths, Stable Diffusion, ControlVideo) and
  ``custom:B,H,S,D``;
- :mod:`.choices` — the device, dtype, strategies and budget of a run, checked before any work;
- :mod:`.reference` — a shape's seeded inputs and the float64 answer on auto's parity slice;
- :mod:`.cells` — one (strategy, shape) cell: choose the kernel, measure its peak memory and its error against the
  reference, or record why it was refused;
- :mod:`.runner` — the run: shape by shape, the cells' calls timed in interleaved rounds
  (:mod:`npu_port.device.timing`);
- :mod:`.memory` — peak memory of one call (the device's allocator statistics, or a dispatch-mode tracker on CPU);
- :mod:`.results` — the record of a run and the machine it ran on; :mod:`.report` — the table, CSV and JSON;
- :mod:`.plot` — the PNG (matplotlib, imported only when a plot is asked for).

Nothing here is imported by ``import npu_port``; torch is imported by the modules that need it.
"""

from __future__ import annotations

from ..errors import NpuPortError


class BenchError(NpuPortError, ValueError):
    """A bench option naming a shape, strategy or device that does not exist here; the message lists valid ones."""


class BenchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a bench run, carrying what was measured until then (``report``, marked partial).

    A KeyboardInterrupt still, so a caller that does not look for it stops as on any Ctrl-C; ``npu-port bench``
    catches it, writes the partial report and exits with 130.
    """

    def __init__(self, report) -> None:
        super().__init__(report.stopped_because)
        self.report = report


__all__ = ["BenchError", "BenchInterrupted"]
