"""The dump format: one folder per run, written on one machine and read on another.

    run.d/
      index.json                what ran (meta: device, dtype, strategy, versions, ...), the record count, the
                                tensor files, whether the run finished (``complete``)
      records.jsonl             one JSON object per captured tensor, in the order the run produced them
      tensors-00000.safetensors full tensors of the modules asked for (``full=``), keyed by record ``seq``

A record (:class:`DumpWriter.add`) holds where the tensor was seen — ``kind`` (``module`` or ``attention``, a call
through npu-port's router), ``module`` (the module's path), ``step`` (the denoising step: the denoiser call in
progress or last finished, -1 before the first), ``call`` (the how-manieth call of that module in that step), ``io``
(``in`` or ``out``), ``index`` and ``name`` (which tensor of the call: ``args[0]``, ``kwargs.encoder_hidden_states``,
``out[0]``) — and what :func:`~npu_port.diff.stats.tensor_stats` says of it, plus ``tensor``: the key of its full copy
in a tensors file, or null.

Bounded memory: records are appended to ``records.jsonl`` as they come, and full tensors are written out whenever
:data:`SHARD_BYTES` of them are held. Atomic: everything is written into a uniquely named sibling folder, renamed to
the destination when the run ends; after Ctrl-C or an error the records so far are kept (``complete: false``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import torch

from ..atomic import write_json
from ..errors import DiffError

FORMAT = "npu-port-dump"
VERSION = 1
#: Full tensors held in memory before they are written to a tensors file.
SHARD_BYTES = 256 << 20
INDEX = "index.json"
RECORDS = "records.jsonl"


class DumpError(DiffError):
    """A dump that cannot be written or read: the message says which and why (a ``ValueError``, and an
    :class:`~npu_port.errors.NpuPortError` so that the CLI prints it as one line)."""


def check_destination(path: os.PathLike) -> Path:
    """``path`` as a dump destination, refused before any work when it exists (a dump is never merged into, and
    nothing of the user's is replaced) or its folder cannot be written."""
    from ..atomic import folder_problem

    destination = Path(path)
    if destination.exists() or destination.is_symlink():
        raise DumpError(f"{destination} already exists: give a new folder for the dump (or remove that one)")
    problem = folder_problem(destination.parent if str(destination.parent) else Path("."))
    if problem is not None:
        raise DumpError(f"cannot write a dump in {destination.parent or '.'}: {problem}")
    return destination


class DumpWriter:
    """Streams records and full tensors into a temporary folder beside ``path``; :meth:`close` renames it."""

    def __init__(self, path: os.PathLike, meta: Dict[str, Any]) -> None:
        self.path = check_destination(path)
        parent = self.path.parent if str(self.path.parent) else Path(".")
        parent.mkdir(parents=True, exist_ok=True)
        self._work = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=parent))
        self._records = open(self._work / RECORDS, "w", encoding="utf-8")
        self.meta = dict(meta)
        self.count = 0
        self.tensor_count = 0
        self._pending: Dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._shards: List[str] = []
        self.bytes_written = 0
        self.closed = False

    def add(self, record: Dict[str, Any], full: Optional[torch.Tensor] = None) -> int:
        """Append ``record`` (``seq`` is set here); with ``full``, keep a host copy of that tensor too."""
        seq = self.count
        record = dict(record, seq=seq, tensor=None)
        if full is not None:
            key = f"t{seq}"
            host = full.detach().to("cpu", copy=True).contiguous()
            self._pending[key] = host
            self._pending_bytes += host.numel() * host.element_size()
            record["tensor"] = key
            self.tensor_count += 1
            if self._pending_bytes >= SHARD_BYTES:
                self._flush_tensors()
        line = json.dumps(record, allow_nan=True)
        self._records.write(line + "\n")
        self.bytes_written += len(line) + 1
        self.count += 1
        return seq

    def _flush_tensors(self) -> None:
        if not self._pending:
            return
        from safetensors.torch import save_file

        name = f"tensors-{len(self._shards):05d}.safetensors"
        save_file(self._pending, str(self._work / name))
        self.bytes_written += (self._work / name).stat().st_size
        self._shards.append(name)
        self._pending = {}
        self._pending_bytes = 0

    def close(self, complete: bool = True) -> Path:
        """Write what is held, the index, and move the folder into place. Returns the dump's path."""
        if self.closed:
            return self.path
        self.closed = True
        try:
            self._flush_tensors()
        finally:
            self._records.close()
        index = {
            "format": FORMAT,
            "version": VERSION,
            "complete": complete,
            "records": self.count,
            "tensors": self.tensor_count,
            "shards": self._shards,
            "meta": self.meta,
        }
        write_json(self._work / INDEX, index)
        if self.path.exists() or self.path.is_symlink():  # appeared while the run ran: keep both, say where ours is
            raise DumpError(f"{self.path} appeared while the run was going; this run's dump is in {self._work}")
        os.replace(self._work, self.path)
        return self.path

    def discard(self) -> None:
        """Drop everything (the run never started)."""
        self.closed = True
        self._records.close()
        shutil.rmtree(self._work, ignore_errors=True)


class Dump:
    """A dump read back: its meta, its records in order (read lazily), and full tensors by key."""

    def __init__(self, path: os.PathLike) -> None:
        self.path = Path(path)
        index_path = self.path / INDEX
        if not self.path.is_dir():
            raise DumpError(f"{self.path} is not a dump folder (no such folder)")
        if not index_path.is_file():
            raise DumpError(f"{self.path} is not a dump: it has no {INDEX} (was it written by npu-port diff dump?)")
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DumpError(f"{index_path} cannot be read: {exc}") from None
        if not isinstance(index, dict) or index.get("format") != FORMAT:
            raise DumpError(f"{index_path} is not an npu-port dump index (format is not {FORMAT!r})")
        if index.get("version") != VERSION:
            raise DumpError(
                f"{self.path} is a version {index.get('version')} dump; this npu-port reads version {VERSION}"
            )
        self.index = index
        self.meta: Dict[str, Any] = index.get("meta") or {}
        self.complete = bool(index.get("complete"))
        self._tensors: Optional[Dict[str, str]] = None

    def records(self) -> Iterator[Dict[str, Any]]:
        with open(self.path / RECORDS, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except ValueError:
                    raise DumpError(f"{self.path / RECORDS}, line {number}: not a JSON record") from None

    def tensor(self, key: str) -> torch.Tensor:
        """The full tensor stored under ``key`` (a record's ``tensor``)."""
        from safetensors import safe_open

        if self._tensors is None:
            self._tensors = {}
            for shard in self.index.get("shards") or []:
                with safe_open(str(self.path / shard), framework="pt") as fh:
                    for name in fh.keys():
                        self._tensors[name] = shard
        shard = self._tensors.get(key)
        if shard is None:
            raise DumpError(f"{self.path} holds no tensor {key!r}")
        with safe_open(str(self.path / shard), framework="pt") as fh:
            return fh.get_tensor(key)
