"""Checks of the NPU4xx-NPU6xx rules that inline fixtures cannot hold: JSON configs (no comments for ``# expect``),
the requirement-line parser, and the flag table."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_port.scan.engine import scan, scan_file, select_rules
from npu_port.scan.rules._misc import ON_FLAGS, flag, requirement


def test_a_transformers_config_json_asking_for_flash_attention_2_is_reported(tmp_path):
    config = {"architectures": ["LlamaForCausalLM"], "_attn_implementation": "flash_attention_2", "use_xformers": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    found = [(f.line, f.code, f.severity, f.fix) for f in scan_file(str(path), False, select_rules()).findings]
    assert found == [(5, "NPU652", "runtime", "unsafe")]


def test_requirements_are_found_by_the_scan_of_a_folder_and_manifest_in_is_not_one(tmp_path):
    (tmp_path / "requirements.txt").write_text("xformers==0.0.22\napex\n", encoding="utf-8")
    (tmp_path / "MANIFEST.in").write_text("include xformers\n", encoding="utf-8")
    (tmp_path / "kernel.cu").write_text("#include <cuda.h>\n__global__ void k() {}\n", encoding="utf-8")
    result = scan([str(tmp_path)], select=["NPU6", "NPU5"])
    got = sorted((f.path.rsplit("/", 1)[-1], f.line, f.code) for f in result.findings)
    assert got == [("kernel.cu", 2, "NPU504"), ("requirements.txt", 1, "NPU601"), ("requirements.txt", 2, "NPU602")]


def test_requirement_lines_name_the_package_whatever_their_form():
    assert requirement("Flash_Attn>=2.0 ; python_version>'3.8'")[0] == "flash-attn"
    assert requirement("xformers[dev]==0.0.22  # pinned")[0] == "xformers"
    assert requirement("-e git+https://github.com/NVIDIA/apex.git#egg=apex")[0] == "apex"
    assert requirement("https://x.org/flash_attn-2.5.8+cu122-cp310-cp310-linux_x86_64.whl")[0] == "flash-attn"
    assert requirement("git+https://github.com/facebookresearch/xformers.git@v0.0.22")[0] == "xformers"
    assert requirement("-r base.txt") is None
    assert requirement("# flash-attn") is None


def test_flags_are_on_only_when_set_to_a_true_value():
    assert flag("--enable-xformers-memory-efficient-attention", None) == (
        "xformers",
        "enable_xformers_memory_efficient_attention",
    )
    assert flag("use_flash_attn", "True") == ("flash-attn", "use_flash_attn")
    assert flag("use_flash_attn", "false") is None
    assert flag("attn_implementation", "'sdpa'") is None
    assert flag("attn_implementation", '"flash_attention_2"')[0] == "flash_attention_2"


@pytest.mark.parametrize(
    "command, packages",
    [
        ("pip install flash-attn --no-build-isolation", ["flash-attn"]),
        ("pip install -i https://mirror/simple -r req.txt Flash_Attn==2.5.8 einops", ["flash-attn", "einops"]),
        ("python -m pip install --upgrade pip && pip3 install 'xformers>=0.0.20'", ["pip", "xformers"]),
        ("/opt/venv/bin/pip install -U apex; echo done", ["apex"]),
        ("pip download flash-attn", []),
        ("pip uninstall -y xformers", []),
    ],
)
def test_pip_install_commands_name_the_packages_they_install(command, packages):
    import ast

    from npu_port.scan.rules.npu604_cuda_package_install import _installed, _words

    assert _installed(_words(ast.Constant(command))) == packages


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(ON_FLAGS)),
    default=st.sampled_from(["True", "False", "None", "1", '"xformers"']),
    keyword_only=st.booleans(),
    annotated=st.booleans(),
    uses_library=st.booleans(),
)
def test_a_parameter_is_reported_exactly_when_it_defaults_a_flag_to_true(
    name, default, keyword_only, annotated, uses_library
):
    """NPU653 on the default itself, for every flag name the table knows; a truthy non-``True`` default (``1``) is
    left alone: only ``True`` is certain to switch the backend on. A flash-attn flag counts only in a file that
    imports flash-attn (elsewhere it is torch's own flash SDPA)."""
    import tempfile
    from pathlib import Path

    annotation = ": bool" if annotated else ""
    star = "*, " if keyword_only else ""
    head = "import flash_attn.flash_attn_interface as fa\n" if uses_library else ""
    text = f"{head}def build(model, {star}{name}{annotation} = {default}):\n    return model\n"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.py"
        path.write_text(text, encoding="utf-8")
        found = [(f.line, f.column, f.code) for f in scan_file(str(path), False, select_rules(["NPU653"])).findings]
    column = text.index(f"= {default}") - len(head) + 3
    reported = default == "True" and (ON_FLAGS[name] != "flash-attn" or uses_library)
    assert found == ([(1 + bool(head), column, "NPU653")] if reported else [])
