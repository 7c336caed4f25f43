"""Helpers shared by the NPU4xx-NPU6xx rules: the attention flags configs and command lines set, and the CUDA-only
packages requirements files pin."""

from __future__ import annotations

import os
import re
from typing import Iterator, List, Optional, Tuple

#: Values that switch a flag on, in YAML, JSON, TOML, Python and command lines.
TRUE = ("true", "yes", "on", "1")
#: Flags that, when on, make the project call xformers or flash-attn (diffusers' switch, or its own imports).
ON_FLAGS = {
    "enable_xformers_memory_efficient_attention": "xformers",
    "enable_xformers": "xformers",
    "use_xformers": "xformers",
    "xformers": "xformers",
    "use_memory_efficient_attention_xformers": "xformers",
    "flash_attn": "flash-attn",
    "use_flash_attn": "flash-attn",
    "enable_flash_attn": "flash-attn",
    "flash_attention": "flash-attn",
    "use_flash_attention": "flash-attn",
    "enable_flash_attention": "flash-attn",
    "use_flash_attention_2": "flash_attention_2",
    "use_flash_attn_2": "flash_attention_2",
}
#: Keys whose value names an attention backend.
BACKEND_KEYS = ("attention_mode", "attn_mode", "attention_type", "attn_type", "attention_backend", "attn_backend")
BACKEND_VALUES = {
    "xformers": "xformers",
    "softmax-xformers": "xformers",  # Stability's generative-models (sgm) name for it
    "flash": "flash-attn",
    "flash_attn": "flash-attn",
    "flash-attn": "flash-attn",
    "flash_attention": "flash-attn",
    "flash_attn_2": "flash_attention_2",
    "flash_attention_2": "flash_attention_2",
    "flash_attention_3": "flash_attention_3",
}
#: transformers' switch; the value names the backend.
IMPLEMENTATION_KEYS = ("attn_implementation", "_attn_implementation")


def normal(key: str) -> str:
    """``--enable-xformers`` / ``Enable_Xformers`` -> ``enable_xformers``."""
    return key.strip().lstrip("-").replace("-", "_").lower()


def flag(key: str, value: Optional[str]) -> Optional[Tuple[str, str]]:
    """What a ``key: value`` setting switches on: ``("xformers" | "flash-attn", how)`` for NPU651/NPU653,
    ``("flash_attention_2" | "flash_attention_3", how)`` for transformers' backends (NPU652), or None. ``value`` None:
    a command-line option whose presence is the switch."""
    key = normal(key)
    text = None if value is None else value.strip().strip("\"'").lower()
    if key in ON_FLAGS and (text is None or text in TRUE):
        return ON_FLAGS[key], key
    if text is not None and key in BACKEND_KEYS + IMPLEMENTATION_KEYS and text in BACKEND_VALUES:
        return BACKEND_VALUES[text], f"{key}: {text}"
    return None


# ---- requirements ---------------------------------------------------------------------------------------------------

#: Packages with an npu-port drop-in: the pin fails to build without CUDA, the import works under npu-port run.
DROP_IN_PACKAGES = {"flash-attn": "flash_attn", "flash-attention": "flash_attn", "xformers": "xformers"}
#: CUDA-only packages (normalised names) and what to do instead.
CUDA_PACKAGES = {
    "apex": "NVIDIA apex builds CUDA kernels: use torch.amp and torch.nn.LayerNorm / torch_npu's fused optimizers",
    "bitsandbytes": "bitsandbytes' kernels are CUDA (its multi-backend builds aside): keep 8-bit optimizers and "
    "quantisation off on the target",
    "triton": "Triton kernels run on CUDA (and ROCm) only: keep the PyTorch path (triton-ascend is separate)",
    "pycuda": "PyCUDA needs the CUDA toolkit and driver: port what uses it to torch",
    "cupy": "CuPy needs CUDA: use numpy or torch",
    "tensorrt": "TensorRT is NVIDIA's: on Ascend use torch_npu or the CANN toolchain",
    "onnxruntime-gpu": "onnxruntime-gpu needs CUDA: use onnxruntime (or onnxruntime-cann on Ascend)",
    "liger-kernel": "Liger's kernels are Triton: keep the PyTorch path",
    "sageattention": "SageAttention is CUDA-only: use npu_port.attention",
    "flashattn-hopper": "flash-attention 3 (Hopper) is CUDA-only: use npu_port.attention",
    "causal-conv1d": "causal-conv1d builds CUDA kernels: use its PyTorch reference path",
    "mamba-ssm": "mamba-ssm builds CUDA kernels: use its PyTorch reference path",
    "yunchang": "yunchang (ring / Ulysses attention) calls flash-attn kernels: run single-device or route attention "
    "through npu_port.attention",
    "deepspeed-kernels": "deepspeed-kernels are CUDA-only: leave them out (DeepSpeed runs on Ascend via torch_npu)",
}
#: Name prefixes of CUDA-only families: nvidia-cudnn-cu12, cupy-cuda12x, spconv-cu118, cumm-cu118, tensorrt-cu12.
CUDA_PREFIXES = {
    "nvidia-": "NVIDIA's CUDA runtime wheels: torch_npu brings CANN's instead; drop the pin",
    "cupy-cuda": "CuPy needs CUDA: use numpy or torch",
    "spconv-cu": "spconv's CUDA build: use spconv (CPU) or port the sparse convolutions",
    "cumm-cu": "cumm's CUDA build: use cumm (CPU)",
    "tensorrt-": "TensorRT is NVIDIA's: on Ascend use torch_npu or the CANN toolchain",
    "pytorch-triton": "Triton kernels run on CUDA (and ROCm) only: keep the PyTorch path",
}

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")
_WHEEL = re.compile(r"([A-Za-z0-9][A-Za-z0-9._]*?)-\d[^/#\s]*\.(?:whl|tar\.gz|zip)", re.IGNORECASE)
_EGG = re.compile(r"#egg=([A-Za-z0-9][A-Za-z0-9._-]*)")
_REPOSITORY = re.compile(r"github\.com/[^/\s]+/([A-Za-z0-9._-]+?)(?:\.git)?(?:[@#/\s]|$)", re.IGNORECASE)


def normal_package(name: str) -> str:
    """PEP 503 normalisation: ``Flash_Attn`` -> ``flash-attn``."""
    return re.sub(r"[-_.]+", "-", name).lower()


#: Files that pin a project's packages: pip requirements, conda environments, pyproject.toml.
REQUIREMENT_FILES = ("requirements*.txt", "requirements*.in", "*requirements.txt", "*.in", "constraints*.txt")
CONDA_FILES = ("environment*.yml", "environment*.yaml", "conda*.yml", "conda*.yaml")
DEPENDENCY_FILES = REQUIREMENT_FILES + CONDA_FILES + ("pyproject.toml",)


def is_requirements(path: str) -> bool:
    """Whether a file the requirements patterns chose is one (``MANIFEST.in`` is sdist's, not pip's)."""
    return os.path.basename(path).lower() != "manifest.in"


def dependencies(path: str, lines: List[str]) -> Iterator[Tuple[int, str, str, str]]:
    """``(line, normalised name, the rest, "pip" | "conda")`` of every package a dependency file pins: each line of
    a pip requirements file; a conda environment's ``dependencies`` (conda specs, and its ``pip:`` list); a
    pyproject.toml's ``[project]`` dependencies and optional dependencies. A file that is not one (``MANIFEST.in``,
    a YAML or TOML file that does not parse) pins nothing."""
    name = os.path.basename(path).lower()
    if name == "pyproject.toml":
        yield from _pyproject(lines)
    elif name.endswith((".yml", ".yaml")):
        yield from _conda(lines)
    elif is_requirements(path):
        for number, line in enumerate(lines, start=1):
            found = requirement(line)
            if found is not None:
                yield number, found[0], found[1], "pip"


_CONDA_SPEC = re.compile(r"^\s*(?:[\w.-]+::)?([A-Za-z0-9][\w.-]*)\s*(.*)$")


def _conda(lines: List[str]) -> Iterator[Tuple[int, str, str, str]]:
    """A conda environment file read with ``yaml.compose`` (SafeLoader: nothing is constructed), which keeps lines."""
    import yaml

    try:
        root = yaml.compose("\n".join(lines), Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return
    if not isinstance(root, yaml.MappingNode):
        return
    for key, value in root.value:
        if key.value != "dependencies" or not isinstance(value, yaml.SequenceNode):
            continue
        for item in value.value:
            if isinstance(item, yaml.ScalarNode):
                match = _CONDA_SPEC.match(str(item.value))
                if match:
                    yield item.start_mark.line + 1, normal_package(match.group(1)), match.group(2), "conda"
            elif isinstance(item, yaml.MappingNode):
                for inner_key, inner in item.value:
                    if inner_key.value == "pip" and isinstance(inner, yaml.SequenceNode):
                        for entry in inner.value:
                            found = requirement(str(entry.value)) if isinstance(entry, yaml.ScalarNode) else None
                            if found is not None:
                                yield entry.start_mark.line + 1, found[0], found[1], "pip"


def _pyproject(lines: List[str]) -> Iterator[Tuple[int, str, str, str]]:
    """``[project] dependencies`` and ``optional-dependencies`` (PEP 621), each found on the line that quotes it."""
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # pragma: no cover - Python < 3.11: tomli when installed, else pyproject.toml is not read
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            return
    try:
        project = tomllib.loads("\n".join(lines)).get("project", {})
    except (tomllib.TOMLDecodeError, AttributeError):
        return
    if not isinstance(project, dict):
        return
    pinned = list(project.get("dependencies") or [])
    for group in (project.get("optional-dependencies") or {}).values():
        pinned.extend(group or [])
    start = 0
    for entry in pinned:
        found = requirement(str(entry))
        if found is None:
            continue
        number = next((i for i in range(start, len(lines)) if str(entry) in lines[i]), None)
        if number is None:
            number = next((i for i in range(len(lines)) if str(entry) in lines[i]), 0)
        start = number
        yield number + 1, found[0], found[1], "pip"


def requirement(line: str) -> Optional[Tuple[str, str]]:
    """``(normalised name, the rest)`` of one requirements line (a name with a specifier, ``name @ url``, a wheel or
    ``git+...#egg=`` URL), or None for comments, options and blank lines."""
    text = re.split(r"(?:^|\s)#(?!egg=)", line, maxsplit=1)[0].strip()
    if not text or text.startswith("-") and not text.startswith(("-e ", "--editable")):
        return None
    if text.startswith(("-e ", "--editable")):
        text = text.split(None, 1)[1] if len(text.split(None, 1)) > 1 else ""
    if "://" in text or text.startswith(("git+", "./", "/")):
        for pattern in (_EGG, _WHEEL, _REPOSITORY):
            match = pattern.search(text)
            if match:
                return normal_package(match.group(1)), text
        return None
    match = _REQUIREMENT.match(text)
    return (normal_package(match.group(1)), match.group(3)) if match else None


def cuda_package(name: str) -> Optional[str]:
    """What to do about a CUDA-only package (by normalised name), or None when it is not one."""
    if name in CUDA_PACKAGES:
        return CUDA_PACKAGES[name]
    for prefix, advice in CUDA_PREFIXES.items():
        if name.startswith(prefix):
            return advice
    return None


# ---- extension builds -----------------------------------------------------------------------------------------------

CUDA_SUFFIXES = (".cu", ".cuh")


def under_cuda_check(source, node) -> bool:  # type: ignore[no-untyped-def]
    """Whether ``node`` sits under an ``if`` / conditional expression that asks about CUDA (``if
    torch.cuda.is_available():``, ``if CUDA_HOME is not None:``, ``if args.cuda:``): built only where CUDA is."""
    import ast

    parent = source.parents.get(node)
    while parent is not None:
        if isinstance(parent, (ast.If, ast.IfExp, ast.While)) and "cuda" in ast.unparse(parent.test).lower():
            return True
        parent = source.parents.get(parent)
    return False
