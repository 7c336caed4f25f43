"""Every test that starts another process carries the ``e2e`` marker (and so, through conftest, ``slow``): the fast
tier stays fast and ``-m e2e`` selects every whole-program run. The check reads the test files with ``ast``
(:mod:`.markers`), so a new subprocess test without the marker fails here."""

from __future__ import annotations

import textwrap

from . import markers


def test_every_test_that_starts_a_process_is_marked_e2e():
    assert markers.unmarked() == []


def test_the_finder_sees_through_helpers_and_fixtures(tmp_path, monkeypatch):
    monkeypatch.setattr(markers, "TESTS", tmp_path)
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(
            """
            import pytest, sys
            @pytest.fixture
            def server():
                return launch()
            def launch():
                return sys.executable
            """
        )
    )
    path = tmp_path / "test_sample.py"
    path.write_text(
        textwrap.dedent(
            """
            import subprocess, pytest
            def _run(*args):
                return subprocess.run(args)
            def test_direct():
                subprocess.Popen(["x"])
            def test_helper():
                _run("x")
            def test_fixture(server):
                pass
            @pytest.mark.e2e
            def test_marked():
                _run("x")
            def test_faked(monkeypatch):
                monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0))
            def test_plain():
                assert 1
            """
        )
    )
    assert markers.spawning_tests(path) == ["test_direct", "test_fixture", "test_helper", "test_marked"]
    assert markers.unmarked() == [
        ("test_sample.py", "test_direct"),
        ("test_sample.py", "test_fixture"),
        ("test_sample.py", "test_helper"),
    ]


def test_every_collected_e2e_test_is_also_slow(request):
    e2e = [item for item in request.session.items if item.get_closest_marker("e2e") is not None]
    assert all(item.get_closest_marker("slow") is not None for item in e2e), [
        item.nodeid for item in e2e if item.get_closest_marker("slow") is None
    ]
