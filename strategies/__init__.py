"""Built-in attention strategies (``*.yaml``) and device profiles (``profiles/*.yaml``), as data.

This folder sits at the top of the repository (where users look for it) and ships inside the wheel as
``npu_port.strategies``. The code that reads it is ``npu_port.strategy`` (schema, loader, registry).
"""
