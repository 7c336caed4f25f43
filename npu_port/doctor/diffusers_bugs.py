"""diffusers' known NPU bugs, by version range, and what npu-port does about each.

Read from the diffusers 0.42.1 sources and the issue threads each entry cites. A range is
``[since, fixed_in)``; None is open-ended. ``since`` is the first release with the code path involved (the attention
dispatcher and ``AttentionModuleMixin`` arrived in 0.35.0); ``fixed_in`` is the first release known to be free of the
bug (0.42.1, the version read, where the exact fix release is not recorded); an open bug has none. ``breaks_here`` says
whether the bug stops something on *this* machine now, which turns the finding from info into a warning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from .facts import Facts
from .probes import release_tuple

DISPATCHER_SINCE = "0.35.0"
#: The first release whose GEGLU calls torch_npu.npu_geglu (huggingface/diffusers#7816, merged 2024-05-04; the branch
#: is absent from 0.27.2 and present in 0.28.0 through 0.42.1 and main).
NPU_GEGLU_SINCE = "0.28.0"


def _never(facts: Facts) -> bool:
    return False


def _torch_npu_installed(facts: Facts) -> bool:
    return facts.torch_npu_installed


def _torch_npu_broken(facts: Facts) -> bool:
    return facts.torch_npu_broken


def _torch_npu_working(facts: Facts) -> bool:
    return facts.torch_npu_installed and not facts.torch_npu_broken


def _native_npu_backend_without_torch_npu(facts: Facts) -> bool:
    return facts.environ.get("DIFFUSERS_ATTN_BACKEND") == "_native_npu" and not _torch_npu_working(facts)


@dataclass(frozen=True)
class KnownBug:
    id: str
    reference: str
    summary: str
    npu_port: str  # what npu-port does about it
    fix: str  # what the user can do
    since: Optional[str] = None
    fixed_in: Optional[str] = None
    breaks_here: Callable[[Facts], bool] = _never

    def affects(self, version: str) -> bool:
        release = release_tuple(version)
        after_start = self.since is None or release >= release_tuple(self.since)
        before_fix = self.fixed_in is None or release < release_tuple(self.fixed_in)
        return after_start and before_fix

    @property
    def range_text(self) -> str:
        start = f">= {self.since}" if self.since else "all versions"
        end = f", fixed in {self.fixed_in}" if self.fixed_in else ", open"
        return start + end


KNOWN_BUGS: Tuple[KnownBug, ...] = (
    KnownBug(
        "imports-torch-npu",
        "diffusers models/attention_processor.py, activations.py, pipeline_utils.py",
        "import diffusers imports torch_npu whenever the package is installed, so a broken torch_npu breaks diffusers",
        "npu-port reads diffusers' version from metadata and never imports it here",
        "make torch_npu importable (source CANN's set_env.sh) or pip uninstall torch-npu off Ascend",
        breaks_here=_torch_npu_broken,
    ),
    KnownBug(
        "native-npu-drops-causal-and-inverts-float-masks",
        "huggingface/diffusers#14397",
        "the _native_npu backend drops is_causal and inverts additive float masks (0/-inf)",
        "npu-port's npu kernels keep causal (mask + sparse_mode) and refuse float masks with a reason",
        'route attention through npu-port: npu_port.set_attention_strategy("npu", target=pipe)',
        since=DISPATCHER_SINCE,
    ),
    KnownBug(
        "npu-rms-norm-and-singleton-masks",
        "huggingface/diffusers#14380",
        "npu_rms_norm crashes with elementwise_affine=False, and [B,N,1,Skv] masks are rejected",
        "npu-port's kernels broadcast [B|1,H|1,1,Skv] masks; RMSNorm is diffusers' own code",
        'pip install "diffusers>=0.42.1"',
        fixed_in="0.42.1",
        breaks_here=_torch_npu_working,
    ),
    KnownBug(
        "attn-backend-env-read-once",
        "diffusers utils/constants.py, models/attention_dispatch.py",
        "DIFFUSERS_ATTN_BACKEND is read once, at import, and skips the backend's requirement checks",
        "npu-port's strategies set the variable for child processes and the API for this one, after checking "
        "that the kernel can run",
        "set the backend before importing diffusers, or use npu_port.set_attention_strategy",
        since=DISPATCHER_SINCE,
        breaks_here=_native_npu_backend_without_torch_npu,
    ),
    KnownBug(
        "set-use-npu-flash-attention-false",
        "diffusers models/attention.py",
        "set_use_npu_flash_attention(False) still switches the _native_npu backend on",
        "npu-port's strategies are undone with handle.restore(), which gives back the processors that were there",
        "use npu_port.set_attention_strategy(...) and handle.restore() rather than that switch",
        since=DISPATCHER_SINCE,
    ),
    KnownBug(
        "geglu-tanh-on-npu",
        "diffusers models/activations.py GEGLU.forward, L118-120 in 0.42.1, huggingface/diffusers#7816",
        "GEGLU calls torch_npu.npu_geglu(..., approximate=1), tanh GELU, whenever the torch_npu package is installed "
        "(not when the tensor is on an NPU), while CPU and GPU use exact erf GELU: outputs differ between devices",
        "npu-port's fused ops keep GEGLU exact on the NPU (geglu_exact) unless you ask for the tanh form",
        'npu_port.fuse_ops(model, ops=["geglu_exact"]) (reversible; ops=["geglu_tanh"] keeps the faster tanh form)',
        since=NPU_GEGLU_SINCE,
        breaks_here=_torch_npu_working,
    ),
    KnownBug(
        "npu-processor-deprecation-error",
        "xdit-project/xDiT#567",
        "Flux blocks raise ValueError: deprecation tuple ('npu_processor', '0.34.0', ...) when torch_npu is installed",
        "npu-port sets processors and backends explicitly, so its strategies are unaffected once the model is built",
        'pip install "diffusers>=0.42.1" (the call is gone there), or build Flux without torch_npu installed',
        since="0.34.0",
        fixed_in="0.42.1",
        breaks_here=_torch_npu_installed,
    ),
)
