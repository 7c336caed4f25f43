"""NPU320: CUDA work when the module is imported (module or class level, default arguments, decorators)."""

from __future__ import annotations

import ast
from typing import Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import (
    AUTOCAST,
    GENERATOR,
    GRAD_SCALER,
    RAISES,
    argument,
    at_import_time,
    classify,
    cuda_api_name,
    cuda_guarded,
    live_cuda_literal,
)


@register_rule
class CudaAtImport(Rule):
    """CUDA work that runs when the module is imported — at module or class level, in a default argument
    (``def f(device=torch.cuda.current_device())``) or a decorator: a ``torch.cuda`` call that raises without
    CUDA, ``.cuda()``, a tensor made or moved to ``"cuda"``, ``torch.Generator("cuda")``.

    Without CUDA ``import`` of the module itself fails, and with it every module that imports it — before any
    ``if torch.cuda.is_available()`` in the caller can help. ``npu-port run`` installs its redirect before the
    project is imported, so under it these lines work; to make the module importable anywhere, move the work into
    the function that needs it (a default of ``None`` resolved inside the call). Lines that run only where CUDA is
    (under ``if torch.cuda.is_available():``, the ``"cuda"`` of ``"cuda" if torch.cuda.is_available() else "cpu"``)
    are not reported here: importing does not fail there, and the rule of the call itself reports it as ``guarded``.

    Example::

        DEVICE = torch.cuda.current_device()            # NPU320
        def sample(n, device=torch.cuda.current_device()):  # NPU320
            ...
    """

    code = "NPU320"
    name = "cuda-at-import"
    message = "CUDA work at import time: importing this module fails without CUDA"
    severity = "import"
    targets = ("npu", "cpu")
    fix = "manual"
    triggers = ("cuda",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in source.calls():
            what = self._what(source, call, qualified)
            if what and at_import_time(source, call) and not cuda_guarded(source, call):
                yield source.finding(
                    self,
                    call,
                    f"{what} runs at import time: importing this module fails without CUDA; move it into the "
                    "function that uses it (npu-port run handles it)",
                    at=None if cuda_api_name(qualified) else _device_argument(call),
                )

    @staticmethod
    def _what(source: PythonFile, call: ast.Call, qualified: Optional[str]) -> Optional[str]:
        name = cuda_api_name(qualified)
        if name is not None:
            return f"`torch.cuda.{name}()`" if classify(name) == RAISES else None
        if qualified in GENERATOR:
            return '`torch.Generator("cuda")`' if live_cuda_literal(source, argument(call, 0, "device")) else None
        if qualified in ("torch.device", "torch.set_default_device"):  # a device object alone touches nothing
            return None
        if qualified in GRAD_SCALER or qualified in AUTOCAST:  # these warn and disable themselves: NPU307 / NPU308
            return None
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and qualified not in ("torch.cuda",):
            if source.resolve(func.value) not in ("torch", "torch.cuda"):
                return "`.cuda()`"
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "to"
            and call.args
            and live_cuda_literal(source, call.args[0])
        ):
            return '`.to("cuda")`'
        if any(k.arg == "device" and live_cuda_literal(source, k.value) for k in call.keywords):
            return 'a tensor on `"cuda"`'
        return None


def _device_argument(call: ast.Call) -> Optional[ast.AST]:
    """The ``"cuda"`` of a call that is CUDA work because of it — the ``device=`` keyword, the first argument of
    ``.to(...)`` / ``Generator(...)`` — the line to report; None for ``.cuda()``."""
    if isinstance(call.func, ast.Attribute) and call.func.attr == "cuda":
        return None
    keyword = next((k for k in call.keywords if k.arg == "device"), None)
    return keyword if keyword is not None or not call.args else call.args[0]
