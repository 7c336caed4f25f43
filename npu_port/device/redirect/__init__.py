"""The reversible cuda -> device redirect (see :mod:`.install`)."""

from .install import CudaRedirect, active_target, patched_attributes, redirect_cuda

__all__ = ["CudaRedirect", "active_target", "patched_attributes", "redirect_cuda"]
