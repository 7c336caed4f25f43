"""Where a run writes — the image(s) or video, the report, the cache — checked before anything is loaded or computed.

A video is written as an mp4 (``--output NAME.mp4``; needs the ``video`` extra: imageio and imageio-ffmpeg) or, with
an image extension, as one image per frame: ``NAME-000.png``, ``NAME-001.png``, ... beside the given name.

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

from ..atomic import folder_problem, link_problem
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

#: Video containers ``--output`` may name for a video model (written by imageio with imageio-ffmpeg).
VIDEO_FORMATS = (".mp4",)


def video_writer_problem() -> Optional[str]:
    """Why an mp4 cannot be written here (imageio or imageio-ffmpeg missing, or its ffmpeg binary), or None."""
    try:
        import imageio  # noqa: F401
        import imageio_ffmpeg
    except ImportError as exc:
        return f"{exc.name or 'imageio'} is not installed"
    try:
        imageio_ffmpeg.get_ffmpeg_exe()
    except Exception as exc:  # noqa: BLE001 - any failure to find the binary means: cannot write mp4
        return f"imageio-ffmpeg has no ffmpeg binary ({exc})"
    return None


def frame_path(path: Path, index: int) -> Path:
    """Where frame ``index`` of a video written as images goes: ``NAME-000.png`` beside ``NAME.png``."""
    return path.with_name(f"{path.stem}-{index:03d}{path.suffix}")


def earlier_frames(path: Path) -> List[Path]:
    """Frame files of an earlier video run with the same name (``NAME-NNN.ext`` beside ``path``), by index."""
    pattern = re.compile(rf"{re.escape(path.stem)}-(\d{{3,}}){re.escape(path.suffix)}")
    if not path.parent.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in path.parent.iterdir() if (m := pattern.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


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


def check_video_writer(output: str) -> None:
    """Refuse ``--output NAME.mp4`` where no mp4 can be written, naming the extra that brings the writer."""
    from .._optional import extra_hint

    problem = video_writer_problem()
    if problem is not None:
        stem = Path(output).with_suffix("")
        raise InferenceError(
            f"--output {output!r}: writing mp4 needs imageio and imageio-ffmpeg ({problem}): {extra_hint('video')}; "
            f"or give an image extension to write the frames as images ({stem}-000.png, ...)"
        )


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


def plan_outputs(
    output: str,
    report: Optional[str] = None,
    compare: Optional[Sequence[str]] = None,
    *,
    video: Optional[bool] = False,
) -> OutputPlan:
    """Check ``--output`` / ``--report`` (and the per-strategy image names of ``--compare``) before any work.
    ``video``: the model makes videos (True), images (False) or is not known until loaded (None): an mp4 is
    accepted unless it is known to make images, and only where one can be written."""
    image = Path(output).expanduser()
    if image.is_dir():
        raise InferenceError(f"--output {output!r} is a folder; give an image file path, e.g. {image / 'npu-port.png'}")
    formats = sorted(image_formats()) + (list(VIDEO_FORMATS) if video is not False else [])
    extension = image.suffix.lower()
    if extension not in formats:
        what = f"{extension!r} is not an image format npu-port can write" if extension else "it has no extension"
        raise InferenceError(
            f"--output {output!r}: {what}; use one of: {', '.join(formats)} (e.g. outputs/npu-port.png)"
        )
    if extension in VIDEO_FORMATS:
        check_video_writer(output)
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
    for name, path in [*images.items(), (None, report_path)]:
        problem = link_problem(path)
        if problem is not None:
            label = "--report" if path == report_path else ("--output" if name is None else f"the image of {name!r}")
            raise InferenceError(f"{label} {str(path)!r} {problem}")
    frames = earlier_frames(image) if video is not False and extension not in VIDEO_FORMATS else []
    for frame in frames:  # a video written as images writes over an earlier run's frames NAME-000.png, ...
        problem = link_problem(frame)
        if problem is not None:
            raise InferenceError(f"--output {output!r}: the frame file {str(frame)!r} {problem}")
    for label, path in (("--output", image), ("--report", report_path)):
        problem = folder_problem(path.parent)
        if problem is not None:
            raise InferenceError(f"{label} {str(path)!r}: cannot write a file in {path.parent} ({problem})")
    return OutputPlan(images, report_path, image.parent / f".{image.name}.lock")
