"""The package as users get it: every module ships, nothing optional is imported, the wheel carries strategies/."""

from __future__ import annotations

import configparser
import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "npu-port = npu_port.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


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
