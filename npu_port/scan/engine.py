"""Scanning a tree: which files, how each is read, which rules look at it, and what is suppressed.

- Files: every ``*.py`` (and the files non-Python rules name: requirements, YAML configs, CUDA sources) under the
  paths given, minus hidden and build folders and what ``.gitignore`` ignores: in a git checkout, the files git
  lists (committed files always count: git ignores only untracked ones), elsewhere ``.gitignore`` files read with
  pathspec (git's own pattern rules). Folders that hold someone else's code (``third_party``, ``vendor``,
  ``external``, ``site-packages``, ...) are scanned but reported apart: their findings are not the project's to fix.
  So are a checkout's submodules (and checkouts nested in it), which git lists as one folder each, and a link to a
  file in a vendored folder (``fix`` would rewrite the vendored file through it).
- Reading: the encoding a Python file declares (PEP 263) or UTF-8, a byte-order mark dropped; a file that cannot be
  decoded or parsed is a finding (NPU001), never a crash; so is a path given by name that is not a regular file (a
  FIFO, a device: reading it would block or never end).
- Rules: a file is parsed (Python's own parser), its names resolved and rules run only when it contains one of some
  selected rule's ``triggers``: most files of a big tree mention nothing a rule looks for and are only read. A file
  that is parsed and does not parse is reported (NPU001).
- Suppressions: ``# npu-port: ignore[NPU201]`` (or ``ignore[NPU201,NPU301]``; bare ``# npu-port: ignore`` for every
  code) on the line a finding starts on (or the first line of the node it points into: :attr:`Finding.anchor`).
- Parallel over files (a process pool) on big trees, with a progress bar.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import gc
import io
import os
import re
import stat
import tokenize
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Type

from ..errors import NpuPortError
from .context import PythonFile, TextFile, split_lines
from .rule import SEVERITIES, Finding, Rule, rules
from .rules.npu001_unreadable import SyntaxRule

#: Folder names whose contents are someone else's code: scanned, reported apart.
VENDORED = ("third_party", "third-party", "thirdparty", "3rdparty", "vendor", "vendored", "_vendor", "external",
            "externals", "extern", "site-packages")  # fmt: skip
#: Folder names never entered (virtual envs, caches, build output, version control).
SKIPPED = (".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", ".mypy_cache", ".ruff_cache",
           ".pytest_cache", "node_modules", "build", "dist", ".eggs")  # fmt: skip
#: Below this many files the scan runs in this process (a pool costs more than it saves).
PARALLEL_FROM = 64

_SUPPRESSION = re.compile(r"#\s*npu-port:\s*ignore(?:\[([A-Z0-9,\s]+)\])?", re.IGNORECASE)


class ScanError(NpuPortError, ValueError):
    """Bad input to the scan (a path that does not exist, an unknown rule code)."""


@dataclass
class FileResult:
    path: str
    vendored: bool
    findings: List[Finding] = field(default_factory=list)
    parsed: bool = False  # whether some rule read it (Python: parsed; other files: read by a text rule)


@dataclass
class ScanResult:
    """What a scan found: per-file results, and how many files were looked at."""

    roots: List[str]
    files: List[FileResult]
    selected: List[str]

    @property
    def findings(self) -> List[Finding]:
        return [f for result in self.files if not result.vendored for f in result.findings]

    @property
    def vendored_findings(self) -> List[Finding]:
        return [f for result in self.files if result.vendored for f in result.findings]

    def counts(self, vendored: bool = False) -> Dict[str, int]:
        found = self.vendored_findings if vendored else self.findings
        return {severity: sum(1 for f in found if f.severity == severity) for severity in SEVERITIES}


# ---- choosing rules ------------------------------------------------------------------------------------------------


def split_selection(items: Sequence[str]) -> Tuple[List[str], List[str]]:
    """``(codes, severities)`` of a ``--select`` / ``--ignore`` list: a severity name (``guarded``) picks findings by
    severity, anything else is a rule code or prefix (upper-cased: ``npu3`` is ``NPU3``)."""
    codes = [item.upper() for item in items if item.lower() not in SEVERITIES]
    return codes, [item.lower() for item in items if item.lower() in SEVERITIES]


def select_rules(select: Sequence[str] = (), ignore: Sequence[str] = ()) -> List[Type[Rule]]:
    """The rules to run: those whose code starts with one of ``select`` (all when empty), minus those starting with
    one of ``ignore`` — ruff's prefix convention (``NPU2`` is every NPU2xx). An unknown prefix is an error. Severity
    names in either list pick findings, not rules (:func:`keep_severities`): every rule still runs."""
    select, ignore = split_selection(select)[0], split_selection(ignore)[0]
    every = rules()
    codes = [r.code for r in every]
    for prefix in [*select, *ignore]:
        if not any(code.startswith(prefix) for code in codes):
            raise ScanError(
                f"unknown rule code or prefix {prefix!r}; the codes are {', '.join(codes)}, "
                f"and the severities {', '.join(SEVERITIES)}"
            )
    chosen = [r for r in every if not select or any(r.code.startswith(p) for p in select)]
    chosen = [r for r in chosen if not any(r.code.startswith(p) for p in ignore)]
    if not chosen:
        raise ScanError(
            f"--select {','.join(select) or '(all)'} --ignore {','.join(ignore)} leaves no rule to run; "
            "npu-port scan --rules lists them"
        )
    return chosen


def keep_severities(select: Sequence[str] = (), ignore: Sequence[str] = ()) -> Tuple[str, ...]:
    """The severities whose findings are reported: those named in ``select`` (all when none is), minus those named
    in ``ignore`` (``--ignore guarded`` hides what only runs where CUDA is)."""
    chosen, dropped = split_selection(select)[1], split_selection(ignore)[1]
    kept = tuple(s for s in SEVERITIES if (not chosen or s in chosen) and s not in dropped)
    if not kept:
        raise ScanError(f"--select / --ignore leave no severity to report; the severities are {', '.join(SEVERITIES)}")
    return kept


# ---- finding files -------------------------------------------------------------------------------------------------


def _gitignore(folder: Path):
    path = folder / ".gitignore"
    if not path.is_file():
        return None
    import pathspec

    try:
        lines = path.read_text(encoding="utf-8-sig", errors="replace").splitlines()  # git skips a BOM too
    except OSError:
        return None
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _wanted(name: str, patterns: Sequence[str]) -> bool:
    return name.endswith(".py") or any(fnmatch.fnmatch(name, p) for p in patterns)


def _ignored(specs: List[Tuple[Path, object]], path: Path, is_folder: bool) -> bool:
    """Whether the .gitignore files above ``path`` (inside the scanned root) ignore it, as git decides: the deepest
    one with a pattern matching ``path`` says (``!keep.py`` in ``sub/.gitignore`` keeps what ``*.py`` above ignores),
    within it the last matching pattern. ``specs`` are in walk order, so a folder's comes after its parents'."""
    for base, spec in reversed(specs):
        try:
            relative = path.relative_to(base).as_posix()
        except ValueError:
            continue
        verdict = spec.check_file(relative + ("/" if is_folder else "")).include  # type: ignore[attr-defined]
        if verdict is not None:
            return verdict
    return False


def _git_files(root: Path) -> Optional[List[str]]:
    """The files git knows under ``root`` — tracked ones, and untracked ones ``.gitignore`` does not exclude — or
    None outside a git checkout (or without git). Git ignores only untracked files: a committed file in a folder a
    ``.gitignore`` names (CogVideo ignores ``**/sat``, whose 67 files are committed) is part of the project. A
    submodule (or a nested checkout) is listed as its folder."""
    import subprocess

    try:
        done = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    names = [n for n in done.stdout.decode("utf-8", "surrogateescape").split("\0") if n]
    return sorted(str(root / name) for name in names if (root / name).is_file() or (root / name / ".git").exists())


def discover(paths: Sequence[str], patterns: Sequence[str] = ()) -> List[Tuple[str, bool]]:
    """``(path, vendored)`` for every file to scan under ``paths`` (files given by name are always scanned)."""
    found: List[Tuple[str, bool]] = []
    for given in paths:
        root = Path(given)
        if not root.exists():
            raise ScanError(f"no such file or folder: {given}")
        if not root.is_dir():
            found.append((str(root), False))
            continue
        start = len(found)
        tracked = _git_files(root)
        if tracked:  # a git checkout: what git has (committed files count even where .gitignore matches)
            for path in tracked:
                parts = set(Path(os.path.relpath(path, root)).parts[:-1])
                if parts & set(SKIPPED) or any(p.startswith(".") for p in parts):
                    continue
                if os.path.isdir(path):  # a submodule: someone else's code, read and reported as vendored
                    found.extend((inner, True) for inner, _ in discover([path], patterns))
                elif _wanted(os.path.basename(path), patterns):
                    found.append((path, bool(parts & set(VENDORED))))
        else:
            found.extend(_walk(root, patterns))
        found[start:] = [
            (_real_under(path, root), vendored or _links_into_vendored(path, root)) for path, vendored in found[start:]
        ]
    seen = set()
    unique = []
    for path, vendored in found:  # a path given twice, or a file inside a folder also given: once
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            unique.append((path, vendored))
    return unique


def _walk(root: Path, patterns: Sequence[str]) -> List[Tuple[str, bool]]:
    """``(path, vendored)`` under ``root`` outside a git checkout: ``.gitignore`` files read as git reads them."""
    found: List[Tuple[str, bool]] = []
    specs: List[Tuple[Path, object]] = []
    for folder, folders, files in os.walk(root):
        here = Path(folder)
        spec = _gitignore(here)
        if spec is not None:
            specs.append((here, spec))

        folders[:] = sorted(
            d for d in folders if d not in SKIPPED and not d.startswith(".") and not _ignored(specs, here / d, True)
        )
        parts = set(here.relative_to(root).parts)
        vendored = bool(parts & set(VENDORED))
        for name in sorted(files):
            path = here / name
            if _wanted(name, patterns) and path.is_file() and not _ignored(specs, path, False):
                found.append((str(path), vendored))
    return found


def _real_under(path: str, root: Path) -> str:
    """The file a link found under ``root`` points to, spelled from ``root`` as ``path`` is, when it is inside
    ``root``: the finding names the file that holds the code, and a file reached by its name and through a link is
    reported once, under its own name. A link out of ``root`` keeps its own name: the file it points to is not one
    of the paths given (``fix --write`` will not write through it), and the link is where this project uses it."""
    if not os.path.islink(path):
        return path
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    if not real.startswith(real_root.rstrip(os.sep) + os.sep):
        return path
    return os.path.join(str(root), os.path.relpath(real, real_root))


def _links_into_vendored(path: str, root: Path) -> bool:
    """Whether ``path`` is a link to a file in a vendored folder of ``root``: someone else's code wherever it is
    reached from (``fix --write`` rewrote it through the link). Only files can be links here: neither git nor the
    walk enters a linked folder."""
    if not os.path.islink(path):
        return False
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    if not real.startswith(real_root + os.sep):
        return False
    return bool(set(Path(os.path.relpath(real, real_root)).parts[:-1]) & set(VENDORED))


# ---- one file ------------------------------------------------------------------------------------------------------


def _decode(data: bytes, python: bool) -> str:
    """The file's text: its declared encoding (PEP 263) for Python, else UTF-8; a BOM is dropped."""
    if python:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    else:
        text = data.decode("utf-8")
    return text[1:] if text.startswith("\ufeff") else text


def _suppressed(finding: Finding, lines: List[str]) -> bool:
    """Whether a suppression comment names the finding on its line, or on the first line of the statement spread
    over lines it is part of (where the comment was written before findings moved to the CUDA-only line)."""
    for line in dict.fromkeys((finding.line, finding.span[0])):
        match = _SUPPRESSION.search(lines[line - 1]) if 0 < line <= len(lines) else None
        if match is None:
            continue
        codes = match.group(1)
        if codes is None or finding.code in {c.strip().upper() for c in codes.split(",")}:
            return True
    return False


def _interested(selected: Sequence[Type[Rule]], text: str, python: bool) -> List[Type[Rule]]:
    """The rules that want to read this file: a rule of its kind (Python rules ``.py`` files, text rules the files
    they name) with a trigger in its text. Each distinct trigger is looked for once per file (``in``: a fast
    substring search; one regex alternation of all triggers scanned the text once per rule, and was slower)."""
    present: Dict[object, bool] = {}
    if not text.endswith("\n"):
        text += "\n"  # a trigger that ends a line ends the last one too
    wanted: List[Type[Rule]] = []
    for groups, same in _trigger_sets(tuple(selected), python):
        for group in groups:
            for trigger in group:  # inline, not a helper per trigger: this loop runs for every file of a tree
                found = present.get(trigger)
                if found is None:
                    found = present[trigger] = (
                        trigger in text if trigger.__class__ is str else bool(trigger.search(text))
                    )
                if found:
                    break
            else:
                break  # no trigger of this group: these rules do not look
        else:
            wanted.extend(same)
    return sorted(wanted, key=selected.index) if len(wanted) > 1 else wanted


@functools.lru_cache(maxsize=8)
def _trigger_sets(selected: Tuple[Type[Rule], ...], python: bool) -> List[Tuple[Tuple[Tuple[object, ...], ...], List]]:
    """The selected rules of a file's kind, grouped by their triggers (a dozen rules look for ``cuda``): each
    group's triggers are looked at once per file."""
    sets: Dict[Tuple[Tuple[object, ...], ...], List[Type[Rule]]] = {}
    for rule in selected:
        if rule is SyntaxRule or bool(rule.file_patterns) == python:
            continue
        groups = (rule.triggers, rule.also_triggers) if rule.also_triggers else (rule.triggers,)
        sets.setdefault(groups, []).append(rule)
    return list(sets.items())


def scan_file(path: str, vendored: bool, selected: Sequence[Type[Rule]]) -> FileResult:
    """Run the ``selected`` rules on one file."""
    result = FileResult(path, vendored)
    name = os.path.basename(path)
    python = name.endswith(".py")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or a device named on the command line: reading blocks
            raise OSError(f"{path} is not a regular file")
        data = Path(path).read_bytes()
        text = _decode(data, python)
    except (OSError, UnicodeDecodeError, SyntaxError, LookupError) as exc:
        if SyntaxRule in selected:
            result.findings.append(TextFile(path, "").finding(SyntaxRule(), 1, f"cannot be read ({exc}); not scanned"))
        return result
    interested = _interested(selected, text, python)
    unreadable = SyntaxRule in selected
    if python:
        only_syntax = unreadable and len(selected) == 1  # --select NPU001: every file is parsed, for that alone
        if not interested and not only_syntax:  # mentions nothing a rule looks for: not parsed (most files of a tree)
            return result
        try:
            source = PythonFile.parse(path, text)
        except (SyntaxError, ValueError, RecursionError) as exc:
            line = getattr(exc, "lineno", None) or 1
            message = f"cannot be parsed as Python ({getattr(exc, 'msg', None) or exc}); not scanned"
            if unreadable:
                result.findings.append(TextFile(path, text).finding(SyntaxRule(), line, message))
            return result
        result.parsed = True
        for rule in interested:
            result.findings.extend(rule().check(source))
    else:
        source_text = TextFile(path, text)
        for rule in interested:
            if any(fnmatch.fnmatch(name, p) for p in rule.file_patterns):
                result.parsed = True
                result.findings.extend(rule().check_text(source_text))
    if result.findings:
        found = set(result.findings)
        if _SUPPRESSION.search(text) is not None:  # the file has a suppression comment
            lines = source.lines if python else split_lines(text)
            found = {f for f in found if not _suppressed(f, lines)}
        result.findings = sorted(found, key=lambda f: (f.line, f.column, f.code))
    return result


def _scan_many(batch: List[Tuple[str, bool]], codes: List[str]) -> List[FileResult]:
    chosen = [r for r in rules() if r.code in codes]
    with _collector_paused():
        return [scan_file(path, vendored, chosen) for path, vendored in batch]


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while files are parsed: a syntax tree is hundreds of thousands of
    objects, and each one allocated counts toward the next collection, which walks every live object — a quarter
    of a big tree's parse time went to collections that found nothing (a tree holds no cycles: it is freed by
    reference counting when its file is done). Restored as it was after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ---- a tree --------------------------------------------------------------------------------------------------------


def scan(
    paths: Sequence[str],
    *,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    jobs: Optional[int] = None,
    progress: bool = False,
) -> ScanResult:
    """Scan ``paths`` (files or folders) with the selected rules, keeping the findings of the selected severities;
    see the module docstring."""
    chosen = select_rules(select, ignore)
    severities = keep_severities(select, ignore)
    patterns = sorted({p for r in chosen for p in r.file_patterns})
    files = discover(paths, patterns)
    codes = [r.code for r in chosen]
    workers = jobs if jobs is not None else (os.cpu_count() or 1)
    results: List[FileResult] = []
    bar = _progress(len(files)) if progress else None
    try:
        if workers <= 1 or len(files) < PARALLEL_FROM:
            with _collector_paused():
                for path, vendored in files:
                    results.append(scan_file(path, vendored, chosen))
                    if bar is not None:
                        bar.update(1)
        else:
            size = max(8, len(files) // (workers * 8))
            batches = [files[i : i + size] for i in range(0, len(files), size)]
            with ProcessPoolExecutor(max_workers=workers) as pool:
                for batch_result in pool.map(_scan_many, batches, [codes] * len(batches)):
                    results.extend(batch_result)
                    if bar is not None:
                        bar.update(len(batch_result))
    finally:
        if bar is not None:
            bar.close()
    if len(severities) < len(SEVERITIES):
        for one in results:
            one.findings = [f for f in one.findings if f.severity in severities]
    return ScanResult([str(p) for p in paths], results, codes)


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, unit="file", desc="npu-port scan", disable=total < 200, leave=False)


def iter_findings(result: ScanResult, vendored: bool = False) -> Iterable[Finding]:
    return result.vendored_findings if vendored else result.findings
