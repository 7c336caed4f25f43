"""Zero-change migration: everything ``npu-port run`` installs before a CUDA script's first import, in one place."""

from .activate import Activation, activate

__all__ = ["Activation", "activate"]
