"""Run every real project's own entry point unchanged under ``npu-port run``, and its hand port with plain python,
on the same tiny inputs; compare what they wrote and print a table.

usage: run.py [--root /tmp/realrepos] [--only ID[,ID...]] [--rerun-baselines] [--timeout S]

Needs setup.sh first (venvs, inputs, hand ports under ROOT). Three variants of each run, each in its own folder
ROOT/out/ID/VARIANT: "npuport" (the fetched original under npu-port run), "handport" (the edited copy, plain python)
and "plain" (the fetched original under plain python: what happens without npu-port). Each folder holds the command,
log, exit code, wall time, npu-port's --report JSON, the files the project wrote and the captured module outputs
(capture/sitecustomize.py). The hand-port and plain runs do not depend on npu-port and are reused unless
--rerun-baselines. Results: ROOT/results/results.json and ROOT/results/table.md. Runs use OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the harness's sibling modules (runs, compare), also when this file is loaded by path

from runs import DIRNAME, HALF_RATIO, RUNS, Run  # noqa: E402  (after the path is set)


def _fill(values: List[str], inputs: str) -> List[str]:
    return [value.replace("{inputs}", inputs) for value in values]


def _command(run: Run, root: str, variant: str, run_dir: str) -> tuple:
    """(argv, cwd, env, repo, inputs) of one variant: "npuport", "plain" (the fetched original), "handport" or
    "reference64" (the hand port in float64)."""
    venv = os.path.join(root, "venvs", run.project)
    hand = variant in ("handport", "reference64")
    repo = os.path.join(root, "handport" if hand else "src", DIRNAME[run.project])
    inputs = os.path.join(root, "inputs", run.project)
    args = _fill(run.args, inputs)
    entry = run.hand_entry if variant == "handport" and run.hand_entry else run.entry
    if variant == "reference64":
        entry = run.reference_entry
    if entry.startswith("-m "):
        target = ["-m", entry[3:]]
    elif entry.startswith("{inputs}"):
        target = _fill([entry], inputs)
    else:
        target = [os.path.join(repo, entry)]
    py = os.path.join(venv, "bin", "python")
    if run.nproc > 1:
        launcher = [os.path.join(venv, "bin", "torchrun"), "--standalone", "--nproc_per_node", str(run.nproc)]
    else:
        launcher = [py]
    if variant == "npuport":
        npu = [
            "-m",
            "npu_port",
            "run",
            "--device",
            "cpu",
            *run.npu_flags,
            "--report",
            os.path.join(run_dir, "report.json"),
        ]
        if run.nproc == 1:  # the console script, as a user types it
            npu = [os.path.join(venv, "bin", "npu-port"), *npu[2:]]
        argv = [*launcher, *npu, *target, *args] if run.nproc > 1 else [*npu, *target, *args]
    else:
        argv = [*launcher, *target, *args]
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONHASHSEED="0",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        MPLBACKEND="Agg",
        PYTHONPATH=os.path.join(HERE, "capture"),
    )
    if run.repo_on_path:
        env["PYTHONPATH"] += os.pathsep + repo
    if run.capture:
        env.update(REALREPOS_CAPTURE_DIR=os.path.join(run_dir, "capture"), REALREPOS_CAPTURE_CLASSES=run.capture)
    if run.no_display:
        env.update(REALREPOS_CAPTURE_DIR=os.path.join(run_dir, "capture"), REALREPOS_NO_DISPLAY="1")
    cwd = repo if run.cwd_repo else run_dir
    return argv, cwd, env, repo, inputs


def _prepare(run: Run, root: str, run_dir: str, repo: str, inputs: str) -> None:
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    for name, target in run.links.items():
        os.symlink(target.replace("{inputs}", inputs), os.path.join(run_dir, name))
    if run.project == "raft":  # RAFT reads datasets/Sintel relative to its root
        link = os.path.join(repo, "datasets")
        if not os.path.islink(link):
            os.symlink(os.path.join(inputs, "datasets"), link)


def _last_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    patterns = (r"^npu-port: ", r"^[\w.]*(Error|Exception|Interrupt)\b.*", r"^error: ", r"^usage: ")
    for line in reversed(lines):
        if "ChildFailedError" in line:  # torchrun's own summary: the rank's error is further up
            continue
        if any(re.match(p, line) for p in patterns) or re.search(r"\b\w+Error: ", line):
            return line[:240]
    return ""


def execute(run: Run, root: str, variant: str, timeout: int) -> dict:
    run_dir = os.path.join(root, "out", run.id, variant)
    argv, cwd, env, repo, inputs = _command(run, root, variant, run_dir)
    _prepare(run, root, run_dir, repo, inputs)
    shown = " ".join(argv).replace(root, "$ROOT")
    with open(os.path.join(run_dir, "command.txt"), "w", encoding="utf-8") as fh:
        fh.write(f"cd {cwd}\n{shown}\n")
    start = time.perf_counter()
    with open(os.path.join(run_dir, "log.txt"), "w", encoding="utf-8") as log:
        try:
            code = subprocess.run(
                argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    seconds = round(time.perf_counter() - start, 1)
    if run.collect:
        for path in glob.glob(os.path.join(cwd, run.collect)):
            shutil.move(path, os.path.join(run_dir, os.path.basename(path)))
    with open(os.path.join(run_dir, "log.txt"), encoding="utf-8", errors="replace") as fh:
        log_text = fh.read()
    result = {
        "variant": variant,
        "command": shown,
        "cwd": cwd.replace(root, "$ROOT"),
        "exit": code,
        "seconds": seconds,
        "error": _last_error(log_text) if code != 0 else "",
    }
    # report.json, or one file per rank once npu-port writes them (report*.json: rank-suffixed names)
    reports = sorted(name for name in os.listdir(run_dir) if name.startswith("report") and name.endswith(".json"))
    result["report_files"] = reports
    if reports:
        try:
            with open(os.path.join(run_dir, reports[0]), encoding="utf-8") as fh:
                result["report"] = json.load(fh)
        except ValueError as exc:
            result["report"] = {"unreadable": str(exc)}
    with open(os.path.join(run_dir, "exit_code.txt"), "w", encoding="utf-8") as fh:
        fh.write(f"{code}\n{seconds}\n")
    return result


def _compare(root: str, run: Run, ours: str = "npuport", theirs: str = "handport") -> dict:
    python = os.path.join(root, "venvs", run.project, "bin", "python")
    out = os.path.join(root, "out", run.id)
    done = subprocess.run(
        [
            python,
            "-W",
            "ignore",
            os.path.join(HERE, "compare.py"),
            "--json",
            os.path.join(out, ours),
            os.path.join(out, theirs),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout)


def _report_summary(report: Optional[dict]) -> str:
    if not report:
        return "no report"
    if "unreadable" in report:
        return f"report unreadable: {report['unreadable']}"
    parts = [f"exit_code {report.get('exit_code')}"]
    strategy = report.get("strategy") or {}
    parts.append(f"strategy {strategy.get('resolved', '?')}")
    calls = report.get("attention_calls") or {}
    if calls:
        parts.append("attention " + ", ".join(f"{k}: {v}" for k, v in sorted(calls.items())))
    served = (report.get("drop_ins") or {}).get("served") or {}
    if served:
        parts.append("drop-ins served " + "/".join(sorted(served)))
    fallbacks = (report.get("fallbacks") or {}).get("served") or {}
    if fallbacks:
        parts.append("fallbacks served " + "/".join(sorted(fallbacks)))
    legacy = report.get("legacy_attention_classes") or []
    if legacy:
        parts.append("legacy " + ", ".join(name.rsplit(".", 1)[-1] for name in legacy))
    hits = (report.get("redirect") or {}).get("hits") or {}
    if hits:
        parts.append(f"redirect {sum(hits.values())} hits")
    return "; ".join(parts)


def _report_cell(result: dict) -> str:
    text = _report_summary(result.get("report"))
    files = result.get("report_files") or []
    return text + (f" ({len(files)} report files; the first shown)" if len(files) > 1 else "")


def _fmt(value) -> str:
    from compare import fmt

    return fmt(value)


def _outcome(result: dict) -> str:
    if result["exit"] == 0:
        return "0"
    return f"{result['exit']}: {result['error']}".replace("|", "/")


#: outputs "match" the hand port when every float differs by at most this fraction of the largest value in its file
#: (at least 1; float32 kernels that order operations differently) and every 8-bit image by at most one level
FLOAT_RTOL, IMAGE_LEVELS = 1e-4, 1.0


#: a half-precision run (two float16 computations never agree to float32 rounding) "works" when npu-port's floats are
#: at most this many times further from the float64 reference than the hand port's
def verdict(item: dict) -> str:
    """works / FAILS (npu-port only) / DIFFERS (outputs) / hand port fails (too), and a report that says otherwise."""
    word = _outputs_verdict(item)
    report = item["npuport"].get("report") or {}
    if "exit_code" in report and report["exit_code"] != item["npuport"]["exit"]:
        word += f"; report says exit_code {report['exit_code']}"
    return word


def _outputs_verdict(item: dict) -> str:
    npu, hand, comparison = item["npuport"], item["handport"], item.get("compare") or {}
    if hand["exit"] != 0:
        return "hand port fails too" if npu["exit"] != 0 else "hand port fails"
    if npu["exit"] != 0:
        return "FAILS"
    if comparison.get("verdict") != "compared":
        return "DIFFERS"
    if "reference64" in item:
        ours, hand_error = item.get("vs_reference64") or {}, item.get("hand_vs_reference64") or {}
        if item["reference64"]["exit"] != 0 or ours.get("verdict") != "compared":
            return "DIFFERS (no float64 reference)"
        within = (ours.get("float") or 0.0) <= HALF_RATIO * (hand_error.get("float") or 0.0)
        return "works (float16: as close to float64 as the hand port)" if within else "DIFFERS from float64"
    scale = max(comparison.get("float_scale") or 0.0, 1.0)
    if (comparison.get("float") or 0.0) > FLOAT_RTOL * scale or (comparison.get("image") or 0.0) > IMAGE_LEVELS:
        return "DIFFERS"
    return "works"


def table(results: List[dict]) -> str:
    rows = [
        "| run | verdict | original, plain python | original, npu-port run | hand port | npu-port report | "
        "max\\|diff\\| float (values up to) | image (8-bit levels) | time npu-port / hand (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for item in results:
        npu, hand, comparison = item["npuport"], item["handport"], item.get("compare") or {}
        state = comparison.get("verdict", "")
        float_diff, image_diff = _fmt(comparison.get("float")), _fmt(comparison.get("image"))
        if comparison.get("float_scale") is not None:
            float_diff += f" ({_fmt(comparison['float_scale'])})"
        if state and state != "compared":
            float_diff += f" {state}"
        if "vs_reference64" in item:
            float_diff += (
                f"; vs float64: npu-port {_fmt(item['vs_reference64'].get('float'))}, "
                f"hand port {_fmt(item['hand_vs_reference64'].get('float'))}"
            )
        rows.append(
            f"| {item['id']} | {verdict(item)} | {_outcome(item['plain'])} | {_outcome(npu)} | {_outcome(hand)} | "
            f"{_report_cell(npu)} | {float_diff} | {image_diff} | "
            f"{npu['seconds']} / {hand['seconds']} |"
        )
    return "\n".join(rows)


def _git(path: str, *args: str) -> str:
    done = subprocess.run(["git", "-C", path, *args], capture_output=True, text=True)
    return done.stdout.strip()


def environment(root: str) -> dict:
    checkout_file = os.path.join(root, "npu_port_checkout")
    checkout = open(checkout_file, encoding="utf-8").read().strip() if os.path.exists(checkout_file) else "?"
    dirty = " (with uncommitted changes)" if _git(checkout, "status", "--porcelain", "--untracked-files=no") else ""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    return {
        "npu_port": f"{checkout} @ {_git(checkout, 'rev-parse', '--short', 'HEAD')}{dirty}",
        "repos": {name: _git(os.path.join(root, "src", d), "rev-parse", "HEAD") for name, d in DIRNAME.items()},
        "machine": [
            line
            for line in lscpu
            if line.split(":")[0] in ("Architecture", "CPU(s)", "Model name", "Thread(s) per core")
        ],
        "python": platform.python_version(),
        "torch": {name: _freeze(root, name, "torch") for name in DIRNAME},
    }


def _freeze(root: str, project: str, package: str) -> str:
    path = os.path.join(root, "venvs", project, ".freeze")
    if not os.path.exists(path):
        return "?"
    for line in open(path, encoding="utf-8"):
        if line.lower().startswith(package + "=="):
            return line.strip().split("==", 1)[1]
    return "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="/tmp/realrepos")
    parser.add_argument(
        "--only", default="", help="comma-separated run ids (default: all): " + ", ".join(r.id for r in RUNS)
    )
    parser.add_argument("--rerun-baselines", action="store_true", help="run the hand port and plain python again")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    wanted = [r for r in RUNS if not args.only or r.id in args.only.split(",")]
    unknown = set(args.only.split(",")) - {r.id for r in RUNS} - {""}
    if unknown:
        parser.error(f"unknown run ids {sorted(unknown)}; valid: {', '.join(r.id for r in RUNS)}")
    if not os.path.exists(os.path.join(root, "npu_port_checkout")):
        parser.error(f"{root} has not been set up: run setup.sh first")
    results_dir = os.path.join(root, "results")
    os.makedirs(results_dir, exist_ok=True)
    previous = {}
    results_file = os.path.join(results_dir, "results.json")
    if os.path.exists(results_file):
        with open(results_file, encoding="utf-8") as fh:
            previous = {item["id"]: item for item in json.load(fh).get("runs", [])}
    for run in wanted:
        item = {"id": run.id, "note": run.note}
        print(f"== {run.id}: npu-port", flush=True)
        item["npuport"] = execute(run, root, "npuport", args.timeout)
        for variant in ("handport", "plain", *(("reference64",) if run.reference_entry else ())):
            cached = os.path.join(root, "out", run.id, variant, "exit_code.txt")
            if args.rerun_baselines or not os.path.exists(cached) or variant not in previous.get(run.id, {}):
                print(f"== {run.id}: {variant}", flush=True)
                item[variant] = execute(run, root, variant, args.timeout)
            else:
                item[variant] = previous[run.id][variant]
        item["compare"] = _compare(root, run)
        if run.reference_entry:
            item["vs_reference64"] = _compare(root, run, "npuport", "reference64")
            item["hand_vs_reference64"] = _compare(root, run, "handport", "reference64")
        previous[run.id] = item
    ordered = [previous[r.id] for r in RUNS if r.id in previous]
    for item in ordered:  # errors are read from the logs again, so a better reading reaches every row
        for variant in ("npuport", "handport", "plain"):
            log = os.path.join(root, "out", item["id"], variant, "log.txt")
            if variant in item and item[variant]["exit"] != 0 and os.path.exists(log):
                with open(log, encoding="utf-8", errors="replace") as fh:
                    item[variant]["error"] = _last_error(fh.read())
    summary = {"environment": environment(root), "runs": ordered}
    with open(results_file + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    os.replace(results_file + ".tmp", results_file)
    text = table(ordered)
    with open(os.path.join(results_dir, "table.md"), "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    print(text)
    counts: Dict[str, int] = {}
    for item in ordered:
        counts[verdict(item)] = counts.get(verdict(item), 0) + 1
    print("\n" + ", ".join(f"{name}: {n}" for name, n in sorted(counts.items())))
    print(f"results: {results_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
