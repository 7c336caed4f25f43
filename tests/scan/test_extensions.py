"""Custom CUDA extensions: a ``sources`` list however the project builds it (NPU502 / NPU503), and the calls into
what was built or imported (NPU506), with their severities."""

from __future__ import annotations

import pytest

from npu_port.scan.engine import scan_file, select_rules

HEADER = "import glob\nimport os\nfrom torch.utils.cpp_extension import load\nROOT = os.path.dirname(__file__)\n"


def _codes(tmp_path, body):
    path = tmp_path / "ext.py"
    path.write_text(HEADER + body, encoding="utf-8")
    return [
        (f.line - HEADER.count("\n"), f.code, f.severity) for f in scan_file(str(path), False, select_rules()).findings
    ]


@pytest.mark.parametrize(
    "built",
    [
        'src = ["a.cpp", "a_kernel.cu"]',
        'src = [f"{n}.cu" for n in ("a", "b")]',
        'src = [os.path.join(ROOT, n + ".cuh") for n in NAMES]',
        'src = glob.glob(os.path.join(ROOT, "csrc", "*.cu"))',
        'src = ["a.cpp"]\nsrc += glob.glob("*.cu")',
        'src = ["a.cpp"]\nsrc.extend([os.path.join(ROOT, "k.cu")])',
        'cu = ["k.cu"]\nsrc = ["a.cpp"] + cu',
        'src: list = [x for x in os.listdir(ROOT) if x.endswith(".cu")]',
    ],
)
def test_a_sources_variable_naming_cuda_files_is_a_cuda_build(tmp_path, built):
    lines = built.count("\n") + 1
    got = _codes(tmp_path, f"{built}\next = load(name='ext', sources=src)\n")
    assert got == [(lines + 1, "NPU502", "import")]


@pytest.mark.parametrize("built", ['src = ["a.cpp", "b.cpp"]', 'src = glob.glob("*.cpp")', "src = []"])
def test_a_sources_variable_of_cpp_files_is_not(tmp_path, built):
    assert _codes(tmp_path, f"{built}\next = load(name='ext', sources=src)\n") == []


def test_a_name_bound_elsewhere_is_not_followed(tmp_path):
    body = 'def a():\n    src = ["k.cu"]\n    return src\ndef b():\n    return load("ext", sources=src)\n'
    assert _codes(tmp_path, body) == []


def test_a_build_helper_loading_its_parameter_is_a_cuda_build(tmp_path):
    """A project's helper (``get_plugin(name, sources)``) compiles whatever its callers hand it, .cu files
    included; the call handing it .cu names is reported on the first of them, and what it returns is an extension."""
    body = (
        "plugin = None\n"
        "def get_plugin(name, sources):\n"
        "    staged = [os.path.join(ROOT, s) for s in sources]\n"
        "    return load(name, sources=staged)\n"
        "def init():\n"
        "    global plugin\n"
        '    plugin = get_plugin("act", sources=["act.cpp", "act.cu"])\n'
        "def act(x):\n"
        "    return plugin.act(x)\n"
    )
    assert _codes(tmp_path, body) == [(4, "NPU503", "runtime"), (7, "NPU503", "runtime"), (9, "NPU506", "runtime")]


def test_a_module_level_list_read_in_a_function_is_followed(tmp_path):
    body = 'SRC = [os.path.join(ROOT, "k.cu")]\ndef build():\n    return load("ext", sources=SRC)\n'
    assert _codes(tmp_path, body) == [(3, "NPU503", "runtime")]


def test_calls_into_a_loaded_extension_are_runtime_and_guarded_ones_name_their_guard(tmp_path):
    body = (
        'ext = load("ext", sources=["k.cu"])\n'
        "def f(x, torch):\n"
        "    y = ext.forward(x)\n"
        "    if torch.cuda.is_available():\n"
        "        y = ext.backward(y)\n"
        "    return y.sum(), ext\n"
    )
    path = tmp_path / "ext.py"
    path.write_text(HEADER + body, encoding="utf-8")
    found = [f for f in scan_file(str(path), False, select_rules()).findings if f.code == "NPU506"]
    assert [(f.line - 4, f.severity) for f in found] == [(3, "runtime"), (5, "guarded")]
    assert found[0].message == (
        "`ext.forward()` calls into the compiled CUDA extension `ext` (built by load()): it raises where the "
        "extension could not be built or imported; give it a PyTorch fallback"
    )
    assert found[1].message == (
        "`ext.backward()` calls into the compiled CUDA extension `ext` (built by load()), reached only under "
        "`if torch.cuda.is_available()`"
    )


def test_a_cpp_only_load_gives_no_call_finding_and_a_served_extension_an_info_one(tmp_path):
    body = 'cpu = load("cpu", sources=["a.cpp"])\ncpu.forward(1)\nimport alt_cuda_corr\nalt_cuda_corr.forward(1)\n'
    found = [(line, severity) for line, code, severity in _codes(tmp_path, body) if code == "NPU506"]
    assert found == [(4, "info")]  # NPU103 on the import is the handled one
