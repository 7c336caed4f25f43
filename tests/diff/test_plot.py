"""``write_plot``: a real PNG (or a self-contained HTML page around it), written atomically, different reports giving
different pictures; a clear error for a path it cannot write or a missing matplotlib."""

from __future__ import annotations

import base64
import re
import sys

import pytest

from npu_port._optional import extra_hint
from npu_port.diff.plot import write_plot

from .reports import two_module_report

PNG = b"\x89PNG\r\n\x1a\n"


def _size(png: bytes):
    assert png[:8] == PNG and png[12:16] == b"IHDR"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_a_png_is_written_and_two_reports_give_two_pictures(tmp_path):
    one = write_plot(two_module_report(), tmp_path / "one.png")
    two = write_plot(two_module_report(b_last=40.0, steps=2), tmp_path / "two.png")
    same = write_plot(two_module_report(), tmp_path / "same.png")
    assert one == tmp_path / "one.png"
    assert _size(one.read_bytes()) == (1000, 480) and len(one.read_bytes()) > 10_000
    assert one.read_bytes() != two.read_bytes()
    assert one.read_bytes() == same.read_bytes()  # drawn from the report alone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.png", "same.png", "two.png"]  # no temporary left


def test_a_path_without_suffix_is_a_png(tmp_path):
    assert write_plot(two_module_report(), tmp_path / "plot").read_bytes()[:8] == PNG


def test_an_html_page_embeds_the_png_and_lists_the_divergent_calls(tmp_path):
    page = write_plot(two_module_report(), tmp_path / "diff.html").read_text(encoding="utf-8")
    (encoded,) = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    png = base64.b64decode(encoded)
    assert png == write_plot(two_module_report(), tmp_path / "diff.png").read_bytes()
    rows = re.findall(r"<tr><td>(.*?)</td></tr>", page)
    assert [row.split("</td><td>")[:6] for row in rows] == [
        ["0", "0", "lin", "Linear", "error", "0.1"],
        ["0", "0", "act", "ReLU", "error", "0.1"],
    ]
    assert "<p>lin (Linear), step 0, call 0: error 0.1" in page and "http" not in page.replace("http-equiv", "")


def test_a_path_of_another_kind_is_refused_before_drawing(tmp_path):
    with pytest.raises(ValueError) as caught:
        write_plot(two_module_report(), tmp_path / "diff.jpg")
    assert str(caught.value) == f"plot file {str(tmp_path / 'diff.jpg')!r}: give a .png or an .html path"
    assert list(tmp_path.iterdir()) == []


def test_without_matplotlib_it_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError) as caught:
        write_plot(two_module_report(), tmp_path / "diff.png")
    assert str(caught.value).startswith(f"the diff plot needs matplotlib: {extra_hint('bench')} (")
    assert list(tmp_path.iterdir()) == []
