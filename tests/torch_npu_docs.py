"""torch_npu's own operator docs, fetched from the torch_npu wheel and parsed without importing it.

The NPU attention kernels of npu-port cannot be run here (no Ascend hardware), so the test suite checks them
against an emulator of the documented operator contracts, and checks that emulator against the docs themselves:
the docstrings torch_npu ships in ``torch_npu/_op_plugin_docs.py`` hold the interface prototypes and runnable
examples with reference computations.  This module gets that file and cuts pieces out of it.

Rules it keeps:

* it never installs torch-npu (installing the wheel without CANN breaks ``import torch`` itself);
* it never imports or executes ``_op_plugin_docs.py`` -- the file does ``import torch_npu`` at the top -- it
  only parses it with :mod:`ast`;
* the file is looked up in this order: the environment variable ``NPU_PORT_TORCH_NPU_DOCS`` (a path to the
  file), a per-user cache, and only then a ``pip download`` of the wheel (about 43 MB) whose two needed files
  are copied into the cache.
"""

from __future__ import annotations

import ast
import functools
import os
import pathlib
import subprocess
import sys
import tempfile
import warnings
import zipfile

TORCH_NPU_VERSION = "2.13.0"
ENV_VAR = "NPU_PORT_TORCH_NPU_DOCS"
DOCS_MEMBER = "torch_npu/_op_plugin_docs.py"
TESTCASE_MEMBER = "torch_npu/testing/testcase.py"
DOWNLOAD_TIMEOUT_S = 300

# The docs are pure Python and identical in every wheel of a release, so one fixed wheel is fetched whatever the
# host is; pinning platform and interpreter keeps `pip download` from failing on hosts with no matching wheel.
_PIP_PLATFORM_ARGS = ("--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp")


def cache_dir() -> pathlib.Path:
    """Where the extracted files live: ``${XDG_CACHE_HOME:-~/.cache}/npu-port/torch_npu-<version>/``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "npu-port" / f"torch_npu-{TORCH_NPU_VERSION}"


def op_plugin_docs_path() -> pathlib.Path:
    """Path to ``_op_plugin_docs.py`` of torch_npu 2.13.0: env var, else cache, else download into the cache."""
    override = os.environ.get(ENV_VAR)
    if override:
        path = pathlib.Path(override).expanduser()
        if not path.is_file():
            raise RuntimeError(
                f"{ENV_VAR}={override!r} does not name a file; point it at torch_npu/_op_plugin_docs.py "
                f"taken from a torch_npu {TORCH_NPU_VERSION} wheel, or unset it to download the wheel."
            )
        return path
    cached = cache_dir() / "_op_plugin_docs.py"
    if not cached.is_file():
        _download_into_cache(cache_dir())
    return cached


def testcase_path() -> pathlib.Path | None:
    """``torch_npu/testing/testcase.py`` next to the docs file (wheel layout), or None when it is not there."""
    path = op_plugin_docs_path().parent / "testing" / "testcase.py"
    return path if path.is_file() else None


def _download_into_cache(target: pathlib.Path) -> None:
    """Fetch the wheel with pip (never installing it) and copy the docs and testcase files into ``target``."""
    with tempfile.TemporaryDirectory(prefix="npu-port-torch-npu-") as tmp:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"torch-npu=={TORCH_NPU_VERSION}",
            "--no-deps",
            "--only-binary=:all:",
            *_PIP_PLATFORM_ARGS,
            "-d",
            tmp,
        ]
        failure = None
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
            if done.returncode != 0:
                failure = f"exit status {done.returncode}: {(done.stderr or done.stdout).strip()[-2000:]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            failure = repr(exc)
        wheels = sorted(pathlib.Path(tmp).glob("torch_npu-*.whl"))
        if failure is None and not wheels:
            failure = "pip reported success but left no torch_npu wheel"
        if failure is not None:
            raise RuntimeError(
                f"Could not download the torch-npu {TORCH_NPU_VERSION} wheel to read its operator docs "
                f"({' '.join(command)}): {failure}\n"
                f"Provide the file by hand: unzip torch_npu/_op_plugin_docs.py from a torch_npu {TORCH_NPU_VERSION} "
                f"wheel and set {ENV_VAR}=/path/to/_op_plugin_docs.py (or place it, with testing/testcase.py beside "
                f"it, in {target})."
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            _write_atomically(target / "_op_plugin_docs.py", wheel.read(DOCS_MEMBER))
            _write_atomically(target / "testing" / "testcase.py", wheel.read(TESTCASE_MEMBER))


def _write_atomically(path: pathlib.Path, data: bytes) -> None:
    """Write via a temporary file and os.replace, so a parallel or interrupted run never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp_name, 0o644)  # mkstemp makes 0600; the cache is plain shared data
        os.replace(tmp_name, path)
    except BaseException:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        raise


@functools.lru_cache(maxsize=4)
def _docstrings(path: str) -> dict[str, str]:
    """Every ``_add_torch_npu_docstr("name", \"\"\"...\"\"\")`` call in the file, first one per name wins."""
    with warnings.catch_warnings():  # the docstrings hold stray backslashes ("\\_"); not our concern
        warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
        tree = ast.parse(pathlib.Path(path).read_text(encoding="utf-8"), filename=path)
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "_add_torch_npu_docstr"
            and len(node.args) == 2
        ):
            continue
        name, doc = node.args
        if isinstance(name, ast.Constant) and isinstance(doc, ast.Constant) and isinstance(doc.value, str):
            found.setdefault(name.value, doc.value)
    return found


def op_docstring(name: str) -> str:
    """The docstring torch_npu attaches to ``torch_npu.<name>``, read with ast (the module is never imported)."""
    docs = _docstrings(str(op_plugin_docs_path()))
    if name not in docs:
        raise KeyError(f"no _add_torch_npu_docstr({name!r}, ...) in {op_plugin_docs_path()}")
    return docs[name]


def text_between(text: str, start_marker: str, end_marker: str | None) -> str:
    """The text after the first ``start_marker`` up to the next ``end_marker`` (or the end when it is None)."""
    start = text.find(start_marker)
    if start < 0:
        raise ValueError(f"start marker {start_marker!r} not found")
    start += len(start_marker)
    if end_marker is None:
        return text[start:]
    end = text.find(end_marker, start)
    if end < 0:
        raise ValueError(f"end marker {end_marker!r} not found after {start_marker!r}")
    return text[start:end]


def example_code(name: str, start_marker: str, end_marker: str | None) -> str:
    """A code example cut out of an op's docstring; it must parse as Python, or the markers are wrong."""
    code = text_between(op_docstring(name), start_marker, end_marker).strip("\n") + "\n"
    ast.parse(code)  # fail here, with a SyntaxError pointing into the example, rather than at exec time
    return code


def prototype(name: str) -> str:
    """The ``torch_npu.<name>(...) -> ...`` line from the docstring's 接口原型 (interface prototype) section."""
    marker = f"torch_npu.{name}("
    for line in op_docstring(name).splitlines():
        if line.strip().startswith(marker):
            return line.strip()
    raise ValueError(f"no prototype line starting with {marker!r} in the docs of {name}")


def prototype_parameters(name: str) -> list[tuple[str, bool, object]]:
    """``(name, keyword_only, default)`` for each parameter of the documented prototype.

    ``default`` is the sentinel ``REQUIRED`` when the prototype gives none.  Defaults are read as Python
    literals ("None", "1.", "2147483647", "\\"BSH\\"", "True").
    """
    line = prototype(name)
    inner = line[line.index("(") + 1 : line.rindex(") ->")]
    params = []
    keyword_only = False
    for piece in (p.strip() for p in inner.split(",")):
        if piece == "*":
            keyword_only = True
            continue
        declaration, _, default_text = piece.partition("=")
        param_name = declaration.split()[-1]
        default = ast.literal_eval(default_text.strip()) if default_text else REQUIRED
        params.append((param_name, keyword_only, default))
    return params


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()
