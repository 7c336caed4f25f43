"""The on-disk cache of auto's decisions, so that the second run of a model pays nothing for probing.

One JSON file per (device model, versions of everything a decision depends on, strategy fingerprint): a new torch or
torch_npu, another GPU model, or a kernel's package installed, upgraded, removed or broken measures afresh instead of
trusting stale numbers. The packages in the key are not a hand-kept list: they are the ``package`` each candidate
kernel declares (what it probes through :func:`npu_port._optional.probe`), plus torch and diffusers, each recorded as
its version, ``"absent"`` or ``"broken"``. (The CANN and driver versions are not in the key: after upgrading CANN
alone, clear ``auto/`` or run with ``cache: false`` once.) Writes are atomic (:mod:`npu_port.atomic`: a unique
temporary file + ``os.replace``), and the read-merge-write runs under a lock file beside the cache, so processes that
write at once (torchrun's ranks) keep each other's decisions.

It is a cache, so nothing in it is trusted: a corrupt file or a malformed entry (a string where a decision should be,
a missing field) is a cache miss, said in ``explain()`` and as a logged warning naming the file and the entry, then
measured again and overwritten. So is a *provisional* entry: a decision that timing noise left open (see
:func:`npu_port.strategy.measure.pick`) is written so that the process that made it keeps its record, but a later
process measures again rather than pin a kernel that one busy moment chose; once a measurement settles it, the
confident entry replaces it and is reused like any other. The router adds the checks that need the call (the kernel
is no candidate, or cannot run the call now).

Location: ``NPU_PORT_CACHE_DIR``, else ``$XDG_CACHE_HOME/npu-port``, else ``~/.cache/npu-port``; files live in its
``auto/`` folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from .._optional import installed_version, probe
from .._version import __version__
from ..atomic import file_lock, write_json
from ..attn.kernels.base import Kernel
from ..device import device_name
from .decision import Decision

#: The entries' format. Part of the file's key, so installs writing different formats keep separate files instead of
#: rejecting and rewriting each other's entries (2: reasons carry their codes, ``reason_codes``).
FORMAT = 2

logger = logging.getLogger("npu_port.strategy")

#: Packages every decision depends on whatever the candidates (the kernels' own packages are added to these).
BASE_PACKAGES = ("torch", "diffusers")


def cache_root() -> Path:
    explicit = os.environ.get("NPU_PORT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "npu-port"


def kernel_packages(kernels: Iterable[Kernel]) -> List[str]:
    """The optional packages these kernels need (their declared ``package``), sorted, without repeats."""
    return sorted({kernel.package for kernel in kernels if kernel.package})


def package_state(name: str) -> str:
    """A kernel package as the cache key sees it: its version, ``"absent"`` or ``"broken"`` (installed but not
    importable), as :func:`npu_port._optional.probe` finds it — a stand-in module in ``sys.modules`` included."""
    status = probe(name)
    if not status.ok:
        return "broken" if status.reason is not None and status.reason.code == "package-broken" else "absent"
    version = getattr(status.module, "__version__", None)
    return str(version) if version else (installed_version(name) or "unknown version")


def environment(device: torch.device, packages: Iterable[str] = ()) -> Dict[str, Any]:
    """What a measurement depends on besides the shapes and the strategy (the cache key)."""
    found: Dict[str, Any] = {"device": device_name(device), "npu_port": __version__, "torch": torch.__version__}
    found["diffusers"] = installed_version("diffusers") or "absent"  # not imported just to be named
    for name in sorted(set(packages) - set(BASE_PACKAGES)):
        found[name] = package_state(name)
    return found


class DecisionCache:
    """Decisions of one strategy configuration on one device, backed by one JSON file."""

    def __init__(
        self,
        device: torch.device,
        fingerprint: Dict[str, Any],
        root: Optional[Path] = None,
        packages: Iterable[str] = (),
    ) -> None:
        self.environment = environment(device, packages)
        self.fingerprint = fingerprint
        key = json.dumps(
            {"format": FORMAT, "environment": self.environment, "strategy": fingerprint}, sort_keys=True, default=str
        )
        digest = hashlib.sha256(key.encode()).hexdigest()[:20]
        self.path = (root or cache_root()) / "auto" / f"{digest}.json"
        self.loads = 0
        self.writes = 0
        self.error: Optional[str] = None  # why the last write failed, shown by explain()
        self.ignored: List[str] = []  # what was found corrupt or stale and measured again, shown by explain()
        self._file_reported = False

    def _read(self) -> Tuple[Dict[str, Any], Optional[str]]:
        """The stored entries (not yet checked), and what is wrong with the file as a whole, if anything."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}, None
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            return {}, f"cannot be read as JSON ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        if not isinstance(data, dict) or not isinstance(data.get("decisions"), dict):
            return {}, "is not an npu-port decision cache (no 'decisions' object)"
        if data.get("format") != FORMAT:
            return {}, f"has format {data.get('format')!r}, this npu-port writes {FORMAT}"
        return data["decisions"], None

    def ignore(self, bucket: str, problem: str) -> None:
        """Record (for explain()) and log that ``bucket``'s entry is not used: it will be measured again."""
        line = f"disk cache entry {bucket!r} in {self.path} ignored: {problem}; measuring again"
        line += " (it will be overwritten)"
        self.ignored.append(line)
        logger.warning("%s", line)

    def get(self, bucket: str) -> Optional[Decision]:
        """The stored decision for ``bucket``, or None (no entry, or one that is corrupt: see :meth:`ignore`)."""
        entries, file_problem = self._read()
        if file_problem is not None:
            if not self._file_reported:
                self._file_reported = True
                line = f"disk cache file {self.path} {file_problem}: ignored; measuring again (it will be rewritten)"
                self.ignored.append(line)
                logger.warning("%s", line)
            return None
        if bucket not in entries:
            return None
        try:
            decision = Decision.from_dict(entries[bucket], bucket)
        except ValueError as exc:
            self.ignore(bucket, f"malformed entry ({exc})")
            return None
        if decision.provisional:
            self.ignore(bucket, f"provisional entry, timing noise left it open ({decision.why})")
            return None
        decision.source = "disk cache"
        return decision

    def loaded(self) -> None:
        """Count a stored decision the router accepted."""
        self.loads += 1

    def put(self, decision: Decision) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with file_lock(self.path.with_suffix(".lock")):  # torchrun's ranks merge, not overwrite, each other
                decisions, _ = self._read()
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
