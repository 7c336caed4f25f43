"""Zero-change migration: everything ``npu-port run`` installs before a CUDA script's first import, in one place."""

from .activate import Activation, activate
from .overrides import override

__all__ = ["Activation", "activate", "override"]
