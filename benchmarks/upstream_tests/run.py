"""Run transformers' and diffusers' own model tests twice, without npu-port and with a strategy on every model they
build (``npu_port_plugin.py``), compare the outcome of every test id, and write the results.

usage:
  run.py run    [--suite transformers|diffusers ...] [--strategy NAME ...] [-k EXPR] [--files SUBSTR ...]
                [--jobs 2] [--timeout 600] [--compat-shim] [--resume] [--no-confirm] [--work-dir DIR]
                [--transformers-git DIR [--transformers-ref REF]] [--diffusers-git DIR [--diffusers-ref REF]]
  run.py prepare [same source options]      only build the test trees (and collect)
  run.py report                             rewrite benchmarks/upstream_tests.md from results/*.json

Where the tests come from (``prepare``): the library's git repository at the tag of the installed version
(``v5.24.0`` for transformers 5.24.0): ``--<suite>-git DIR`` (a clone or bare mirror), else a shallow clone of the tag
from GitHub. A repository without that tag is refused unless ``--<suite>-ref REF`` names the commit to use instead;
that is then recorded in every result. The installed version's sdist (``pip download --no-binary``) ships some test
files (transformers: ``tests/*.py``, the common mixins; diffusers: ``tests/testing_utils.py``); with ``--overlay auto``
(the default) they replace the repository's copies when the test files still collect with them (fewer or equal
collection errors), since they are exactly the installed version's. Only the listed test files, and what they import,
are extracted, under ``--work-dir`` (outside this repository: upstream sources are never committed here). transformers'
``tests/test_pipeline_mixin.py`` reads ``src/transformers`` of its checkout: that is a link to the installed package.

How it runs: one pytest process per test file and condition (``baseline``, then each strategy), ``-n --jobs`` workers
(pytest-xdist), ``--timeout`` seconds per test (pytest-timeout, thread method: a hung test's worker is killed and
replaced, the test is failed, the run goes on), ``HF_HUB_OFFLINE=1`` and ``OMP_NUM_THREADS`` = cores / jobs in both
conditions. Each run appends to ``WORK/records/<suite>/<condition>/<file>.jsonl``; ``--resume`` keeps the runs whose
record is complete. Then each regression (passes without npu-port, fails with it) is run again alone, both ways
(``--no-confirm`` skips that), and ``results/<suite>-<strategy>-<date>.json`` is written with the versions, the machine,
where the tests came from, counts, every regression with its one-line error, the fixed tests, other changes and the
routed-call totals; ``report`` turns every results file into ``benchmarks/upstream_tests.md``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)  # outcomes, also when this file is loaded by path

import outcomes  # noqa: E402  (after the path is set)

RESULTS = os.path.join(HERE, "results")
SUMMARY = os.path.join(REPO, "benchmarks", "upstream_tests.md")
DEFAULT_WORK = os.path.join(os.path.expanduser("~"), ".cache", "npu-port", "upstream_tests")


@dataclass(frozen=True)
class Suite:
    name: str
    url: str
    files: Tuple[str, ...]
    #: groups of git pathspecs extracted from the repository (one ``git archive`` each)
    extract: Tuple[Tuple[str, ...], ...]
    strategies: Tuple[str, ...]
    link_src: bool = False
    #: what the installed version's sdist contributes: its files under these folders / these files
    sdist_paths: Tuple[str, ...] = ("tests/", "pyproject.toml")
    env: Dict[str, str] = field(default_factory=dict)


TRANSFORMERS_MODELS = ("clip", "t5", "umt5")
DIFFUSERS_FILES = (
    "tests/models/unets/test_models_unet_2d_condition.py",
    "tests/models/autoencoders/test_models_autoencoder_kl.py",
    "tests/models/transformers/test_models_dit_transformer2d.py",
    "tests/models/transformers/test_models_pixart_transformer2d.py",
    "tests/models/transformers/test_models_transformer_sd3.py",
    "tests/models/transformers/test_models_transformer_flux.py",
    "tests/models/transformers/test_models_transformer_wan.py",
    "tests/models/transformers/test_models_transformer_hunyuan_video.py",
    "tests/models/transformers/test_models_transformer_cogvideox.py",
    "tests/models/transformers/test_models_transformer_ltx.py",
    "tests/models/autoencoders/test_models_autoencoder_wan.py",
    "tests/models/autoencoders/test_models_autoencoder_kl_cogvideox.py",
    "tests/models/autoencoders/test_models_autoencoder_hunyuan_video.py",
    "tests/models/autoencoders/test_models_autoencoder_ltx_video.py",
)

SUITES: Dict[str, Suite] = {
    "transformers": Suite(
        name="transformers",
        url="https://github.com/huggingface/transformers.git",
        files=tuple(f"tests/models/{m}/test_modeling_{m}.py" for m in TRANSFORMERS_MODELS),
        extract=(
            ("conftest.py", "pyproject.toml", "utils/test_module", "tests", ":(exclude)tests/models"),
            ("tests/models/__init__.py", *(f"tests/models/{m}" for m in TRANSFORMERS_MODELS)),
        ),
        strategies=("sdpa",),
        link_src=True,
    ),
    "diffusers": Suite(
        name="diffusers",
        url="https://github.com/huggingface/diffusers.git",
        files=DIFFUSERS_FILES,
        extract=(
            ("pyproject.toml", "tests/__init__.py", "tests/conftest.py", "tests/testing_utils.py"),
            ("tests/models", "tests/fixtures", "tests/others"),
        ),
        strategies=("sdpa", "auto"),
    ),
}


class HarnessError(RuntimeError):
    """A step that cannot go on; the message says what to do."""


# ---- small helpers ---------------------------------------------------------------------------------------------


def _git(git_dir: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "--git-dir", git_dir, *args], capture_output=True, text=True, check=check)


def _git_dir(path: str) -> str:
    """The git directory of a clone (``path/.git``) or of a bare mirror (``path``)."""
    for candidate in (os.path.join(path, ".git"), path):
        if (
            os.path.isdir(candidate)
            and subprocess.run(
                ["git", "--git-dir", candidate, "rev-parse", "--git-dir"], capture_output=True
            ).returncode
            == 0
        ):
            return candidate
    raise HarnessError(f"{path} is not a git repository (a clone or a bare mirror)")


def installed_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError as exc:
        raise HarnessError(f"{package} is not installed in {sys.executable}") from exc


def _versions() -> Dict[str, Optional[str]]:
    found: Dict[str, Optional[str]] = {}
    for name in (
        "torch",
        "transformers",
        "diffusers",
        "accelerate",
        "peft",
        "huggingface_hub",
        "safetensors",
        "tokenizers",
        "pytest",
        "pytest-xdist",
        "pytest-timeout",
        "npu-port",
    ):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    found["python"] = platform.python_version()
    return found


def _our_commit() -> Dict[str, Any]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {
        "commit": git("rev-parse", "HEAD"),
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        # the measured code itself: the npu_port/ tree and whether it differs from the commit
        "npu_port_tree": git("rev-parse", "HEAD:npu_port"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "npu_port_dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", "npu_port")),
    }


def machine() -> Dict[str, Any]:
    info: Dict[str, Any] = {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            names = [line.split(":", 1)[1].strip() for line in stream if line.startswith("model name")]
        info["cpu"] = names[0] if names else None
    except OSError:
        info["cpu"] = platform.processor() or None
    try:
        with open("/proc/meminfo", encoding="utf-8") as stream:
            total = next(line for line in stream if line.startswith("MemTotal"))
        info["memory_gib"] = round(int(total.split()[1]) / 2**20, 1)
    except (OSError, StopIteration):
        info["memory_gib"] = None
    return info


# ---- preparing the test trees ----------------------------------------------------------------------------------


@dataclass
class Source:
    git_dir: str
    commit: str
    ref: str
    tag_matched: bool
    date: str
    version_in_source: Optional[str]

    def to_dict(self) -> Dict[str, Any]:
        return self.__dict__.copy()


def _version_in(git_dir: str, commit: str, package: str) -> Optional[str]:
    for path in (f"src/{package}/__init__.py", "setup.py"):
        shown = _git(git_dir, "show", f"{commit}:{path}", check=False)
        match = re.search(r"""(?:__version__\s*=|version=)\s*["']([^"']+)["']""", shown.stdout)
        if shown.returncode == 0 and match:
            return match.group(1)
    return None


def resolve_source(suite: Suite, version: str, git_path: Optional[str], ref: Optional[str], work: str) -> Source:
    tag = f"v{version}"
    if git_path is None:
        clone = os.path.join(work, "clones", f"{suite.name}-{tag}")
        if not os.path.isdir(clone):
            done = subprocess.run(
                ["git", "clone", "--depth", "1", "--branch", tag, suite.url, clone], capture_output=True, text=True
            )
            if done.returncode != 0:
                last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
                raise HarnessError(
                    f"could not clone {suite.url} at {tag} ({last});\n"
                    f"give --{suite.name}-git DIR (a clone or mirror of {suite.url}); if it has no tag {tag}, also "
                    f"--{suite.name}-ref REF (then recorded as not the installed version's tests)"
                )
        git_path = clone
    git_dir = _git_dir(git_path)
    tagged = _git(git_dir, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}", check=False)
    if tagged.returncode == 0:
        commit, used, matched = tagged.stdout.strip(), tag, True
    elif ref:
        named = _git(git_dir, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
        if named.returncode != 0:
            raise HarnessError(f"{git_path}: no commit {ref!r}")
        commit, used, matched = named.stdout.strip(), ref, False
    else:
        tags = _git(git_dir, "tag", "--sort=-creatordate", check=False).stdout.split()[:5]
        raise HarnessError(
            f"{git_path} has no tag {tag} (the installed {suite.name} {version}); its newest tags: "
            f"{', '.join(tags) or 'none'}. Give a repository that has it, or --{suite.name}-ref REF to run the tests "
            "of another commit (recorded as such in the results)"
        )
    date = _git(git_dir, "log", "-1", "--format=%cI", commit).stdout.strip()
    return Source(git_dir, commit, used, matched, date, _version_in(git_dir, commit, suite.name))


def _extract(git_dir: str, commit: str, pathspecs: Sequence[str], dest: str) -> None:
    archive = subprocess.run(
        ["git", "--git-dir", git_dir, "archive", "--format=tar", commit, "--", *pathspecs], capture_output=True
    )
    if archive.returncode != 0:
        raise HarnessError(f"git archive {commit} {' '.join(pathspecs)}: {archive.stderr.decode(errors='replace')}")
    with tempfile.TemporaryFile() as stream:
        stream.write(archive.stdout)
        stream.seek(0)
        with tarfile.open(fileobj=stream) as tar:
            tar.extractall(dest, filter="data")


def fetch_sdist(package: str, version: str, work: str) -> Tuple[Optional[str], str]:
    """(path of the installed version's sdist, how it was had); None when pip cannot get it."""
    folder = os.path.join(work, "sdist")
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        if name.lower().startswith(f"{package}-{version}.") and name.endswith((".tar.gz", ".zip")):
            return os.path.join(folder, name), "cached"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"{package}=={version}",
            "--no-binary",
            ":all:",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-d",
            folder,
        ],
        capture_output=True,
        text=True,
    )
    for name in os.listdir(folder):
        if name.lower().startswith(f"{package}-{version}.") and name.endswith((".tar.gz", ".zip")):
            return os.path.join(folder, name), "pip download"
    return None, f"pip download failed: {outcomes.cause(done.stderr)}"


def _sdist_members(sdist: str, suite: Suite) -> Dict[str, bytes]:
    """The sdist's files under ``suite.sdist_paths``, by path relative to the source root."""
    found: Dict[str, bytes] = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            relative = member.name.split("/", 1)[1] if "/" in member.name else member.name
            if any(relative == p or (p.endswith("/") and relative.startswith(p)) for p in suite.sdist_paths):
                found[relative] = tar.extractfile(member).read()
    return found


def _build_tree(suite: Suite, source: Source, tree: str, overlay: Dict[str, bytes]) -> None:
    if os.path.exists(tree):
        shutil.rmtree(tree)
    os.makedirs(tree)
    for group in suite.extract:
        _extract(source.git_dir, source.commit, group, tree)
    for relative, data in overlay.items():
        path = os.path.join(tree, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as stream:
            stream.write(data)
    if suite.link_src:  # transformers' test_pipeline_mixin imports src/transformers of its checkout
        import importlib.util

        spec = importlib.util.find_spec(suite.name)
        os.makedirs(os.path.join(tree, "src"), exist_ok=True)
        os.symlink(os.path.dirname(spec.origin), os.path.join(tree, "src", suite.name))


def _pytest_env(extra: Optional[Dict[str, str]] = None, jobs: int = 1) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPU_PORT_UPSTREAM_")}
    plugin_dir = os.environ.get("NPU_PORT_UPSTREAM_PLUGIN_DIR", HERE)  # the snapshot cmd_run takes
    env["PYTHONPATH"] = os.pathsep.join(p for p in (plugin_dir, os.environ.get("PYTHONPATH", "")) if p)
    env["HF_HUB_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, jobs)))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def collect(tree: str, files: Sequence[str], keyword: Optional[str]) -> Dict[str, Any]:
    """Test ids the files hold (with ``-k``), and the files that fail to collect."""
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files]
    if keyword:
        argv += ["-k", keyword]
    done = subprocess.run(argv, cwd=tree, capture_output=True, text=True, env=_pytest_env())
    ids = [line.strip() for line in done.stdout.splitlines() if "::" in line and not line.startswith(("ERROR", " "))]
    errors = sorted({line.split()[1] for line in done.stdout.splitlines() if line.startswith("ERROR ")})
    return {"ids": ids, "errors": errors, "returncode": done.returncode}


def prepare(suite: Suite, args: argparse.Namespace) -> Dict[str, Any]:
    version = installed_version(suite.name)
    work = os.path.abspath(args.work_dir)
    source = resolve_source(
        suite, version, getattr(args, f"{suite.name}_git"), getattr(args, f"{suite.name}_ref"), work
    )
    if not source.tag_matched:
        print(
            f"WARNING: {suite.name} tests from {source.ref} ({source.commit[:12]}, {source.date}, "
            f"version {source.version_in_source}), not tag v{version} of the installed {version}",
            file=sys.stderr,
        )
    sdist, sdist_how = (
        (None, "not used (the tag's own files)") if source.tag_matched else fetch_sdist(suite.name, version, work)
    )
    overlay = _sdist_members(sdist, suite) if sdist else {}
    tree = os.path.join(work, "trees", suite.name)
    files = [f for f in suite.files if not args.files or any(s in f for s in args.files)]
    choice: Dict[str, Any] = {"mode": args.overlay, "sdist": sdist and os.path.basename(sdist), "sdist_how": sdist_how}
    use_overlay = False
    if overlay and args.overlay != "no":
        _build_tree(suite, source, tree, overlay)
        collected = collect(tree, files, args.k)
        use_overlay = True
        choice["collection_with_overlay"] = {"ids": len(collected["ids"]), "errors": collected["errors"]}
        if args.overlay == "auto" and collected["errors"]:
            _build_tree(suite, source, tree, {})
            without = collect(tree, files, args.k)
            choice["collection_without_overlay"] = {"ids": len(without["ids"]), "errors": without["errors"]}
            if len(without["errors"]) < len(collected["errors"]):
                use_overlay, collected = False, without
            else:
                _build_tree(suite, source, tree, overlay)
    else:
        _build_tree(suite, source, tree, {})
        collected = collect(tree, files, args.k)
    used_overlay = sorted(overlay) if use_overlay else []
    choice["overlaid_files"] = used_overlay
    provenance = {
        "suite": suite.name,
        "installed_version": version,
        "source": source.to_dict(),
        "tests_are_the_installed_versions": source.tag_matched,
        "overlay": choice,
        "src_link": os.path.join("src", suite.name) if suite.link_src else None,
        "files": files,
        "collected": len(collected["ids"]),
        "collection_errors": collected["errors"],
    }
    with open(os.path.join(tree, "PROVENANCE.json"), "w", encoding="utf-8") as stream:
        json.dump(provenance, stream, indent=2)
    with open(os.path.join(tree, "COLLECTED.txt"), "w", encoding="utf-8") as stream:
        stream.write("\n".join(collected["ids"]) + "\n")
    print(
        f"{suite.name}: {len(collected['ids'])} tests in {len(files)} files from {source.ref} "
        f"({source.commit[:12]}); sdist files overlaid: {len(used_overlay)}; collection errors: "
        f"{collected['errors'] or 'none'}"
    )
    return {"tree": tree, "provenance": provenance, "ids": collected["ids"], "files": files}


# ---- running ---------------------------------------------------------------------------------------------------


def _pytest_argv(targets: Sequence[str], args: argparse.Namespace) -> List[str]:
    argv = [
        sys.executable,
        "-m",
        "pytest",
        *targets,
        "-p",
        "npu_port_plugin",
        "-p",
        "no:cacheprovider",
        "-q",
        "--timeout",
        str(args.timeout),
        "--timeout-method",
        "thread",
        "-n",
        str(args.jobs if args.jobs > 1 else 0),
    ]
    if args.k:
        argv += ["-k", args.k]
    return argv


def _auto_cache(suite: str, condition: str, args: argparse.Namespace) -> str:
    """npu-port's on-disk cache of auto's decisions for one condition's runs: its own folder under the work dir, so
    what the machine's own cache holds cannot change the measurement (emptied at the start, unless --resume)."""
    return os.path.join(os.path.abspath(args.work_dir), "npu_port_cache", suite, condition)


def _condition_env(condition: str, record: str, args: argparse.Namespace, suite: str = "") -> Dict[str, str]:
    extra = {"NPU_PORT_UPSTREAM_RECORD": record, "NPU_PORT_CACHE_DIR": _auto_cache(suite, condition, args)}
    if condition != "baseline":
        extra["NPU_PORT_UPSTREAM_STRATEGY"] = condition
        if args.compat_shim:
            extra["NPU_PORT_UPSTREAM_COMPAT_SHIM"] = "1"
    return _pytest_env(extra, args.jobs)


def _run_pytest(argv: List[str], tree: str, env: Dict[str, str], log: str, limit: float) -> Tuple[int, float]:
    os.makedirs(os.path.dirname(log), exist_ok=True)
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        process = subprocess.Popen(
            argv, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            out.write(f"\n[run.py] killed after {limit:.0f} s (--file-timeout)\n")
            code = -9
        except BaseException:  # Ctrl-C or SIGTERM of the runner: its pytest (own session) goes too
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    return code, time.monotonic() - start


def run_condition(suite: str, prepared: Dict[str, Any], condition: str, args: argparse.Namespace) -> Dict[str, Any]:
    """One condition (``baseline`` or a strategy) over every file: record files, wall time per file."""
    folder = os.path.join(os.path.abspath(args.work_dir), "records", suite, condition)
    os.makedirs(folder, exist_ok=True)
    cache = _auto_cache(suite, condition, args)
    if not args.resume and os.path.isdir(cache):
        shutil.rmtree(cache)
    runs = []
    for path in prepared["files"]:
        stem = os.path.splitext(os.path.basename(path))[0]
        record = os.path.join(folder, f"{stem}.jsonl")
        meta_path = os.path.join(folder, f"{stem}.meta.json")
        if args.resume and outcomes.complete(record) and os.path.exists(meta_path):
            with open(meta_path, encoding="utf-8") as stream:
                runs.append(json.load(stream) | {"resumed": True})
            print(f"  {suite} {condition} {stem}: kept (--resume)")
            continue
        if os.path.exists(record):
            os.remove(record)
        argv = _pytest_argv([path], args)
        log = os.path.join(os.path.abspath(args.work_dir), "logs", suite, condition, f"{stem}.log")
        code, wall = _run_pytest(
            argv, prepared["tree"], _condition_env(condition, record, args, suite), log, args.file_timeout
        )
        meta = {
            "file": path,
            "record": record,
            "log": log,
            "argv": argv[1:],
            "returncode": code,
            "wall_s": round(wall, 1),
            "finished": outcomes.complete(record),
        }
        with open(meta_path, "w", encoding="utf-8") as stream:
            json.dump(meta, stream, indent=2)
        runs.append(meta)
        counts = outcomes.counts(outcomes.aggregate(outcomes.read_records([record])))
        print(
            f"  {suite} {condition} {stem}: {wall:.0f} s, exit {code}, "
            + ", ".join(f"{k} {v}" for k, v in counts.items() if v and k != "total"),
            flush=True,
        )
    return {"runs": runs, "records": [r["record"] for r in runs]}


def confirm(
    suite: str, prepared: Dict[str, Any], strategy: str, ids: List[str], args: argparse.Namespace
) -> Dict[str, Dict[str, str]]:
    """Each regression run again alone (one process per condition for all of them): test id -> outcomes."""
    folder = os.path.join(os.path.abspath(args.work_dir), "records", suite, "confirm")
    os.makedirs(folder, exist_ok=True)
    again: Dict[str, Dict[str, str]] = {test_id: {} for test_id in ids}
    argsfile = os.path.join(folder, f"{strategy}-ids.txt")
    with open(argsfile, "w", encoding="utf-8") as stream:
        stream.write("\n".join(ids) + "\n")
    for condition in ("baseline", strategy):
        record = os.path.join(folder, f"{strategy}-{condition}.jsonl")
        if os.path.exists(record):
            os.remove(record)
        argv = _pytest_argv([f"@{argsfile}"], args)
        log = os.path.join(os.path.abspath(args.work_dir), "logs", suite, "confirm", f"{strategy}-{condition}.log")
        _run_pytest(argv, prepared["tree"], _condition_env(condition, record, args, suite), log, args.file_timeout)
        results = outcomes.with_missing(outcomes.aggregate(outcomes.read_records([record])), ids)
        side = "baseline" if condition == "baseline" else "strategy"
        for test_id in ids:
            again[test_id][side] = results[test_id]["outcome"]
            for key in ("message", "where", "line"):
                if side == "strategy" and results[test_id].get(key):
                    again[test_id][f"strategy_{key}"] = results[test_id][key]
    return again


def _sessions(records: Sequence[str]) -> List[Dict[str, Any]]:
    found = []
    for record in outcomes.read_records(records):
        if record.get("kind") == "session":
            found.append({k: v for k, v in record.items() if k not in ("kind", "pid")})
    unique = []
    for entry in found:
        if entry not in unique:
            unique.append(entry)
    return unique


def suite_results(
    suite: Suite,
    prepared: Dict[str, Any],
    baseline: Dict[str, Any],
    strategy: str,
    run: Dict[str, Any],
    args: argparse.Namespace,
    started: str,
) -> Dict[str, Any]:
    ids = prepared["ids"]
    base = outcomes.with_missing(outcomes.aggregate(outcomes.read_records(baseline["records"])), ids)
    with_strategy = outcomes.with_missing(outcomes.aggregate(outcomes.read_records(run["records"])), ids)
    comparison = outcomes.compare(base, with_strategy)
    if comparison["regressions"] and args.confirm:
        again = confirm(suite.name, prepared, strategy, [r["id"] for r in comparison["regressions"]], args)
        for regression in comparison["regressions"]:
            rerun = again[regression["id"]]
            regression["rerun_alone"] = rerun
            regression["status"] = outcomes.confirm_status(rerun.get("baseline"), rerun.get("strategy"))
            if not regression.get("line") and rerun.get("strategy_where"):  # a record from before the plugin said
                regression["where"] = rerun["strategy_where"]
                regression["line"] = rerun.get("strategy_line", "")
    return {
        "suite": suite.name,
        "strategy": strategy,
        "date": args.date,
        "started": started,
        "finished": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": _versions(),
        "npu_port_checkout": args.checkout,
        "tests_from": prepared["provenance"],
        "options": {
            "jobs": args.jobs,
            "timeout_per_test_s": args.timeout,
            "timeout_method": "thread (a hung test's xdist worker is killed; the test is failed)",
            "compat_shim": args.compat_shim,
            "k": args.k,
            "files_filter": args.files,
            "env": {
                "HF_HUB_OFFLINE": "1",
                "OMP_NUM_THREADS": _pytest_env(jobs=args.jobs)["OMP_NUM_THREADS"],
                "NPU_PORT_CACHE_DIR": "WORK/npu_port_cache/<suite>/<condition> (emptied at the start of a condition)",
            },
            "command": "python benchmarks/upstream_tests/run.py " + shlex.join(args.argv),
        },
        "sessions": _sessions(run["records"]),
        "wall_s": {
            "baseline": round(sum(r["wall_s"] for r in baseline["runs"]), 1),
            "strategy": round(sum(r["wall_s"] for r in run["runs"]), 1),
            "per_file": {
                r["file"]: {"baseline": b["wall_s"], "strategy": r["wall_s"]}
                for b, r in zip(baseline["runs"], run["runs"])
            },
        },
        "resumed_runs": sum(1 for r in baseline["runs"] + run["runs"] if r.get("resumed")),
        "unfinished_runs": [r["file"] for r in baseline["runs"] + run["runs"] if not r.get("finished")],
        "collected": len(ids),
        "counts": {"baseline": outcomes.counts(base), "strategy": outcomes.counts(with_strategy)},
        "regressions": comparison["regressions"],
        "regressions_by_cause": outcomes.group_by_cause(comparison["regressions"]),
        "regressions_by_message": [
            {"message": text, "tests": len(ids)} for text, ids in outcomes.group_by_signature(comparison["regressions"])
        ],
        "fixed": comparison["fixed"],
        "changed": comparison["changed"],
        "routing": outcomes.routing(with_strategy),
        "tests": {
            test_id: [
                base[test_id]["outcome"],
                with_strategy[test_id]["outcome"],
                (with_strategy[test_id].get("npu_port") or {}).get("routed", 0),
            ]
            for test_id in sorted(with_strategy)
        },
    }


def _snapshot_plugin(work: str) -> str:
    """A copy of the plugin for this invocation's pytest processes: editing the checkout during a long run does not
    change what the rest of the run measures."""
    folder = os.path.join(work, "plugin", f"{os.getpid()}")
    os.makedirs(folder, exist_ok=True)
    shutil.copy2(os.path.join(HERE, "npu_port_plugin.py"), folder)
    os.environ["NPU_PORT_UPSTREAM_PLUGIN_DIR"] = folder
    return folder


def cmd_run(args: argparse.Namespace) -> int:
    os.makedirs(RESULTS, exist_ok=True)
    args.checkout = _our_commit()  # at the start: what is measured
    _snapshot_plugin(os.path.abspath(args.work_dir))
    written = []
    for name in args.suite:
        suite = SUITES[name]
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        prepared = prepare(suite, args)
        if prepared["provenance"]["collection_errors"]:
            print(
                f"  collection errors in {prepared['provenance']['collection_errors']}: those files' tests are "
                "not counted (both runs would fail them the same way)",
                file=sys.stderr,
            )
        strategies = args.strategy or list(suite.strategies)
        baseline = run_condition(name, prepared, "baseline", args)
        for strategy in strategies:
            run = run_condition(name, prepared, strategy, args)
            result = suite_results(suite, prepared, baseline, strategy, run, args, started)
            path = os.path.join(RESULTS, f"{name}-{strategy}-{args.date}.json")
            with open(path, "w", encoding="utf-8") as stream:
                json.dump(result, stream, indent=1, sort_keys=False)
                stream.write("\n")
            written.append(path)
            c = result["counts"]
            print(
                f"{name} / {strategy}: baseline {c['baseline']}, with {strategy} {c['strategy']}; "
                f"regressions {len(result['regressions'])}; routed calls {result['routing']['routed_calls']} "
                f"-> {os.path.relpath(path, REPO)}"
            )
    if written and not args.no_report:
        write_report()
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    for name in args.suite:
        prepare(SUITES[name], args)
    return 0


# ---- the Markdown summary ----------------------------------------------------------------------------------------

PREAMBLE = """\
# Upstream model tests under npu-port

transformers' and diffusers' own model tests, run twice on the same machine, in the same session: without npu-port
(baseline), and with `npu_port.set_attention_strategy(strategy, target=model)` applied to every model the tests build
(the pytest plugin [`upstream_tests/npu_port_plugin.py`](upstream_tests/npu_port_plugin.py): applied at the end of a
model's outermost `__init__` or `from_pretrained`, restored at the end of each test). A **regression** is a test that
passes without npu-port and fails with it; the regressions were then run again without the rest of their files
(one pytest process per condition, `rerun alone`): `confirmed` = passes again without npu-port, fails again with it.
This file is written by `python benchmarks/upstream_tests/run.py report` from
[`upstream_tests/results/*.json`](upstream_tests/results/), which also hold every test's two outcomes and routed
calls; a `results/<name>.notes.md` beside a results file (a reading of its regressions, written by hand) is appended
to its section.

How to rerun (needs the test dependencies `parameterized pytest-timeout pytest-xdist requests_mock`; pass a clone or
mirror of each library, or let the runner clone the installed version's tag from GitHub):

```
python benchmarks/upstream_tests/run.py run --suite transformers \\
    [--transformers-git DIR [--transformers-ref REF]] --work-dir /tmp/upstream
python benchmarks/upstream_tests/run.py run --suite diffusers [--diffusers-git DIR [--diffusers-ref REF]] \\
    --work-dir /tmp/upstream
```

`--strategy NAME` (repeatable) replaces the default strategies (transformers: sdpa; diffusers: sdpa, auto); `-k EXPR`
and `--files SUBSTR` select tests; `--resume` keeps finished runs; `--timeout S` is the limit per test;
`--compat-shim` was needed only to measure npu-port before its transformers integration stopped reading
`PagedAttentionCache` (the 2026-11-27 transformers results).
"""


def _fmt_counts(c: Dict[str, int]) -> str:
    return " | ".join(
        str(c.get(k, 0)) for k in ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "missing", "total")
    )


def _md_escape(text: str) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def render(result: Dict[str, Any]) -> str:
    src = result["tests_from"]
    source = src["source"]
    v = result["versions"]
    m = result["machine"]
    ours = result["npu_port_checkout"]
    lines = [f"## {result['suite']} / `{result['strategy']}` ({result['date']})", ""]
    lines.append(
        f"Machine: {m.get('cpu')}, {m.get('cpu_count')} cores, {m.get('memory_gib')} GiB, {m.get('platform')}; "
        f"Python {v.get('python')}, torch {v.get('torch')}, transformers {v.get('transformers')}, diffusers "
        f"{v.get('diffusers')}, accelerate {v.get('accelerate')}, peft {v.get('peft')}, pytest {v.get('pytest')}, "
        f"pytest-xdist {v.get('pytest-xdist')}, pytest-timeout {v.get('pytest-timeout')}. npu-port "
        f"{v.get('npu-port')} at `{ours.get('commit', '')[:12]}` ({ours.get('branch')}"
        + (f"; `npu_port/` tree `{ours['npu_port_tree'][:12]}`" if ours.get("npu_port_tree") else "")
        + (", uncommitted changes" if ours.get("npu_port_dirty", ours.get("dirty")) else "")
        + f"). Started {result['started']}, finished "
        f"{result['finished']}."
    )
    lines.append("")
    tests_note = (
        "the installed version's tag"
        if src["tests_are_the_installed_versions"]
        else f"**not the installed version's tag** (no copy of tag v{src['installed_version']} was reachable here)"
    )
    overlay = src["overlay"]
    lines.append(
        f"Tests: {len(src['files'])} files, {result['collected']} test ids, from `{source['ref']}` = "
        f"`{source['commit'][:12]}` ({source['date']}, version string {source['version_in_source']}): {tests_note}; "
        f"sdist {overlay.get('sdist')} files overlaid: {len(overlay.get('overlaid_files', []))}"
        + (f" ({', '.join('`' + f + '`' for f in overlay['overlaid_files'])})" if overlay.get("overlaid_files") else "")
        + (
            f"; collection errors (not counted): {', '.join(src['collection_errors'])}"
            if src["collection_errors"]
            else ""
        )
        + "."
    )
    lines.append("")
    o = result["options"]
    lines.append(
        f"Run: `{o['command']}`; {o['jobs']} xdist workers, {o['timeout_per_test_s']} s per test, "
        f"HF_HUB_OFFLINE=1, OMP_NUM_THREADS={o['env']['OMP_NUM_THREADS']}"
        + (f", `-k {o['k']}`" if o.get("k") else "")
        + (f", files matching {o['files_filter']}" if o.get("files_filter") else "")
        + f". Wall time: baseline {result['wall_s']['baseline'] / 60:.1f} min, with `{result['strategy']}` "
        f"{result['wall_s']['strategy'] / 60:.1f} min."
    )
    shims = sorted({s.get("compat_shim", "off") for s in result.get("sessions", []) if s.get("strategy")})
    if o.get("compat_shim"):
        lines.append("")
        lines.append(
            f"**Compat shim on** (`--compat-shim`): {'; '.join(shims) or 'no session recorded'}. npu-port's "
            "transformers integration reads `transformers.integrations.sdpa_attention.PagedAttentionCache`, which "
            "transformers 5.24.0 no longer has (every routed transformers call would raise AttributeError); the shim "
            "puts an empty class of that name back for this measurement only."
        )
    if result.get("resumed_runs"):
        lines.append("")
        lines.append(
            f"{result['resumed_runs']} of the runs were kept from an earlier invocation (`--resume`): their records "
            "and wall times are theirs; the start and end times above and the reruns of the regressions are this one's."
        )
    if result.get("unfinished_runs"):
        lines.append("")
        lines.append(f"Runs that did not reach their end: {', '.join(result['unfinished_runs'])}.")
    lines += [
        "",
        "| run | passed | failed | error | skipped | xfailed | xpassed | missing | total |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines.append(f"| baseline (no npu-port) | {_fmt_counts(result['counts']['baseline'])} |")
    lines.append(f"| `{result['strategy']}` on every model | {_fmt_counts(result['counts']['strategy'])} |")
    r = result["routing"]
    lines.append("")
    kernels = ", ".join(f"{k} {n}" for k, n in r["routed_calls_by_kernel"].items()) or "none"
    lines.append(
        f"npu-port: {r['models_applied']} model applications in {r['tests_with_a_model']} tests; "
        f"{r['routed_calls']} attention calls routed ({kernels}) in {r['tests_with_routed_calls']} tests; "
        f"apply errors: {sum(e['models'] for e in r['apply_errors'])}; restore errors: "
        f"{sum(e['tests'] for e in r['restore_errors'])}."
    )
    for e in r["apply_errors"]:
        lines.append(f"- apply error ({e['models']} models): {_md_escape(e['error'])}")
    for e in r["restore_errors"]:
        lines.append(f"- restore error ({e['tests']} tests): {_md_escape(e['error'])}")
    regressions = result["regressions"]
    lines += ["", f"**Regressions: {len(regressions)}** (pass without npu-port, fail with `{result['strategy']}`)"]
    if regressions:
        lines.append(" by cause: " + ", ".join(f"{c} {n}" for c, n in outcomes.group_by_cause(regressions)) + ".")
        lines += ["", "Grouped by their one-line error (numbers blanked):", ""]
        for text, ids in outcomes.group_by_signature(regressions):
            lines.append(f"- {len(ids)} x `{_md_escape(text)}`")
        lines += [
            "",
            "| test id | with npu-port | one-line error | failing line of the test | rerun alone |",
            "|---|---|---|---|---|",
        ]
        for reg in regressions:
            site = f"`{reg['where']}`: `{_md_escape(reg.get('line', ''))}`" if reg.get("where") else ""
            lines.append(
                f"| `{reg['id']}` | {reg['strategy']} | {_md_escape(reg.get('message', '') or reg['cause'])} | "
                f"{site} | {reg.get('status', 'not rerun')} |"
            )
    if result["fixed"]:
        lines += ["", f"Fixed with npu-port (fail without, pass with): {len(result['fixed'])}"]
        lines += [
            f"- `{f['id']}` (baseline {f['baseline']}: {_md_escape(f.get('baseline_message', ''))})"
            for f in result["fixed"]
        ]
    if result["changed"]:
        lines += ["", f"Other changes: {len(result['changed'])}"]
        for ch in result["changed"]:
            detail = ch.get("strategy_message") or ch.get("baseline_message") or ""
            lines.append(
                f"- `{ch['id']}`: {ch['baseline']} -> {ch['strategy']}" + (f" ({_md_escape(detail)})" if detail else "")
            )
    return "\n".join(lines) + "\n"


def overview(results: List[Dict[str, Any]]) -> str:
    lines = [
        "| suite | strategy | date | test ids | baseline passed / failed / skipped | with npu-port passed / failed / "
        "skipped | regressions (confirmed alone) | fixed | routed calls |",
        "|---|---|---|---:|---|---|---:|---:|---:|",
    ]
    for r in results:
        b, s = r["counts"]["baseline"], r["counts"]["strategy"]
        confirmed = sum(1 for reg in r["regressions"] if reg.get("status") == "confirmed")
        lines.append(
            f"| {r['suite']} | `{r['strategy']}` | {r['date']} | {r['collected']} | {b['passed'] + b['xpassed']} / "
            f"{b['failed'] + b['error'] + b['missing']} / {b['skipped'] + b['xfailed']} | "
            f"{s['passed'] + s['xpassed']} / {s['failed'] + s['error'] + s['missing']} / {s['skipped'] + s['xfailed']} "
            f"| {len(r['regressions'])} ({confirmed}) | {len(r['fixed'])} | {r['routing']['routed_calls']} |"
        )
    return "\n".join(lines) + "\n"


def write_report(results_dir: str = RESULTS, summary: str = SUMMARY) -> str:
    paths = sorted(p for p in os.listdir(results_dir) if p.endswith(".json")) if os.path.isdir(results_dir) else []
    results = []
    for name in paths:
        with open(os.path.join(results_dir, name), encoding="utf-8") as stream:
            results.append(json.load(stream))
    sections = []
    for name, result in zip(paths, results):
        section = render(result)
        notes = os.path.join(results_dir, name[: -len(".json")] + ".notes.md")
        if os.path.exists(notes):  # a reading of the regressions, written by whoever looked at them
            with open(notes, encoding="utf-8") as stream:
                section += "\n" + stream.read().strip() + "\n"
        sections.append(section)
    if results:
        body = "## Overview\n\n" + overview(results) + "\n" + "\n".join(sections)
    else:
        body = "No results yet.\n"
    with open(summary, "w", encoding="utf-8") as stream:
        stream.write(PREAMBLE + "\n" + body)
    print(f"wrote {os.path.relpath(summary, REPO)} from {len(paths)} results files")
    return summary


# ---- command line ----------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "prepare"):
        p = sub.add_parser(name)
        p.add_argument("--suite", action="append", choices=sorted(SUITES), help="default: both")
        p.add_argument(
            "--work-dir",
            default=os.environ.get("NPU_PORT_UPSTREAM_WORK", DEFAULT_WORK),
            help="where test trees, records and logs go (outside this repository)",
        )
        for suite in SUITES:
            p.add_argument(f"--{suite}-git", dest=f"{suite}_git", help=f"a clone or bare mirror of {suite}")
            p.add_argument(
                f"--{suite}-ref",
                dest=f"{suite}_ref",
                help="the commit to use when the repository has no tag of the installed version",
            )
        p.add_argument(
            "--overlay",
            choices=("auto", "yes", "no"),
            default="auto",
            help="put the installed version's sdist test files over the repository's (when not the tag)",
        )
        p.add_argument("--files", action="append", help="only test files whose path contains this")
        p.add_argument("-k", help="pytest -k expression, for every run")
        if name == "run":
            p.add_argument(
                "--strategy", action="append", help="default: the suite's (transformers sdpa; diffusers sdpa and auto)"
            )
            p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="pytest-xdist workers")
            p.add_argument("--timeout", type=int, default=600, help="seconds per test (pytest-timeout)")
            p.add_argument(
                "--file-timeout", type=int, default=4 * 3600, help="seconds per pytest process, a last resort"
            )
            p.add_argument(
                "--compat-shim",
                action="store_true",
                help="put a dummy transformers PagedAttentionCache back (recorded in the results): only to measure "
                "an npu-port from before its transformers integration stopped reading it",
            )
            p.add_argument("--resume", action="store_true", help="keep runs whose record is complete")
            p.add_argument("--no-confirm", dest="confirm", action="store_false", help="do not rerun regressions")
            p.add_argument("--no-report", action="store_true", help="do not rewrite benchmarks/upstream_tests.md")
            p.add_argument("--date", default=datetime.date.today().isoformat(), help="in the results file name")
    sub.add_parser("report", help="rewrite benchmarks/upstream_tests.md from the results files")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds, so a running pytest is ended too
    args.argv = argv
    if args.command == "report":
        write_report()
        return 0
    args.suite = args.suite or sorted(SUITES, reverse=True)
    try:
        return cmd_run(args) if args.command == "run" else cmd_prepare(args)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
