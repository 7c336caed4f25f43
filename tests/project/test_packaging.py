"""The package as users get it: every module ships, nothing optional is imported, the wheel carries strategies/."""

from __future__ import annotations

import configparser
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _packages_on_disk():
    found = {"npu_port.strategies"}
    for init in (ROOT / "npu_port").rglob("__init__.py"):
        found.add(".".join(init.parent.relative_to(ROOT).parts))
    return found


def test_setup_cfg_lists_every_package():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    assert listed == _packages_on_disk()
    assert config["options"]["package_dir"].split() == ["npu_port.strategies", "=", "strategies"]


@pytest.mark.e2e
@pytest.mark.slow
def test_wheel_contains_every_module_and_the_strategies_package(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("npu_port-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {str(p.relative_to(ROOT)) for p in (ROOT / "npu_port").rglob("*.py")}
    assert expected <= names
    assert "npu_port/strategies/__init__.py" in names
    assert "npu_port/support_tested.json" in names  # what the CI lanes last ran, for npu-port doctor
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "npu-port = npu_port.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.e2e
@pytest.mark.slow
def test_import_is_light_and_never_touches_optional_packages():
    """``import npu_port`` loads no torch; using the API loads torch but no optional package."""
    code = (
        "import sys, json, npu_port\n"
        "light = 'torch' not in sys.modules\n"
        "import torch\n"
        "npu_port.attention(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4))\n"
        "npu_port.kernels(); [k.availability() for k in npu_port.kernels()]\n"
        "print(json.dumps({'light': light, 'loaded': sorted(m for m in ('torch_npu', 'xformers', 'flash_attn', "
        "'diffusers', 'transformers', 'gradio', 'yaml') if m in sys.modules)}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == {"light": True, "loaded": []}


def test_public_api_names_resolve():
    import npu_port

    for name in npu_port.__all__:
        assert getattr(npu_port, name) is not None
    assert callable(npu_port.attention) and npu_port.masks.__name__ == "npu_port.attn.masks"


# ---- install hints: npu-port is not on the package index, so a hint names the checkout it was installed from ----


def test_the_extras_table_for_hints_matches_setup_cfg():
    from npu_port._optional import EXTRAS

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    declared = {extra: value.split() for extra, value in config["options.extras_require"].items() if extra != "dev"}
    assert EXTRAS == declared


def _setup_cfg_requirements():
    """``{where: [Requirement]}`` for install_requires and every extra of setup.cfg."""
    from packaging.requirements import Requirement

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    found = {"install_requires": [Requirement(r) for r in config["options"]["install_requires"].split()]}
    for extra, value in config["options.extras_require"].items():
        found[extra] = [Requirement(r) for r in value.split()]
    return found


def test_setup_cfg_states_the_support_policys_lower_bounds_and_never_a_cap():
    """Each requirement of a library with a support policy is exactly ``>=`` its minimum, wherever setup.cfg names
    it (the extras of its policy entry and ``dev`` alike); nothing anywhere is capped or pinned."""
    from npu_port.support import POLICY, supported

    requirements = _setup_cfg_requirements()
    for where, listed in requirements.items():
        for requirement in listed:
            operators = {spec.operator for spec in requirement.specifier}
            assert operators <= {">="}, f"{where}: {requirement} is capped or pinned; state a lower bound only"
    for entry in POLICY:
        for extra in entry.extras:
            assert entry.package in {r.name for r in requirements[extra]}, (
                f"extra {extra!r} must require {entry.package}"
            )
    named = [
        (where, r) for where, listed in requirements.items() for r in listed if r.name in {e.package for e in POLICY}
    ]
    assert {r.name for _, r in named} >= {"torch", "diffusers", "transformers", "gradio"}
    for where, requirement in named:
        assert str(requirement.specifier) == f">={supported(requirement.name).minimum}", (
            f"{where}: {requirement}; npu_port/support.py's minimum is {supported(requirement.name).minimum}"
        )
    assert {str(r) for r in requirements["dev"] if r.name in ("diffusers", "transformers", "gradio")} == {
        supported(name).requirement for name in ("diffusers", "transformers", "gradio")
    }


class _Distribution:
    def __init__(self, direct_url):
        self.direct_url = direct_url

    def read_text(self, name):
        assert name == "direct_url.json"
        return None if self.direct_url is None else json.dumps(self.direct_url)


def _hint_with(monkeypatch, direct_url, *, installed=True, checkout=None):
    from importlib import metadata

    from npu_port import _optional

    monkeypatch.setattr(_optional, "_checkout", lambda: checkout)  # as if imported from a wheel, unless given

    def distribution(name):
        assert name == "npu-port"
        if not installed:
            raise metadata.PackageNotFoundError(name)
        return _Distribution(direct_url)

    monkeypatch.setattr(metadata, "distribution", distribution)
    _optional._installed_from.cache_clear()
    try:
        return _optional.extra_hint("demo")
    finally:
        _optional._installed_from.cache_clear()


def test_hint_for_an_editable_checkout_names_the_checkout(monkeypatch, tmp_path):
    url = {"url": (tmp_path / "my checkout").as_uri(), "dir_info": {"editable": True}}
    assert (
        _hint_with(monkeypatch, url) == f'pip install -e "{tmp_path}/my checkout[demo]" (or: pip install "gradio>=5.0")'
    )


def test_hint_for_a_plain_install_from_a_folder_has_no_dash_e(monkeypatch, tmp_path):
    url = {"url": tmp_path.as_uri(), "dir_info": {}}
    assert _hint_with(monkeypatch, url) == f'pip install "{tmp_path}[demo]" (or: pip install "gradio>=5.0")'


def test_hint_for_a_checkout_inside_the_working_directory_is_relative(monkeypatch, tmp_path):
    (tmp_path / "npu-port").mkdir()
    monkeypatch.chdir(tmp_path)
    url = {"url": (tmp_path / "npu-port").as_uri(), "dir_info": {"editable": True}}
    assert _hint_with(monkeypatch, url) == 'pip install -e "npu-port[demo]" (or: pip install "gradio>=5.0")'


def test_hint_for_a_wheel_of_unknown_origin_names_the_packages_only(monkeypatch):
    assert _hint_with(monkeypatch, None) == 'pip install "gradio>=5.0"'
    assert _hint_with(
        monkeypatch, {"url": "https://example.org/npu_port-0.1-py3-none-any.whl", "archive_info": {}}
    ) == ('pip install "gradio>=5.0"')


def test_hint_for_a_source_tree_on_sys_path_names_that_tree(monkeypatch):
    monkeypatch.chdir(ROOT)
    expected = 'pip install -e ".[demo]" (or: pip install "gradio>=5.0")'
    assert _hint_with(monkeypatch, None, installed=False, checkout=ROOT) == expected
    # the checkout's npu_port.egg-info, first on sys.path when the working directory is, has no direct_url.json
    assert _hint_with(monkeypatch, None, installed=True, checkout=ROOT) == expected


def test_this_checkout_is_found_as_a_checkout():
    from npu_port import _optional

    assert _optional._checkout() == ROOT  # the tests run from the source tree (an editable install or sys.path)


def test_no_hint_anywhere_names_a_package_index_release():
    """``npu-port[...]`` is not installable from an index: no message may suggest it."""
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in [*(ROOT / "npu_port").rglob("*.py"), *(ROOT / "scripts").rglob("*.py"), *ROOT.glob("README*.md")]
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "npu-port[" in line
    ]
    assert offenders == []
