"""Overrides replace one name in one module — as it is imported, or at once — and restore exactly; entry points and
the project's folders are found without running any of the project's code."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

from npu_port.errors import RunError
from npu_port.runtime import override
from npu_port.runtime.locate import locate_module, resolve_entry, watch_roots
from npu_port.runtime.overrides import Override, Overrides


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A package ``ovpkg`` with a module defining a function, a class with a method, and an importer of both."""
    pkg = tmp_path / "ovpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ops.py").write_text(
        "def fused(x):\n    raise RuntimeError('needs the CUDA kernel')\n\n"
        "class Block:\n    def run(self, x):\n        return fused(x)\n"
    )
    (pkg / "user.py").write_text("from ovpkg.ops import fused\n\ndef call(x):\n    return fused(x)\n")
    (tmp_path / "my_ops.py").write_text("def fused(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.split(".")[0] in ("ovpkg", "my_ops")]:
        del sys.modules[name]


def test_an_override_waits_for_the_import_and_importers_get_the_replacement(project):
    handle = override("ovpkg.ops:fused", "my_ops:fused")
    assert not handle.applied and "ovpkg.ops" not in sys.modules
    try:
        user = importlib.import_module("ovpkg.user")  # imports ovpkg.ops, then copies `fused`
        assert handle.applied and user.call(1) == 2
        ops = sys.modules["ovpkg.ops"]
        assert ops.Block().run(1) == 2  # the module's own global now names the replacement
    finally:
        handle.restore()
    with pytest.raises(RuntimeError, match="needs the CUDA kernel"):
        ops.fused(1)
    assert ops.fused.__module__ == "ovpkg.ops"
    assert not [f for f in sys.meta_path if type(f).__name__ == "ImportWatcher"]


def test_an_override_of_an_imported_module_applies_at_once_and_restores_the_very_object(project):
    ops = importlib.import_module("ovpkg.ops")
    original = ops.fused
    with override("ovpkg.ops:fused", lambda x: x * 10) as handle:
        assert handle.applied and ops.fused(2) == 20
    assert ops.fused is original


def test_an_inherited_method_is_overridden_on_the_class_and_deleted_again(project):
    ops = importlib.import_module("ovpkg.ops")
    sub = type("Sub", (ops.Block,), {})
    ops.Sub = sub
    with override("ovpkg.ops:Sub.run", lambda self, x: "mine"):
        assert sub().run(1) == "mine" and "run" in vars(sub)
    assert "run" not in vars(sub) and sub.run is ops.Block.run


def test_a_name_replaced_again_after_ours_is_kept_on_restore(project):
    ops = importlib.import_module("ovpkg.ops")
    handle = override("ovpkg.ops:fused", lambda x: "ours")

    def theirs(x):
        return "theirs"

    ops.fused = theirs
    handle.restore()
    assert ops.fused is theirs


@pytest.mark.parametrize(
    "spec, message",
    [
        ("ovpkg.ops:fused", "--override 'ovpkg.ops:fused' has no '='; expected pkg.module:name=my_module:name"),
        ("ovpkg.ops=my_ops:fused", "override target 'ovpkg.ops' is not module:name; expected pkg.module:name="),
        ("ovpkg.ops:fused=my_ops", "override replacement 'my_ops' is not module:name; expected pkg.module:name="),
        ("ovpkg.ops:1x=my_ops:fused", "override target 'ovpkg.ops:1x' is not module:name"),
    ],
)
def test_malformed_specs_are_refused_with_the_format(spec, message):
    with pytest.raises(RunError) as info:
        Overrides.parse([spec])
    assert str(info.value).startswith(message)
    assert "(name may be dotted: Class.method)" in str(info.value)


def test_modules_that_cannot_be_found_are_refused_before_anything_runs(project):
    with pytest.raises(RunError) as info:
        Override("ovpkg.nothere:fused", "my_ops:fused").check_locatable()
    assert str(info.value) == (
        f"--override ovpkg.nothere:fused: no module named 'ovpkg.nothere': the package 'ovpkg' ({project / 'ovpkg'}) "
        "has no module 'nothere'"
    )
    with pytest.raises(RunError, match="no module named 'cpu_nothere' on the module search path"):
        Override("ovpkg.ops:fused", "cpu_nothere:fused").check_locatable()
    Override("ovpkg.ops:fused", "my_ops:fused").check_locatable()
    assert "ovpkg" not in sys.modules  # locating ran none of the project's code


def test_a_missing_attribute_names_what_the_module_has(project):
    item = Override("ovpkg.ops:fuse", "my_ops:fused")
    with pytest.raises(RunError) as info:
        item.apply(importlib.import_module("ovpkg.ops"))
    assert str(info.value) == "--override ovpkg.ops:fuse: ovpkg.ops has no attribute 'fuse' (it has: Block, fused)"
    item = Override("ovpkg.ops:fused", "my_ops:nope")
    with pytest.raises(RunError, match=r"--override ovpkg.ops:fused=my_ops:nope: my_ops:nope does not exist"):
        item.apply(sys.modules["ovpkg.ops"])
    assert sys.modules["ovpkg.ops"].fused.__module__ == "ovpkg.ops"  # nothing half-applied


# ---- locating the entry point and the project's folders -------------------------------------------------------------


def test_locating_a_module_runs_none_of_its_packages(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "__init__.py").write_text("raise SystemExit('ran!')\n")
    (tmp_path / "scripts" / "animate.py").write_text("")
    assert locate_module("scripts.animate", [str(tmp_path)]) == str(tmp_path / "scripts" / "animate.py")
    assert locate_module("scripts.nothing", [str(tmp_path)]) is None
    assert locate_module("not-a-name", [str(tmp_path)]) is None


def test_entry_points_and_their_watch_roots(tmp_path):
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    (project / "scripts" / "__init__.py").write_text("")
    (project / "scripts" / "animate.py").write_text("")
    (project / "tool").mkdir()
    (project / "tool" / "__main__.py").write_text("")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    entry = resolve_entry("scripts.animate", as_module=True, cwd=str(project))
    assert (entry.kind, entry.path, entry.sys_path0) == (
        "module",
        str(project / "scripts" / "animate.py"),
        str(project),
    )
    assert entry.top_package_parent == str(project)
    package = resolve_entry("tool", as_module=True, cwd=str(project))
    assert package.path == str(project / "tool" / "__main__.py") and package.name == "tool.__main__"

    script = resolve_entry(str(project / "scripts" / "animate.py"), as_module=False, cwd=str(elsewhere))
    assert script.sys_path0 == str(project / "scripts") and script.top_package_parent == str(project)
    roots = watch_roots(script, [str(tmp_path)], cwd=str(elsewhere), environ={})
    assert roots == [str(elsewhere), str(project / "scripts"), str(project), str(tmp_path)]
    library = tmp_path / "lib"
    library.mkdir()
    on_path = {"PYTHONPATH": os.pathsep.join([str(library), "../project", str(tmp_path / "missing")])}
    roots = watch_roots(script, [], cwd=str(elsewhere), environ=on_path)
    assert roots == [str(elsewhere), str(project / "scripts"), str(project), str(library)]  # each once, existing only


@pytest.mark.parametrize(
    "target, as_module, message",
    [
        ("missing.py", False, "no such script: 'missing.py'"),
        ("scripts.animate", False, "no such script: 'scripts.animate' (to run the module 'scripts.animate', as "
                                   "python -m does: npu-port run -m scripts.animate)"),
        ("scripts", False, "'scripts' is a folder without __main__.py; give a script, or -m package.module"),
        ("scripts", True, "'scripts' is a package without __main__.py; name the module to run (-m scripts.NAME)"),
        ("scripts.gone", True, "no module named 'scripts.gone': the package 'scripts' ({root}/scripts) has no module "
                               "'gone'"),
        ("scripts.animate.x", True, "no module named 'scripts.animate.x': 'scripts.animate' is a module "
                                    "({root}/scripts/animate.py), not a package"),
        ("gone", True, "no module named 'gone' on the module search path (the working directory {root} first, as "
                       "python -m puts it); run from the project's root folder, or give the script's path"),
    ],
)  # fmt: skip
def test_bad_entry_points_say_what_to_do(tmp_path, target, as_module, message):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "__init__.py").write_text("")
    (tmp_path / "scripts" / "animate.py").write_text("")
    with pytest.raises(RunError) as info:
        resolve_entry(target, as_module, cwd=str(tmp_path))
    assert str(info.value).startswith(message.format(root=tmp_path))


def test_a_watch_folder_that_does_not_exist_is_refused(tmp_path):
    (tmp_path / "main.py").write_text("")
    entry = resolve_entry("main.py", False, cwd=str(tmp_path))
    with pytest.raises(RunError) as info:
        watch_roots(entry, [str(tmp_path / "nope")])
    assert str(info.value) == (
        f"--watch {str(tmp_path / 'nope')!r}: no such folder (give a folder holding the project's modules)"
    )
