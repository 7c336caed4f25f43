"""``npu-port fix``: a dry run by default, atomic writes keeping permissions, comments and formatting kept, output that
parses, idempotent, and leaving no safe fix undone."""

from __future__ import annotations

import ast
import os
import stat

from hypothesis import given, settings
from hypothesis import strategies as st

from npu_port.cli.main import main
from npu_port.scan.engine import scan
from npu_port.scan.fix import fix

SOURCE = """import torch
import os  # a comment that stays

model = torch.nn.Linear(2, 2).cuda()   # trailing comment
x = torch.zeros(2).cuda(non_blocking=True)
y = x.cuda(0)
s = "café"; z = x.cuda()
"""

FIXED = """import torch
import os  # a comment that stays
import npu_port

model = torch.nn.Linear(2, 2).to(npu_port.get_device().type)   # trailing comment
x = torch.zeros(2).to(npu_port.get_device().type, non_blocking=True)
y = x.cuda(0)
s = "café"; z = x.to(npu_port.get_device().type)
"""


def test_the_default_is_a_dry_run_printing_the_diff(tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(SOURCE, encoding="utf-8")
    assert main(["fix", str(path)]) == 0
    captured = capsys.readouterr()
    assert path.read_text(encoding="utf-8") == SOURCE  # nothing written
    assert "+model = torch.nn.Linear(2, 2).to(npu_port.get_device().type)   # trailing comment" in captured.out
    assert "would fix 3 findings in 1 files" in captured.err
    assert "NPU301 `.cuda(device)` needs a CUDA device" in captured.err and "dry run: nothing written" in captured.err


def test_write_fixes_keeps_formatting_and_permissions_and_a_second_run_changes_nothing(tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(SOURCE, encoding="utf-8")
    os.chmod(path, 0o750)
    assert main(["fix", str(path), "--write"]) == 0
    assert path.read_text(encoding="utf-8") == FIXED
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o750
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]  # no temporary left behind
    before = path.read_bytes()
    assert main(["fix", str(path), "--write"]) == 0
    assert path.read_bytes() == before
    assert "fixed 0 findings in 0 files" in capsys.readouterr().err


def test_an_existing_npu_port_import_is_not_added_twice(tmp_path):
    path = tmp_path / "a.py"
    path.write_text("import npu_port\nimport torch\nx = torch.ones(1).cuda()\n", encoding="utf-8")
    (one,) = fix([str(path)])
    assert one.new == "import npu_port\nimport torch\nx = torch.ones(1).to(npu_port.get_device().type)\n"


def test_select_and_ignore_limit_what_is_fixed(tmp_path):
    path = tmp_path / "a.py"
    path.write_text("import torch\nx = torch.ones(1).cuda()\n", encoding="utf-8")
    assert all(f.new is None for f in fix([str(path)], ignore=["NPU301"]))
    assert fix([str(path)], select=["NPU301"])[0].new is not None


# ---- a property: whatever the mix, the output parses, is a fixed point, and leaves no safe fix undone --------------

STATEMENTS = [
    "torch.cuda.synchronize()",
    "peak = torch.cuda.max_memory_allocated(0)",
    "from torch.cuda import empty_cache\nempty_cache()",
    "t = torch.zeros(2, device='cuda')",
    "u2 = x.to('cuda:1')",
    "dev = torch.device('cuda', 0)",
    "d3 = f'cuda:{x}'",
    "import torch.distributed as dist\ndist.init_process_group(backend='nccl')",
    "dist2 = torch.distributed.new_group(backend='cpu:gloo,cuda:nccl')",
    "ctx = torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False)",
    "ctx2 = torch.backends.cuda.sdp_kernel(enable_flash=flag)",
    "x = torch.zeros(2).cuda()",
    "y = model.cuda()  # move it",
    "z = batch['a'].cuda(non_blocking=True)",
    "w = x.cuda(0)",
    "v = [t.cuda() for t in (x, y)]",
    "u = torch.cuda.is_available()",
    "s = 'naïve'; t = x.cuda()",
    "def f(a):\n    return a.cuda().float()",
    "class M:\n    def g(self, b):\n        return (b + 1).cuda(\n            non_blocking=False,\n        )",
    "# just a comment with .cuda() in it",
    "q = f(x).cuda().cuda()",
    "dist3 = torch.distributed.init_process_group('NCCL')",
    "def init_dist(backend='nccl'):\n    torch.distributed.init_process_group(backend=backend)\ninit_dist(backend='nccl')",
    "from torch.distributed.device_mesh import init_device_mesh\nm = init_device_mesh('cuda', (2,))",
    "class P:\n    def a(self):\n        self.b('cuda')\n    def b(self, t):\n        return init_device_mesh(t, (1,))",
    "DEVICE = 'cuda'\nw2 = x.to(DEVICE)",
    "e2 = pipe.encode(p, execution_device='cuda', device_map='cuda:0')",
    "g2 = x.cuda() if torch.cuda.is_available() else x",
    "if torch.cuda.is_available():\n    torch.cuda.synchronize()\nelse:\n    x = x.to('cuda')",
]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(STATEMENTS), min_size=1, max_size=8), st.booleans())
def test_fix_output_parses_is_idempotent_and_leaves_no_safe_fix(tmp_path_factory, statements, import_npu_port):
    folder = tmp_path_factory.mktemp("fix")
    path = folder / "m.py"
    head = "import npu_port\n" if import_npu_port else ""
    path.write_text(head + "import torch\nmodel = x = y = batch = pipe = p = None\n" + "\n".join(statements) + "\n")
    fix([str(path)], write=True)
    once = path.read_text()
    ast.parse(once)
    assert once.count("import npu_port") <= 1
    fix([str(path)], write=True)
    assert path.read_text() == once
    assert [f for f in scan([str(path)]).findings if f.fix == "safe"] == []


def test_each_safe_fix_writes_what_means_the_same_on_cuda(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "import torch\n"
        "import torch.distributed as dist\n"
        "def run(x, rank):\n"
        "    torch.cuda.synchronize()\n"
        "    y = x.to('cuda:1', non_blocking=True)\n"
        "    z = torch.zeros(1, device='cuda')\n"
        "    dist.init_process_group(backend='nccl')\n"
        "    with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_cudnn=False):\n"
        "        pass\n"
        "    return y, z\n"
    )
    (one,) = fix([str(path)])
    assert one.new.splitlines() == [
        "import torch",
        "import torch.distributed as dist",
        "import npu_port",
        "import torch.nn.attention",
        "",
        "def run(x, rank):",
        "    npu_port.device.synchronize()",
        "    y = x.to(f'{npu_port.get_device().type}:1', non_blocking=True)",
        "    z = torch.zeros(1, device=npu_port.get_device().type)",
        "    dist.init_process_group(backend=npu_port.distributed.default_backend())",
        "    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH, "
        "torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION]):",
        "        pass",
        "    return y, z",
    ]


def test_ctrl_c_during_fix_write_leaves_each_file_fixed_or_as_it_was(tmp_path, monkeypatch, capsys):
    from npu_port.scan import fix as fix_module

    first, second = tmp_path / "a.py", tmp_path / "b.py"
    for path in (first, second):
        path.write_text("import torch\ndef f(x):\n    return x.cuda()\n")
    real = fix_module._replace
    calls = []

    def replace_then_interrupt(path, text):
        if calls:
            raise KeyboardInterrupt
        calls.append(path)
        real(path, text)

    monkeypatch.setattr(fix_module, "_replace", replace_then_interrupt)
    assert main(["fix", str(tmp_path), "--write"]) == 130
    assert "interrupted; files already fixed stay fixed, the others are unchanged" in capsys.readouterr().err
    texts = sorted(p.read_text() for p in (first, second))
    assert texts == sorted(["import torch\ndef f(x):\n    return x.cuda()\n", FIXED_SMALL])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py", "b.py"]


FIXED_SMALL = "import torch\nimport npu_port\n\ndef f(x):\n    return x.to(npu_port.get_device().type)\n"


def test_a_symlinked_source_is_fixed_where_it_points_and_the_link_stays(tmp_path):
    shared = tmp_path / "shared.py"
    shared.write_text("import torch\ndef f(x):\n    return x.cuda()\n")
    (tmp_path / "project").mkdir()
    link = tmp_path / "project" / "lib.py"
    link.symlink_to(shared)
    fix([str(tmp_path / "project")], write=True)
    assert link.is_symlink() and shared.read_text() == FIXED_SMALL


def test_fix_cases_that_are_not_safe_stay_manual_and_one_bad_file_does_not_stop_the_others(tmp_path, capsys):
    (tmp_path / "a.py").write_text("import torch\ndef f(x):\n    return x.cuda()\n")
    (tmp_path / "b.py").write_text(
        "import torch\n"
        "def g(x):\n"
        "    s = x.untyped_storage().cuda()\n"  # a storage: its .to() takes no device
        "    return f\"{x.to('cuda:0')}\"\n"  # inside an f-string: the original quote keeps it valid
    )
    assert main(["fix", str(tmp_path), "--write"]) == 0
    assert (tmp_path / "a.py").read_text() == FIXED_SMALL
    fixed_b = (tmp_path / "b.py").read_text()
    assert "x.untyped_storage().cuda()" in fixed_b
    assert "f\"{x.to(f'{npu_port.get_device().type}:0')}\"" in fixed_b
    ast.parse(fixed_b)
    assert "storage.cuda()` needs a CUDA device" in capsys.readouterr().err


def test_the_fixes_of_values_passed_through_the_files_own_functions(tmp_path):
    """A literal passed to the file's own function is rewritten where it is passed (evaluated at the call); a
    parameter default, evaluated at import, and a guarded or accelerate-default value are left."""
    path = tmp_path / "m.py"
    path.write_text(
        "import torch\n"
        "import torch.distributed as dist\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "DEVICE = 'cuda'\n"
        "def init_dist(backend='nccl'):\n"
        "    dist.init_process_group(backend=backend)\n"
        "class Dims:\n"
        "    def setup(self):\n"
        "        self.mesh('cuda')\n"
        "    def mesh(self, kind='cuda'):\n"
        "        return init_device_mesh(kind, (2,))\n"
        "def main(x, pipe):\n"
        "    init_dist(backend='NCCL')\n"
        "    pipe.encode(x.to(DEVICE), execution_device='cuda:1')\n"
        "    return 'cuda' if torch.cuda.is_available() else 'cpu'\n"
    )
    (one,) = fix([str(path)])
    assert one.new.splitlines() == [
        "import torch",
        "import torch.distributed as dist",
        "from torch.distributed.device_mesh import init_device_mesh",
        "import npu_port",
        "",
        "DEVICE = npu_port.get_device().type",
        "def init_dist(backend='nccl'):",
        "    dist.init_process_group(backend=backend)",
        "class Dims:",
        "    def setup(self):",
        "        self.mesh(npu_port.get_device().type)",
        "    def mesh(self, kind='cuda'):",
        "        return init_device_mesh(kind, (2,))",
        "def main(x, pipe):",
        "    init_dist(backend=npu_port.distributed.default_backend())",
        "    pipe.encode(x.to(DEVICE), execution_device=f'{npu_port.get_device().type}:1')",
        "    return 'cuda' if torch.cuda.is_available() else 'cpu'",
    ]
    assert sorted((f.code, f.line) for f in one.left if f.code in ("NPU311", "NPU312")) == [
        ("NPU311", 5),
        ("NPU312", 10),
    ]
    fix([str(path)], write=True)
    assert fix([str(path)])[0].new is None  # a fixed point
