"""A scan's findings as people and tools read them: a report grouped by file and severity with a summary that answers
"what breaks at import, what ``npu-port run`` handles, what needs a manual change"; JSON; CSV with the columns of
Ascend's migration tool (File, Start Line, End Line, OP, Tips) plus Code, Severity and Fix; SARIF 2.1.0, which GitHub
code scanning accepts."""

from __future__ import annotations

import csv
import io
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Dict, List
from urllib.parse import quote

from .._version import __version__
from .engine import ScanResult
from .rule import SEVERITIES, Finding, rules

FORMATS = ("text", "json", "csv", "sarif")
#: SARIF levels for our severities (error: it breaks; warning: slow; note: handled or informative).
SARIF_LEVEL = {"import": "error", "runtime": "error", "handled": "note", "perf": "warning", "deprecated": "warning",
               "guarded": "note", "info": "note"}  # fmt: skip
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
HEADLINES = {
    "import": "breaks at import (the module cannot be imported without CUDA)",
    "runtime": "breaks when reached",
    "handled": "handled by npu-port (npu-port run, a strategy or a drop-in)",
    "perf": "works, but slow or memory-hungry on the target",
    "deprecated": "works, but the API is going away",
    "guarded": "CUDA-only, reached only where CUDA is available (the guard keeps it safe)",
    "info": "for information",
}


def summary_lines(result: ScanResult) -> List[str]:
    counts = result.counts()
    scanned = len(result.files)
    parsed = sum(1 for f in result.files if f.parsed)
    found = result.findings
    manual = sum(1 for f in found if f.severity in ("import", "runtime", "perf", "deprecated") and f.fix == "manual")
    fixable = sum(1 for f in found if f.fix == "safe")
    lines = [f"{scanned} files scanned ({parsed} looked at by rules: the others mention nothing a rule looks for)"]
    for severity in SEVERITIES:
        lines.append(f"  {counts[severity]:5d} {severity:10s} {HEADLINES[severity]}")
    lines.append(f"  {fixable:5d} with a safe fix (no change on CUDA); {manual:5d} need a manual change")
    vendored = result.vendored_findings
    if vendored:
        folders = sorted({f.path for f in vendored})
        lines.append(f"  {len(vendored):5d} more in vendored code ({len(folders)} files; not counted above)")
    return lines


def text_report(result: ScanResult) -> str:
    out: List[str] = []
    sections = (("", result.findings), ("vendored code (someone else's: not counted)", result.vendored_findings))
    for title, found in sections:
        if not found:
            continue
        if title:
            out.append(f"== {title}")
        by_file: Dict[str, List[Finding]] = defaultdict(list)
        for finding in found:
            by_file[finding.path].append(finding)
        for path in sorted(by_file):
            out.append(path)
            for severity in SEVERITIES:
                for f in (x for x in by_file[path] if x.severity == severity):
                    handled = f" [handled by {f.handled_by}]" if f.handled_by else ""
                    fix = f" (fix: {f.fix})" if f.fix != "manual" else ""
                    out.append(f"  {f.line}:{f.column} {f.code} {severity}: {f.message}{handled}{fix}")
        out.append("")
    out.extend(summary_lines(result))
    return "\n".join(out) + "\n"


def json_report(result: ScanResult) -> str:
    payload = {
        "npu_port": __version__,
        "roots": result.roots,
        "files_scanned": len(result.files),
        "rules": result.selected,
        "counts": result.counts(),
        "findings": [f.to_dict() for f in result.findings],
        "vendored_findings": [f.to_dict() for f in result.vendored_findings],
    }
    return json.dumps(payload, indent=1) + "\n"


CSV_COLUMNS = ("File", "Start Line", "End Line", "OP", "Tips", "Code", "Severity", "Fix", "Vendored")


def csv_report(result: ScanResult) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for vendored, found in ((False, result.findings), (True, result.vendored_findings)):
        for f in found:
            writer.writerow([f.path, f.line, f.end_line, f.snippet, f.message, f.code, f.severity, f.fix, vendored])
    return buffer.getvalue()


#: The base the relative ``uri`` of every SARIF location is read against: the folder the scan ran in (GitHub code
#: scanning resolves it against the checkout's root, which is where a CI job runs ``npu-port scan .``).
SARIF_ROOT = "%SRCROOT%"


def _sarif_location(path: str) -> Dict[str, str]:
    """A SARIF ``artifactLocation``: a relative, percent-encoded URI under the working folder, else a ``file://`` URI
    (a path as given — absolute, with spaces, ``#`` or bytes that are not UTF-8 — is not a valid URI reference)."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute)
    if relative != ".." and not relative.startswith(".." + os.sep):
        return {"uri": quote(os.fsencode(relative.replace(os.sep, "/"))), "uriBaseId": SARIF_ROOT}
    return {"uri": Path(absolute).as_uri()}


def sarif_report(result: ScanResult) -> str:
    catalogue = [r for r in rules() if r.code in result.selected]
    index = {r.code: i for i, r in enumerate(catalogue)}
    results = []
    for vendored, found in ((False, result.findings), (True, result.vendored_findings)):
        for f in found:
            entry = {
                "ruleId": f.code,
                "ruleIndex": index.get(f.code, 0),
                "level": SARIF_LEVEL[f.severity],
                "message": {"text": f.message + (f" (handled by {f.handled_by})" if f.handled_by else "")},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": _sarif_location(f.path),
                            "region": {
                                "startLine": f.line,
                                "startColumn": f.column,
                                "endLine": f.end_line,
                                "endColumn": max(f.end_column, f.column),
                            },
                        }
                    }
                ],
                "properties": {"severity": f.severity, "fix": f.fix, "vendored": vendored},
            }
            results.append(entry)
    payload = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "npu-port scan",
                        "version": __version__,
                        "informationUri": "https://github.com/npu-port/npu-port",
                        "rules": [
                            {
                                "id": r.code,
                                "name": r.name,
                                "shortDescription": {"text": r.message},
                                "fullDescription": {"text": r.summary()},
                                "help": {"text": (r.__doc__ or "").strip()},
                                "defaultConfiguration": {"level": SARIF_LEVEL[r.severity]},
                                "properties": {"severity": r.severity, "fix": r.fix, "targets": list(r.targets)},
                            }
                            for r in catalogue
                        ],
                    }
                },
                "originalUriBaseIds": {SARIF_ROOT: {"uri": Path.cwd().as_uri() + "/"}},
                "results": results,
            }
        ],
    }
    return json.dumps(payload, indent=1) + "\n"


def render(result: ScanResult, form: str) -> str:
    return {"text": text_report, "json": json_report, "csv": csv_report, "sarif": sarif_report}[form](result)


def rules_table(markdown: bool = False) -> str:
    """Every rule: code, name, severity, fix, targets, message (the site's scan-rules reference is this, with
    ``markdown=True``)."""
    rows = [(r.code, r.name, r.severity, r.fix, ",".join(r.targets), r.message, r.handled_by or "") for r in rules()]
    if markdown:
        out = ["| code | name | severity | fix | targets | finds | handled by |", "|---|---|---|---|---|---|---|"]
        out += ["| " + " | ".join(f"`{c}`" if i == 0 else c for i, c in enumerate(row)) + " |" for row in rows]
        return "\n".join(out) + "\n"
    return "\n".join(f"{c}  {n:34s} {s:10s} {f:7s} {t:12s} {m}" for c, n, s, f, t, m, _ in rows) + "\n"
