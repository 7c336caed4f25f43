"""NPU001: a file that cannot be read or parsed is listed, never a crash."""

from __future__ import annotations

from ..rule import Rule, register_rule


@register_rule
class SyntaxRule(Rule):
    """A file npu-port could not read: not valid Python for this interpreter, or not decodable. It is listed, not
    scanned, so nothing in it is known.

    Example: a Python 2 ``print "x"``, or a Latin-1 file without an encoding declaration."""

    code = "NPU001"
    name = "unreadable-file"
    message = "cannot be read as Python; not scanned"
    severity = "info"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    triggers = ("",)
