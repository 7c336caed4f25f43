"""NPU604: a CUDA-only package installed by the program itself (``pip install`` run from code or a notebook)."""

from __future__ import annotations

import ast
import re
import shlex
from typing import Iterator, List, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._misc import DROP_IN_PACKAGES, cuda_package, requirement

#: Functions that run a command line (a string or an argument list).
_RUNNERS = (
    "os.system",
    "os.popen",
    "subprocess.run",
    "subprocess.call",
    "subprocess.check_call",
    "subprocess.check_output",
    "subprocess.Popen",
    "subprocess.getoutput",
    "subprocess.getstatusoutput",
)
#: pip options whose value is the next word (not a package).
_VALUED = frozenset(
    "-r --requirement -c --constraint -i --index-url --extra-index-url -f --find-links -t --target --prefix --root "
    "--src --upgrade-strategy --python-version --platform --config-settings -C --global-option --install-option "
    "--trusted-host --cache-dir".split()
)


@register_rule
class CudaPackageInstall(Rule):
    """``pip install`` of a CUDA-only package run by the program: ``os.system("pip install flash-attn
    --no-build-isolation")``, ``subprocess.check_call([sys.executable, "-m", "pip", "install", "xformers"])``, and a
    notebook's ``!pip install ...`` / ``%pip install ...`` as an exported script has them
    (``get_ipython().system(...)``, ``get_ipython().run_line_magic("pip", ...)``).

    The install fails without CUDA (flash-attn's build needs nvcc; xformers', apex's and bitsandbytes' wheels or
    builds are CUDA's) — when the line is reached, often at start-up (Open-Sora's Gradio app installs flash-attn,
    apex and xformers from source as it starts). flash-attn and xformers need no install under ``npu-port run``
    (its drop-ins serve the imports); for the others the finding says what to use instead. Skip the install where
    CUDA is not available.

    Example::

        os.system("pip install flash-attn --no-build-isolation")      # NPU604
        get_ipython().system("pip install xformers==0.0.22")         # NPU604 (a notebook's `!pip install`)
    """

    code = "NPU604"
    name = "cuda-package-install"
    message = "the program pip-installs a CUDA-only package: the install fails without CUDA"
    severity = "runtime"
    targets = ("npu", "cpu")
    fix = "manual"
    #: `pip install`, `pip3 install`, `"pip", "install"`, `run_line_magic('pip', 'install ...')`: "install" alone is in
    #: every "please install X" message.
    triggers = (re.compile(r"""pip3?["']?\s*,?\s*["']?install"""),)
    also_triggers = ("system", "subprocess", "popen", "Popen", "get_ipython")  # ... and something that runs it

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, name in source.calls():
            words = _command(call, name)
            if not words:
                continue
            for package in _installed(words):
                if package in DROP_IN_PACKAGES:
                    advice = (
                        f"; npu-port run's drop-in serves `import {DROP_IN_PACKAGES[package]}` without it: skip the "
                        "install where CUDA is not available"
                    )
                elif cuda_package(package) is not None:
                    advice = f": {cuda_package(package)}"
                else:
                    continue
                yield source.finding(self, call, f"`pip install {package}` fails without CUDA{advice}")


def _command(call: ast.Call, name: Optional[str]) -> List[str]:
    """The words of the command line ``call`` runs, when it runs one (else empty)."""
    func = call.func
    if name in _RUNNERS and call.args:
        return _words(call.args[0])
    if (  # get_ipython().system("pip install x") / .getoutput / .run_line_magic("pip", "install x")
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Call)
        and isinstance(func.value.func, ast.Name)
        and func.value.func.id == "get_ipython"
    ):
        if func.attr in ("system", "getoutput") and call.args:
            return _words(call.args[0])
        if func.attr == "run_line_magic" and len(call.args) >= 2:
            magic = _words(call.args[0])
            return (["pip"] if magic == ["pip"] else []) + _words(call.args[1]) if magic else []
    return []


def _words(node: ast.AST) -> List[str]:
    """A command given as a string (an f-string's constant parts), or as a list of strings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr):
        text = "".join(v.value if isinstance(v, ast.Constant) else " {} " for v in node.values)
    elif isinstance(node, (ast.List, ast.Tuple)):
        return [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else "{}" for e in node.elts]
    else:
        return []
    text = re.sub(r"(&&|\|\||;|\|)", r" \1 ", text)  # `pip install a;echo` ends the install at `;`
    try:
        return shlex.split(text, comments=False)
    except ValueError:
        return text.split()


def _installed(words: List[str]) -> List[str]:
    """The packages (normalised names) a ``pip install`` in ``words`` installs, for every install in the line
    (``pip install a && pip install b``)."""
    found: List[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        pip = word.rsplit("/", 1)[-1] in ("pip", "pip3") or (
            word == "-m" and i + 1 < len(words) and words[i + 1] in ("pip", "pip3")
        )
        if pip and "install" in words[i : i + 3]:
            i = words.index("install", i) + 1
            while i < len(words) and words[i] not in ("&&", "||", ";", "|"):
                word = words[i]
                if word in _VALUED:
                    i += 2
                    continue
                if not word.startswith("-") and word != "{}":
                    parsed = requirement(word)
                    if parsed is not None:
                        found.append(parsed[0])
                i += 1
            continue
        i += 1
    return found
