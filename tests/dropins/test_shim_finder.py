"""The stand-in import hook: specs and metadata for served modules, a real package winning, broken extensions
replaced with a log line, and everything gone after unregistering."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import sys

import pytest

from npu_port.dropins.finder import Replacement, register, registered, unregister


@pytest.fixture
def impl_dir(tmp_path, monkeypatch):
    """Implementation modules (what npu-port would ship) and, separately, "real" packages of the same names."""
    impls, real = tmp_path / "impls", tmp_path / "real"
    impls.mkdir()
    real.mkdir()
    (impls / "npu_port_test_impl_top.py").write_text('"""stand-in top"""\ndef attend():\n    return "stand-in"\n')
    (impls / "npu_port_test_impl_sub.py").write_text("def helper():\n    return 'stand-in helper'\n")
    monkeypatch.syspath_prepend(str(impls))
    monkeypatch.syspath_prepend(str(real))
    yield real
    for name in list(registered()):
        if name.startswith("npu_port_test_"):
            unregister(name)
    for name in list(sys.modules):
        if name.startswith("npu_port_test_"):
            del sys.modules[name]


def _replacement(name: str, mode: str = "missing") -> Replacement:
    return Replacement(
        name,
        {name: "npu_port_test_impl_top", f"{name}.sub": "npu_port_test_impl_sub"},
        mode=mode,
        distribution=name.replace("_", "-"),
        version="9.9.9",
    )


def test_a_missing_package_is_served_with_a_spec_and_metadata(impl_dir):
    name = "npu_port_test_pkg_a"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)
    register(_replacement(name))
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin == "npu-port stand-in (npu_port_test_impl_top)"
    module = importlib.import_module(name)
    assert module.attend() == "stand-in" and module.__name__ == name and module.__doc__ == "stand-in top"
    assert module.__version__ == "9.9.9"
    assert importlib.import_module(f"{name}.sub").helper() == "stand-in helper"
    assert importlib.metadata.version("npu-port-test-pkg-a") == "9.9.9"
    assert importlib.metadata.version(name) == "9.9.9"
    assert registered()[name].served == [name, f"{name}.sub"]
    unregister(name)
    assert name not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version(name)


def test_a_real_package_wins_unless_forced(impl_dir):
    name = "npu_port_test_pkg_b"
    (impl_dir / f"{name}.py").write_text("def attend():\n    return 'real'\n")
    register(_replacement(name))
    assert importlib.import_module(name).attend() == "real"
    unregister(name)
    sys.modules.pop(name, None)
    register(_replacement(name, mode="always"))
    assert importlib.import_module(name).attend() == "stand-in"


def test_a_broken_extension_is_replaced_and_the_reason_logged(impl_dir, caplog):
    name = "npu_port_test_pkg_c"
    (impl_dir / f"{name}.py").write_text('raise ImportError("libcudart.so.12: cannot open shared object file")\n')
    register(_replacement(name, mode="broken"))
    with caplog.at_level(logging.WARNING, logger="npu_port.shims"):
        module = importlib.import_module(name)
    assert module.attend() == "stand-in"
    assert registered()[name].reason == (
        "the real module failed to load (ImportError: libcudart.so.12: cannot open shared object file)"
    )
    assert f"npu-port: {name} failed to load (ImportError: libcudart.so.12" in caplog.text


def test_a_source_folder_without_init_is_not_the_real_package(impl_dir, caplog):
    """A checkout's folder of the package's name (no ``__init__.py``) is an empty namespace package to Python: the
    stand-in is served, with its metadata, and the reason says the folder is not built."""
    name = "npu_port_test_pkg_e"
    (impl_dir / name).mkdir()
    (impl_dir / name / "setup.py").write_text("from setuptools import setup\n")
    register(_replacement(name))
    assert importlib.metadata.version(name) == "9.9.9"
    with caplog.at_level(logging.WARNING, logger="npu_port.shims"):
        assert importlib.import_module(name).attend() == "stand-in"
    reason = f"not built ({impl_dir / name} holds its unbuilt sources)"
    assert registered()[name].reason == reason
    assert caplog.messages == [f"npu-port: {name} is {reason}; using npu-port's fallback"]


def test_a_working_module_wins_in_broken_mode(impl_dir):
    name = "npu_port_test_pkg_d"
    (impl_dir / f"{name}.py").write_text("def attend():\n    return 'real'\n")
    register(_replacement(name, mode="broken"))
    assert importlib.import_module(name).attend() == "real"


def test_bad_registrations_are_refused():
    with pytest.raises(ValueError, match="mode must be one of missing, broken, always, got 'sometimes'"):
        register(Replacement("x_pkg", {"x_pkg": "m"}, mode="sometimes"))
    with pytest.raises(ValueError, match="modules must include the top-level module 'x_pkg'"):
        register(Replacement("x_pkg", {"x_pkg.sub": "m"}))


def test_install_dropins_registers_the_drop_ins_named_in_the_mode_asked():
    """What the guarded imports ``npu-port fix`` writes call: ``install_dropins("xformers", broken=True)`` registers
    that drop-in alone (an absent flash_attn stays absent), in mode "broken"."""
    from npu_port.dropins.install import install_dropins, uninstall_dropins

    try:
        assert install_dropins("xformers", broken=True) == ["xformers"]
        assert {name: r.mode for name, r in registered().items() if name in ("flash_attn", "xformers")} == {
            "xformers": "broken"
        }
        assert install_dropins(force=True, broken=True) == ["flash_attn", "xformers"]
        assert {registered()[name].mode for name in ("flash_attn", "xformers")} == {"always"}
        with pytest.raises(ValueError, match="no drop-in named flash-attn; the drop-ins are flash_attn, xformers"):
            install_dropins("flash-attn")
    finally:
        uninstall_dropins()
    assert "xformers" not in registered()
