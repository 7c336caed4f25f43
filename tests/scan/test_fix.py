"""``npu-port fix``: a dry run by default, atomic writes keeping permissions, comments and formatting kept, output that
parses, idempotent, and leaving no safe fix undone. These tests read the rewrites of the ``npu-port`` target (``fix``
below pins it); what the default ``torch`` target writes, and that it behaves as the original on CUDA, is
test_fix_targets.py's."""

from __future__ import annotations

import ast
import os
import stat
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_port.cli.main import main
from npu_port.scan.engine import scan
from npu_port.scan.fix import _left
from npu_port.scan.fix import fix as fix_any_target
from npu_port.scan.rule import Finding, Rule, rules
from npu_port.scan.targets import TARGETS


def fix(paths, **options):
    """``npu_port.scan.fix.fix`` for the ``npu-port`` target unless another is asked for."""
    return fix_any_target(paths, **{"target": "npu-port", **options})


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
    assert (
        main(["fix", "--target", "npu-port", str(path)]) == 1
    )  # a dry run with changes pending exits 1, as ruff --diff
    captured = capsys.readouterr()
    assert path.read_text(encoding="utf-8") == SOURCE  # nothing written
    assert "+model = torch.nn.Linear(2, 2).to(npu_port.get_device().type)   # trailing comment" in captured.out
    assert "would fix 3 findings in 1 files" in captured.err
    assert "NPU301 `.cuda(device)` needs a CUDA device" in captured.err and "dry run: nothing written" in captured.err


def test_write_fixes_keeps_formatting_and_permissions_and_a_second_run_changes_nothing(tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(SOURCE, encoding="utf-8")
    os.chmod(path, 0o750)
    assert main(["fix", "--target", "npu-port", str(path), "--write"]) == 0
    assert path.read_text(encoding="utf-8") == FIXED
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o750
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]  # no temporary left behind
    before = path.read_bytes()
    assert main(["fix", "--target", "npu-port", str(path), "--write"]) == 0
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
    "sd = torch.load(p, map_location={'cuda:0': 'cuda:1'})",
    "lm = M.from_pretrained(p, device_map={'': 'cuda'})",
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
    "import flash_attn",
    "from flash_attn import flash_attn_func  # the fast kernel",
    "import xformers.ops as xops",
    "from xformers.ops import memory_efficient_attention, LowerTriangularMask",
    "# padding helpers\nfrom flash_attn.bert_padding import (\n    pad_input,  # re-pad\n    unpad_input,\n)",
    "import os; import flash_attn.flash_attn_interface as fai; import sys",
    "def h():\n    from flash_attn import flash_attn_varlen_func\n    return flash_attn_varlen_func",
    "def k(): import xformers; return xformers",
    "from xformers.ops import fmha, SwiGLU",  # also what no drop-in has: left to the user
    "xf = importlib.import_module('xformers.ops')",  # dynamic: left to the user
    "",  # a blank line: the imports on either side get a try each
    "dist3 = torch.distributed.init_process_group('NCCL')",
    "dist4 = torch.distributed.init_process_group('nccl' if x else 'gloo')",
    "def init_dist(backend='nccl'):\n    torch.distributed.init_process_group(backend=backend)\ninit_dist(backend='nccl')",
    "from torch.distributed.device_mesh import init_device_mesh\nm = init_device_mesh('cuda', (2,))",
    "class P:\n    def a(self):\n        self.b('cuda')\n    def b(self, t):\n        return init_device_mesh(t, (1,))",
    "DEVICE = 'cuda'\nw2 = x.to(DEVICE)",
    "e2 = pipe.encode(p, execution_device='cuda', device_map='cuda:0')",
    "g2 = x.cuda() if torch.cuda.is_available() else x",
    "if torch.cuda.is_available():\n    torch.cuda.synchronize()\nelse:\n    x = x.to('cuda')",
    "with torch.cuda.amp.autocast(enabled=True):\n    y = model(x)",
    "from torch.cuda.amp import autocast as ac, GradScaler\nwith ac(dtype=torch.bfloat16):\n    sc = GradScaler()",
    "@torch.autocast(device_type='cuda', dtype=torch.float16)\ndef fwd(a):\n    return a",
    "sc2 = torch.amp.GradScaler('cuda', init_scale=1024)",
    "g = torch.Generator('cuda').manual_seed(0)",
    "g2 = torch.Generator(device='cuda:1')",
    "with torch.autocast('cuda' if x else 'cpu'):\n    pass",  # the project's choice of device: left to the user
    "if torch.cuda.is_available():\n    sc3 = torch.cuda.amp.GradScaler()",
]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(STATEMENTS), min_size=1, max_size=8), st.booleans(), st.sampled_from(TARGETS))
def test_fix_output_parses_is_idempotent_and_leaves_no_safe_fix(tmp_path_factory, statements, import_npu_port, target):
    folder = tmp_path_factory.mktemp("fix")
    path = folder / "m.py"
    head = "import npu_port\n" if import_npu_port else ""
    path.write_text(
        head + "import importlib, torch\nmodel = x = y = batch = pipe = p = None\n" + "\n".join(statements) + "\n"
    )
    fix([str(path)], write=True, target=target)
    once = path.read_text()
    ast.parse(once)
    assert once.count("import npu_port") <= (1 if target == "npu-port" or import_npu_port else 0)
    fix([str(path)], write=True, target=target)
    assert path.read_text() == once
    by_code = {r.code: r for r in rules()}
    made_for_target = [f for f in scan([str(path)]).findings if target in (by_code[f.code].fix_targets or (target,))]
    assert [f for f in made_for_target if f.fix == "safe"] == []  # the drop-in guard is the npu-port target's


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
    assert main(["fix", "--target", "npu-port", str(tmp_path), "--write"]) == 130
    assert "interrupted; files already fixed stay fixed, the others are unchanged" in capsys.readouterr().err
    texts = sorted(p.read_text() for p in (first, second))
    assert texts == sorted(["import torch\ndef f(x):\n    return x.cuda()\n", FIXED_SMALL])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py", "b.py"]


FIXED_SMALL = "import torch\nimport npu_port\n\ndef f(x):\n    return x.to(npu_port.get_device().type)\n"


def test_a_symlinked_source_is_fixed_where_it_points_and_the_link_stays(tmp_path):
    (tmp_path / "project" / "src").mkdir(parents=True)
    shared = tmp_path / "project" / "src" / "shared.py"
    shared.write_text("import torch\ndef f(x):\n    return x.cuda()\n")
    link = tmp_path / "project" / "lib.py"
    link.symlink_to(shared)
    fix([str(tmp_path / "project")], write=True)
    assert link.is_symlink() and shared.read_text() == FIXED_SMALL


def test_a_link_out_of_the_paths_given_and_a_read_only_file_are_not_written(tmp_path, capsys):
    """``--write`` replaces files by rename, which needs only the folder to be writable: it would replace someone
    else's file through a link, and a file made read-only on purpose, without asking."""
    source = "import torch\ndef f(x):\n    return x.cuda()\n"
    outside = tmp_path / "elsewhere.py"
    outside.write_text(source)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "lib.py").symlink_to(outside)
    frozen = tmp_path / "project" / "frozen.py"
    frozen.write_text(source)
    frozen.chmod(0o444)
    normal = tmp_path / "project" / "normal.py"
    normal.write_text(source)
    assert main(["fix", "--target", "npu-port", str(tmp_path / "project"), "--write"]) == 1
    assert outside.read_text() == source and frozen.read_text() == source and normal.read_text() == FIXED_SMALL
    err = capsys.readouterr().err
    assert f"{tmp_path / 'project' / 'lib.py'}: not written: it links to {outside}, outside the paths given" in err
    assert f"{frozen}: not written: the file is read-only (no one may write it)" in err


def test_fix_cases_that_are_not_safe_stay_manual_and_one_bad_file_does_not_stop_the_others(tmp_path, capsys):
    (tmp_path / "a.py").write_text("import torch\ndef f(x):\n    return x.cuda()\n")
    (tmp_path / "b.py").write_text(
        "import torch\n"
        "def g(x):\n"
        "    s = x.untyped_storage().cuda()\n"  # a storage: its .to() takes no device
        "    return f\"{x.to('cuda:0')}\"\n"  # inside an f-string: the original quote keeps it valid
    )
    assert main(["fix", "--target", "npu-port", str(tmp_path), "--write"]) == 0
    assert (tmp_path / "a.py").read_text() == FIXED_SMALL
    fixed_b = (tmp_path / "b.py").read_text()
    assert "x.untyped_storage().cuda()" in fixed_b
    assert "f\"{x.to(f'{npu_port.get_device().type}:0')}\"" in fixed_b
    ast.parse(fixed_b)
    assert "storage.cuda()` raises without CUDA and npu-port run does not redirect it" in capsys.readouterr().err


# ---- NPU101 / NPU102: the import in try, npu-port's drop-in as the fallback -----------------------------------------

FLASH = "# no working flash-attn build here: npu-port's drop-in serves it (npu_port.attention)"
XFORMERS = "# no working xformers build here: npu-port's drop-in serves it (npu_port.attention)"


def guarded(imports, dropin="flash_attn", comment=FLASH, indent=""):
    """What the fix writes for ``imports`` (lines), as the brief and the README show it."""
    lines = ["try:", *(f"    {i}" for i in imports), f"except ImportError:  {comment}"]
    lines += ["    from npu_port.dropins import install_dropins", "", f'    install_dropins("{dropin}", broken=True)']
    lines += [f"    {i}" for i in imports]
    return "".join(f"{indent}{line}\n" if line else "\n" for line in lines)


def fixed(tmp_path, text, name="m.py"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    (one,) = fix([str(path)])
    return one


@pytest.mark.parametrize(
    "statement, dropin, comment",
    [
        ("import flash_attn", "flash_attn", FLASH),
        ("import flash_attn.flash_attn_interface as fai", "flash_attn", FLASH),
        ("from flash_attn import flash_attn_func", "flash_attn", FLASH),
        ("from flash_attn import flash_attn_func as faf, flash_attn_varlen_func", "flash_attn", FLASH),
        ("from flash_attn import bert_padding", "flash_attn", FLASH),
        ("from flash_attn.bert_padding import pad_input, unpad_input", "flash_attn", FLASH),
        ("from flash_attn.flash_attn_interface import flash_attn_varlen_qkvpacked_func", "flash_attn", FLASH),
        ("import xformers", "xformers", XFORMERS),
        ("import xformers.ops as xops", "xformers", XFORMERS),
        ("import xformers.ops", "xformers", XFORMERS),
        ("from xformers.ops import memory_efficient_attention, LowerTriangularMask", "xformers", XFORMERS),
        ("from xformers.ops.fmha.attn_bias import BlockDiagonalMask", "xformers", XFORMERS),
        ("from xformers.ops.fmha import attn_bias", "xformers", XFORMERS),
        ("from xformers import ops as xops", "xformers", XFORMERS),
    ],
)
def test_each_alias_form_is_guarded_with_its_drop_in(tmp_path, statement, dropin, comment):
    one = fixed(tmp_path, f"import torch\n{statement}\n\nx = 1\n")
    assert one.new == "import torch\n" + guarded([statement], dropin, comment) + "\nx = 1\n"
    assert [f.code for f in one.fixed] == ["NPU101" if dropin == "flash_attn" else "NPU102"] and one.left == []


def test_the_brief_example_exactly(tmp_path):
    one = fixed(tmp_path, "from flash_attn import flash_attn_func\n")
    assert one.new == (
        "try:\n"
        "    from flash_attn import flash_attn_func\n"
        "except ImportError:  # no working flash-attn build here: npu-port's drop-in serves it (npu_port.attention)\n"
        "    from npu_port.dropins import install_dropins\n"
        "\n"
        '    install_dropins("flash_attn", broken=True)\n'
        "    from flash_attn import flash_attn_func\n"
    )


def test_imports_in_functions_classes_and_one_line_suites_are_guarded_where_they_are(tmp_path):
    one = fixed(
        tmp_path,
        "def attend(q):\n"
        "    from flash_attn import flash_attn_func  # lazy\n"
        "    return flash_attn_func(q, q, q)\n"
        "class Block:\n"
        "    def ops(self): import xformers.ops as xops; return xops\n"
        "try:\n"
        "    pass\n"
        "except ValueError:\n"
        "    import flash_attn\n",
    )
    assert one.new == (
        "def attend(q):\n"
        + guarded(["from flash_attn import flash_attn_func  # lazy"], indent="    ")
        + "    return flash_attn_func(q, q, q)\n"
        "class Block:\n"
        "    def ops(self):\n" + guarded(["import xformers.ops as xops"], "xformers", XFORMERS, indent="        ") + ""
        "        return xops\n"
        "try:\n"
        "    pass\n"
        "except ValueError:\n" + guarded(["import flash_attn"], indent="    ")
    )


def test_comments_stay_adjacent_imports_share_a_try_and_a_blank_line_keeps_them_apart(tmp_path):
    one = fixed(
        tmp_path,
        "import os\n"
        "\n"
        "# attention kernels\n"
        "from flash_attn import flash_attn_func  # noqa: F401\n"
        "# padding\n"
        "from flash_attn.bert_padding import (\n"
        "    pad_input,  # re-pad\n"
        "    unpad_input,\n"
        ")\n"
        "import xformers.ops as xops\n"
        "\n"
        "import flash_attn\n",
    )
    assert one.new == (
        "import os\n"
        "\n"
        "# attention kernels\n"
        "try:\n"
        "    from flash_attn import flash_attn_func  # noqa: F401\n"
        "    # padding\n"
        "    from flash_attn.bert_padding import (\n"
        "        pad_input,  # re-pad\n"
        "        unpad_input,\n"
        "    )\n"
        "    import xformers.ops as xops\n"
        "except ImportError:  # no working flash-attn / xformers build here: npu-port's drop-ins serve them "
        "(npu_port.attention)\n"
        "    from npu_port.dropins import install_dropins\n"
        "\n"
        '    install_dropins("flash_attn", "xformers", broken=True)\n'
        "    from flash_attn import flash_attn_func  # noqa: F401\n"
        "    from flash_attn.bert_padding import (\n"
        "        pad_input,  # re-pad\n"
        "        unpad_input,\n"
        "    )\n"
        "    import xformers.ops as xops\n"
        "\n" + guarded(["import flash_attn"])
    )
    assert len(one.fixed) == 4


def test_a_shared_line_is_split_and_its_trailing_comment_stays_with_its_last_statement(tmp_path):
    one = fixed(tmp_path, "import os; import flash_attn; import sys  # kernels\nimport os; import xformers  # ops\n")
    assert one.new == (
        "import os\n"
        + guarded(["import flash_attn"])
        + "import sys  # kernels\n"
        + "import os\n"
        + guarded(["import xformers  # ops"], "xformers", XFORMERS)
    )


def test_a_crlf_file_with_tabs_keeps_its_newlines_and_indentation(tmp_path):
    one = fixed(tmp_path, "import torch\r\ndef f():\r\n\timport flash_attn  # here\r\n\treturn flash_attn\r\n")
    assert one.new == (
        "import torch\r\ndef f():\r\n"
        + guarded(["import flash_attn  # here"], indent="\t").replace("    ", "\t").replace("\n", "\r\n")
        + "\treturn flash_attn\r\n"
    )
    assert one.new.count("\n") == one.new.count("\r\n")


def test_what_cannot_be_guarded_safely_is_left_and_listed_as_manual(tmp_path):
    source = (
        "import importlib\n"
        "from xformers.ops import fmha, SwiGLU\n"  # SwiGLU: no drop-in has it; a try would only hide that
        "fa = importlib.import_module('flash_attn')\n"  # a dynamic import
        "import flash_attn, xformers\n"  # two drop-ins in one statement
        "import flash_attn, os\n"  # and something else
    )
    path = tmp_path / "m.py"
    path.write_text(source)
    found = {(f.line, f.code): f.fix for f in scan([str(path)]).findings}
    assert found == {
        (2, "NPU102"): "manual",
        (2, "NPU104"): "manual",
        (3, "NPU101"): "manual",
        (4, "NPU101"): "manual",
        (4, "NPU102"): "manual",
        (5, "NPU101"): "manual",
    }
    assert all(f.new is None for f in fix([str(path)]))


def test_a_second_fix_changes_nothing_and_the_scan_sees_guarded_imports_only(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "import flash_attn\nimport xformers.ops as xops\n\ndef f():\n    from flash_attn import flash_attn_func\n"
    )
    fix([str(path)], write=True)
    once = path.read_text()
    assert fix([str(path)])[0].new is None
    found = scan([str(path)]).findings  # the imports in the try (info); those after install_dropins() are served
    assert [(f.line, f.code) for f in found] == [(2, "NPU106"), (3, "NPU106"), (13, "NPU106")], once
    assert all("imported inside try/except" in f.message for f in found)


# ---- the fixed file, run: the drop-in where the package is missing or broken, the real one where it works ---------

MODEL = """\
import torch
from flash_attn import flash_attn_func
import xformers.ops as xops


def attend(q, k, v):
    return flash_attn_func(q, k, v, causal=True), xops.memory_efficient_attention(q, k, v, xops.LowerTriangularMask())
"""

CHECK = """\
import sys
import torch
import npu_port

import model

q, k, v = (torch.randn(2, 6, 3, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
flash, xformers_out = model.attend(q, k, v)
expected = npu_port.attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2)
torch.testing.assert_close(flash, expected)
torch.testing.assert_close(xformers_out, expected)
print(sys.modules["flash_attn"].__npu_port_stand_in__, sys.modules["xformers.ops"].__npu_port_stand_in__)
"""


def _python(folder, code, *path):
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, [folder, *path])))
    return subprocess.run(
        [sys.executable, "-c", code], cwd=folder, env=environment, capture_output=True, text=True, timeout=240
    )


@pytest.mark.e2e
def test_the_fixed_file_imports_and_computes_what_npu_port_attention_does_without_flash_attn_or_xformers(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    before = _python(tmp_path, "import model")
    assert "ModuleNotFoundError: No module named 'flash_attn'" in before.stderr  # this venv has neither package
    fix([str(tmp_path / "model.py")], write=True)
    result = _python(tmp_path, CHECK)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["npu_port.dropins.flash_attn_impl", "npu_port.dropins.xformers_ops_impl"]


FLASH_MODEL = "from flash_attn import flash_attn_func\n"


@pytest.mark.e2e
def test_where_the_real_package_imports_it_wins_and_npu_port_is_not_even_imported(tmp_path):
    (tmp_path / "site" / "flash_attn").mkdir(parents=True)
    (tmp_path / "site" / "flash_attn" / "__init__.py").write_text("def flash_attn_func(*args):\n    return 'real'\n")
    (tmp_path / "model.py").write_text(FLASH_MODEL)
    fix([str(tmp_path / "model.py")], write=True)
    code = "import sys, model\nprint(model.flash_attn_func(), 'npu_port' in sys.modules)"
    result = _python(tmp_path, code, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["real", "False"]


@pytest.mark.e2e
def test_a_real_package_that_fails_to_load_is_replaced_and_its_error_said(tmp_path):
    """The ``except`` installs the drop-in in mode "broken": mode "missing" would find the real package again and
    re-raise, so the fix would not fix a wheel built for another torch or CUDA."""
    (tmp_path / "site" / "flash_attn").mkdir(parents=True)
    (tmp_path / "site" / "flash_attn" / "__init__.py").write_text(
        "raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi')\n"
    )
    (tmp_path / "model.py").write_text(FLASH_MODEL)
    fix([str(tmp_path / "model.py")], write=True)
    code = "import sys, model\nprint(sys.modules['flash_attn'].__npu_port_stand_in__)"
    result = _python(tmp_path, code, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["npu_port.dropins.flash_attn_impl"]
    assert (
        "npu-port: flash_attn failed to load (ImportError: flash_attn_2_cuda.so: undefined symbol: "
        "_ZN3c104cuda9SetDeviceEi); using npu-port's fallback" in result.stderr
    )


@pytest.mark.e2e
def test_a_real_package_that_loads_but_lacks_the_name_still_raises(tmp_path):
    """flash-attn 1.x loads but has no ``flash_attn_func``: the real module stays, and the ImportError is not
    swallowed by the fallback."""
    (tmp_path / "site" / "flash_attn").mkdir(parents=True)
    (tmp_path / "site" / "flash_attn" / "__init__.py").write_text("def flash_attn_unpadded_func(*args):\n    pass\n")
    (tmp_path / "model.py").write_text(FLASH_MODEL)
    fix([str(tmp_path / "model.py")], write=True)
    result = _python(tmp_path, "import model", tmp_path / "site")
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and last.startswith(
        "ImportError: cannot import name 'flash_attn_func' from 'flash_attn'"
    )


def test_what_fix_leaves_is_told_apart_manual_changes_from_what_npu_port_handles(tmp_path, capsys):
    """A finding with no automatic fix is a manual change only when it breaks or slows something; a ``handled``
    one needs nothing under npu-port run (its mechanism is named); an ``info`` one is not listed."""
    path = tmp_path / "m.py"
    path.write_text(
        "import torch\ntry:\n    import xformers\nexcept ImportError:\n    xformers = None\n\n\n"
        "def f():\n    torch.cuda.set_device(0)\n    return torch.cuda.cudart()\n",
        encoding="utf-8",
    )
    assert main(["fix", "--target", "npu-port", str(path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "npu-port fix: would fix 0 findings in 0 files"
    assert err[1] == "1 need a manual change:" and err[2].startswith(f"  {path}:10:12 NPU305 ")
    assert err[3] == "1 with no automatic fix are handled by npu-port as they are:"
    assert err[4].startswith(f"  {path}:9:5 NPU313 ") and err[4].endswith("[npu-port run (the CUDA redirect)]")
    assert len(err) == 5  # the guarded xformers import (NPU106, info) is not a change to make


def test_fix_writes_a_file_back_in_its_own_encoding_bom_included(tmp_path):
    """A UTF-8 file with a byte-order mark keeps it; a file that declares latin-1 is fixed and stays latin-1."""
    body = "import torch\n\n\ndef f(x):\n    return x.cuda()\n"
    bom = tmp_path / "bom.py"
    bom.write_bytes(b"\xef\xbb\xbf" + body.encode())
    latin = tmp_path / "latin.py"
    latin.write_bytes(("# -*- coding: latin-1 -*-\n# caf\xe9\n" + body).encode("latin-1"))
    assert main(["fix", "--target", "npu-port", str(tmp_path), "--write"]) == 0
    fixed = "import torch\nimport npu_port\n\n\ndef f(x):\n    return x.to(npu_port.get_device().type)\n"
    assert bom.read_bytes() == b"\xef\xbb\xbf" + fixed.encode()
    assert latin.read_bytes() == ("# -*- coding: latin-1 -*-\n# caf\xe9\n" + fixed).encode("latin-1")
    assert [f for f in fix([str(tmp_path)]) if f.new is not None] == []  # and a second run changes nothing


def test_a_from_import_the_rewrites_leave_unused_is_removed_and_one_still_used_is_kept(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "import torch\n"
        "from torch.backends.cuda import sdp_kernel as sk, SDPBackend\n"
        "from torch.cuda import synchronize, empty_cache  # the memory helpers\n"
        "\n\ndef f(q, k, v):\n"
        "    synchronize()\n"
        "    with sk(enable_math=True, enable_flash=False, enable_mem_efficient=False):\n"
        "        return q, SDPBackend, empty_cache\n",
        encoding="utf-8",
    )
    (one,) = fix([str(path)])
    assert one.new == (
        "import torch\n"
        "from torch.backends.cuda import SDPBackend\n"
        "from torch.cuda import empty_cache  # the memory helpers\n"
        "import npu_port\n"
        "import torch.nn.attention\n"
        "\n\ndef f(q, k, v):\n"
        "    npu_port.device.synchronize()\n"
        "    with torch.nn.attention.sdpa_kernel("
        "[torch.nn.attention.SDPBackend.MATH, torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):\n"
        "        return q, SDPBackend, empty_cache\n"
    )


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


# ---- NPU307 / NPU308 / NPU309: autocast, GradScaler and Generator for the detected device ----------------------------

#: Each form as the project writes it -> what ``npu-port fix`` writes (the file starts ``import torch``).
AMP_FORMS = [
    ("with torch.cuda.amp.autocast():", "with npu_port.device.autocast(dtype=torch.float16, cache_enabled=True):"),
    (
        "with torch.cuda.amp.autocast(True, torch.bfloat16, False):",
        "with npu_port.device.autocast(enabled=True, dtype=torch.bfloat16, cache_enabled=False):",
    ),
    (
        "with torch.cuda.amp.autocast(enabled=False):",
        "with npu_port.device.autocast(enabled=False, dtype=torch.float16, cache_enabled=True):",
    ),
    (
        "with torch.cuda.amp.autocast(dtype=torch.bfloat16, cache_enabled=False):",
        "with npu_port.device.autocast(dtype=torch.bfloat16, cache_enabled=False):",
    ),
    ("@torch.cuda.amp.autocast()", "@npu_port.device.autocast(dtype=torch.float16, cache_enabled=True)"),
    ("with torch.autocast('cuda'):", "with npu_port.device.autocast():"),
    ("with torch.autocast('cuda', torch.bfloat16):", "with npu_port.device.autocast(torch.bfloat16):"),
    (
        "with torch.autocast(device_type='cuda', dtype=torch.float16, enabled=use_amp):",
        "with npu_port.device.autocast(dtype=torch.float16, enabled=use_amp):",
    ),
    (
        "with torch.autocast(dtype=torch.float16, device_type='cuda'):",
        "with npu_port.device.autocast(dtype=torch.float16):",
    ),
    ("with torch.amp.autocast('cuda', enabled=False):", "with npu_port.device.autocast(enabled=False):"),
    ("@torch.autocast(device_type='cuda', enabled=False)", "@npu_port.device.autocast(enabled=False)"),
    ("with torch.autocast('cuda', **amp_options):", "with npu_port.device.autocast(**amp_options):"),
    ("scaler = torch.cuda.amp.GradScaler()", "scaler = npu_port.device.grad_scaler()"),
    (
        "scaler = torch.cuda.amp.GradScaler(2.0**10, 2.0, 0.5, 100, use_amp)",
        "scaler = npu_port.device.grad_scaler(2.0**10, 2.0, 0.5, 100, use_amp)",
    ),
    ("scaler = torch.cuda.amp.GradScaler(**amp_options)", "scaler = npu_port.device.grad_scaler(**amp_options)"),
    ("scaler = torch.amp.GradScaler('cuda')", "scaler = npu_port.device.grad_scaler()"),
    ("scaler = torch.amp.GradScaler()", "scaler = npu_port.device.grad_scaler()"),
    (
        "scaler = torch.amp.GradScaler('cuda', 1024.0, enabled=use_amp)",
        "scaler = npu_port.device.grad_scaler(1024.0, enabled=use_amp)",
    ),
    (
        "scaler = torch.amp.GradScaler(init_scale=8.0, device='cuda')",
        "scaler = npu_port.device.grad_scaler(init_scale=8.0)",
    ),
    (
        "scaler = torch.GradScaler(device='cuda', growth_interval=10)",
        "scaler = npu_port.device.grad_scaler(growth_interval=10)",
    ),
    ("g = torch.Generator('cuda').manual_seed(0)", "g = torch.Generator(npu_port.get_device().type).manual_seed(0)"),
    ("g = torch.Generator(device='cuda')", "g = torch.Generator(device=npu_port.get_device().type)"),
    ("g = torch.Generator(device='cuda:1')", "g = torch.Generator(device=f'{npu_port.get_device().type}:1')"),
    (  # the "cuda" is a torch.device argument: NPU310's, fixed the same way
        "g = torch.Generator(device=torch.device('cuda'))",
        "g = torch.Generator(device=torch.device(npu_port.get_device().type))",
    ),
]


@pytest.mark.parametrize("before, after", AMP_FORMS, ids=[before for before, _ in AMP_FORMS])
def test_each_amp_and_generator_form_is_fixed_exactly(tmp_path, before, after):
    """In a function: at module level the Generator would also be NPU320's (it runs at import)."""
    body = "        pass\n" if before.startswith("with") else "    def f():\n        pass\n" if before[0] == "@" else ""
    head = "import torch\ndef run(use_amp, amp_options):\n"
    one = fixed(tmp_path, f"{head}    {before}\n{body}")
    assert one.new == f"import torch\nimport npu_port\n\n{head[13:]}    {after}\n{body}"
    assert [f.fix for f in one.fixed] == ["safe"] and one.left == []
    path = tmp_path / "m.py"
    path.write_text(one.new)
    assert scan([str(path)]).findings == [] and all(f.new is None for f in fix([str(path)]))  # a fixed point


def test_every_alias_of_the_cuda_amp_classes_is_fixed_and_the_imports_left_unused_go(tmp_path):
    one = fixed(
        tmp_path,
        "import torch\n"
        "import torch.cuda.amp as amp\n"
        "from torch.cuda.amp import autocast, GradScaler  # mixed precision\n"
        "from torch import autocast as torch_autocast\n"
        "my_autocast = torch.cuda.amp.autocast\n"
        "def train(model, x):\n"
        "    scaler = GradScaler(enabled=True)\n"
        "    with autocast(dtype=torch.float16):\n"
        "        with amp.autocast(enabled=False):\n"
        "            with my_autocast():\n"
        "                with torch_autocast('cuda', enabled=True):\n"
        "                    return scaler, amp.GradScaler()\n",
    )
    assert one.new == (
        "import torch\n"
        "import torch.cuda.amp as amp\n"
        "import npu_port\n"
        "\n"
        "my_autocast = torch.cuda.amp.autocast\n"
        "def train(model, x):\n"
        "    scaler = npu_port.device.grad_scaler(enabled=True)\n"
        "    with npu_port.device.autocast(dtype=torch.float16, cache_enabled=True):\n"
        "        with npu_port.device.autocast(enabled=False, dtype=torch.float16, cache_enabled=True):\n"
        "            with npu_port.device.autocast(dtype=torch.float16, cache_enabled=True):\n"
        "                with npu_port.device.autocast(enabled=True):\n"
        "                    return scaler, npu_port.device.grad_scaler()\n"
    )


def test_the_dtype_written_out_brings_import_torch_where_the_file_had_only_a_from_import(tmp_path):
    one = fixed(
        tmp_path, "from torch.cuda.amp import autocast\n\n\ndef f(m, x):\n    with autocast():\n        return m(x)\n"
    )
    assert one.new == (
        "import npu_port\nimport torch\n\n\n"
        "def f(m, x):\n    with npu_port.device.autocast(dtype=torch.float16, cache_enabled=True):\n        return m(x)\n"
    )


def test_a_call_over_several_lines_keeps_its_layout_and_trailing_comma(tmp_path):
    one = fixed(
        tmp_path,
        "import torch\n"
        "with torch.cuda.amp.autocast(\n"
        "    enabled=True,  # on\n"
        "):\n"
        "    pass\n"
        "scaler = torch.amp.GradScaler(\n"
        "    init_scale=8.0,\n"
        "    device='cuda',\n"
        ")\n",
    )
    assert one.new == (
        "import torch\n"
        "import npu_port\n"
        "\n"
        "with npu_port.device.autocast(\n"
        "    enabled=True, dtype=torch.float16, cache_enabled=True,  # on\n"
        "):\n"
        "    pass\n"
        "scaler = npu_port.device.grad_scaler(\n"
        "    init_scale=8.0,\n"
        ")\n"
    )


def test_amp_forms_that_cannot_be_fixed_safely_stay_manual_and_cuda_guarded_ones_are_fixed_as_guarded(tmp_path):
    source = (
        "import torch\n"
        "def run(model, x, args, options, rank, use_cuda):\n"
        "    with torch.autocast('cuda' if use_cuda else 'cpu'):\n"  # the project's choice of device
        "        pass\n"
        "    with torch.autocast('cuda:0'):\n"  # not a device type: torch raises; the fix would hide it
        "        pass\n"
        "    with torch.cuda.amp.autocast(*args):\n"
        "        pass\n"
        "    with torch.cuda.amp.autocast(**options):\n"  # is a dtype in there? its default must be written or not
        "        pass\n"
        "    scaler = torch.amp.GradScaler(*args)\n"  # the device may be args[0]
        "    gen = torch.Generator(f'cuda:{rank}')\n"
        "    if torch.cuda.is_available():\n"
        "        with torch.cuda.amp.autocast():\n"
        "            scaler = torch.cuda.amp.GradScaler()\n"
        "            gen = torch.Generator('cuda')\n"
        "    return scaler, gen\n"
        "@torch.jit.script\n"
        "def scripted(x: torch.Tensor) -> torch.Tensor:\n"
        "    with torch.cuda.amp.autocast():\n"  # TorchScript calls no Python helper
        "        return x * 2\n"
    )
    one = fixed(tmp_path, source)
    left = sorted((f.line, f.code, f.fix) for f in one.left if f.code in ("NPU307", "NPU308", "NPU309"))
    assert left == [
        (3, "NPU307", "manual"),
        (5, "NPU307", "manual"),
        (7, "NPU307", "manual"),
        (9, "NPU307", "manual"),
        (11, "NPU308", "manual"),
        (12, "NPU309", "manual"),
        (20, "NPU307", "manual"),
    ]
    # behind `if torch.cuda.is_available():` the same forms are guarded findings, and their safe fixes are made
    assert sorted((f.line, f.code, f.severity) for f in one.fixed) == [
        (14, "NPU307", "guarded"),
        (15, "NPU308", "guarded"),
        (16, "NPU309", "guarded"),
    ]
    lines = one.new.splitlines()
    guard = lines.index("    if torch.cuda.is_available():")
    assert lines[guard : guard + 4] == [
        "    if torch.cuda.is_available():",
        "        with npu_port.device.autocast(dtype=torch.float16, cache_enabled=True):",
        "            scaler = npu_port.device.grad_scaler()",
        "            gen = torch.Generator(npu_port.get_device().type)",
    ]


#: A CUDA-written mixed-precision step: every autocast form, a GradScaler step and a seeded CUDA generator. It saves
#: what it computed (outputs, their dtypes, the scaler's state, the weights after the step, the random draw).
AMP_SCRIPT = """\
import sys

import torch
from torch.cuda.amp import GradScaler, autocast


@torch.cuda.amp.autocast()
def forward(model, x):
    return model(x)


def main(out):
    torch.manual_seed(0)
    model, x = torch.nn.Linear(8, 4), torch.randn(3, 8)
    results = {}
    with autocast():
        results["legacy"] = model(x)
    with torch.autocast("cuda"):
        results["modern"] = model(x)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        results["bf16"] = model(x)
    with torch.amp.autocast("cuda", enabled=False):
        results["off"] = model(x)
    results["decorated"] = forward(model, x)
    scaler = GradScaler(init_scale=2.0**10, growth_interval=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with autocast():
        loss = model(x).float().square().mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    results["scale"], results["weight"] = scaler.get_scale(), model.weight.detach().clone()
    save(results, out)  # what ran before the generator (which raises without CUDA)
    generator = torch.Generator("cuda").manual_seed(3)
    results["draw"] = torch.randn(4, generator=generator, device=generator.device)
    save(results, out)


def save(results, out):
    torch.save({key: (value, getattr(value, "dtype", None)) for key, value in results.items()}, out)


if __name__ == "__main__":
    main(sys.argv[1])
"""


def _amp_run(folder, script, out, *run, fails=None):
    """Run ``script`` (under ``npu-port run`` with ``run``'s options, if any) and load what it saved; ``fails``: the
    last line of the error it must stop with."""
    environment = {k: v for k, v in os.environ.items() if k not in ("NPU_PORT_DEVICE", "PYTHONPATH")}
    environment.update(PYTHONWARNINGS="ignore", NPU_PORT_CACHE_DIR=str(folder / "cache"))
    command = [sys.executable, *(["-m", "npu_port", "run", *run] if run else []), script, out]
    result = subprocess.run(command, cwd=folder, env=environment, capture_output=True, text=True, timeout=300)
    if fails is None:
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith(fails), result.stderr
    import torch

    return torch.load(folder / out)


@pytest.mark.e2e
def test_the_fixed_amp_step_computes_on_the_cpu_what_the_original_does_under_npu_port_run(tmp_path):
    """The original, run with ``npu-port run --device cpu`` (the CUDA redirect), against the fixed file run with
    plain Python and under ``npu-port run``: the same outputs in the same dtypes, the same scaler step and scale,
    the same random draw. Run with plain Python the original autocasts nothing (CUDA autocast is off without CUDA)."""
    import torch

    (tmp_path / "original.py").write_text(AMP_SCRIPT)
    (tmp_path / "fixed.py").write_text(AMP_SCRIPT)
    (one,) = fix([str(tmp_path / "fixed.py")], write=True)
    assert sorted({f.code for f in one.fixed}) == ["NPU307", "NPU308", "NPU309"]
    assert [(f.code, f.line) for f in one.left] == [("NPU317", 4)]  # the deprecated import: its names are replaced
    assert "torch.cuda.amp" not in (tmp_path / "fixed.py").read_text()  # ... and it goes with them
    redirected = _amp_run(tmp_path, "original.py", "redirected.pt", "--device", "cpu")
    plain = _amp_run(tmp_path, "original.py", "plain.pt", fails="RuntimeError: Cannot get CUDA generator")
    for name, results in (("fixed", "fixed.pt"), ("fixed-under-run", "fixed-run.pt")):
        got = _amp_run(tmp_path, "fixed.py", results, *(["--device", "cpu"] if name == "fixed-under-run" else []))
        assert got.keys() == redirected.keys()
        for key, (value, dtype) in redirected.items():
            assert got[key][1] == dtype, (name, key)
            assert torch.equal(torch.as_tensor(got[key][0]), torch.as_tensor(value)), (name, key)
    assert [redirected[k][1] for k in ("legacy", "modern", "bf16", "off", "decorated")] == [
        torch.float16,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float16,
    ]
    assert redirected["scale"][0] == 2.0**11  # a finite step: the scale grew after growth_interval=1
    assert plain["legacy"][1] == torch.float32 and plain["scale"][0] == 1.0  # off: no autocast, no scaling


def test_the_fixed_cuda_training_benchmark_trains_on_the_cpu_exactly_as_the_one_written_for_it(tmp_path):
    """benchmarks/redirect/train_cuda.py (``.cuda()``, ``device="cuda"``, ``torch.cuda.amp.autocast`` with a
    ``GradScaler``, ``torch.cuda.synchronize``), fixed and run with no redirect, gives train_cpu.py's losses and
    weights bit for bit: float16 autocast and a scaler on the CPU, as the CUDA code asked of CUDA."""
    import runpy
    import shutil
    import warnings

    import torch

    redirect = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "redirect")
    script = tmp_path / "train_cuda.py"
    shutil.copy(os.path.join(redirect, "train_cuda.py"), script)
    (one,) = fix([str(script)], write=True)
    assert sorted(f.code for f in one.fixed) == ["NPU301", "NPU301", "NPU302", "NPU302", "NPU302"] + [
        "NPU307",
        "NPU308",
        "NPU310",
    ]
    assert [f.code for f in one.left] == ["NPU303"]  # torch.cuda.manual_seed: seeds nothing here, harmlessly
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "CUDA is not available ... Disabling" left
        fixed = runpy.run_path(str(script))["train"](12)
    cpu = runpy.run_path(os.path.join(redirect, "train_cpu.py"))["train"](12)
    assert fixed["device"] == "cpu" and fixed["losses"] == cpu["losses"]
    assert all(torch.equal(a, b) for a, b in zip(fixed["params"], cpu["params"]))


@pytest.mark.parametrize(
    "installed, why",
    [
        ("2.2.1+cpu", "not fixed: the fix needs torch >= 2.3; this environment has torch 2.2.1+cpu"),
        (None, "not fixed: the fix needs torch >= 2.3, and torch is not installed here"),
    ],
)
def test_a_rewrite_that_needs_a_newer_torch_than_the_one_installed_is_left_and_said(
    tmp_path, monkeypatch, installed, why
):
    import importlib.metadata

    real = importlib.metadata.version

    def version(name):
        if name != "torch":
            return real(name)
        if installed is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(importlib.metadata, "version", version)
    path = tmp_path / "m.py"
    path.write_text("import torch\n\nwith torch.backends.cuda.sdp_kernel(enable_math=False):\n    pass\n")
    (one,) = fix([str(path)])
    assert one.new is None
    (left,) = one.left
    assert (left.code, left.fix) == ("NPU314", "manual") and left.message.endswith(f"({why})")


def test_an_import_with_a_fallback_beside_it_stays_when_the_rewrite_leaves_it_unused(tmp_path):
    path = tmp_path / "m.py"
    source = (
        "import torch\n"
        "try:\n    from torch.cuda import synchronize\nexcept ImportError:\n    def synchronize():\n        pass\n"
        "\n\ndef f():\n    synchronize()\n"
    )
    path.write_text(source)
    (one,) = fix([str(path)])
    assert one.new is not None and "try:\n    from torch.cuda import synchronize\nexcept ImportError:" in one.new


def test_the_diff_ends_a_name_with_a_space_with_a_tab_as_git_does(tmp_path):
    path = tmp_path / "with space.py"
    path.write_text("import torch\ndef f(x):\n    return x.cuda()\n", encoding="utf-8")
    (one,) = fix([str(path)])
    shown = str(path).lstrip("/")
    assert one.diff().split("\n")[:2] == [f"--- a/{shown}\t", f"+++ b/{shown}\t"]  # GNU patch reads up to a tab


def test_the_diff_marks_a_last_line_without_newline_and_splits_lines_only_at_newlines(tmp_path):
    path = tmp_path / "a.py"
    path.write_text("import torch\n\x0c\ndef f(x):\n    return x.cuda()", encoding="utf-8")  # no newline at the end
    (one,) = fix([str(path)])
    assert one.diff().split("\n", 2)[2] == (
        "@@ -1,4 +1,5 @@\n"
        " import torch\n"
        "+import npu_port\n"
        " \x0c\n"  # one line, as git and patch count it (str.splitlines makes two of it)
        " def f(x):\n"
        "-    return x.cuda()\n"
        "\\ No newline at end of file\n"
        "+    return x.to(npu_port.get_device().type)\n"
        "\\ No newline at end of file\n"
    )


@pytest.mark.e2e
def test_the_diff_applies_with_git_apply_to_crlf_form_feed_unterminated_bom_and_latin1_files(
    tmp_path, monkeypatch, capsysbinary
):
    files = {
        "crlf.py": b"import torch\r\ndef f(x):\r\n    return x.cuda()\r\n",
        "ff.py": b"import torch\n\x0c\ndef f(x):\n    return x.cuda()\n",
        "end.py": b"import torch\ndef f(x):\n    return x.cuda()",
        "with space.py": b"import torch\ndef f(x):\n    return x.cuda()\n",
        "bom.py": b"\xef\xbb\xbfimport torch\ny = torch.ones(1).cuda()\n",
        "latin.py": b'# -*- coding: latin-1 -*-\nimport torch\ns = "\xe9"; y = torch.ones(1).cuda()\n',
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    monkeypatch.chdir(tmp_path)  # the diff names files relative to the working folder, as git does
    fixes = fix(["."])
    assert main(["fix", "--target", "npu-port", "."]) == 1  # the diff as npu-port fix prints it
    (tmp_path / "fix.patch").write_bytes(capsysbinary.readouterr().out)
    subprocess.run(["git", "init", "-q", "."], check=True)
    done = subprocess.run(["git", "apply", "fix.patch"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert {name: (tmp_path / name).read_bytes() for name in files} == {
        os.path.basename(one.path): one.new.encode(one.encoding) for one in fixes
    }


def test_fixing_many_findings_in_one_file_compares_findings_a_linear_number_of_times(tmp_path, monkeypatch):
    # Each rewrite made was looked for in a list of those made: a 50,000-line file with 30,000 fixes took 7 minutes.
    count = 400
    path = tmp_path / "many.py"
    path.write_text("import torch\n" + "".join(f"def f{i}(x):\n    return x.cuda()\n" for i in range(count)))
    equal = Finding.__eq__
    compared = []

    def counting(self, other):
        compared.append(1)
        return equal(self, other)

    monkeypatch.setattr(Finding, "__eq__", counting)
    (one,) = fix([str(path)])
    assert len(one.fixed) == count and one.left == []
    assert len(compared) <= 4 * count


def test_an_aliased_torch_cuda_call_gets_the_helper_of_what_it_resolves_to(tmp_path):
    path = tmp_path / "a.py"
    path.write_text(
        "from torch.cuda import empty_cache as synchronize\n"
        "from torch.cuda import synchronize as sync_now\n"
        "def f():\n"
        "    synchronize()\n"
        "    sync_now()\n"
    )
    (one,) = fix([str(path)])
    assert (
        one.new == "import npu_port\n\ndef f():\n    npu_port.device.empty_cache()\n    npu_port.device.synchronize()\n"
    )
    assert one.left == []


def test_fix_lists_what_no_rewrite_makes_unsafe_kinds_and_requirements_included(tmp_path, capsys):
    """Requirements files are never rewritten, and an unsafe fix is made only when asked: fix lists both (it once
    said nothing of them: "would fix 0 findings in 0 files", a runtime finding unmentioned)."""
    (tmp_path / "m.py").write_text(
        "import torch\nfrom transformers import AutoModel\n"
        'm = AutoModel.from_pretrained("x", attn_implementation="flash_attention_2")\n'
        "def f():\n    torch.cuda.manual_seed(0)\n",
        encoding="utf-8",
    )
    (tmp_path / "requirements.txt").write_text("apex==0.1\nflash-attn==2.5.8\n", encoding="utf-8")
    left = [
        "1 need a manual change:",
        [f"{tmp_path}/requirements.txt:1:1", "NPU602"],
        "1 with no automatic fix are handled by npu-port as they are:",
        [f"{tmp_path}/requirements.txt:2:1", "NPU601"],
    ]
    for extra, head in (
        (
            [],
            [
                "npu-port fix: would fix 0 findings in 0 files",
                "2 have a fix that may change behaviour (--unsafe-fixes applies it):",
                [f"{tmp_path}/m.py:3:56", "NPU130"],
                [f"{tmp_path}/m.py:5:5", "NPU303"],
            ],
        ),
        (["--unsafe-fixes"], ["npu-port fix: would fix 2 findings in 1 files"]),
    ):
        assert main(["fix", "--target", "npu-port", str(tmp_path), *extra]) == (1 if extra else 0)  # 1: changes pending
        err = [line.split()[:2] if line.startswith("  ") else line for line in capsys.readouterr().err.splitlines()]
        tail = ["dry run: nothing written (--write applies the fixes)"] if extra else []
        assert err == head + left + tail


def test_an_unsafe_fix_not_asked_for_stays_unsafe_and_one_no_rule_can_make_is_manual(tmp_path):
    class Unsafe(Rule):
        code = "NPU130"

        def rewrite(self, node, finding):
            return node

    finding = Finding("NPU130", str(tmp_path / "m.py"), 1, 1, 1, 2, "m", "runtime", "unsafe")
    assert _left([finding], {"NPU130": Unsafe}, set()) == [finding]
    assert _left([finding], {"NPU130": Rule}, set())[0].fix == "manual"  # no rewrite: manual
    assert _left([finding], {"NPU130": Unsafe}, {finding})[0].fix == "manual"  # tried and not made: manual


def test_a_link_to_a_vendored_file_is_vendored_and_fix_leaves_the_vendored_file_alone(tmp_path):
    vendored = tmp_path / "third_party" / "attn.py"
    vendored.parent.mkdir()
    vendored.write_text("import torch\ndef f(x):\n    return x.cuda()\n")
    (tmp_path / "attn.py").symlink_to(vendored)  # found first, by the link: it used to count as the project's
    result = scan([str(tmp_path)])
    assert result.findings == [] and [f.path for f in result.vendored_findings] == [str(vendored)]  # the real file
    assert fix([str(tmp_path)], write=True) == []
    assert vendored.read_text() == "import torch\ndef f(x):\n    return x.cuda()\n"


def test_an_sdp_kernel_call_with_comments_among_its_flags_is_left_with_its_comments(tmp_path):
    text = (
        "import torch\ndef f(q):\n    with torch.backends.cuda.sdp_kernel(\n"
        "        enable_flash=True,  # fast path on A100\n        enable_math=False,\n    ):\n        return q\n"
    )
    path = tmp_path / "a.py"
    path.write_text(text, encoding="utf-8")
    (one,) = fix([str(path)])
    assert one.new is None  # the rewrite dropped the comment
    assert [(f.code, f.line, f.fix) for f in one.left] == [("NPU314", 3, "manual")]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_fix_write_keeps_the_files_owner(tmp_path):
    path = tmp_path / "a.py"
    path.write_text("import torch\ndef f(x):\n    return x.cuda()\n")
    os.chown(path, 1234, 2345)
    os.chmod(path, 0o640)
    fix([str(path)], write=True)
    after = os.stat(path)
    assert (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode)) == (1234, 2345, 0o640)
    assert path.read_text() == FIXED_SMALL


def test_a_file_whose_folder_cannot_be_written_is_named_and_the_others_are_still_fixed(tmp_path, monkeypatch, capsys):
    for folder in ("a_locked", "b_open"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "m.py").write_text("import torch\ndef f(x):\n    return x.cuda()\n")
    import npu_port.atomic

    made = npu_port.atomic.tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):  # a read-only folder (root may write any folder: chmod cannot show it)
        if str(dir).endswith("a_locked"):
            raise PermissionError(1, "Operation not permitted", str(dir))
        return made(*args, dir=dir, **kwargs)

    monkeypatch.setattr(npu_port.atomic.tempfile, "mkstemp", mkstemp)
    assert (
        main(["fix", "--target", "npu-port", str(tmp_path), "--write"]) == 1
    )  # it used to stop with a traceback, b_open unfixed
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == [
        "npu-port fix: fixed 1 findings in 1 files",
        f"{tmp_path / 'a_locked' / 'm.py'}: not written: Operation not permitted",
    ]
    assert err[2] == "1 with no automatic fix are handled by npu-port as they are:"  # nothing was written
    assert len(err) == 4 and err[3].startswith(f"  {tmp_path / 'a_locked' / 'm.py'}:3:12 NPU301 ")
    assert (tmp_path / "a_locked" / "m.py").read_text() == "import torch\ndef f(x):\n    return x.cuda()\n"
    assert (tmp_path / "b_open" / "m.py").read_text() == FIXED_SMALL


UNSAFE = (
    "import torch\n"
    "from torch.cuda import manual_seed_all as seed_everything\n"
    "from transformers import AutoModelForCausalLM\n"
    "\n\ndef load(path, seed, fast):\n"
    "    torch.cuda.manual_seed(seed)\n"
    "    seed_everything(seed)\n"
    "    torch.cuda.seed_all()\n"
    "    a = AutoModelForCausalLM.from_pretrained(path, attn_implementation='flash_attention_2')\n"
    '    b = AutoModelForCausalLM.from_pretrained(path, attn_implementation="flash_attention_3" if fast else "eager")\n'
    "    return a, b\n"
)


def test_unsafe_fixes_are_made_only_when_asked_and_a_second_run_changes_nothing(tmp_path):
    """NPU303 (torch.cuda seeding -> torch.manual_seed: the CPU generator is reseeded too) and NPU130
    (flash_attention_2 -> sdpa: another kernel on CUDA) change behaviour on CUDA: --unsafe-fixes only."""
    path = tmp_path / "m.py"
    path.write_text(UNSAFE)
    (safe_only,) = fix([str(path)])
    assert safe_only.new is None and {f.code for f in safe_only.left} == {"NPU303", "NPU130"}
    fix([str(path)], unsafe=True, write=True)
    assert path.read_text() == (
        "import torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "\n\ndef load(path, seed, fast):\n"
        "    torch.manual_seed(seed)\n"
        "    torch.manual_seed(seed)\n"
        "    torch.seed()\n"
        "    a = AutoModelForCausalLM.from_pretrained(path, attn_implementation='sdpa')\n"
        '    b = AutoModelForCausalLM.from_pretrained(path, attn_implementation="flash_attention_3" if fast else "eager")\n'
        "    return a, b\n"
    )  # a value chosen in one branch is left (NPU130, manual)
    (again,) = fix([str(path)], unsafe=True)
    assert again.new is None and [(f.code, f.fix) for f in again.left] == [("NPU130", "manual")]


def test_cuda_calls_in_a_file_with_its_own_cuda_method_are_left_to_a_person(tmp_path):
    """``.to()`` may not exist on the project's own object whose ``cuda()`` the call may be: not a safe rewrite."""
    path = tmp_path / "m.py"
    path.write_text("class Batch:\n    def cuda(self):\n        return self\n\n\ndef f(b):\n    return b.cuda()\n")
    (one,) = fix([str(path)], write=True)
    assert one.new is None and [(f.code, f.fix) for f in one.left] == [("NPU301", "manual")]
