"""The doctor's NPU-side findings, on stand-ins: the chip warning (910A / 310P), diffusers' GEGLU on torch_npu,
MindIE-SD's import order and flash-attn-npu's import side effects.

No NPU is needed: torch_npu is the recorder from tests/fakes (its ``npu`` namespace, with ``get_device_name`` set
to what a real device reports), installed in ``sys.modules`` and as ``torch.npu`` for one test; packages such as
mindiesd are "found" by replacing the doctor's ``locate`` and metadata lookups, never imported.
"""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from npu_port._optional import PackageStatus
from npu_port.doctor import checks_attention, checks_diffusers, checks_extensions
from npu_port.doctor.facts import Facts
from npu_port.doctor.probes import ImportOutcome
from npu_port.reasons import Reason
from tests.fakes import torch_npu_recorder

CHUNKED_FIX = (
    'for memory, the chunked strategy never holds the whole score matrix: npu_port.set_attention_strategy("chunked", '
    "target=pipe); else lower the resolution, frame count or batch; fused attention needs a 910B or newer"
)


def npu_facts(**attributes) -> Facts:
    """This environment's torch, with the answers about torch_npu set as a test needs them."""
    facts = Facts(environ=attributes.pop("environ", {}))
    facts.torch_import = ImportOutcome("torch", 0, "")
    for name, value in attributes.items():
        setattr(facts, name, value)
    return facts


@pytest.fixture
def fake_npu(monkeypatch):
    """A torch_npu stand-in whose device 0 reports ``name``; returns a function that sets the name."""
    module = torch_npu_recorder.build_module(initialized=True)
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(torch, "npu", module.npu, raising=False)

    def device(name: str):
        module.npu.get_device_name = lambda index=0: name
        return module

    return device


# --- chip ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "device_name, chip, product",
    [
        ("Ascend310P3", "310P", "Atlas 300I Duo / 300I Pro (Ascend 310P)"),
        ("Ascend910A", "910A", "Ascend 910 (first generation, Atlas 800 training 9000)"),
    ],
)
def test_a_chip_without_fused_attention_warns_that_every_call_builds_the_score_matrix(
    fake_npu, device_name, chip, product
):
    fake_npu(device_name)
    (finding,) = checks_attention.check_npu_chip(npu_facts(npu_usable=True))
    assert (finding.check, finding.status, finding.code) == ("npu-chip", "warn", "chip")
    assert finding.summary == (
        f"NPU 0 is {device_name} ({chip}, {product}): no fused attention on this chip, so every attention call "
        "builds the whole score matrix (SDPA always runs the math path; npu_fusion_attention is unavailable)"
    )
    assert finding.fix == CHUNKED_FIX
    assert finding.details == {"device_name": device_name, "chip": chip, "fused_attention": False}


@pytest.mark.parametrize(
    "device_name, chip", [("Ascend910B3", "910B"), ("Ascend910_9392", "910C"), ("Ascend950PR", "950")]
)
def test_a_chip_with_fused_attention_is_ok(fake_npu, device_name, chip):
    fake_npu(device_name)
    (finding,) = checks_attention.check_npu_chip(npu_facts(npu_usable=True))
    assert finding.status == "ok"
    assert finding.summary.startswith(f"NPU 0 is {device_name} ({chip}): fused attention available")


def test_an_unknown_chip_and_no_npu_are_informational(fake_npu):
    fake_npu("Ascend710")
    (unknown,) = checks_attention.check_npu_chip(npu_facts(npu_usable=True))
    assert unknown.status == "info" and unknown.summary.startswith("NPU 0 (Ascend710) is not a chip npu-port's table")
    (absent,) = checks_attention.check_npu_chip(npu_facts(npu_usable=False))
    assert (absent.status, absent.summary) == ("info", "no NPU is usable here: the chip was not checked")


# --- diffusers' GEGLU ------------------------------------------------------------------------------------------------

GEGLU_SUMMARY = (
    "GEGLU calls torch_npu.npu_geglu(..., approximate=1), tanh GELU, whenever the torch_npu package is installed (not "
    "when the tensor is on an NPU), while CPU and GPU use exact erf GELU: outputs differ between devices (diffusers "
    "models/activations.py GEGLU.forward, L118-120 in 0.42.1, huggingface/diffusers#7816; >= 0.28.0, open); npu-port's "
    "fused ops keep GEGLU exact on the NPU (geglu_exact) unless you ask for the tanh form"
)


@pytest.mark.parametrize(
    "version, npu_installed, npu_broken, status",
    [("0.42.1", "2.13.0", False, "warn"), ("0.28.0", None, False, "info"), ("0.42.1", "2.13.0", True, "info")],
)
def test_the_geglu_finding_warns_when_torch_npu_works(monkeypatch, version, npu_installed, npu_broken, status):
    monkeypatch.setattr(checks_diffusers, "installed_version", lambda name: version)
    facts = npu_facts(torch_npu_version=npu_installed)
    facts.torch_npu_import = ImportOutcome("torch_npu", 1 if npu_broken else 0, "")
    findings = {f.check: f for f in checks_diffusers.check_diffusers(facts)}
    geglu = findings["diffusers-geglu-tanh-on-npu"]
    assert (geglu.status, geglu.summary) == (status, GEGLU_SUMMARY)
    assert geglu.fix == (
        'npu_port.fuse_ops(model, ops=["geglu_exact"]) (reversible; ops=["geglu_tanh"] keeps the faster tanh form)'
    )


def test_no_geglu_finding_before_diffusers_0_28(monkeypatch):
    monkeypatch.setattr(checks_diffusers, "installed_version", lambda name: "0.27.2")
    checks = {f.check for f in checks_diffusers.check_diffusers(npu_facts(torch_npu_version="2.13.0"))}
    assert "diffusers-geglu-tanh-on-npu" not in checks


def test_diffusers_geglu_takes_the_tanh_branch_on_a_cpu_tensor_once_torch_npu_is_present(monkeypatch):
    """What the finding says, checked on diffusers itself: exact erf GELU without torch_npu; with the package
    present (a recorder standing in for npu_geglu), GEGLU calls npu_geglu(approximate=1) on a CPU tensor."""
    activations = pytest.importorskip("diffusers.models.activations")
    torch.manual_seed(0)
    layer = activations.GEGLU(8, 4).double()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    hidden, gate = layer.proj(x).chunk(2, dim=-1)
    exact = hidden * F.gelu(gate)
    assert torch.equal(layer(x), exact)

    calls = []

    def npu_geglu(tensor, dim=-1, approximate=1):
        calls.append((tensor.device.type, dim, approximate))
        a, b = tensor.chunk(2, dim=dim)
        return a * F.gelu(b, approximate="tanh" if approximate == 1 else "none"), b

    monkeypatch.setattr(activations, "is_torch_npu_available", lambda: True)
    monkeypatch.setattr(activations, "torch_npu", types.SimpleNamespace(npu_geglu=npu_geglu), raising=False)
    tanh = layer(x)
    assert calls == [("cpu", -1, 1)]
    difference = (tanh - exact).abs().max().item()
    assert 1e-6 < difference < 1e-2  # a real, small, systematic difference between devices


def test_the_cited_lines_are_diffusers_0_42_1s():
    activations = pytest.importorskip("diffusers.models.activations")
    import diffusers

    if diffusers.__version__ != "0.42.1":
        pytest.skip(f"the line numbers cited are 0.42.1's; diffusers {diffusers.__version__} is installed")
    lines = open(activations.__file__, encoding="utf-8").read().splitlines()
    assert lines[117].strip() == "if is_torch_npu_available():"
    assert lines[119].strip() == "return torch_npu.npu_geglu(hidden_states, dim=-1, approximate=1)[0]"


# --- MindIE-SD -------------------------------------------------------------------------------------------------------

MINDIESD_DIR = "/site-packages/mindiesd"
VENDORS = [f"{MINDIESD_DIR}/ops/vendors/{name}" for name in ("customize_transformer", "aie_ascendc", "customize")]
MINDIESD_FIX = (
    "put `import mindiesd` right after `import torch_npu`, before any tensor goes to the NPU; or, before starting "
    f"Python, export ASCEND_CUSTOM_OPP_PATH={os.pathsep.join(VENDORS)}{os.pathsep}$ASCEND_CUSTOM_OPP_PATH"
)


@pytest.fixture
def mindiesd_installed(monkeypatch):
    monkeypatch.setattr(checks_extensions, "locate", lambda name: MINDIESD_DIR if name == "mindiesd" else None)
    monkeypatch.setattr(checks_extensions, "installed_version", lambda *names: "3.1.0")
    monkeypatch.delitem(sys.modules, "mindiesd", raising=False)


def test_mindiesd_installed_says_import_it_before_the_first_npu_operator(mindiesd_installed):
    (finding,) = checks_extensions.check_mindiesd(npu_facts())
    assert finding.status == "info"
    assert finding.summary == (
        "MindIE-SD 3.1.0 is installed: `import mindiesd` must run before the first NPU operator (it adds its operator "
        "directories to ASCEND_CUSTOM_OPP_PATH, which CANN reads once, at the first operator lookup); imported later, "
        'its operators fail with EZ1001 "... does not support opType" for the whole process '
        "(vllm-project/vllm-omni#6054)"
    )
    assert finding.fix == MINDIESD_FIX
    assert finding.details["vendor_dirs"] == VENDORS


def test_mindiesd_directories_already_exported_make_order_irrelevant(mindiesd_installed):
    environ = {"ASCEND_CUSTOM_OPP_PATH": os.pathsep.join([*VENDORS, "/other/vendor"])}
    (finding,) = checks_extensions.check_mindiesd(npu_facts(environ=environ))
    assert finding.status == "ok" and "import order does not matter" in finding.summary


def test_mindiesd_imported_after_torch_npu_initialised_the_npu_warns(mindiesd_installed, monkeypatch, fake_npu):
    fake_npu("Ascend910B3")  # initialized=True
    torch_npu = sys.modules.pop("torch_npu")
    monkeypatch.setitem(sys.modules, "torch_npu", torch_npu)  # torch_npu first ...
    monkeypatch.setitem(sys.modules, "mindiesd", types.ModuleType("mindiesd"))  # ... then mindiesd
    (finding,) = checks_extensions.check_mindiesd(npu_facts())
    assert finding.status == "warn"
    assert finding.summary == (
        "mindiesd 3.1.0 was imported in this process after torch_npu had initialised the NPU: if any NPU operator ran "
        'before `import mindiesd`, its operators fail with EZ1001 "... does not support opType" for the rest of the '
        "process (vllm-project/vllm-omni#6054)"
    )
    assert finding.fix == MINDIESD_FIX


def test_mindiesd_imported_before_torch_npu_is_ok(mindiesd_installed, monkeypatch, fake_npu):
    fake_npu("Ascend910B3")
    torch_npu = sys.modules.pop("torch_npu")
    monkeypatch.setitem(sys.modules, "mindiesd", types.ModuleType("mindiesd"))
    monkeypatch.setitem(sys.modules, "torch_npu", torch_npu)
    (finding,) = checks_extensions.check_mindiesd(npu_facts())
    assert finding.status == "ok"
    assert finding.summary == (
        "mindiesd 3.1.0 was imported in this process before torch_npu initialised the NPU, as it must be"
    )


def test_no_mindiesd_is_informational(monkeypatch):
    monkeypatch.setattr(checks_extensions, "locate", lambda name: None)
    (finding,) = checks_extensions.check_mindiesd(npu_facts())
    assert (finding.status, finding.summary) == (
        "info",
        "MindIE-SD is not installed (optional: fused adaLN / attention operators for diffusion models)",
    )


def test_mindiesd_is_located_without_being_imported(monkeypatch, tmp_path):
    """``locate`` finds a package by its spec; the package's code (here: a raise) never runs."""
    package = tmp_path / "mindiesd"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mindiesd", raising=False)
    assert checks_extensions.locate("mindiesd") == str(package)
    assert "mindiesd" not in sys.modules


# --- flash-attn-npu --------------------------------------------------------------------------------------------------

SIDE_EFFECTS = (
    "its import initialises the NPU (torch_npu.npu.get_device_name()) and raises RuntimeError('Unsupported Ascend "
    "device: ...') unless the device is an Ascend910* (flash_attn_npu_3 also accepts Ascend950)"
)


@pytest.fixture
def flash_attn_npu_installed(monkeypatch):
    present = {"flash_attn_npu": "/sp/flash_attn_npu", "flash_attn_npu_3": "/sp/flash_attn_npu_3"}
    monkeypatch.setattr(checks_extensions, "locate", present.get)
    monkeypatch.setattr(checks_extensions, "installed_version", lambda *names: "0.4.2.post1")

    def never_import(name):
        raise AssertionError(f"the doctor imported {name}")

    monkeypatch.setattr(checks_extensions, "probe", never_import)


def test_flash_attn_npu_off_an_npu_is_described_not_imported(flash_attn_npu_installed):
    facts = npu_facts(npu_usable=False, torch_version="2.13.0+cpu")
    imported, compiled = checks_extensions.check_flash_attn_npu(facts)
    assert (imported.status, imported.summary) == (
        "info",
        "flash-attn-npu 0.4.2.post1 is installed (flash_attn_npu, flash_attn_npu_3); not imported here (no NPU): "
        + SIDE_EFFECTS,
    )
    assert compiled.status == "info"
    assert compiled.summary == (
        "with torch 2.13.0+cpu, flash-attn-npu's ops are not registered as torch custom ops (it tests "
        'torch.__version__ >= "2.4.0" as strings, which is False for "2.13.0+cpu"): torch.compile cannot trace them, '
        "expect a graph break at each call"
    )


@pytest.mark.parametrize(
    "device_name, chip, elsewhere",
    [
        ("Ascend310P3", "310P", ""),
        ("Ascend950PR", "950", " (on 950 its flash_attn_npu_3 / flash_attn_npu_4 APIs apply)"),
    ],
)
def test_flash_attn_npu_on_a_chip_its_v2_api_refuses_warns_without_importing(
    flash_attn_npu_installed, fake_npu, device_name, chip, elsewhere
):
    fake_npu(device_name)
    imported, _ = checks_extensions.check_flash_attn_npu(npu_facts(npu_usable=True, torch_version="2.9.0"))
    assert (imported.status, imported.code) == ("warn", "chip")
    assert imported.summary == (
        f"flash-attn-npu 0.4.2.post1's flash-attn 2 API (flash_attn_npu) does not support this {chip}: it supports "
        f"Ascend 910B / 910C, and {SIDE_EFFECTS}{elsewhere}"
    )


def test_flash_attn_npu_on_a_910b_is_imported_guarded(flash_attn_npu_installed, fake_npu, monkeypatch):
    fake_npu("Ascend910B3")
    probed = []

    def probe(name):
        probed.append(name)
        return PackageStatus(name, types.ModuleType(name), None)

    monkeypatch.setattr(checks_extensions, "probe", probe)
    imported, _ = checks_extensions.check_flash_attn_npu(npu_facts(npu_usable=True, torch_version="2.9.0"))
    assert (imported.status, imported.summary) == (
        "ok",
        "flash-attn-npu 0.4.2.post1: flash_attn_npu imports on this 910B",
    )
    assert probed == ["flash_attn_npu"]

    broken = Reason("package-broken", "flash_attn_npu is installed but cannot be imported (RuntimeError: boom)")
    monkeypatch.setattr(checks_extensions, "probe", lambda name: PackageStatus(name, None, broken))
    imported, _ = checks_extensions.check_flash_attn_npu(npu_facts(npu_usable=True, torch_version="2.9.0"))
    assert (imported.status, imported.code) == ("warn", "package-broken")
    assert imported.summary == f"flash-attn-npu 0.4.2.post1: {broken}"


@pytest.mark.parametrize(
    "torch_version, status, why",
    [
        ("2.9.0", "ok", None),
        ("2.4.0", "ok", None),
        ("2.10.0", "info", 'it tests torch.__version__ >= "2.4.0" as strings, which is False for "2.10.0"'),
        ("2.14.0", "info", 'it tests torch.__version__ >= "2.4.0" as strings, which is False for "2.14.0"'),
        ("2.3.1", "info", "it registers them from torch 2.4.0 on"),
    ],
)
def test_flash_attn_npu_custom_op_registration_follows_its_string_comparison(
    flash_attn_npu_installed, torch_version, status, why
):
    _, compiled = checks_extensions.check_flash_attn_npu(npu_facts(npu_usable=False, torch_version=torch_version))
    assert compiled.status == status
    assert compiled.details["custom_ops_registered"] is (status == "ok")
    if why:
        assert f"({why})" in compiled.summary


def test_no_flash_attn_npu_is_informational(monkeypatch):
    monkeypatch.setattr(checks_extensions, "locate", lambda name: None)
    (finding,) = checks_extensions.check_flash_attn_npu(npu_facts())
    assert finding.status == "info" and finding.summary.startswith("flash-attn-npu is not installed")
