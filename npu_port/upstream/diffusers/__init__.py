"""The diffusers adapter: everything npu-port takes from diffusers, found by feature detection, in one place.

The pieces are declared by area, one module each, and resolved by one :class:`~npu_port.upstream.adapter.Adapter`
(:data:`ADAPTER`):

* :mod:`.attention` — attention modules and processors in each of diffusers' layouts (0.11's processor-less
  ``CrossAttention``, 0.12-0.14's ``cross_attention``, 0.15 onwards' ``attention_processor``), ``AttentionBlock``,
  pipelines and models as the integration recognises them;
* :mod:`.dispatch` — the attention dispatcher (0.35 onwards) and its backend registry;
* :mod:`.parallel` — hooks and context parallelism (``npu-port infer --nproc``);
* :mod:`.ops` — the modules whose functions and classes ``fuse_ops`` replaces;
* :mod:`.pipelines` — logging and the loggers npu-port quiets.

Only this package names diffusers' modules and attributes (a test enforces it). Public, documented APIs are
preferred wherever one exists; each piece says which it is.
"""

from __future__ import annotations

from ..adapter import Adapter
from . import attention, dispatch, ops, parallel, pipelines

LIBRARY = "diffusers"

ADAPTER = Adapter(LIBRARY, attention.PIECES + dispatch.PIECES + parallel.PIECES + ops.PIECES + pipelines.PIECES)
