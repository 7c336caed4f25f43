"""The classes whose ``from_pretrained`` takes a ``device_map`` (transformers' ``PreTrainedModel``, diffusers'
``ModelMixin`` and ``DiffusionPipeline``), and safetensors' ``load_file``, for the CUDA redirect, which hands them
the map or device already on its target — at the call the caller wrote, so the report books it there (safetensors
would otherwise meet the CUDA device inside its own Python code, and a hit there belongs to safetensors).

They are looked up only in modules the program has imported: importing transformers' or diffusers' models here
would cost seconds in programs that never load one. ``npu-port run`` watches :data:`MODULES` and lets the redirect
take each class as its module is imported. A release that moved a class elsewhere simply has it not found: its
loads go through the redirect's torch-level mapping as before (a CUDA name in the map still lands on the target).
"""

from __future__ import annotations

import sys
from typing import List, Tuple

#: (module, class) where a ``from_pretrained`` that takes ``device_map`` is defined, in each release's layout.
LOADERS: Tuple[Tuple[str, str], ...] = (
    ("transformers.modeling_utils", "PreTrainedModel"),
    ("diffusers.models.modeling_utils", "ModelMixin"),
    ("diffusers.modeling_utils", "ModelMixin"),  # diffusers 0.11 - 0.13
    ("diffusers.pipelines.pipeline_utils", "DiffusionPipeline"),
    ("diffusers.pipeline_utils", "DiffusionPipeline"),  # diffusers 0.11 - 0.13
)
#: (module, function, position of its ``device`` argument): public loaders that take a device.
DEVICE_FUNCTIONS: Tuple[Tuple[str, str, int], ...] = (("safetensors.torch", "load_file", 1),)
#: The modules to watch for (a class or function is taken once its module has run).
MODULES: Tuple[str, ...] = tuple(
    dict.fromkeys([module for module, _ in LOADERS] + [module for module, _, _ in DEVICE_FUNCTIONS])
)


def imported_loaders() -> List[type]:
    """The classes of :data:`LOADERS` whose modules are imported, each defining ``from_pretrained`` itself (a
    release that re-exports a class from an old path gives it once). Imports nothing."""
    found: List[type] = []
    for module_name, name in LOADERS:
        cls = getattr(sys.modules.get(module_name), name, None)
        if isinstance(cls, type) and isinstance(vars(cls).get("from_pretrained"), classmethod) and cls not in found:
            found.append(cls)
    return found


def imported_device_functions() -> List[Tuple[object, str, int]]:
    """``(module, name, position)`` for each of :data:`DEVICE_FUNCTIONS` whose module is imported. Imports nothing."""
    found: List[Tuple[object, str, int]] = []
    for module_name, name, position in DEVICE_FUNCTIONS:
        module = sys.modules.get(module_name)
        if callable(getattr(module, name, None)):
            found.append((module, name, position))
    return found
