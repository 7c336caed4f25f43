"""``npu-port fix``'s default target, torch's own device-agnostic API: each rewrite, run on this CPU with CUDA faked,
does what the original does on CUDA (the same call, the same device); run for real here (no accelerator), it runs;
the rewritten file imports torch only. The ``npu-port`` target and the fallback for old torch are checked too."""

from __future__ import annotations

import types

import pytest
import torch

from npu_port.cli.main import main
from npu_port.scan import targets
from npu_port.scan.fix import fix

#: One row per rewrite: the rule, the original snippet (a module of its own; ``result`` is what it gives), and
#: what must be in the rewritten one. The snippets assign ``result`` so the two runs' values can be compared too.
ROWS = [
    ("NPU301", "x = torch.zeros(2)\nresult = x.cuda()\n", ".to("),
    ("NPU301", "x = torch.zeros(2)\nresult = x.cuda(non_blocking=True)\n", "non_blocking=True)"),
    ("NPU310", 'x = torch.zeros(2)\nresult = x.to("cuda")\n', ".to(("),
    ("NPU310", 'result = torch.device("cuda")\n', "torch.device(("),
    ("NPU310", 'result = torch.device("cuda:0")\n', "}:0"),
    ("NPU309", 'result = torch.Generator("cuda")\n', "torch.Generator(("),
    ("NPU309", 'result = torch.Generator(device="cuda:0")\n', "torch.Generator(device=f"),
    ("NPU302", "result = torch.cuda.synchronize()\n", "torch.accelerator.synchronize()"),
    ("NPU302", "result = torch.cuda.empty_cache()\n", "torch.get_device_module().empty_cache()"),
    ("NPU302", "result = torch.cuda.memory_allocated()\n", "torch.get_device_module().memory_allocated()"),
    ("NPU302", "result = torch.cuda.max_memory_allocated(0)\n", "torch.get_device_module().max_memory_allocated(0)"),
    ("NPU302", "result = torch.cuda.reset_peak_memory_stats()\n", "reset_peak_memory_stats() if"),
    ("NPU308", "result = torch.cuda.amp.GradScaler(init_scale=1024)\n", "torch.amp.GradScaler(("),
    ("NPU308", 'result = torch.amp.GradScaler("cuda", init_scale=1024)\n', "torch.amp.GradScaler(("),
    ("NPU307", "with torch.cuda.amp.autocast():\n    result = 1\n", "torch.autocast(("),
    ("NPU307", 'with torch.autocast("cuda", dtype=torch.bfloat16):\n    result = 1\n', "torch.autocast(("),
    (
        "NPU311",
        'torch.distributed.init_process_group(backend="nccl", init_method=INIT, rank=0, world_size=1)\n'
        "torch.distributed.destroy_process_group()\n",
        "default_device_backend_map[",
    ),
    (
        "NPU312",
        "from torch.distributed.device_mesh import init_device_mesh\n\n"
        'torch.distributed.init_process_group(backend="gloo", init_method=INIT, rank=0, world_size=1)\n'
        'result = init_device_mesh("cuda", (1,))\n'
        "torch.distributed.destroy_process_group()\n",
        "init_device_mesh((",
    ),
]
IDS = [f"{code}-{index}" for index, (code, _, _) in enumerate(ROWS)]


def _rewritten(tmp_path, code, snippet, target="torch"):
    path = tmp_path / "snippet.py"
    path.write_text("import torch\n\n" + snippet, encoding="utf-8")
    (one,) = fix([str(path)], select=[code], target=target)
    assert one.new is not None, one.left
    return one.new


class _Recorder:
    """Stands in for CUDA: every call it is given is recorded as (what, device, arguments) and answers a token."""

    def __init__(self):
        self.calls = []

    def __call__(self, what, device=None, fill=None, method=False):
        def call(*args, **kwargs):
            if device is not None:  # after the tensor, for a method
                args = (*args[:1], device, *args[1:]) if method else (device, *args)
            args = tuple("<tensor>" if isinstance(a, torch.Tensor) else a for a in args)
            self.calls.append((what, args, {**(fill or {}), **kwargs}))
            return f"<{what}>"

        return call


def _fake_cuda(monkeypatch, recorder):
    """torch as on a machine with one CUDA device, its CUDA-side effects recorded: the original calls CUDA's own
    functions, the rewrite torch's device-agnostic ones; both land in the recorder under the same names."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda"))
    monkeypatch.setattr(torch.Tensor, "cuda", recorder("to", device="cuda", method=True))
    monkeypatch.setattr(torch.Tensor, "to", recorder("to"))
    monkeypatch.setattr(torch, "Generator", recorder("Generator"))
    module = types.SimpleNamespace()
    for name in ("synchronize", "empty_cache", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, recorder(name))
        setattr(module, name, recorder(name))
    monkeypatch.setattr(torch.accelerator, "synchronize", recorder("synchronize"))
    monkeypatch.setattr(torch, "get_device_module", lambda device=None: module)
    # torch.cuda.amp's classes are torch.amp's for "cuda", with their own defaults
    monkeypatch.setattr(torch.cuda.amp, "GradScaler", recorder("GradScaler", device="cuda"))
    monkeypatch.setattr(torch.amp, "GradScaler", recorder("GradScaler"))
    autocast = {"enabled": True}
    legacy = {"enabled": True, "dtype": torch.float16, "cache_enabled": True}
    monkeypatch.setattr(torch.cuda.amp, "autocast", _context(recorder("autocast", device="cuda", fill=legacy)))
    monkeypatch.setattr(torch, "autocast", _context(recorder("autocast", fill=autocast)))
    monkeypatch.setattr(torch.distributed, "init_process_group", recorder("init_process_group"))
    monkeypatch.setattr(torch.distributed, "destroy_process_group", recorder("destroy_process_group"))
    import torch.distributed.device_mesh as mesh

    monkeypatch.setattr(mesh, "init_device_mesh", recorder("init_device_mesh"))


def _context(call):
    """A recorder usable as ``with ...:``."""

    class Context:
        def __init__(self, *args, **kwargs):
            call(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    return Context


def _run(text, tmp_path):
    namespace = {"INIT": f"file://{tmp_path}/store", "__name__": "snippet"}
    exec(compile(text, "snippet.py", "exec"), namespace)
    return namespace.get("result")


@pytest.mark.parametrize(("code", "snippet", "written"), ROWS, ids=IDS)
def test_each_rewrite_does_on_cuda_what_the_original_does_and_runs_on_a_cpu(code, snippet, written, tmp_path):
    original = "import torch\n\n" + snippet
    new = _rewritten(tmp_path, code, snippet)
    assert written in new and "npu_port" not in new
    effects = []
    for text in (original, new):
        recorder = _Recorder()
        with pytest.MonkeyPatch.context() as monkeypatch:
            _fake_cuda(monkeypatch, recorder)
            result = _run(text, tmp_path)
        effects.append((recorder.calls, result))
    assert effects[0] == effects[1]
    assert effects[0][0] or isinstance(effects[0][1], torch.device)  # the fake saw the CUDA side (or a device)
    assert not torch.accelerator.is_available()  # for real, here: a CPU, where the original raised or did nothing
    _run(new, tmp_path)


def test_the_torch_target_adds_import_torch_after_the_files_imports_and_drops_the_unused_import(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os\nfrom torch.cuda import synchronize\n\nos.sep\nsynchronize()\n", encoding="utf-8")
    (one,) = fix([str(path)], target="torch")
    assert one.new == (
        "import os\nimport torch\n\nos.sep\n"
        "(torch.accelerator.synchronize() if torch.accelerator.is_available() else None)\n"
    )


def test_the_npu_port_target_keeps_the_helpers(tmp_path):
    new = _rewritten(tmp_path, "NPU302", "torch.cuda.synchronize()\n", target="npu-port")
    assert new == "import torch\nimport npu_port\n\nnpu_port.device.synchronize()\n"


def test_torch_older_than_2_6_falls_back_to_the_helpers_said_one_line_before_the_diff(tmp_path, monkeypatch, capsys):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.5.1")
    note = "npu-port fix: torch 2.5.1 here, and torch's device-agnostic API needs 2.6: the fixes use npu_port's helpers"
    assert targets.resolve("torch") == ("npu-port", note)
    assert targets.resolve("npu-port") == ("npu-port", None)
    path = tmp_path / "m.py"
    path.write_text("import torch\n\ntorch.cuda.synchronize()\n", encoding="utf-8")
    assert main(["fix", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"# {note}"
    assert out[1].startswith("--- ") and "+npu_port.device.synchronize()" in out


def test_check_writes_nothing_names_the_files_and_exits_1_when_changes_are_pending(tmp_path, capsys):
    dirty, clean = tmp_path / "dirty.py", tmp_path / "clean.py"
    dirty.write_text("import torch\n\ntorch.cuda.synchronize()\n", encoding="utf-8")
    clean.write_text("import torch\n", encoding="utf-8")
    assert main(["fix", "--check", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == f"would fix {dirty}\n"
    assert captured.err.splitlines()[0] == "npu-port fix: would fix 1 findings in 1 files"
    assert dirty.read_text(encoding="utf-8") == "import torch\n\ntorch.cuda.synchronize()\n"
    assert main(["fix", "--check", str(clean)]) == 0
    assert capsys.readouterr().out == ""
    assert main(["fix", str(clean)]) == 0  # a dry run with nothing to change
    capsys.readouterr()
    assert main(["fix", "--check", "--write", str(dirty)]) == 2
    assert capsys.readouterr().err == "npu-port fix: --check writes nothing; drop --write or --check\n"
    assert main(["fix", "--write", str(dirty)]) == 0
    assert main(["fix", "--check", str(dirty)]) == 0


def test_write_with_the_default_target_leaves_no_npu_port_import_and_a_second_run_changes_nothing(tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(
        "import torch\n\n\ndef train(model, x):\n"
        + "".join(f"    {line}\n" for line in [row[1].splitlines()[-1] for row in ROWS[:14]])
        + '    with torch.cuda.amp.autocast(True):\n        pass\n    torch.distributed.init_process_group("nccl")\n',
        encoding="utf-8",
    )
    assert main(["fix", "--write", str(path)]) == 0
    text = path.read_text(encoding="utf-8")
    compile(text, str(path), "exec")
    assert "npu_port" not in text and "cuda" not in text.replace('"cuda"', "")
    assert main(["fix", "--check", str(path)]) == 0


def test_the_python_api_targets_torch_by_default_and_names_the_targets_for_an_unknown_one(tmp_path):
    from npu_port.scan.engine import ScanError

    path = tmp_path / "m.py"
    path.write_text("import torch\n\ntorch.cuda.synchronize()\n", encoding="utf-8")
    (one,) = fix([str(path)])
    assert "torch.accelerator.synchronize()" in one.new and "npu_port" not in one.new
    with pytest.raises(ScanError) as raised:
        fix([str(path)], target="cuda")
    assert str(raised.value) == "unknown fix target 'cuda'; the targets are torch, npu-port"


def test_the_drop_in_guard_is_made_for_the_npu_port_target_only_and_said_for_torch(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from flash_attn import flash_attn_func\n", encoding="utf-8")
    (torch_fix,) = fix([str(path)], target="torch")
    assert torch_fix.new is None and [(f.code, f.fix) for f in torch_fix.left] == [("NPU101", "manual")]
    assert torch_fix.left[0].message.endswith("(fixed by --target npu-port)")
    (helper_fix,) = fix([str(path)], target="npu-port")
    assert 'install_dropins("flash_attn", broken=True)' in helper_fix.new
