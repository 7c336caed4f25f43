"""``npu-port doctor``: what is wrong with this machine for running ported code, and how to fix it.

Each check returns :class:`Finding` objects (status, one-line summary, one-line fix); :func:`run_doctor` runs them
all in a safe order and never raises from a check. Importing this package imports no torch: on the machines the
doctor is for, ``import torch`` itself may be what is broken.
"""

from .finding import Finding, exit_code
from .run import DoctorResult, run_doctor

__all__ = ["DoctorResult", "Finding", "exit_code", "run_doctor"]
