"""Where a finding is placed: on the line of the CUDA-only call or name when its statement spreads over several lines,
in every report; and ``fix`` still rewrites the whole node (``Finding.anchor``), as it does on one line."""

from __future__ import annotations

import ast
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from npu_port.scan.engine import scan, scan_file, select_rules
from npu_port.scan.fix import fix
from npu_port.scan.report import json_report, sarif_report


def _findings(tmp_path, text, name="a.py"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return scan_file(str(path), False, select_rules()).findings


def test_a_call_chain_over_lines_is_reported_at_its_cuda_name_and_fixed_over_the_whole_call(tmp_path):
    (finding,) = _findings(tmp_path, "def f(torch):\n    x = (torch.zeros(3)\n         .cuda())\n    return x\n")
    assert finding.code == "NPU301"
    assert (finding.line, finding.column, finding.end_line, finding.end_column) == (3, 11, 3, 17)
    assert finding.anchor == (2, 10, 3, 17)  # the call, from `torch.zeros` on: what fix rewrites
    assert finding.span == finding.anchor
    assert finding.snippet == ".cuda())"


def test_a_one_line_finding_has_no_anchor_of_its_own(tmp_path):
    (finding,) = _findings(tmp_path, "def f(x):\n    return x.cuda()\n")
    assert finding.anchor is None and finding.span == (2, 12, 2, 20)


def test_keywords_literals_and_import_modules_are_reported_on_their_own_line(tmp_path):
    text = (
        "import torch.distributed\n"
        "from xformers.ops import (\n"
        "    memory_efficient_attention,\n"
        ")\n"
        "def f(Model, a):\n"
        "    torch.distributed.init_process_group(\n"
        '        backend="nccl")\n'
        "    return Model(\n"
        "        a,\n"
        '        device="cuda",\n'
        "    ), memory_efficient_attention\n"
    )
    got = [(f.line, f.column, f.code) for f in _findings(tmp_path, text)]
    assert got == [(2, 1, "NPU102"), (7, 17, "NPU311"), (10, 16, "NPU310")]  # the CUDA-only module's line


def test_json_and_sarif_report_the_line_of_the_cuda_name(tmp_path):
    (tmp_path / "a.py").write_text("def f(x):\n    return (x.float()\n            .cuda())\n", encoding="utf-8")
    result = scan([str(tmp_path)], jobs=1)
    (finding,) = json.loads(json_report(result))["findings"]
    assert (finding["line"], finding["column"], finding["end_line"], finding["end_column"]) == (3, 14, 3, 20)
    (sarif,) = json.loads(sarif_report(result))["runs"][0]["results"]
    region = sarif["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"], region["endLine"], region["endColumn"]) == (3, 14, 3, 20)


def test_a_suppression_on_the_first_line_of_the_statement_or_on_the_reported_line_holds(tmp_path):
    first = "def f(x):\n    return (x.float()  # npu-port: ignore[NPU301]\n            .cuda())\n"
    reported = "def f(x):\n    return (x.float()\n            .cuda())  # npu-port: ignore[NPU301]\n"
    other = "def f(x):\n    return (x.float()  # npu-port: ignore[NPU302]\n            .cuda())\n"
    assert _findings(tmp_path, first) == []
    assert _findings(tmp_path, reported) == []
    assert [f.code for f in _findings(tmp_path, other)] == ["NPU301"]


# ---- fix: a statement over several lines is fixed as the same statement on one line is -----------------------------

MULTILINE_AND_ONE_LINE = [
    ("x = (torch.zeros(3)\n     .cuda())\n", "x = torch.zeros(3).cuda()\n"),
    ('m = Model(\n    a,\n    device="cuda",\n)\n', 'm = Model(a, device="cuda")\n'),
    (
        'torch.distributed.init_process_group(\n    backend="nccl")\n',
        'torch.distributed.init_process_group(backend="nccl")\n',
    ),
    ("torch.cuda.synchronize(\n)\n", "torch.cuda.synchronize()\n"),
    ('y = x.to(\n    "cuda",\n    non_blocking=True,\n)\n', 'y = x.to("cuda", non_blocking=True)\n'),
    ("from flash_attn import (\n    flash_attn_func,\n)\n", "from flash_attn import flash_attn_func\n"),
]


def _fixed_tree(tmp_path, name, body):
    path = tmp_path / name
    path.write_text("import torch\nimport torch.distributed\n\n\ndef f(x, a, Model):\n    pass\n\n\n" + body)
    (one,) = fix([str(path)], write=True, target="npu-port")  # the target whose fixes include the drop-in guard
    assert one.problem is None and one.fixed, body
    again = fix([str(path)], target="npu-port")  # a second run changes nothing
    assert all(f.new is None for f in again)
    return ast.dump(ast.parse(path.read_text()))


def test_each_statement_over_several_lines_is_fixed_as_it_is_on_one_line(tmp_path):
    for index, (multiline, one_line) in enumerate(MULTILINE_AND_ONE_LINE):
        assert _fixed_tree(tmp_path, f"m{index}.py", multiline) == _fixed_tree(tmp_path, f"o{index}.py", one_line)


# A call chain with a line break (inside the parentheses) before any of its dots, after an opening parenthesis or before
# a closing one: where people break lines (``x.\ncuda()`` and ``.cuda\n()`` are no one's, and the scan's trigger is
# the text ``.cuda(``).
_TOKENS = ["y", "=", "(", "x", ".", "float", "(", ")", ".", "cuda", "(", ")", ".", "sum", "(", "1", ")", ")"]
_GAPS = [i for i in range(2, len(_TOKENS) - 1) if _TOKENS[i] == "(" or _TOKENS[i + 1] in (".", ")")]


@settings(max_examples=40, deadline=None)
@given(breaks=st.sets(st.sampled_from(_GAPS)))
def test_wherever_the_chain_breaks_the_finding_is_on_the_cuda_line_and_the_fix_is_the_same(tmp_path_factory, breaks):
    text = "".join(token + ("\n    " if index in breaks else "") for index, token in enumerate(_TOKENS)) + "\n"
    source = "def f(x):\n" + "".join("    " + line.strip() + "\n" for line in text.splitlines())
    folder = tmp_path_factory.mktemp("chain")
    findings = _findings(folder, source)
    cuda_line = next(number for number, line in enumerate(source.splitlines(), 1) if "cuda" in line)
    assert [(f.line, f.code) for f in findings] == [(cuda_line, "NPU301")]
    path = folder / "a.py"
    (one,) = fix([str(path)])
    flat = ast.parse(one.new).body[-1]
    one_line = folder / "b.py"
    one_line.write_text("def f(x):\n    y = (x.float().cuda().sum(1))\n")
    (expected,) = fix([str(one_line)])
    assert ast.dump(flat) == ast.dump(ast.parse(expected.new).body[-1])
