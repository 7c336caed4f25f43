"""Finding strategy files and turning them into :class:`Strategy` objects (``extends`` merged in).

Built-ins ship inside the wheel as ``npu_port.strategies`` (top-level ``strategies/``, profiles in
``strategies/profiles/``). Users add directories with ``NPU_PORT_STRATEGY_PATH`` (``os.pathsep``-separated) or pass
a file path directly. A user file may not reuse a built-in's name — that would change what ``"sdpa"`` means
without a trace — it should ``extends:`` it under a new name instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from ..errors import StrategyFileError
from .schema import RawStrategy, parse
from .spec import Strategy, check_env, check_fuse_ops, check_option

PATH_VARIABLE = "NPU_PORT_STRATEGY_PATH"
SUFFIXES = (".yaml", ".yml")


def builtin_dirs() -> List[Path]:
    from .. import strategies

    root = Path(strategies.__file__).resolve().parent
    return [root, root / "profiles"]


def user_dirs() -> List[Path]:
    value = os.environ.get(PATH_VARIABLE, "")
    return [Path(p).expanduser() for p in value.split(os.pathsep) if p.strip()]


def strategy_files(directory: Path) -> List[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix in SUFFIXES and p.is_file())


def decode(data: bytes, path: str) -> str:
    """A file's bytes as text, or a :class:`StrategyFileError` giving the line and byte offset of the first byte that
    is not UTF-8 (YAML files are UTF-8; a file saved in a legacy code page fails here, not with a traceback)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise StrategyFileError(
            path,
            line,
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} at byte offset {exc.start} cannot be decoded "
            "(strategy files must be UTF-8; re-save the file as UTF-8)",
        ) from None


def read_file(path: Path) -> RawStrategy:
    if path.exists() and not path.is_file() and not path.is_dir():  # a FIFO would block the read; /dev/zero never end
        raise StrategyFileError(str(path), 1, "not a regular file; give the path of a YAML file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise StrategyFileError(str(path), 1, f"cannot read the file: {exc.strerror or exc}") from None
    raw = parse(decode(data, str(path)), str(path))
    raw.data.setdefault("name", path.stem)
    raw.lines.setdefault("name", 1)
    return raw


def every_kernel() -> Tuple[str, ...]:
    """The candidates of a ``first`` / ``measure`` strategy that names none (``auto``): every registered kernel, most
    preferred first (each kernel class declares its ``priority``), so a new kernel joins ``auto`` by registering."""
    from ..attn.registry import priority_order

    return tuple(priority_order())


def registry_snapshot() -> Optional[Tuple[str, ...]]:
    """What :func:`every_kernel` would give now, or None while no kernel is loaded yet (then nothing built so far can
    have depended on it): a strategy built from the registry is rebuilt when this changes."""
    if "npu_port.attn.registry" not in sys.modules:
        return None
    return every_kernel()


def build(raw: RawStrategy, lookup: Callable[[str], Strategy], chain: tuple = ()) -> Strategy:
    """The Strategy a file describes; ``lookup`` finds the strategy named in ``extends``."""
    data = raw.data
    name = data["name"]
    parent: Optional[Strategy] = None
    if "extends" in data:
        if data["extends"] == name or data["extends"] in chain:
            raise StrategyFileError(raw.path, raw.line("extends"), f"extends cycle: {' -> '.join(chain + (name,))}")
        try:
            parent = lookup(data["extends"])
        except StrategyFileError:  # already names its own file and line
            raise
        except ValueError as exc:
            raise StrategyFileError(raw.path, raw.line("extends"), str(exc)) from None

    def merged(key: str) -> Dict:
        own = data.get(key) or {}
        return {**(getattr(parent, key) if parent else {}), **own}

    candidates = parent.candidates if parent else ()
    select = parent.select if parent else "fixed"
    if "kernel" in data:
        candidates, select = (data["kernel"],), "fixed"
    elif "candidates" in data:
        candidates = tuple(dict.fromkeys(data["candidates"]))
        select = select if select != "fixed" else "first"  # extending auto with new candidates still measures
    if "select" in data:
        select = data["select"]
    processor = data.get("processor", parent.processor if parent else None)
    base = (parent.base or parent.name) if parent else None
    custom = processor is not None or name == "custom-processor" or base == "custom-processor"
    if not candidates and not custom and select in ("first", "measure"):
        candidates = every_kernel()
    if not candidates and not custom:
        raise StrategyFileError(raw.path, 1, "a strategy needs kernel, candidates, processor or extends")
    if select == "fixed" and len(candidates) > 1:
        raise StrategyFileError(raw.path, raw.line("select"), "select: fixed takes exactly one kernel")
    options = {k: check_option(k, v) for k, v in merged("options").items()}
    return Strategy(
        name=name,
        description=data.get("description", parent.description if parent else ""),
        candidates=candidates,
        select=select,
        env=check_env(merged("env")),
        options=options,
        kernel_options={**(parent.kernel_options if parent else {}), **(data.get("kernel_options") or {})},
        processor=processor,
        kind=data.get("kind", "strategy"),
        extends=data.get("extends"),
        base=base,
        device=data.get("device", parent.device if parent else None),
        acl_options=merged("acl_options"),
        npu=merged("npu"),
        safe_math=merged("safe_math"),
        fuse_ops=check_fuse_ops(data["fuse_ops"]) if "fuse_ops" in data else (parent.fuse_ops if parent else ()),
        source=raw.path,
        processor_origin=f"{raw.path}:{raw.line('processor')}" if data.get("processor") else None,
    )
