"""Why something cannot run: a message for people and a stable code for programs.

Following xformers' ``not_supported_reasons``, a refusal is data, not a log line: a kernel's ``reasons(call)``
returns a list of :class:`Reason`; an empty list means it can run the call. Each reason states the value it saw and
the limit it needs ("head_dim 800 > 768 (npu_fusion_attention limit)"), so the user knows what to change. This module
depends on nothing else in npu-port, so the attention core and the device layer can both use it.
"""

from __future__ import annotations

import re
from typing import Any

_CODE = re.compile(r"^[a-z][a-z0-9-]*$")

#: The code of a reason that was recorded without one (an auto cache entry written before codes were kept).
UNKNOWN = "unknown"


class Reason(str):
    """One reason something cannot run.

    It *is* the message string (so ``reasons(call) -> list[str]`` holds and printing is trivial) and carries a
    short, stable ``code`` (lower-case words joined by dashes, e.g. ``"package-missing"``) for JSON and tests.
    """

    code: str

    def __new__(cls, code: str, message: str) -> "Reason":
        if not isinstance(code, str) or not _CODE.match(code):
            raise ValueError(f"a reason code is lower-case words joined by dashes, got {code!r}")
        obj = super().__new__(cls, message)
        obj.code = code
        return obj

    def __reduce__(self):  # keep the code through pickling (multiprocessing, caches)
        return (Reason, (self.code, str(self)))

    def as_dict(self) -> dict:
        return {"code": self.code, "message": str(self)}


def as_reason(value: Any, code: str = UNKNOWN) -> Reason:
    """``value`` itself if it is a :class:`Reason`, else its text with ``code`` — so that everything that collects
    reasons (errors, decisions) holds Reasons with codes, whatever a third-party kernel returned."""
    return value if isinstance(value, Reason) else Reason(code, str(value))
