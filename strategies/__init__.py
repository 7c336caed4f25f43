"""Built-in attention strategies and device profiles, as YAML files.

This folder sits at the top of the repository (where users look for it) and ships inside the wheel as
``npu_port.strategies``. The strategy registry that reads these files arrives with the strategies issue.
"""
