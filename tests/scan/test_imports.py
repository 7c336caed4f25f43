"""The NPU1xx family beyond the inline fixtures: the project's own look-alikes only stay silent because they are the
project's, and the served sets come from npu-port's drop-ins and fallbacks themselves."""

from __future__ import annotations

import shutil
from pathlib import Path

from npu_port.scan.engine import scan_file, select_rules
from npu_port.scan.rules._imports import classify, served_modules

LOCAL = Path(__file__).parent / "fixtures" / "imports" / "project" / "uses_local.py"


def test_the_same_imports_fire_without_the_projects_own_folders(tmp_path):
    copy = tmp_path / "uses_local.py"
    shutil.copy(LOCAL, copy)
    assert scan_file(str(LOCAL), False, select_rules(["NPU1"])).findings == []
    found = scan_file(str(copy), False, select_rules(["NPU1"])).findings
    assert [(f.line, f.code) for f in found] == [
        (2, "NPU104"),
        (3, "NPU104"),
        (4, "NPU104"),
    ]  # line 5 imports a name, never matched by suffix


def test_what_the_drop_ins_serve_is_read_from_them():
    assert {"flash_attn", "flash_attn.bert_padding", "xformers.ops"} <= set(served_modules())
    assert classify("flash_attn", "flash_attn_varlen_func").kind == "handled"
    assert classify("xformers.ops", "SwiGLU").kind == "cuda-only"
    assert classify("alt_cuda_corr").by == "npu-port run's compiled-extension fallback"
    assert classify("torch._C") is None and classify("models.layers") is None
