"""Does each integration route on this machine, with these library versions? Asked of tiny models, in a child process.

``npu-port doctor`` must not be green while the main job is broken: a transformers release that moved a name once
crashed every pipeline run while the doctor said nothing. So the doctor runs this module in a child Python
(``python -m npu_port.doctor.integration_probe``; importing diffusers can fail on a broken torch_npu, and a crash
must not take the doctor down): it applies the ``sdpa`` strategy to a tiny model of each installed library, runs one
forward, and prints one JSON object: per probe ``routes`` (calls went through npu-port), ``declines`` (the model ran on
the library's own path; why) or ``error`` (what raised: a bug to report); per adapter, each feature's pieces.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any, Callable, Dict, List

#: Statuses a probe can have.
ROUTES, DECLINES, ERROR, ABSENT = "routes", "declines", "error", "absent"


def _outcome(handle: Any, run: Callable[[], Any]) -> Dict[str, Any]:
    with handle:
        run()
        report = handle.report()
    calls = sum(report["calls"].values())
    reasons: List[str] = [
        f"{m['name'] or m['model']}: {m['reason']}" for m in report.get("text_models", []) if not m["routed"]
    ]
    reasons = reasons or [d["message"] for d in report.get("declines", [])]
    if calls and not reasons:
        return {"status": ROUTES, "calls": calls, "detail": f"{calls} attention calls routed"}
    detail = "; ".join(reasons) or "no attention call reached npu-port"
    return {"status": DECLINES if not calls else ROUTES, "calls": calls, "detail": detail}


def probe_transformers() -> Dict[str, Any]:
    """A 1-layer CLIP text encoder built from a config, under ``sdpa``."""
    import torch

    from npu_port.integrations.diffusers.tiny_text2image import tiny_clip_text_encoder
    from npu_port.strategy.api import set_attention_strategy

    model = tiny_clip_text_encoder(32, 31, 30).eval()
    ids = torch.randint(0, 30, (1, 5), generator=torch.Generator().manual_seed(0))
    handle = set_attention_strategy("sdpa", target=model, cache=False)
    with torch.no_grad():
        return _outcome(handle, lambda: model(input_ids=ids))


def probe_diffusers() -> Dict[str, Any]:
    """The tiny UNet (self- and cross-attention) built from a config, under ``sdpa``."""
    import torch

    from npu_port.integrations.diffusers.tiny import run_tiny, tiny_unet
    from npu_port.strategy.api import set_attention_strategy

    model = tiny_unet()
    handle = set_attention_strategy("sdpa", target=model, cache=False)
    with torch.no_grad():
        return _outcome(handle, lambda: run_tiny(model, batch_size=1))


PROBES: Dict[str, Callable[[], Dict[str, Any]]] = {"transformers": probe_transformers, "diffusers": probe_diffusers}


def _guarded(library: str, probe: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    from npu_port.upstream import adapters

    adapter = next(a for a in adapters() if a.library == library)
    if adapter.version() is None:
        return {"status": ABSENT, "detail": f"{library} is not installed"}
    try:
        result = probe()
    except Exception as exc:  # noqa: BLE001 - what raised is the finding
        where = traceback.extract_tb(exc.__traceback__)[-1]
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return {"status": ERROR, "detail": f"{detail} (at {where.filename}:{where.lineno})"}
    return result


def capabilities() -> Dict[str, Dict[str, Any]]:
    """Each adapter's version and, per feature, None (every piece found) or the decline's message."""
    from npu_port.upstream import adapters

    found: Dict[str, Dict[str, Any]] = {}
    for adapter in adapters():
        version = adapter.version()
        features = {} if version is None else adapter.capabilities()
        found[adapter.library] = {
            "version": version,
            "features": {name: (None if d is None else f"no {', '.join(d.missing)}") for name, d in features.items()},
        }
    return found


def probe() -> Dict[str, Any]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the declines are in the result; a warning would only be noise here
        results = {library: _guarded(library, run) for library, run in PROBES.items()}
        return {"probes": results, "capabilities": capabilities()}


def main() -> int:
    print(json.dumps(probe()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
