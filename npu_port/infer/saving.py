"""Writing a run's image(s) — or video: an mp4, or one image per frame — and report as one consistent set.

Each file is written atomically (:mod:`npu_port.atomic`: a unique temporary name, then one rename), but a set of
files needs more: two runs with the same ``--output`` could otherwise leave one run's image beside the other's
report. So the set is written under an advisory lock (``fcntl.flock`` on a lock file beside the image; nothing
where ``fcntl`` is missing) — the last run to take it writes its whole set — and the report records each image's
sha256, so anyone can check that the pair belongs together. Ctrl-C while the set is being written is held back
until the set is complete: a set is written whole or not at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence

import numpy as np

from ..atomic import file_lock, write_bytes, write_json


def encode_image(image: np.ndarray, path: Path) -> bytes:
    """The (H, W, 3) image in [0, 1] encoded in the format ``path``'s extension names
    (:func:`~npu_port.infer.paths.image_formats`)."""
    from .paths import image_formats
    from .run import to_pil

    buffer = io.BytesIO()
    to_pil(image).save(buffer, format=image_formats()[path.suffix.lower()])
    return buffer.getvalue()


#: Frames per second of a written mp4 (Wan's 16).
VIDEO_FPS = 16


def encode_video(frames: np.ndarray, path: Path) -> bytes:
    """The (F, H, W, 3) video in [0, 1] as an mp4 (H.264 through imageio-ffmpeg; :func:`~npu_port.infer.paths.
    check_video_writer` has made sure it is there). ffmpeg writes to a file, so it goes through a temporary one and
    comes back as bytes for the atomic set."""
    import imageio

    data = (np.clip(frames, 0.0, 1.0) * 255).round().astype(np.uint8)
    handle, temporary = tempfile.mkstemp(prefix="npu-port-", suffix=path.suffix)
    os.close(handle)
    try:
        # macro_block_size 1: never resize (the model's sizes are even, which H.264's yuv420p needs)
        imageio.mimwrite(temporary, list(data), format="FFMPEG", fps=VIDEO_FPS, macro_block_size=1)
        return Path(temporary).read_bytes()
    finally:
        os.unlink(temporary)


def encode_output(data: np.ndarray, path: Path) -> Dict[Path, bytes]:
    """What a result is written as: an (H, W, 3) image at ``path``; an (F, H, W, 3) video as the mp4 ``path``
    names, or as one image per frame (``NAME-000.png``, ... beside it)."""
    from .paths import VIDEO_FORMATS, frame_path

    if data.ndim == 3:
        return {path: encode_image(data, path)}
    if path.suffix.lower() in VIDEO_FORMATS:
        return {path: encode_video(data, path)}
    return {frame_path(path, index): encode_image(frame, path) for index, frame in enumerate(data)}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back for the block and raise it after: the block is not cut half way. Only in the main
    thread (where Python runs signal handlers); elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: List[Any] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def write_set(
    images: Dict[Path, bytes],
    report_path: Path,
    report: Dict[str, Any],
    lock: Path,
    written: List[Path],
    stale: Sequence[Path] = (),
) -> None:
    """Write ``images`` (path -> encoded bytes) and then the report, together, under ``lock``, after removing
    ``stale`` (image paths this run has no picture for: an earlier run's file there would pass for this run's);
    ``written`` gets each path as it is written (a Ctrl-C held back meanwhile is raised after the last one)."""
    with file_lock(lock), interrupts_held():
        for path in stale:
            path.unlink(missing_ok=True)
        for path, data in images.items():
            write_bytes(path, data)
            written.append(path)
        write_json(report_path, report)
        written.append(report_path)
