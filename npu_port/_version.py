"""The single source of the package version (read by setup.cfg and ``npu-port --version``)."""

__version__ = "0.1.0"
