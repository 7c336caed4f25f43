"""Entry points and override targets are found as ``import`` / ``python -m`` finds them — namespace packages
(PEP 420) at any depth, mixed with regular packages, spread over several folders — without running any of the
project's code: each layout is checked against Python's own answer."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from npu_port.errors import RunError
from npu_port.runtime.locate import find_module, locate_module, resolve_entry
from npu_port.runtime.overrides import Override

EXTEND = "__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n"

#: name -> (files, relative to tmp_path; the folders searched, in order; the module to locate).
LAYOUTS = {
    "namespace three deep": ({"nsa/b/c/mod.py": ""}, ["."], "nsa.b.c.mod"),
    "regular inside namespace": ({"nsb/reg/__init__.py": "", "nsb/reg/mod.py": ""}, ["."], "nsb.reg.mod"),
    "namespace inside regular": ({"nsc/__init__.py": "", "nsc/ns/mod.py": ""}, ["."], "nsc.ns.mod"),
    "namespace over two folders": (
        {"one/nsd/sub/first.py": "", "two/nsd/sub/second.py": ""},
        ["one", "two"],
        "nsd.sub.second",
    ),
    "a regular package later on the path beats a namespace portion": (
        {"one/nse/x.py": "", "two/nse/__init__.py": "", "two/nse/y.py": ""},
        ["one", "two"],
        "nse.y",
    ),
    "a module beats a namespace portion": ({"one/nsf/x.py": "", "two/nsf.py": ""}, ["one", "two"], "nsf"),
    "pkgutil.extend_path": (
        {"one/nsg/__init__.py": EXTEND, "one/nsg/a.py": "", "two/nsg/__init__.py": EXTEND, "two/nsg/b.py": ""},
        ["one", "two"],
        "nsg.b",
    ),
}


def _write(root, files):
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def forget_modules():
    """Drop what a test imported (the layouts' top-level names) from ``sys.modules`` afterwards."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]
    importlib.invalidate_caches()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_layout_resolves_to_the_file_python_imports(tmp_path, monkeypatch, forget_modules, layout):
    files, folders, name = LAYOUTS[layout]
    _write(tmp_path, files)
    search = [str(tmp_path / folder) for folder in folders]
    located = locate_module(name, search)
    assert not any(n.split(".")[0] == name.split(".")[0] for n in sys.modules)  # nothing imported to find it
    monkeypatch.setattr(sys, "path", [*search, *sys.path])
    importlib.invalidate_caches()
    assert located == importlib.util.find_spec(name).origin


def test_what_python_cannot_import_is_not_found_either(tmp_path):
    _write(tmp_path, {"one/nse/x.py": "", "two/nse/__init__.py": ""})
    found = find_module("nse.x", [str(tmp_path / "one"), str(tmp_path / "two")])
    assert found.problem == f"the package 'nse' ({tmp_path / 'two' / 'nse'}) has no module 'x'"


@pytest.mark.parametrize(
    "name, problem",
    [
        ("nsa.b.c.gone", "the namespace package 'nsa.b.c' ({root}/nsa/b/c) has no module 'gone'"),
        ("nsa.b.gone.mod", "the namespace package 'nsa.b' ({root}/nsa/b) has no module 'gone'"),
        ("nsa.b.c.mod.x", "'nsa.b.c.mod' is a module ({root}/nsa/b/c/mod.py), not a package"),
        ("nsa.b-c", "'b-c' is not a module name"),
        ("gone.b", ""),
    ],
)
def test_what_is_missing_is_named_at_the_level_it_is_missing(tmp_path, name, problem):
    _write(tmp_path, {"nsa/b/c/mod.py": ""})
    found = find_module(name, [str(tmp_path)])
    assert not found.found and found.problem == problem.format(root=tmp_path)
    assert locate_module(name, [str(tmp_path)]) is None


def test_a_namespace_package_is_its_folders_and_a_package_its_init(tmp_path):
    _write(tmp_path, {"one/nsd/sub/x.py": "", "two/nsd/sub/y.py": "", "one/reg/__init__.py": ""})
    search = [str(tmp_path / "one"), str(tmp_path / "two")]
    namespace = find_module("nsd.sub", search)
    assert (namespace.origin, namespace.is_package) == (None, True)
    assert namespace.locations == (str(tmp_path / "one" / "nsd" / "sub"), str(tmp_path / "two" / "nsd" / "sub"))
    assert locate_module("nsd.sub", search) == str(tmp_path / "one" / "nsd" / "sub")
    assert locate_module("reg", search) == str(tmp_path / "one" / "reg" / "__init__.py")


def test_locating_through_mixed_levels_runs_none_of_the_packages(tmp_path):
    _write(
        tmp_path,
        {
            "nsh/reg/__init__.py": "raise SystemExit('nsh.reg ran')\n",
            "nsh/reg/tools/run.py": "raise SystemExit('run ran')\n",
        },
    )
    entry = resolve_entry("nsh.reg.tools.run", as_module=True, cwd=str(tmp_path))
    assert (entry.name, entry.path) == ("nsh.reg.tools.run", str(tmp_path / "nsh" / "reg" / "tools" / "run.py"))
    assert entry.top_package_parent == str(tmp_path)
    assert "nsh" not in sys.modules and "nsh.reg" not in sys.modules


def test_a_namespace_package_runs_its_main_from_whichever_folder_has_it(tmp_path, monkeypatch):
    _write(tmp_path, {"one/nsd/sub/x.py": "", "two/nsd/sub/__main__.py": ""})
    monkeypatch.setattr(sys, "path", [sys.path[0], str(tmp_path / "two"), *sys.path[1:]])
    entry = resolve_entry("nsd.sub", as_module=True, cwd=str(tmp_path / "one"))
    assert (entry.name, entry.path) == ("nsd.sub.__main__", str(tmp_path / "two" / "nsd" / "sub" / "__main__.py"))
    assert entry.sys_path0 == str(tmp_path / "one")  # the working directory, as python -m puts it
    with pytest.raises(RunError) as info:
        resolve_entry("nsd", as_module=True, cwd=str(tmp_path / "one"))
    assert str(info.value) == "'nsd' is a package without __main__.py; name the module to run (-m nsd.NAME)"


def test_overrides_of_namespace_modules_are_located_at_any_depth(tmp_path):
    _write(tmp_path, {"nsa/b/c/mod.py": "def f():\n    pass\n", "nsi/my_mod.py": ""})
    search = [str(tmp_path)]
    Override("nsa.b.c.mod:f", "nsi.my_mod:f").check_locatable(search)
    with pytest.raises(RunError) as info:
        Override("nsa.b.c.gone:f", "nsi.my_mod:f").check_locatable(search)
    assert str(info.value) == (
        f"--override nsa.b.c.gone:f: no module named 'nsa.b.c.gone': the namespace package 'nsa.b.c' "
        f"({tmp_path / 'nsa' / 'b' / 'c'}) has no module 'gone'"
    )
    with pytest.raises(RunError) as info:
        Override("nsa.b.c.mod:f", "nsi.other:f").check_locatable(search)
    assert str(info.value) == (
        f"--override nsa.b.c.mod:f=nsi.other:f: no module named 'nsi.other': the namespace package 'nsi' "
        f"({tmp_path / 'nsi'}) has no module 'other'"
    )
    assert "nsa" not in sys.modules and "nsi" not in sys.modules
