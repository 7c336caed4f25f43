"""The import watcher calls back after each of the user's own modules executes — and only those."""

from __future__ import annotations

import importlib
import sys

from npu_port.runtime.watch_imports import ImportWatcher


def test_only_modules_under_the_watched_directory_are_reported(tmp_path, monkeypatch):
    project, other = tmp_path / "project", tmp_path / "other"
    (project / "pkg").mkdir(parents=True)
    other.mkdir()
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "npu_port_watch_model.py").write_text("class Model:\n    pass\n")
    (other / "npu_port_watch_elsewhere.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.syspath_prepend(str(other))
    seen = []
    watcher = ImportWatcher([str(project)], lambda module: seen.append((module.__name__, hasattr(module, "Model"))))
    watcher.install()
    try:
        module = importlib.import_module("pkg.npu_port_watch_model")
        importlib.import_module("npu_port_watch_elsewhere")
        import json  # noqa: F401 - the standard library is never watched
    finally:
        watcher.uninstall()
        for name in ("pkg", "pkg.npu_port_watch_model", "npu_port_watch_elsewhere"):
            sys.modules.pop(name, None)
    assert seen == [("pkg", False), ("pkg.npu_port_watch_model", True)]  # called after the module body ran
    assert watcher.watched == ["pkg", "pkg.npu_port_watch_model"]
    assert module.__loader__.get_source(module.__name__).startswith("class Model")  # the real loader shows through
    assert watcher not in sys.meta_path
