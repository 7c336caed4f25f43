"""Errors npu-port raises on purpose.

Every error names the problem and the valid choices, so a user never has to read a traceback from deep inside
torch. The attention errors carry their reasons as data (``.reasons``) so the CLI, ``auto`` and tests can show or
check them without parsing text.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

from .reasons import Reason, as_reason

#: The exit status of a command stopped with Ctrl-C (SIGINT: 128 + 2), as a shell reports it — for every command and
#: for ``npu-port run``'s report of a script stopped that way.
EXIT_ON_CTRL_C = 130


class NpuPortError(Exception):
    """Base class of the errors npu-port raises deliberately."""


class AttentionInputError(NpuPortError, ValueError):
    """The arguments of an attention call are invalid whatever kernel runs it (shapes, dtypes, mask form)."""


class UnknownKernelError(NpuPortError, ValueError):
    """A kernel name that is not registered."""

    def __init__(self, name: str, valid: Sequence[str]):
        self.name = name
        self.valid = list(valid)
        super().__init__(f"unknown attention kernel {name!r}; valid kernels: {', '.join(self.valid)}")


class KernelOptionError(NpuPortError, ValueError):
    """A kernel option that does not exist or has a value the kernel cannot use."""


class KernelUnavailableError(NpuPortError, RuntimeError):
    """A kernel that was asked for by name cannot run this call.

    ``reasons`` lists why (each a :class:`~npu_port.reasons.Reason`, its ``code`` for programs; ``codes`` lists
    them); ``runnable`` names the registered kernels that could run the same call, so the message always points
    somewhere.
    """

    def __init__(self, kernel: str, call_description: str, reasons: Sequence[str], runnable: Sequence[str]):
        self.kernel = kernel
        self.reasons: List[Reason] = [as_reason(reason) for reason in reasons]
        self.runnable: List[str] = list(runnable)
        lines = [f"attention kernel {kernel!r} cannot run this call ({call_description}):"]
        lines += [f"  - {reason}" for reason in self.reasons]
        if self.runnable:
            lines.append(f"kernels that can run it: {', '.join(self.runnable)}")
        else:
            lines.append("no registered kernel can run it")
        super().__init__("\n".join(lines))

    @property
    def codes(self) -> List[str]:
        """The reasons' codes, in order (``["dtype", "head-dim"]``)."""
        return [reason.code for reason in self.reasons]


class NoKernelError(NpuPortError, RuntimeError):
    """No kernel in the order being tried can run the call; every kernel's reasons are listed, xformers-style
    (``reasons``: kernel -> its :class:`~npu_port.reasons.Reason` list; ``codes``: kernel -> their codes)."""

    def __init__(self, call_description: str, reasons: Dict[str, Sequence[str]]):
        self.reasons: Dict[str, List[Reason]] = {name: [as_reason(x) for x in r] for name, r in reasons.items()}
        lines = [f"no attention kernel can run this call ({call_description}):"]
        for name, kernel_reasons in self.reasons.items():
            lines.append(f"  {name}:")
            lines += [f"    - {reason}" for reason in kernel_reasons]
        super().__init__("\n".join(lines))

    @property
    def codes(self) -> Dict[str, List[str]]:
        """Each kernel's reason codes, in order."""
        return {name: [reason.code for reason in reasons] for name, reasons in self.reasons.items()}


class KernelRuntimeError(NpuPortError, RuntimeError):
    """A kernel accepted a call but its backend failed; the message says which kernel and what to try instead."""


class UnknownStrategyError(NpuPortError, ValueError):
    """A strategy name that is neither built in, registered, nor a YAML file on the search path."""

    def __init__(self, name: str, valid: Sequence[str], searched: Sequence[str]):
        self.name = name
        self.valid = list(valid)
        self.searched = list(searched)
        message = f"unknown attention strategy {name!r}; valid strategies: {', '.join(self.valid)}"
        if self.searched:
            message += f"; YAML searched: {', '.join(self.searched)}"
        super().__init__(message)


class StrategyFileError(NpuPortError, ValueError):
    """A strategy or profile file that does not follow the schema; the message starts with ``file:line:``."""

    def __init__(self, path: str, line: int, message: str):
        self.path = path
        self.line = line
        super().__init__(f"{path}:{line}: {message}")


class StrategyOptionError(NpuPortError, ValueError):
    """A strategy option that does not exist or has a value the strategy cannot use (the valid ones are named)."""


class StrategyError(NpuPortError, ValueError):
    """A strategy that cannot be applied as asked (bad option, missing processor, unavailable kernel)."""


class DeviceError(NpuPortError, ValueError):
    """A device was named that is unknown or not usable here; the message lists what this machine has."""


class NpuOptionError(NpuPortError, ValueError):
    """An Ascend option (ACL option, NPU runtime setting or environment variable) that the docs do not allow."""


class RedirectError(NpuPortError, RuntimeError):
    """The cuda -> device redirect was asked for something it cannot do safely (e.g. two different targets)."""


class InferenceError(NpuPortError, ValueError):
    """``npu-port infer`` / the demo was given something it cannot run (a missing model, a size out of range...)."""


class PlanError(NpuPortError, ValueError):
    """``npu-port plan`` / ``npu_port.plan`` was asked for a plan it cannot make (a strategy that routes no call to
    a kernel, say); the message says why and what to give instead."""


class DropInError(NpuPortError, NotImplementedError):
    """A flash_attn / xformers drop-in was asked for something it cannot compute faithfully (ALiBi, softcap, the
    softmax statistics, a paged KV cache...); the message says what and what to use instead."""


class FallbackError(NpuPortError, ValueError):
    """A compiled-extension fallback was registered with a bad module name, replacement or mode, or a fallback op
    (``alt_cuda_corr.forward``...) was called with arguments the CUDA op it stands in for does not take."""


class RunError(NpuPortError, ValueError):
    """``npu-port run`` / ``npu_port.activate`` was given an entry point, watch folder or override it cannot use (a
    missing script or module, a malformed ``--override``, an attribute the overridden module does not have)."""


class RankFailedError(NpuPortError, RuntimeError):
    """A rank of a multi-process run failed for a reason other than bad input (a crash, an exit code, an error
    inside the model); its traceback has been printed. ``npu-port infer`` exits 1 on it, as on a failed run."""


class ParallelError(NpuPortError, ValueError):
    """A multi-device layout that cannot work (heads not divisible by the Ulysses degree, a sequence shorter than the
    ring, a model without a context-parallel plan, a process count that is not the layout's) or an attention call
    the sequence-parallel path cannot compute faithfully; the message names the valid choices."""


class FuseError(NpuPortError, ValueError):
    """``npu_port.fuse_ops`` was asked for something it cannot do: an unknown op name (the valid ones are listed), a
    target that is not a model or pipeline, or — with ``strict=True`` — an op it refuses on this machine (torch_npu or
    mindiesd missing, mindiesd imported too late), with the reason."""


class FuseCheckError(NpuPortError, RuntimeError):
    """With ``strict=True``, a fused op did not match the module or function it replaces on its first call (or
    raised); the original is back in place before this is raised, and the message gives the error and the tolerance."""


class DiffError(NpuPortError, ValueError):
    """``npu-port diff`` was given something it cannot record or compare: a dump folder that is not one (or that
    exists already, as a destination), a side spec with an unknown key or value, two dumps that cannot be paired;
    the message names the problem and the valid choices."""
