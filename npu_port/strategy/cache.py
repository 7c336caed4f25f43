"""The on-disk cache of auto's decisions, so that the second run of a model pays nothing for probing.

One JSON file per (device model, torch / torch_npu / diffusers / npu-port versions, strategy fingerprint): a new
driver stack or another GPU model measures afresh instead of trusting stale numbers. Writes are atomic
(:mod:`npu_port.atomic`: a unique temporary file + ``os.replace``) and merge with what another process may have
written meanwhile; a corrupt or unreadable file is ignored (and rewritten), never fatal — it is a cache.

Location: ``NPU_PORT_CACHE_DIR``, else ``$XDG_CACHE_HOME/npu-port``, else ``~/.cache/npu-port``; files live in its
``auto/`` folder.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from .._version import __version__
from ..atomic import write_json
from ..device import device_name
from .decision import Decision

FORMAT = 1


def cache_root() -> Path:
    explicit = os.environ.get("NPU_PORT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "npu-port"


def _version(distribution: str) -> Optional[str]:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def environment(device: torch.device) -> Dict[str, Any]:
    """What a measurement depends on besides the shapes (the cache key)."""
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "torch_npu": _version("torch-npu") or _version("torch_npu"),
        "diffusers": _version("diffusers"),
        "npu_port": __version__,
    }


class DecisionCache:
    """Decisions of one strategy configuration on one device, backed by one JSON file."""

    def __init__(self, device: torch.device, fingerprint: Dict[str, Any], root: Optional[Path] = None) -> None:
        self.environment = environment(device)
        self.fingerprint = fingerprint
        key = json.dumps({"environment": self.environment, "strategy": fingerprint}, sort_keys=True, default=str)
        digest = hashlib.sha256(key.encode()).hexdigest()[:20]
        self.path = (root or cache_root()) / "auto" / f"{digest}.json"
        self.loads = 0
        self.writes = 0
        self.error: Optional[str] = None  # why the last write failed, shown by explain()

    def _read(self) -> Dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("decisions"), dict):
            return {}
        return data["decisions"]

    def get(self, bucket: str) -> Optional[Decision]:
        entry = self._read().get(bucket)
        if entry is None:
            return None
        try:
            decision = Decision.from_dict(entry)
        except (KeyError, TypeError, ValueError):
            return None
        decision.source = "disk cache"
        self.loads += 1
        return decision

    def put(self, decision: Decision) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            decisions = self._read()
            decisions[decision.bucket] = decision.to_dict()
            payload = {
                "format": FORMAT,
                "environment": self.environment,
                "strategy": self.fingerprint,
                "decisions": decisions,
            }
            write_json(self.path, payload, indent=1, sort_keys=True)
            self.writes += 1
        except OSError as exc:  # a read-only home or a full disk costs a re-measurement, not a failed model run
            self.error = f"cannot write {self.path}: {exc.strerror or exc}"
