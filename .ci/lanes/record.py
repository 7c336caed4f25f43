#!/usr/bin/env python3
"""What the CI lanes ran, kept true: each lane's result, the merged record, and README's compatibility table.

Why a record: "which versions does npu-port work with" must be what CI measured, not what someone remembers. Each
lane of ``.ci/run`` writes one result (the versions it had installed, its steps, the test counts from pytest's JUnit
XML, the failures, its wall time, the date); ``.ci/run`` merges them into ``npu_port/support_tested.json``
(``npu_port.support.TESTED_FILE``, shipped in the wheel, read by ``npu-port doctor``) and renders the table in
README.md between the compat-table markers from that record, so the README can only say what the record says
(tests/project/test_compat_table.py checks both).

Only the standard library (each lane's own interpreter runs ``versions`` and ``unpinned``), plus
``npu_port.atomic`` for the writes.

    record.py versions                          the lane interpreter's versions, as JSON
    record.py unpinned CONSTRAINTS              exit 1 naming installed packages CONSTRAINTS does not pin exactly
    record.py lane --name N --python PY ...     write one lane's result
    record.py merge --results DIR --lanes ...   merge the results into the record and README, print the summary;
                                                exit 1 when a lane of this run failed
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RECORD = ROOT / "npu_port" / "support_tested.json"  # npu_port.support.TESTED_FILE (a test checks they agree)

#: The distributions whose installed versions every lane records, in the table's column order.
PACKAGES = ("torch", "diffusers", "transformers", "huggingface_hub", "accelerate", "gradio")
#: Never pinned in a lane's constraints: the project itself and the installer's own tools.
NOT_PINNED = {"npu-port", "pip", "setuptools", "wheel"}
OUTCOMES = ("pass", "fail")
COUNTS = ("passed", "failed", "errors", "skipped")
START = "<!-- compat-table:start -->"
END = "<!-- compat-table:end -->"
#: The record's layout; bump it when a field changes meaning.
SCHEMA = 1


# ---- inside a lane's interpreter -------------------------------------------------------------------------------


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def versions() -> Dict[str, Optional[str]]:
    """The installed version of each of :data:`PACKAGES` (None when absent) and of Python, read from metadata."""
    from importlib import metadata

    found: Dict[str, Optional[str]] = {"python": ".".join(map(str, sys.version_info[:3]))}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def pins(constraints_text: str) -> Dict[str, str]:
    """``name -> version`` for every exact pin (``name==version``) of a constraints file; other lines are ignored."""
    found = {}
    for line in constraints_text.splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;]+)", line)
        if match:
            found[_canonical(match.group(1))] = match.group(2)
    return found


def unpinned(installed: Mapping[str, str], constraints_text: str) -> List[str]:
    """The installed distributions (``name -> version``) the constraints do not pin exactly, as ``name==version``."""
    pinned = pins(constraints_text)
    return sorted(
        f"{name}=={version}"
        for name, version in ((_canonical(n), v) for n, v in installed.items())
        if name not in pinned and name not in NOT_PINNED
    )


def _installed() -> Dict[str, str]:
    from importlib import metadata

    return {d.metadata["Name"]: d.version for d in metadata.distributions() if d.metadata["Name"]}


# ---- one lane's result -----------------------------------------------------------------------------------------


def junit_results(paths: Iterable[Path]) -> Dict[str, Any]:
    """Counts and failures from pytest's JUnit XML files (``-o junit_family=xunit1``: each case names its file).

    A failure is ``{"test": node id, "cause": the first line of pytest's message}``. A missing file counts nothing:
    the step that should have written it failed, and its exit status says so.
    """
    counts = dict.fromkeys(COUNTS, 0)
    failures: List[Dict[str, str]] = []
    for path in paths:
        if not Path(path).is_file():
            continue
        root = ElementTree.parse(path).getroot()
        for case in root.iter("testcase"):
            outcome = "passed"
            cause = ""
            for kind, label in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped")):
                child = case.find(kind)
                if child is not None:
                    outcome = label
                    cause = _cause(child.get("message") or "", child.text or "")
                    break
            counts[outcome] += 1
            if outcome in ("failed", "errors"):
                failures.append({"test": _node_id(case), "cause": cause})
    return {"counts": counts, "failures": failures}


def _node_id(case: ElementTree.Element) -> str:
    name, file, classname = case.get("name", ""), case.get("file"), case.get("classname", "")
    if not classname:  # a module that could not be collected: pytest names it in ``name``
        return file or name
    if not file:
        return f"{classname}::{name}"
    module = file[:-3].replace("/", ".") if file.endswith(".py") else ""
    inner = classname[len(module) + 1 :] if module and classname.startswith(module + ".") else ""
    return "::".join(part for part in (file, *inner.split("."), name) if part)


def _cause(message: str, text: str, limit: int = 200) -> str:
    """One line saying why: pytest's message, or (for a collection error, whose message is only "collection failure")
    the last ``E`` line of the traceback."""
    raised = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    line = message.strip().splitlines()[0].strip() if message.strip() else ""
    if (not line or line == "collection failure") and raised:
        line = raised[-1]
    line = line or "(no message)"
    return line if len(line) <= limit else line[: limit - 1] + "…"


def lane_result(
    name: str,
    *,
    about: str,
    tests: str,
    constraints: Optional[str],
    versions: Mapping[str, Optional[str]],
    steps: Sequence[Sequence[Any]],
    junit: Dict[str, Any],
    seconds: float,
    date: str,
) -> Dict[str, Any]:
    """One lane's result: it passes when every step exited 0 and its tests ran with no failure or error."""
    counts = junit["counts"]
    ran = sum(counts.values()) > 0
    ok = all(int(code) == 0 for _, code in steps) and ran and counts["failed"] == 0 and counts["errors"] == 0
    return {
        "lane": name,
        "about": about,
        "tests": tests,
        "constraints": constraints,
        "versions": dict(versions),
        "outcome": "pass" if ok else "fail",
        "steps": [{"step": step, "exit": int(code)} for step, code in steps],
        "counts": dict(counts),
        "failures": [f["test"] for f in junit["failures"]],
        "seconds": round(float(seconds)),
        "date": date,
    }


# ---- the record -----------------------------------------------------------------------------------------------


def problems(record: Any) -> List[str]:
    """What is wrong with a record (an empty list when it is well-formed)."""
    if not isinstance(record, dict):
        return [f"the record is a {type(record).__name__}, not an object"]
    found = []
    if record.get("schema") != SCHEMA:
        found.append(f"schema is {record.get('schema')!r}, expected {SCHEMA}")
    lanes = record.get("lanes")
    if not isinstance(lanes, list) or not lanes:
        return found + ["lanes must be a non-empty list"]
    seen = set()
    for index, lane in enumerate(lanes):
        where = f"lanes[{index}]"
        if not isinstance(lane, dict):
            found.append(f"{where} is not an object")
            continue
        name = lane.get("lane")
        if not isinstance(name, str) or not name:
            found.append(f"{where}: lane must be a non-empty string")
        elif name in seen:
            found.append(f"{where}: lane {name!r} appears twice")
        seen.add(name)
        where = f"lane {name!r}"
        for key in ("about", "tests", "date"):
            if not isinstance(lane.get(key), str) or not lane.get(key):
                found.append(f"{where}: {key} must be a non-empty string")
        if not _is_date(lane.get("date")):
            found.append(f"{where}: date must be YYYY-MM-DD, got {lane.get('date')!r}")
        if lane.get("outcome") not in OUTCOMES:
            found.append(f"{where}: outcome must be one of {OUTCOMES}, got {lane.get('outcome')!r}")
        installed = lane.get("versions")
        if not isinstance(installed, dict) or any(p not in installed for p in ("python",) + PACKAGES):
            found.append(f"{where}: versions must name python and each of {', '.join(PACKAGES)} (null if absent)")
        elif lane.get("outcome") == "pass" and not installed.get("torch"):
            found.append(f"{where}: outcome pass without torch installed")
        counts = lane.get("counts")
        if not isinstance(counts, dict) or any(not _is_count(counts.get(k)) for k in COUNTS):
            found.append(f"{where}: counts must give {', '.join(COUNTS)} as numbers >= 0")
        else:
            failures = lane.get("failures")
            if not isinstance(failures, list) or len(failures) != counts["failed"] + counts["errors"]:
                found.append(f"{where}: failures must list every failed test and error")
            if lane.get("outcome") == "pass" and (counts["failed"] or counts["errors"] or not counts["passed"]):
                found.append(f"{where}: outcome pass with {counts}")
        steps = lane.get("steps")
        if not isinstance(steps, list) or not steps or any(not isinstance(s, dict) for s in steps):
            found.append(f"{where}: steps must be a non-empty list of {{step, exit}}")
        elif lane.get("outcome") == "pass" and any(s.get("exit") != 0 for s in steps):
            found.append(f"{where}: outcome pass with a failed step")
        if not _is_count(lane.get("seconds")):
            found.append(f"{where}: seconds must be a number >= 0")
    run = record.get("run")
    if run is not None:
        if not isinstance(run, dict) or not _is_date(run.get("date")) or not _is_count(run.get("seconds")):
            found.append("run must be {date: YYYY-MM-DD, seconds, cores, fresh}")
    return found


def _is_date(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def _is_count(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def merge(
    record: Optional[Dict[str, Any]],
    results: Sequence[Dict[str, Any]],
    order: Sequence[str],
    run: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The record after a run: each lane of ``order`` (``.ci/run``'s lanes) gets this run's result, or keeps its
    last one when it did not run this time; lanes no longer in ``order`` go. ``run`` (a run of every lane) replaces
    the record's run summary; a partial run keeps the last complete one's."""
    unknown = [r["lane"] for r in results if r["lane"] not in order]
    if unknown:
        raise ValueError(f"results for lanes .ci/run does not define: {', '.join(unknown)} (lanes: {', '.join(order)})")
    previous = {lane["lane"]: lane for lane in (record or {}).get("lanes", []) if isinstance(lane, dict)}
    new = {result["lane"]: result for result in results}
    lanes = [new.get(name) or previous.get(name) for name in order]
    merged: Dict[str, Any] = {"schema": SCHEMA, "lanes": [lane for lane in lanes if lane is not None]}
    last_run = run if run is not None else (record or {}).get("run")
    if last_run is not None:
        merged["run"] = last_run
    return merged


# ---- README's table ---------------------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _tests_cell(lane: Dict[str, Any]) -> str:
    counts = lane["counts"]
    parts = [f"{counts['passed']} passed"]
    parts += [f"{counts[k]} {k}" for k in ("failed", "errors", "skipped") if counts[k]]
    return ", ".join(parts)


def render_table(record: Dict[str, Any]) -> str:
    """README's compatibility table (between the markers, markers excluded) for ``record``."""
    header = ["lane", "tests"] + list(PACKAGES) + ["result", "time", "date"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for lane in record["lanes"]:
        installed = lane["versions"]
        verdict = "✔ pass" if lane["outcome"] == "pass" else "✘ fail"
        cells = [f"`{lane['lane']}`", lane["tests"]]
        cells += [installed.get(p) or "—" for p in PACKAGES]
        cells += [f"{verdict}: {_tests_cell(lane)}", _duration(lane["seconds"]), lane["date"]]
        lines.append("| " + " | ".join(cells) + " |")
    run = record.get("run")
    if run:
        caches = "from empty caches" if run.get("fresh") else "with the CI home's caches (pip wheels, locked envs)"
        lines += [
            "",
            f"The last `.ci/run` of every lane took {_duration(run['seconds'])} on {run['date']} "
            f"({run.get('cores', '?')} cores, {caches}).",
        ]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """``text`` with what lies between the compat-table markers replaced by ``block`` (each marker exactly once)."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"README.md must hold {START} and then {END}, each once")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{block}\n{END}{tail}"


def block_in(text: str) -> str:
    """What README's compat-table markers hold now (without the markers and their line ends)."""
    if text.count(START) != 1 or text.count(END) != 1:
        raise ValueError(f"README.md must hold {START} and then {END}, each once")
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def summary(results: Sequence[Dict[str, Any]], failures: Mapping[str, List[Dict[str, str]]]) -> List[str]:
    """What ``.ci/run`` prints at the end: one line per lane, then each failure with its cause."""
    lines = []
    for lane in results:
        steps = ", ".join(f"{s['step']} {'ok' if s['exit'] == 0 else 'exit ' + str(s['exit'])}" for s in lane["steps"])
        installed = ", ".join(f"{p} {lane['versions'].get(p) or '-'}" for p in PACKAGES[1:4])
        lines.append(
            f"lane {lane['lane']}: {lane['outcome'].upper()} — {_tests_cell(lane)} ({lane['tests']}; {steps}; "
            f"{installed}; {_duration(lane['seconds'])})"
        )
        for failure in failures.get(lane["lane"], []):
            lines.append(f"    {failure['test']}: {failure['cause']}")
    total = {k: sum(lane["counts"][k] for lane in results) for k in COUNTS}
    failed = total["failed"] + total["errors"]
    lines.append(f"ci: {total['passed']} passed, {failed} failed, {total['skipped']} skipped")
    return lines


# ---- the command line ---------------------------------------------------------------------------------------------


def _write_json(path: Path, data: Any) -> None:
    sys.path.insert(0, str(ROOT))
    from npu_port.atomic import write_json

    write_json(path, data)


def _write_text(path: Path, text: str) -> None:
    sys.path.insert(0, str(ROOT))
    from npu_port.atomic import write_text

    write_text(path, text)


def _load(path: Path) -> Optional[Dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=".ci/lanes/record.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("versions", help="print this interpreter's versions as JSON")
    check = commands.add_parser("unpinned", help="exit 1 when an installed package is not pinned exactly")
    check.add_argument("constraints", type=Path)
    lane = commands.add_parser("lane", help="write one lane's result")
    lane.add_argument("--name", required=True)
    lane.add_argument("--about", required=True)
    lane.add_argument("--tests", required=True)
    lane.add_argument("--constraints")
    lane.add_argument("--python", required=True, help="the lane's interpreter (asked for its versions)")
    lane.add_argument("--junit", type=Path, action="append", default=[])
    lane.add_argument("--step", action="append", default=[], metavar="NAME=EXIT")
    lane.add_argument("--seconds", type=float, required=True)
    lane.add_argument("--out", type=Path, required=True)
    merging = commands.add_parser("merge", help="merge lane results into the record and README; print the summary")
    merging.add_argument("--results", type=Path, required=True)
    merging.add_argument("--lanes", required=True, help="every lane .ci/run defines, in order, comma-separated")
    merging.add_argument("--ran", required=True, help="the lanes this run ran, comma-separated")
    merging.add_argument("--seconds", type=float, help="the whole run's wall time, when every lane ran")
    merging.add_argument("--fresh", action="store_true", help="the run started from empty caches")
    merging.add_argument("--record", type=Path, default=RECORD)
    merging.add_argument("--readme", type=Path, default=README)
    args = parser.parse_args(argv)

    if args.command == "versions":
        print(json.dumps(versions()))
        return 0
    if args.command == "unpinned":
        missing = unpinned(_installed(), args.constraints.read_text(encoding="utf-8"))
        if missing:
            print(
                f"{args.constraints}: these installed packages are not pinned (add them, or the lane is not "
                f"reproducible): {' '.join(missing)}",
                file=sys.stderr,
            )
            return 1
        return 0
    if args.command == "lane":
        asked = subprocess.run(
            [args.python, __file__, "versions"], capture_output=True, text=True, check=False, timeout=120
        )
        found = json.loads(asked.stdout) if asked.returncode == 0 else {"python": None, **dict.fromkeys(PACKAGES)}
        steps = []
        for step in args.step:
            name, _, code = step.rpartition("=")
            steps.append((name, int(code)))
        junit = junit_results(args.junit)
        result = lane_result(
            args.name,
            about=args.about,
            tests=args.tests,
            constraints=args.constraints,
            versions=found,
            steps=steps,
            junit=junit,
            seconds=args.seconds,
            date=datetime.date.today().isoformat(),
        )
        _write_json(args.out, {"result": result, "failures": junit["failures"]})
        return 0

    # merge
    order = [name for name in args.lanes.split(",") if name]
    loaded = [_load(path) for path in sorted(args.results.glob("*.json"))]
    results = sorted(
        (d["result"] for d in loaded if d), key=lambda r: order.index(r["lane"]) if r["lane"] in order else -1
    )
    failures = {d["result"]["lane"]: d["failures"] for d in loaded if d}
    ran = [name for name in args.ran.split(",") if name]
    missing = [name for name in ran if name not in failures]
    if missing:
        print(f".ci/lanes/record.py: no result from lane {', '.join(missing)} in {args.results}", file=sys.stderr)
        return 2
    run = None
    if args.seconds is not None and set(ran) == set(order):
        run = {
            "date": datetime.date.today().isoformat(),
            "seconds": round(args.seconds),
            "cores": os.cpu_count(),
            "fresh": bool(args.fresh),
        }
    record = merge(_load(args.record), results, order, run)
    wrong = problems(record)
    if wrong:
        print(".ci/lanes/record.py: the merged record is malformed: " + "; ".join(wrong), file=sys.stderr)
        return 2
    _write_json(args.record, record)
    _write_text(args.readme, replace_block(args.readme.read_text(encoding="utf-8"), render_table(record)))
    print("\n".join(summary(results, failures)))
    return 1 if any(result["outcome"] != "pass" for result in results) else 0


if __name__ == "__main__":
    sys.exit(_main())
