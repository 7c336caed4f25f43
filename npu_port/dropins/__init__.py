"""Drop-ins for packages a CUDA project imports but this machine cannot build (flash_attn, xformers), computed by
``npu_port.attention``, and the import hook that serves them (:mod:`.finder`; a real, working package always wins).

:func:`install_dropins` / :func:`uninstall_dropins` (:mod:`.install`) are what ``npu-port run`` calls.
Compiled-extension fallbacks use the same import hook and live in :mod:`npu_port.fallbacks`. Importing this package
imports no torch.
"""

from .install import install_dropins, uninstall_dropins

__all__ = ["install_dropins", "uninstall_dropins"]
