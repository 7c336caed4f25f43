"""Each fused replacement is checked once, on its first call, against what it replaces.

A fused op can be wrong on a given chip, CANN version or shape in ways no document predicts (a layout read
differently, an epsilon ignored, a half-precision path that loses more than expected). So the first call that the
fused form may take runs both: the reference first (its result is what that call returns, gradients included), then
the fused form on the same inputs without gradients; the two are compared with a tolerance per dtype. Within it,
later calls run fused only. Outside it — or if the fused op raises — the site is refused: the original goes back in
place (:func:`npu_port._patching.release`), a :class:`FuseWarning` names the site, the error and the tolerance, and
with ``strict=True`` :class:`~npu_port.errors.FuseCheckError` is raised (after the original is back).

The tolerance (:data:`RTOL`) is relative, scaled by the tensor's own magnitude: an element passes when
``|fused - reference| <= rtol * (|reference| + max |reference|)``. float32 uses 1e-5; float16 and bfloat16 four units
in the last place at 1 (4 * 2**-10 and 4 * 2**-7): the fused ops compute in float32 inside and round once, like the
unfused paths, so they differ by a rounding or two. NaN is never within tolerance, in either result; an infinity must
be matched exactly.

A :class:`Site` is one patched place: a module's ``forward`` or a module-level function (possibly held by several
modules' globals); :class:`FusedCall` is what is installed there.
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import _patching
from ..errors import FuseCheckError
from ..reasons import Reason

#: Relative tolerance per dtype (see the module docstring).
RTOL: Dict[torch.dtype, float] = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 4 * 2.0**-10,
    torch.bfloat16: 4 * 2.0**-7,
}

#: The ``key`` of every patch this package makes (per op), so ours are told from anyone else's.
KEY_PREFIX = "npu_port.fuse"


class FuseWarning(UserWarning):
    """npu-port could not fuse something that was asked for (an op refused on this machine, a site that failed its
    first-call check); the handle's ``explain()`` / ``refused`` has the details."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _leaves(value: Any) -> List[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def compare(fused: Any, reference: Any) -> Tuple[Optional[str], float]:
    """``(problem, max_error)``: problem is None when ``fused`` matches ``reference`` within :data:`RTOL`."""
    got, want = _leaves(fused), _leaves(reference)
    if len(got) != len(want):
        return f"returned {len(got)} values where the original returns {len(want)}", float("inf")
    worst = 0.0
    for index, (g, w) in enumerate(zip(got, want)):
        where = f" (output {index})" if len(want) > 1 else ""
        if not isinstance(w, torch.Tensor) or not isinstance(g, torch.Tensor):
            if type(g) is not type(w) or g != w:
                return f"returned {g!r} where the original returns {w!r}{where}", float("inf")
            continue
        if g.shape != w.shape:
            return f"shape {tuple(g.shape)} where the original gives {tuple(w.shape)}{where}", float("inf")
        if g.dtype != w.dtype:
            return (
                f"dtype {_dtype_name(g.dtype)} where the original gives {_dtype_name(w.dtype)}{where}",
                float("inf"),
            )
        if not w.is_floating_point():
            if not torch.equal(g, w):
                return f"different {_dtype_name(w.dtype)} values{where}", float("inf")
            continue
        g64, w64 = g.detach().to(torch.float64), w.detach().to(torch.float64)
        if torch.isnan(g64).any() or torch.isnan(w64).any():
            side = "the fused result" if torch.isnan(g64).any() else "the original's result"
            return f"NaN in {side}{where} (NaN is never within tolerance)", float("nan")
        finite = torch.isfinite(w64)
        if not torch.equal(torch.isfinite(g64), finite) or not torch.equal(g64[~finite], w64[~finite]):
            return f"infinities differ from the original's{where}", float("inf")
        if not finite.any():
            continue
        error = (g64 - w64)[finite].abs()
        magnitude = w64[finite].abs()
        rtol = RTOL.get(w.dtype, RTOL[torch.float32])
        scale = float(magnitude.max())
        worst = max(worst, float(error.max()))
        excess = error - rtol * (magnitude + scale)
        if bool((excess > 0).any()):
            at = int(excess.argmax())
            return (
                f"differs from the original by up to {float(error.max()):.3g}{where} in {_dtype_name(w.dtype)} "
                f"(allowed: {rtol:.3g} x (|original| + {scale:.3g}); first over it: {float(error[at]):.3g} where "
                f"the original is {float(w64[finite][at]):.6g})",
                float(error.max()),
            )
    return None, worst


class Site:
    """One place a fused op is installed: what it is (``op``, ``where``, ``how``), its state and what it has done.

    ``state`` is ``installed`` until the first check, then ``checked`` or ``refused`` (``reason`` says why);
    ``restored`` once its handle put the original back. ``fused_calls`` counts calls that ran fused (the checked first
    call included), ``fallbacks`` the calls that ran the original, per reason.
    """

    def __init__(self, op: str, where: str, how: str, *, strict: bool = False, keep_on_refusal: bool = False):
        self.op, self.where, self.how = op, where, how
        self.strict = strict
        #: geglu_*: a refused fused op leaves our replacement in place, computing through the torch path (exact erf
        #: or tanh, as asked) — putting diffusers' NPU forward back would silently switch to the other GELU.
        self.keep_on_refusal = keep_on_refusal
        self.state = "installed"
        self.reason: Optional[Reason] = None
        self.max_error: Optional[float] = None
        self.fused_calls = 0
        self.fallbacks: Counter = Counter()
        self.patches: List[_patching.Patch] = []
        self.handles = 0  # handles holding it (a shared function site may be held by several)
        self.lock = threading.RLock()

    @property
    def key(self) -> str:
        return f"{KEY_PREFIX}:{self.op}"

    def refuse(self, reason: Reason) -> None:
        """Stop using the fused form here; put the original back (unless ``keep_on_refusal``)."""
        with self.lock:
            self.state, self.reason = "refused", reason
            if not self.keep_on_refusal:
                for patch in self.patches:
                    while patch.users > 0:
                        _patching.release(patch)

    def describe(self) -> str:
        text = f"{self.op}: {self.where} -> {self.how}: {self.state}"
        if self.state == "refused" and self.reason is not None:
            text += f" ({self.reason})"
        calls = [f"{self.fused_calls} fused"] + [f"{n} original ({why})" for why, n in self.fallbacks.items()]
        return f"{text}; calls: {', '.join(calls)}"

    def report(self) -> Dict[str, Any]:
        return {
            "op": self.op,
            "where": self.where,
            "how": self.how,
            "state": self.state,
            "reason": self.reason.as_dict() if self.reason is not None else None,
            "max_error": self.max_error,
            "fused_calls": self.fused_calls,
            "fallbacks": dict(self.fallbacks),
        }

    def __repr__(self) -> str:
        return f"<Site {self.describe()}>"


class FusedCall:
    """What stands at a :class:`Site`: the fused form behind the first-call check.

    ``eligible(*args, **kwargs)`` returns None when the fused form may take the call, else why not; then ``fallback``
    runs (the original, unless the op says otherwise). ``reference`` is what the fused form must match (the original,
    unless the op changes the formula on purpose: geglu_exact is checked against exact GELU, geglu_tanh against tanh
    GELU). It carries the original's name, docstring and signature (``__wrapped__``), as diffusers inspects some.
    """

    def __init__(
        self,
        site: Site,
        original: Callable[..., Any],
        fused: Callable[..., Any],
        eligible: Callable[..., Optional[str]],
        *,
        reference: Optional[Callable[..., Any]] = None,
        fallback: Optional[Callable[..., Any]] = None,
    ) -> None:
        self.site = site
        self.original = original
        self.fused = fused
        self.eligible = eligible
        self.reference = reference or original
        self.fallback = fallback or original
        try:
            functools.update_wrapper(self, original)
        except (AttributeError, TypeError):  # a callable without __name__: keep ours
            pass

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.original)

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        """A deep copy of a fused module (an EMA copy, ``copy.deepcopy(pipe.transformer)``) gets the original forward,
        bound to the copy: our closures hold the fused module itself, and the copy's patch would be one nobody
        restores."""
        import copy

        return copy.deepcopy(self.original, memo)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        site = self.site
        if site.state == "refused":
            return self.fallback(*args, **kwargs)
        why = self.eligible(*args, **kwargs)
        if why is not None:
            site.fallbacks[why] += 1
            return self.fallback(*args, **kwargs)
        if site.state != "checked":
            return self._first_call(args, kwargs)
        site.fused_calls += 1
        return self.fused(*args, **kwargs)

    def _first_call(self, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        site = self.site
        with site.lock:
            if site.state == "refused":
                return self.fallback(*args, **kwargs)
            if site.state == "checked":
                site.fused_calls += 1
                return self.fused(*args, **kwargs)
            reference = self.reference(*args, **kwargs)
            try:
                with torch.no_grad():
                    got = self.fused(*args, **kwargs)
            except Exception as exc:  # the fused op itself refused the call: the original stays
                detail = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
                problem, error, code = f"the fused op raised {detail}", None, "check-error"
            else:
                problem, error = compare(got, reference)
                code = "check-mismatch"
            site.max_error = error
            if problem is None:
                site.state = "checked"
                site.fused_calls += 1
                return reference
            reason = Reason(code, f"first-call check failed: {problem}")
            site.refuse(reason)
        kept = "the torch path stays" if site.keep_on_refusal else "the original is back"
        message = f"npu-port fuse_ops: {site.op} at {site.where} refused, {kept}: {reason}"
        if site.strict:
            raise FuseCheckError(message)
        warnings.warn(message, FuseWarning, stacklevel=3)
        return reference

    def __repr__(self) -> str:
        return f"<fused {self.site.how} at {self.site.where}: {self.site.state}>"
