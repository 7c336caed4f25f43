"""The on-disk cache of auto's decisions, so that the second run of a model pays nothing for probing.

One JSON file per (device model, versions of everything a decision depends on, strategy fingerprint): a new torch or
torch_npu, another GPU model, or a kernel's package installed, upgraded, removed or broken measures afresh instead of
trusting stale numbers. The packages in the key are not a hand-kept list: they are the ``package`` each candidate
kernel declares (what it probes through :func:`npu_port._optional.probe`), plus torch and diffusers, each recorded as
its version, ``"absent"`` or ``"broken"``. (The CANN and driver versions are not in the key: after upgrading CANN
alone, clear ``auto/`` or run with ``cache: false`` once.) Writes are atomic (:mod:`npu_port.atomic`: a unique
temporary file + ``os.replace``), and the read-merge-write runs under a lock file beside the cache, so processes that
write at once (torchrun's ranks) keep each other's decisions — and for the same bucket, each other's runs: ``put``
takes a ``merge`` that pools the stored entry with the new one (:func:`npu_port.strategy.measure.pool`), so the
better-informed entry is kept, never simply the last one written.

It is a cache, so nothing in it is trusted. The file is read with bounds, checked before JSON is parsed: at most
:data:`MAX_FILE_BYTES`, nested at most :data:`MAX_DEPTH` deep (a crafted ``[[[[...`` would otherwise exhaust the
parser's recursion), a regular file (never a FIFO that blocks the read). It must record this environment and this
strategy: a file that names another torch, device or package version than the one running is not used, whatever
its name. Any of these is a miss of the whole file; a malformed entry (a string where a decision should be, a
missing field, a time that is NaN, infinite, zero or negative, a median that is not the one of its recorded runs) a
miss of that entry. Each miss is one logged warning naming the file (and the entry), also in ``explain()``; the
bucket is measured again and the file or entry overwritten. The router adds the checks that need the call: the
kernel is no candidate or cannot run the call now, or the entry's timings do not make its kernel the winner.

A *provisional* entry (a decision that timing noise left open, see :func:`npu_port.strategy.measure.pick`) is not a
miss: it is handed to the router, which measures the bucket more and pools its runs with the stored ones; nothing is
said beyond ``explain()``.

Location: ``NPU_PORT_CACHE_DIR``, else ``$XDG_CACHE_HOME/npu-port``, else ``~/.cache/npu-port``; files live in its
``auto/`` folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

from .._optional import installed_version, probe
from .._version import __version__
from ..atomic import file_lock, write_json
from ..attn.kernels.base import Kernel
from ..device import device_name
from .decision import Decision

#: The entries' format. Part of the file's key, so installs writing different formats keep separate files instead of
#: rejecting and rewriting each other's entries (2: reasons carry their codes, ``reason_codes``; 3: the timed runs,
#: ``samples``, by ``measurements``, so that later measurements pool with them).
FORMAT = 3

#: The largest cache file read. A file holds one entry per shape bucket, a few KiB each: thousands of buckets fit.
MAX_FILE_BYTES = 16 * 2**20

#: The deepest nesting of arrays and objects read (an entry needs 7 levels).
MAX_DEPTH = 16

#: The problem of a FIFO, device or folder where the cache file should be: never read, never written into.
NOT_A_FILE = "is not a regular file"

_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")

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
        self.pooled = 0  # provisional entries measured more (their runs pooled with this process's)
        self._file_reported = False
        self._last: Optional[Tuple[Tuple[int, int, int], Dict[str, Any], Optional[str]]] = None  # see _read

    def _read(self, fresh: bool = False) -> Tuple[Dict[str, Any], Optional[str]]:
        """The stored entries (not yet checked), and what is wrong with the file as a whole, if anything. The file
        read last is kept while its inode, size and modification time stay the same (a write replaces the file, so
        it changes them): the first call of each bucket asks, and a file of many buckets is parsed once, not once
        per bucket. ``fresh`` reads it again regardless (for the read-merge-write)."""
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            return {}, None
        except OSError as exc:
            return {}, f"cannot be read ({exc.strerror or type(exc).__name__})"
        identity = (found.st_ino, found.st_size, found.st_mtime_ns)
        if not fresh and self._last is not None and self._last[0] == identity:
            return self._last[1], self._last[2]
        decisions, problem = self._parse(found)
        self._last = (identity, decisions, problem)
        return decisions, problem

    def _parse(self, found: os.stat_result) -> Tuple[Dict[str, Any], Optional[str]]:
        if not stat.S_ISREG(found.st_mode):
            return {}, NOT_A_FILE
        if found.st_size > MAX_FILE_BYTES:
            return {}, f"is {found.st_size / 2**20:.1f} MiB, over the {MAX_FILE_BYTES // 2**20} MiB a cache file may be"
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read(MAX_FILE_BYTES + 1)  # (a file that grew since the stat is cut off here)
            if len(raw) > MAX_FILE_BYTES:
                return {}, f"is over the {MAX_FILE_BYTES // 2**20} MiB a cache file may be"
            text = raw.decode("utf-8")
            if nested_deeper(text, MAX_DEPTH):
                return {}, f"is nested deeper than {MAX_DEPTH} levels"
            data = json.loads(text)
        except FileNotFoundError:
            return {}, None
        except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            return {}, f"cannot be read as JSON ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        if not isinstance(data, dict) or not isinstance(data.get("decisions"), dict):
            return {}, "is not an npu-port decision cache (no 'decisions' object)"
        if data.get("format") != FORMAT:
            return {}, f"has format {data.get('format')!r}, this npu-port writes {FORMAT}"
        problem = self._foreign(data)
        return ({}, problem) if problem else (data["decisions"], None)

    def _foreign(self, data: Dict[str, Any]) -> Optional[str]:
        """Why a file records another environment or strategy than this one (None: it records this one). Its name
        is derived from both, so only a copied or edited file can: its timings were made elsewhere."""
        recorded = data.get("environment")
        if not isinstance(recorded, dict):
            return "records no environment"
        ours = _as_json(self.environment)
        for name in sorted(set(ours) | set(recorded)):
            theirs, mine = recorded.get(name, "(none)"), ours.get(name, "(none)")
            if theirs != mine:
                return f"was written for {name} {theirs}, this is {name} {mine}"
        if data.get("strategy") != _as_json(self.fingerprint):
            return "was written for another strategy configuration (candidates or options differ)"
        return None

    def ignore(self, bucket: str, problem: str) -> None:
        """Record (for explain()) and log that ``bucket``'s entry is not used: it will be measured again."""
        line = f"disk cache entry {bucket!r} in {self.path} ignored: {problem}; measuring again"
        line += " (it will be overwritten)"
        self.ignored.append(line)
        logger.warning("%s", line)

    def get(self, bucket: str) -> Optional[Decision]:
        """The stored decision for ``bucket``, or None (no entry, or one that is corrupt: see :meth:`ignore`). A
        provisional decision is returned as such: the router measures it more."""
        entries, file_problem = self._read()
        if file_problem is not None:
            if not self._file_reported:
                self._file_reported = True
                then = "delete it to keep decisions again" if file_problem == NOT_A_FILE else "it will be rewritten"
                line = f"disk cache file {self.path} {file_problem}: ignored; measuring again ({then})"
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
        decision.source = "disk cache"
        return decision

    def loaded(self) -> None:
        """Count a stored decision the router accepted."""
        self.loads += 1

    def put(self, decision: Decision, merge: Optional[Callable[[Decision, Decision], Decision]] = None) -> None:
        """Store ``decision``, keeping the other buckets' entries. When the file already holds a valid entry for its
        bucket (another process wrote one since this one read it, or this one pooled it), ``merge(stored,
        decision)`` gives what is written. Only valid entries are written back: a malformed one is dropped."""
        try:
            if self.path.exists() and not self.path.is_file():  # a FIFO would block the write, a device take it
                self.error = f"cannot write {self.path}: it {NOT_A_FILE}; delete it"
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with file_lock(self.path.with_suffix(".lock")):  # torchrun's ranks merge, not overwrite, each other
                stored, _ = self._read(fresh=True)
                decisions = {}
                for bucket, entry in stored.items():
                    try:
                        decisions[bucket] = Decision.from_dict(entry, bucket)
                    except ValueError:  # said when that bucket is looked up; not carried forward
                        continue
                earlier = decisions.get(decision.bucket)
                if earlier is not None and merge is not None:
                    decision = merge(earlier, decision)
                decisions[decision.bucket] = decision
                payload = {
                    "format": FORMAT,
                    "environment": self.environment,
                    "strategy": self.fingerprint,
                    "decisions": {bucket: entry.to_dict() for bucket, entry in decisions.items()},
                }
                write_json(self.path, payload, indent=1, sort_keys=True)
            self.writes += 1
        except OSError as exc:  # a read-only home or a full disk costs a re-measurement, not a failed model run
            self.error = f"cannot write {self.path}: {exc.strerror or exc}"


def _as_json(value: Any) -> Any:
    """``value`` as it reads back from the file (tuples become lists, other objects their ``str``)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def nested_deeper(text: str, limit: int) -> bool:
    """Whether the JSON ``text`` nests arrays and objects more than ``limit`` deep, found without parsing it (Python's
    parser recurses once per level). Strings are blanked first, so brackets inside them do not count. Pairs are then
    stripped from the inside out, a few passes at C speed; a file of ordinary depth is gone within ``limit // 2``
    of them (a pass strips at most two levels), and only what is left (too deep, or unbalanced) is walked."""
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", text))
    left = brackets
    for _ in range(limit // 2):
        left = left.replace("[]", "").replace("{}", "")
        if not left:
            return False
    depth = 0
    for char in brackets:
        depth += 1 if char in "[{" else -1
        if depth > limit:
            return True
    return False
