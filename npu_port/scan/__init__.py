"""``npu-port scan``: what in a project will break on an NPU, a CPU or a GPU without CUDA-only builds, where, and
what npu-port already handles — before porting it.

:mod:`.rule` (what a rule is, the registry), :mod:`.rules` (one module per rule), :mod:`.context` (a file and its
names resolved through its imports), :mod:`.engine` (files, reading, suppressions, parallel scan), :mod:`.report`
(text, JSON, CSV, SARIF).
"""

from .engine import ScanError, ScanResult, scan
from .rule import Finding, Rule, register_rule, rules

__all__ = ["Finding", "Rule", "ScanError", "ScanResult", "register_rule", "rules", "scan"]
