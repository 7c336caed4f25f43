"""npu_port.atomic: every file npu-port writes for the user appears whole or not at all, whoever else writes it."""

from __future__ import annotations

import json
import math
import os
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npu_port import atomic


def _leftovers(folder: Path):
    return sorted(p.name for p in folder.iterdir() if ".tmp" in p.name)


def test_write_text_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "deep" / "report.json"
    atomic.write_text(path, "one")
    atomic.write_text(path, "two")
    assert path.read_text() == "two"
    assert _leftovers(path.parent) == []


def test_mode_is_what_open_would_give_not_mkstemps_private_0600(tmp_path):
    path = tmp_path / "image.png"
    atomic.write_bytes(path, b"x")
    plain = tmp_path / "plain.png"
    plain.write_bytes(b"x")
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)


def test_temporary_names_are_unique_and_keep_the_suffix(tmp_path):
    seen = []
    for _ in range(3):
        with atomic.atomic_path(tmp_path / "out.png") as temporary:
            seen.append(temporary.name)
            assert temporary.suffix == ".png" and temporary.parent == tmp_path
            temporary.write_bytes(b"")
    assert len(set(seen)) == 3


@pytest.mark.parametrize("error", [RuntimeError("writer failed"), KeyboardInterrupt()])
def test_a_failing_or_interrupted_writer_keeps_the_old_file_and_removes_its_temporary(tmp_path, error):
    path = tmp_path / "report.json"
    path.write_text("old")

    def writer(temporary: Path):
        temporary.write_text("half")
        raise error

    with pytest.raises(type(error)):
        atomic.write_with(path, writer)
    assert path.read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_concurrent_writers_never_interleave(tmp_path):
    path = tmp_path / "shared.json"
    payloads = [json.dumps({"writer": i, "data": "x" * 200_000}) for i in range(8)]
    errors = []

    def write(text):
        try:
            for _ in range(5):
                atomic.write_text(path, text)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert path.read_text() in payloads
    assert _leftovers(tmp_path) == []


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
        max_leaves=12,
    )
)
def test_json_safe_makes_any_value_valid_json_and_keeps_finite_ones(value):
    cleaned = atomic.json_safe(value)
    text = json.dumps(cleaned, allow_nan=False)  # raises on NaN / inf

    def same(original, loaded):
        if isinstance(original, float):
            return loaded is None if not math.isfinite(original) else loaded == original
        if isinstance(original, dict):
            return set(original) == set(loaded) and all(same(original[k], loaded[k]) for k in original)
        if isinstance(original, list):
            return len(original) == len(loaded) and all(same(a, b) for a, b in zip(original, loaded))
        return original == loaded

    assert same(value, json.loads(text))


def test_write_json_writes_null_for_nan_and_never_bare_nan(tmp_path):
    path = tmp_path / "r.json"
    atomic.write_json(path, {"max_abs_diff": float("nan"), "psnr": float("inf"), "ok": 1.5, "t": (1, 2)})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"max_abs_diff": None, "psnr": None, "ok": 1.5, "t": [1, 2]}


def test_a_folder_in_the_way_is_an_error_and_nothing_is_left(tmp_path):
    (tmp_path / "out.png").mkdir()
    with pytest.raises(OSError):
        atomic.write_bytes(tmp_path / "out.png", b"x")
    assert _leftovers(tmp_path) == []
    assert os.path.isdir(tmp_path / "out.png")


def test_a_destination_that_is_not_a_regular_file_is_written_into_never_replaced(tmp_path):
    """``npu-port scan -o /dev/null``: renaming over a device node or a FIFO would replace it with a plain file (for
    /dev/null, breaking the machine); the bytes are written into it instead."""
    from npu_port.atomic import write_text

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_text(fifo, "report\n")
    reader.join(timeout=10)
    assert received == [b"report\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still a FIFO
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary left beside it
