"""Where a run writes — the image(s), the report, the cache — checked before anything is loaded or computed.

Whether a folder can be written is asked of :func:`npu_port.atomic.folder_problem`, which tries it.
"""

from __future__ import annotations

import atexit
import functools
import io
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..atomic import folder_problem
from ..errors import InferenceError

# --------------------------------------------------------------------------------------------- the cache folder


_TEMPORARY_MODELS: List[Path] = []


@dataclass(frozen=True)
class CacheLocation:
    """The npu-port cache folder for this run, or ``root=None``: no disk cache (built-in models are then built in a
    temporary folder removed at exit, and auto's decisions are kept in memory only)."""

    root: Optional[Path]

    @classmethod
    def default(cls) -> "CacheLocation":
        """The configured cache folder, unchecked (``NPU_PORT_CACHE_DIR``, else the XDG / home default)."""
        from ..strategy.cache import cache_root

        return cls(cache_root())

    @property
    def models(self) -> Path:
        if self.root is not None:
            return self.root / "models"
        if not _TEMPORARY_MODELS:
            _TEMPORARY_MODELS.append(Path(tempfile.mkdtemp(prefix="npu-port-models-")))
            atexit.register(shutil.rmtree, _TEMPORARY_MODELS[0], True)
        return _TEMPORARY_MODELS[0]


def cache_location() -> Tuple[CacheLocation, Optional[str]]:
    """The cache folder, checked by writing to it: ``(location, warning)``.

    ``NPU_PORT_CACHE_DIR`` set to a folder that cannot be written is an error (the user asked for that folder); the
    default location unwritable gives a warning line and no disk cache, and the run goes on.
    """
    location = CacheLocation.default()
    assert location.root is not None
    problem = folder_problem(location.root, create=True)
    if problem is None:
        return location, None
    explicit = os.environ.get("NPU_PORT_CACHE_DIR")
    if explicit:
        raise InferenceError(
            f"NPU_PORT_CACHE_DIR={explicit}: cannot write there ({problem}); set it to a folder you can write, or "
            "unset it to use the default cache folder"
        )
    return CacheLocation(None), (
        f"warning: cannot write the cache folder {location.root} ({problem}); running without a disk cache (auto "
        "measures again, built-in models are built in a temporary folder); set NPU_PORT_CACHE_DIR to a writable folder"
    )


# --------------------------------------------------------------------------------------------- images and report


@functools.lru_cache(maxsize=None)
def image_formats() -> Dict[str, str]:
    """Extension -> PIL format, for every format this PIL can write an RGB image in (tried on a 2x2 image: some
    registered savers take only 1-bit images or need a plug-in that is not there)."""
    from PIL import Image

    Image.init()
    probe = Image.new("RGB", (2, 2))
    writable: Dict[str, str] = {}
    for extension, name in sorted(Image.registered_extensions().items()):
        if name not in Image.SAVE:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                probe.save(io.BytesIO(), format=name)
        except Exception:  # noqa: BLE001 - any failure means: not a format we can write
            continue
        writable[extension] = name
    return writable


def _file_part(strategy: str) -> str:
    """A strategy name or path as it appears in an image's file name (``out-<this>.png``)."""
    base = Path(strategy).name if ("/" in strategy or os.sep in strategy) else strategy
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", base) or "strategy"


@dataclass(frozen=True)
class OutputPlan:
    """Where a run writes: one image per strategy (one image, key None, for a single run), the report, and the
    lock file that keeps the image(s) and report of one run together (:mod:`npu_port.infer.saving`)."""

    images: Dict[Optional[str], Path]
    report: Path
    lock: Path

    @property
    def image(self) -> Path:
        return next(iter(self.images.values()))


def plan_outputs(output: str, report: Optional[str] = None, compare: Optional[Sequence[str]] = None) -> OutputPlan:
    """Check ``--output`` / ``--report`` (and the per-strategy image names of ``--compare``) before any work."""
    image = Path(output).expanduser()
    if image.is_dir():
        raise InferenceError(f"--output {output!r} is a folder; give an image file path, e.g. {image / 'npu-port.png'}")
    formats = image_formats()
    extension = image.suffix.lower()
    if extension not in formats:
        what = f"{extension!r} is not an image format npu-port can write" if extension else "it has no extension"
        raise InferenceError(
            f"--output {output!r}: {what}; use one of: {', '.join(sorted(formats))} (e.g. outputs/npu-port.png)"
        )
    if compare:
        images: Dict[Optional[str], Path] = {}
        for name in compare:
            path = image.with_name(f"{image.stem}-{_file_part(name)}{image.suffix}")
            clash = [other for other, taken in images.items() if taken == path]
            if clash:
                raise InferenceError(
                    f"--compare: strategies {clash[0]!r} and {name!r} would both write {path}; rename one of them"
                )
            images[name] = path
    else:
        images = {None: image}
    report_path = Path(report).expanduser() if report else image.with_suffix(".json")
    if report_path.is_dir():
        raise InferenceError(f"--report {str(report_path)!r} is a folder; give a file path, e.g. {report_path}.json")
    for name, path in images.items():
        if os.path.realpath(path) == os.path.realpath(report_path):
            what = "--output" if name is None else f"the image of strategy {name!r}"
            raise InferenceError(f"--report {str(report_path)!r} is the same file as {what}; give another path")
        if name is not None and path.is_dir():
            raise InferenceError(f"the image of strategy {name!r} would be written to {path}, which is a folder")
    for label, path in (("--output", image), ("--report", report_path)):
        problem = folder_problem(path.parent)
        if problem is not None:
            raise InferenceError(f"{label} {str(path)!r}: cannot write a file in {path.parent} ({problem})")
    return OutputPlan(images, report_path, image.parent / f".{image.name}.lock")
