"""The top level of ``npu_port`` is a small API declared once (``npu_port._PUBLIC``): ``__all__``, attribute access
and ``dir()`` agree with it, and every name is the very object its defining module holds."""

from __future__ import annotations

import importlib
import types

import npu_port

#: The public API (issue 14), written out: a change to the top level is a decision, not a side effect.
PUBLIC = [
    "attention",
    "set_attention_strategy",
    "attention_strategy",
    "list_strategies",
    "register_strategy",
    "kernels",
    "register_kernel",
    "Kernel",
    "masks",
    "get_device",
    "redirect_cuda",
    "apply_npu_options",
    "activate",
    "patch_legacy_attention",
    "register_fallback",
    "fuse_ops",
    "NpuPortError",
    "Reason",
    "__version__",
]


def test_the_top_level_is_the_small_public_api():
    assert npu_port.__all__ == PUBLIC


def test_every_public_name_is_its_defining_modules_object():
    """Resolved under the suite's filter that makes npu-port's deprecation warnings errors: none of them warns."""
    for name, module_name in npu_port._PUBLIC.items():
        value = getattr(npu_port, name)
        assert value is getattr(importlib.import_module(module_name), name), name
        assert isinstance(value, types.ModuleType) == (name == "masks"), name  # activate is the function, say
    assert npu_port.masks.__name__ == "npu_port.attn.masks"
    assert callable(npu_port.activate) and npu_port.activate.__module__ == "npu_port.runtime.activate"
    assert npu_port.__version__ == importlib.import_module("npu_port._version").__version__


def test_dir_lists_the_public_names_and_the_sub_packages_reachable_as_attributes():
    listed = dir(npu_port)
    assert set(PUBLIC) <= set(listed) and {"device", "distributed"} <= set(listed)
    assert listed == sorted(listed)
    assert npu_port.device is importlib.import_module("npu_port.device")
    assert npu_port.distributed is importlib.import_module("npu_port.distributed")
