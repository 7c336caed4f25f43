"""The flash_attn and xformers drop-ins: ``import flash_attn`` / ``import xformers.ops`` in a CUDA project work on an
NPU or a CPU, computing through ``npu_port.attention`` (the active strategy's kernel).

:func:`install_dropins` registers them with the import hook (:mod:`npu_port.dropins.finder`), which also presents
package metadata, so ``importlib.util.find_spec("flash_attn")``, ``importlib.metadata.version("flash-attn")`` and the
availability checks of diffusers and transformers see them. By default (mode ``"missing"``) a real, installed
package always wins: the stand-in is served only where no real one can be found. ``broken=True`` (mode ``"broken"``)
also serves it where the real package is installed but fails to load (a wheel built for another torch or CUDA: the
failure is logged), which is what the guarded imports ``npu-port fix`` writes ask for, after the real import failed.
``force=True`` (mode ``"always"``) serves the stand-ins even where a real package works. :func:`uninstall_dropins`
undoes it all.
"""

from __future__ import annotations

import dataclasses
from typing import List

from ..hits import HitLog
from .finder import Replacement, register, unregister

_HERE = "npu_port.dropins."
#: The calls of the flash_attn drop-in's functions that the project made, each counted once when it returned, with
#: where it was made (``npu-port run --report`` lists them under NPU110; ``npu_port.activate`` clears it).
CALLS = HitLog()
#: The same for the xformers drop-in's ``memory_efficient_attention`` (listed under NPU112).
XFORMERS_CALLS = HitLog()

#: The drop-ins, as registration templates (installing registers fresh copies).
DROP_INS = (
    Replacement(
        "flash_attn",
        {
            "flash_attn": _HERE + "flash_attn_impl",
            "flash_attn.flash_attn_interface": _HERE + "flash_attn_impl",
            "flash_attn.bert_padding": _HERE + "flash_attn_bert_padding",
        },
        distribution="flash-attn",
        version="2.7.4",
    ),
    Replacement(
        "xformers",
        {
            "xformers": _HERE + "xformers_impl",
            "xformers.ops": _HERE + "xformers_ops_impl",
            "xformers.ops.fmha": _HERE + "xformers_fmha_impl",
            "xformers.ops.fmha.attn_bias": _HERE + "xformers_attn_bias_impl",
        },
        distribution="xformers",
        version="0.0.32.post2",
    ),
)


def install_dropins(*names: str, force: bool = False, broken: bool = False) -> List[str]:
    """Register the drop-ins (``names``: only these, e.g. ``"flash_attn"``; none: all); returns their names.
    ``force``: serve them even where a real package works; ``broken``: also where a real one fails to load."""
    known = [template.name for template in DROP_INS]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"no drop-in named {', '.join(map(str, unknown))}; the drop-ins are {', '.join(known)}")
    mode = "always" if force else "broken" if broken else "missing"
    chosen = [template for template in DROP_INS if not names or template.name in names]
    for template in chosen:
        register(dataclasses.replace(template, mode=mode, served=[], reason=None))
    return [template.name for template in chosen]


def uninstall_dropins() -> None:
    """Unregister the drop-ins; modules they served leave ``sys.modules`` (a real package imports afresh)."""
    for template in DROP_INS:
        unregister(template.name)
