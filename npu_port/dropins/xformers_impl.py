"""npu-port's stand-in for the ``xformers`` package: only what CUDA projects use of it, ``xformers.ops`` (served
from :mod:`npu_port.dropins.xformers_ops_impl`), computed by ``npu_port.attention`` on any device."""

from __future__ import annotations
