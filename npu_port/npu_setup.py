"""``npu_port.apply_npu_options("ascend-910b")``: Ascend's runtime options from a profile, a YAML file or a dict.

The device layer (:mod:`npu_port.device.npu_options`) checks and sets the ``acl_options``, ``npu`` and ``env``
sections but knows nothing of strategies; finding a profile by name or reading a YAML file (with its ``extends``)
needs the strategy registry, so that part lives here, at the edge, and hands the device layer plain sections.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

from .device import npu_options as _device
from .errors import NpuOptionError
from .strategy.loader import SUFFIXES
from .strategy.registry import get_strategy, load_strategy_file


def _is_yaml_path(source: str) -> bool:
    return source.lower().endswith(SUFFIXES) or os.path.isfile(source)


def _load(source: Any) -> Any:
    """A profile name or a YAML path becomes its Strategy; a mapping or a Strategy-like object is used as is."""
    if isinstance(source, os.PathLike) or (isinstance(source, str) and _is_yaml_path(source)):
        return load_strategy_file(source)
    if isinstance(source, str):
        return get_strategy(source)
    return source


def apply_npu_options(
    source: Any = None,
    *,
    dry_run: Optional[bool] = None,
    acl_options: Optional[Mapping[str, Any]] = None,
    npu: Optional[Mapping[str, Any]] = None,
    env: Optional[Mapping[str, Any]] = None,
) -> _device.NpuOptionsReport:
    """Check and set Ascend's ACL options, NPU runtime settings and environment variables.

    ``source``: a built-in or user profile name (``"ascend-910b"``), a path to a YAML strategy / profile file, a
    mapping with ``acl_options`` / ``npu`` / ``env`` sections, or a Strategy. The keyword sections are merged over
    it, key by key (the keyword wins). Off an NPU (``dry_run=None``) nothing is set and the report says what would
    be; see :func:`npu_port.device.npu_options.apply_npu_options` for ``dry_run`` and the report.
    """
    overrides = {"acl_options": acl_options, "npu": npu, "env": env}
    if source is None and all(section is None for section in overrides.values()):
        raise NpuOptionError("nothing to apply: give a profile name, a YAML path or a dict")
    base = _device.read_sections(_load(source)) if source is not None else {}
    extra = _device.read_sections(overrides)
    merged: Dict[str, Dict[Any, Any]] = {name: {**base.get(name, {}), **extra[name]} for name in _device.SECTIONS}
    return _device.apply_npu_options(merged, dry_run=dry_run)
