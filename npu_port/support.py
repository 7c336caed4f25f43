"""Which versions of the libraries around npu-port it supports and tests: the support policy, as data, in one place.

Why: ported projects pin the libraries of their time (diffusers 0.11-0.14 with transformers 4.25-4.30), while new
projects install each release the day it comes out. Both ends are ours to support, so the range is stated here once
and read by everything that needs it: ``setup.cfg``'s extras state the lower bounds (a test compares them), the CI
lanes install the oldest and the newest (``.ci/run``), ``npu-port doctor`` compares what is installed with what the
lanes last tested (:data:`TESTED_FILE`, written by ``.ci/run``), and the README's compatibility table is generated
from the same record. There is no upper cap: the upper end is the newest release, and the *newest* CI lane resolves
it afresh every run.

``features`` names the oldest version on which an integration's modern path is claimed (older versions still work:
the integration declines there, and the model runs on the library's own path). torch_npu's pairing with torch is
not here: it follows torch's own version exactly and lives in :mod:`npu_port.doctor.pairing`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

#: What the CI lanes last ran: versions, outcome and date per lane (written by ``.ci/lanes/record.py``, read by
#: ``npu-port doctor`` and by the README's compatibility table). Shipped inside the package.
TESTED_FILE = Path(__file__).with_name("support_tested.json")


@dataclass(frozen=True)
class Supported:
    """One library's supported range. ``minimum``: the oldest release supported (a lower bound in ``setup.cfg``'s
    ``extras`` where one installs it); ``extras``: those extras; ``features``: integration -> oldest version on which
    its modern path is claimed; ``why``: what sets the lower bound."""

    package: str
    minimum: str
    why: str
    extras: Tuple[str, ...] = ()
    features: Mapping[str, str] = field(default_factory=dict)

    @property
    def requirement(self) -> str:
        """The requirement the extras state: a lower bound, never a cap."""
        return f"{self.package}>={self.minimum}"


POLICY: Tuple[Supported, ...] = (
    Supported(
        "torch",
        "2.1",
        "torch.nn.functional.scaled_dot_product_attention with scale=; every lane runs the 2.13.0 CPU build",
    ),
    Supported(
        "diffusers",
        "0.11.1",
        "Tune-A-Video and AnimateDiff pin 0.11.1; 0.12-0.14 (the cross_attention layout) are pinned by many more",
        extras=("diffusers",),
        features={
            "legacy attention (CrossAttention._attention, AttentionBlock)": "0.11.1",
            "attention processors": "0.12.0",
            "Attention modules (attention_processor layout)": "0.15.0",
            "attention dispatcher (dispatch_attention_fn)": "0.35.0",
            # diffusers' context parallelism appears in 0.36.0; ContextParallelConfig(mesh=...), which npu-port's
            # session passes, in 0.38.0 (measured: 0.36.0 and 0.37.0 refuse it)
            "context parallelism (npu-port infer --nproc)": "0.38.0",
        },
    ),
    Supported(
        "transformers",
        "4.25.1",
        "the text encoders of the diffusers 0.11-0.14 era: their projects pin transformers 4.25-4.30",
        extras=("diffusers",),
        # measured: AttentionInterface appears in 4.51.0, but CLIP computes through it only from 4.52.1 (before, the
        # integration finds its pieces and reports CLIP "not routed: its own code"); T5 / UMT5 from 5.15.0
        features={
            "text encoders routed (transformers AttentionInterface)": "4.52.1",
            "T5 / UMT5 text encoders routed (AttentionInterface)": "5.15.0",
        },
    ),
    Supported(
        "huggingface_hub",
        "0.10.0",
        "what transformers 4.25 and diffusers 0.11 need (diffusers < 0.26 also needs huggingface_hub < 0.26)",
    ),
    Supported("accelerate", "0.15.0", "diffusers' low_cpu_mem_usage loading of the diffusers 0.11-0.14 era"),
    Supported("gradio", "5.0", "the demo uses gradio 5's Blocks API", extras=("demo",)),
)

BY_PACKAGE: Dict[str, Supported] = {entry.package: entry for entry in POLICY}


def supported(package: str) -> Supported:
    """The policy entry of ``package`` (a ``KeyError`` naming the packages that have one otherwise)."""
    try:
        return BY_PACKAGE[package]
    except KeyError:
        raise KeyError(f"no support policy for {package!r}; packages with one: {', '.join(BY_PACKAGE)}") from None


def tested() -> Optional[Dict[str, Any]]:
    """What the CI lanes last ran (:data:`TESTED_FILE`), or None when there is no readable record."""
    try:
        data = json.loads(TESTED_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("lanes"), list) else None


class TestedLane(NamedTuple):
    """One CI lane's run as the record keeps it: which lane, the package's version there, whether it passed, when."""

    lane: str
    version: str
    passed: bool
    date: str


def tested_versions(package: str, record: Optional[Dict[str, Any]] = None) -> List[TestedLane]:
    """The versions of ``package`` the CI lanes last ran, per lane (empty without a record, or where a lane did not
    have it installed)."""
    record = tested() if record is None else record
    found = []
    for lane in (record or {}).get("lanes", []):
        if not isinstance(lane, dict):
            continue
        version = (lane.get("versions") or {}).get(package)
        if isinstance(version, str):
            found.append(
                TestedLane(str(lane.get("lane", "?")), version, lane.get("passed") is True, str(lane.get("date", "")))
            )
    return found
