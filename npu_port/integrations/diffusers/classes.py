"""The diffusers classes the integration depends on, as the diffusers adapter finds them — whatever the version.

diffusers is optional for npu-port, and importing it is not free (and on a machine with a broken torch_npu, importing
diffusers' attention modules itself fails on ``libhccl.so``). So nothing in this package imports diffusers at module
level: every diffusers class is found by :mod:`npu_port.upstream.diffusers` (the pieces of its ``attention`` area,
each in every layout diffusers has had: 0.11's processor-less ``CrossAttention``, 0.12-0.14's ``cross_attention``,
0.15 onwards' ``attention_processor``), when a target is first applied to. :func:`load` gives them as one
:class:`DiffusersClasses`, and names the cause when diffusers itself cannot be imported.
"""

from __future__ import annotations

from ..._optional import extra_hint, installed_version
from ...upstream.diffusers import attention as upstream
from ...upstream.diffusers.attention import DiffusersClasses

__all__ = ["DiffusersClasses", "import_error", "load"]


def import_error(exc: BaseException) -> ImportError:
    """The error for a diffusers that cannot be imported, saying what to do.

    Only a missing diffusers gets the install hint of npu-port's ``diffusers`` extra: an installed one (a project's
    pinned 0.11.1, say) would be upgraded by it, and the project's own imports broken. npu-port works with the
    version that is there, so the message says which it is and that its import is what needs fixing.
    """
    detail = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    version = installed_version("diffusers")
    if version is None:
        missing = f"npu-port's diffusers integration needs diffusers, which is not installed ({detail})"
        return ImportError(f"{missing}; {extra_hint('diffusers')}")
    hint = "fix that import (npu-port works with diffusers 0.11 onwards; upgrading diffusers is not needed)"
    if "huggingface_hub" in detail:
        hint += "; an old diffusers needs the huggingface_hub of its time, e.g. pip install 'huggingface_hub<0.26'"
    return ImportError(f"diffusers {version} is installed but cannot be imported ({detail}); {hint}")


def _detect() -> DiffusersClasses:
    import diffusers  # noqa: F401 - the library itself: its failure is the one to report

    return upstream.classes()


def load() -> DiffusersClasses:
    """The diffusers classes of the installed version (see :class:`DiffusersClasses`), importing diffusers on the
    first call. Each is found once by the adapter; a piece it cannot find is None here, and the integration that
    needs it declines.

    Raises :class:`ImportError` naming the cause when diffusers is missing or cannot be imported (see
    :func:`import_error`); an old diffusers is described, not refused.
    """
    try:
        return _detect()
    except Exception as exc:  # a broken optional dependency of diffusers (torch_npu without CANN) lands here too
        raise import_error(exc) from exc
