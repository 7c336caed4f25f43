"""``npu-port doctor --explain``: every code users paste, the forms they paste it in, unknown codes, the JSON
variant, and the README table generated from the same data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npu_port.cli.main import main
from npu_port.doctor import error_codes
from npu_port.doctor.error_codes import ERROR_CODES, find, lookup, render, tokens, unknown_message

ROOT = Path(__file__).resolve().parents[2]
#: The codes the issue names, and the rest users commonly hit: each must be explained.
REQUIRED = (
    "507015 507035 EZ1001 EE9999 ERR99999 507011 507013 507014 507033 507034 507053 507899 107002 100000 161001 "
    "161002 561003 E39999 EI9999 EZ9999 EL0004 EH9999 EE1001 EZ3002 EZ3003"
).split()
LIST_HINT = f"npu-port doctor --explain list shows the {len(ERROR_CODES)} codes it explains"


def explain(*argv, capsys):
    code = main(["doctor", "--explain", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("code", REQUIRED)
def test_each_listed_code_has_a_cause_a_fix_and_a_source(code, capsys):
    entry = lookup(code)
    assert entry is not None and entry.code == code
    for text in (entry.name, entry.component, entry.summary, entry.cause, entry.fix):
        assert text and "\n" not in text and "|" not in text
    assert entry.sources and all(url.startswith("https://") for url in entry.sources)
    exit_code, out, err = explain(code, capsys=capsys)
    assert (exit_code, err) == (0, "")
    assert out.splitlines()[0] == f"{code}  {entry.name}  ({entry.component})"
    assert f"  cause:  {entry.cause}\n" in out and f"  fix:    {entry.fix}\n" in out
    assert f"  source: {entry.sources[0]}\n" in out


def test_the_table_has_one_entry_per_code_and_numbers_named_as_their_headers_do():
    codes = [entry.code for entry in ERROR_CODES]
    assert len(codes) == len(set(codes))
    for entry in ERROR_CODES:
        if entry.code.isdigit():
            prefix = {"1": "ACL", "2": "ACL_ERROR_RT_", "5": "ACL", "3": "ACLNN_"}[entry.code[0]]
            assert entry.name.startswith(prefix), entry
            if entry.code[:3] in ("161", "361", "561"):
                assert entry.name.startswith("ACLNN_ERR_"), entry


def test_507015_in_full():
    assert render([lookup("507015")]) == "\n".join(
        [
            "507015  ACL_ERROR_RT_AICORE_EXCEPTION  (CANN runtime (ACL return code))",
            "  what:   a kernel failed on the AI Core (aicore exception)",
            "  cause:  an operator's kernel faulted on the device, e.g. an out-of-range memory access by a kernel given "
            "inputs it does not handle, or a kernel bug; it is reported asynchronously, at the next synchronisation "
            "('ACL stream synchronize failed, error code:...'), so the Python line in the traceback is usually not "
            "the operator at fault",
            "  fix:    rerun with ASCEND_LAUNCH_BLOCKING=1 (operators run synchronously, so the traceback names the "
            "operator that failed) and ASCEND_SLOG_PRINT_TO_STDOUT=1 (CANN's log on the terminal); check that "
            "operator's inputs against its documented limits (shape, dtype, layout); try the newest torch_npu / CANN "
            "pair",
            f"  source: {error_codes.RT_HEADER}",
            f"          {error_codes.TORCH_NPU_ACL_CODES}",
            f"          {error_codes.LAUNCH_BLOCKING}",
            "          https://github.com/vllm-project/vllm-ascend/issues/5661",
            "          https://github.com/MinghuasLab/flash-attention-npu/issues/237",
        ]
    )


def test_key_facts_of_the_codes_the_issue_names():
    assert lookup("507035").name == "ACL_ERROR_RT_VECTOR_CORE_EXCEPTION"
    assert lookup("507011").name == "ACL_ERROR_RT_MODEL_EXECUTE"  # not "memory allocation failed"
    assert lookup("EZ1001").name == "AclNN_Parameter_Error"
    assert "does not support opType [Y]" in lookup("EZ1001").cause
    assert "import mindiesd" in lookup("EZ1001").fix
    assert error_codes.VLLM_OMNI_6054 in lookup("EZ1001").sources
    assert lookup("ERR99999").cause.startswith(
        "torch_npu's exception handler prints '[ERROR] ... ERR99999 UNKNOWN applicaiton exception' (sic) when the "
        "process ends on any uncaught exception"
    )
    assert lookup("ERR99999").fix.startswith("read the traceback above it")
    assert lookup("EE9999").summary == "internal error in CANN's runtime"
    assert lookup("EH9999").fix.startswith("pip install decorator sympy cffi protobuf attrs pyyaml scipy psutil")
    assert (
        lookup("107002").fix
        == "call torch.npu.set_device(index) in each process (and thread) before its first NPU tensor"
    )


# --- the forms users paste -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query, codes",
    [
        ("EZ1001", ["EZ1001"]),
        ("ez1001", ["EZ1001"]),
        ("error code 507015", ["507015"]),
        ("error code:507015", ["507015"]),
        ("ERR99999 UNKNOWN applicaiton exception", ["ERR99999"]),
        (
            "[ERROR] 2025-10-15-16:32:29 (PID:2994, Device:-1, RankID:-1) ERR99999 UNKNOWN applicaiton exception",
            ["ERR99999"],
        ),
        ("RuntimeError: ACL stream synchronize failed, error code:507035", ["507035"]),
        (
            "RuntimeError: aclnnGather failed, error code 161002\nAclNN_Parameter_Error(EZ1001): Size does not match at "
            "dimension 0",
            ["161002", "EZ1001"],
        ),
        (
            "RuntimeError: call aclnnAddRmsNormBias failed, detail:[PID: 364676] 2026-07-07-09:36:12.120.702 "
            "AclNN_Parameter_Error(EZ1001): Get regInfo failed, The binary_info_config.json of socVersion "
            "[ascend910_93] does not support opType [AddRmsNormBias].",
            ["EZ1001"],
        ),
        (
            "EE1001: The argument is invalid.Reason: rtGetDevMsg execute failed (error code is 107002, EE1001)",
            ["EE1001", "107002"],
        ),
        ("NPU function error: ..., error code is 507015 ERR01100 OPS call acl api failed", ["507015", "ERR01100"]),
    ],
)
def test_codes_are_found_in_what_users_paste(query, codes, capsys):
    assert [entry.code for entry in find(query)] == codes
    exit_code, out, _ = explain(query, capsys=capsys)
    assert exit_code == 0
    assert [line.split()[0] for line in out.split("\n\n")] == codes


def test_a_pasted_line_split_by_the_shell_is_joined_back(capsys):
    exit_code, out, _ = explain("ERR99999", "UNKNOWN", "applicaiton", "exception", capsys=capsys)
    assert exit_code == 0 and out.startswith("ERR99999  UNKNOWN application exception  (torch_npu)\n")


@given(
    entry=st.sampled_from(ERROR_CODES),
    upper=st.lists(st.booleans(), min_size=8, max_size=8),
    before=st.text(alphabet=" :()[]=,-\t\n'\"", max_size=6),
    after=st.text(alphabet=" :()[]=,-.\t\n'\"", max_size=6),
)
def test_any_case_and_any_punctuation_around_a_code_finds_it(entry, upper, before, after):
    code = "".join(c.upper() if up else c.lower() for c, up in zip(entry.code, upper + [True] * 8))
    assert find(before + code + after) == [entry]


def test_codes_inside_longer_words_or_numbers_are_not_codes():
    assert tokens("id 15070150 and xEZ1001 and EZ10012 and 0x507015") == []


@pytest.mark.parametrize(
    "code, name, cause_starts",
    [
        (
            "ERR00100",
            "PTA call acl api failed",
            "torch_npu's core: a call to ACL failed; the same message carries ACL's",
        ),
        ("ERR02200", "DIST call hccl api failed", "torch.distributed on hccl: a call to HCCL failed"),
        ("ERR01002", "OPS invalid type", "torch_npu reports 'invalid type' from an operator"),
    ],
)
def test_torch_npu_codes_are_decoded_from_its_error_table(code, name, cause_starts):
    entry = lookup(code)
    assert (entry.name, entry.component, entry.sources) == (name, "torch_npu", (error_codes.TORCH_NPU_ERR_CODES,))
    assert entry.cause.startswith(cause_starts)


# --- what is not known -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query, line",
    [
        (
            "E10035",
            f"npu-port doctor --explain: E10035 is not a code npu-port knows (by its form: a CANN GE error code, user "
            f"class); {LIST_HINT}",
        ),
        (
            "ej9999",
            f"npu-port doctor --explain: EJ9999 is not a code npu-port knows (by its form: a CANN HCCP error code, "
            f"internal class); {LIST_HINT}",
        ),
        (
            "507046",
            f"npu-port doctor --explain: 507046 is not a code npu-port knows (by its form: an ACL return code of "
            f"class 5: internal software / hardware error: report it with the log); {LIST_HINT}",
        ),
        (
            "ERR05001",
            "npu-port doctor --explain: ERR05001 is not a code npu-port knows (by its form: a torch_npu error code, "
            f"ERR<submodule><code>, with a submodule or code torch_npu does not define); {LIST_HINT}",
        ),
        ("999999", f"npu-port doctor --explain: 999999 is not a code npu-port knows; {LIST_HINT}"),
        ("hello there", f"npu-port doctor --explain: no error code in 'hello there'; {LIST_HINT}"),
        ("123456 654321", f"npu-port doctor --explain: none of 123456, 654321 is a code npu-port knows; {LIST_HINT}"),
    ],
)
def test_an_unknown_code_is_one_line_on_stderr_and_exit_2(query, line, capsys):
    assert unknown_message(query) == line
    exit_code, out, err = explain(query, capsys=capsys)
    assert (exit_code, out, err) == (2, "", line + "\n")


def test_list_names_every_code(capsys):
    exit_code, out, _ = explain("LIST", capsys=capsys)
    lines = out.splitlines()
    assert exit_code == 0
    assert lines[0] == f"npu-port explains {len(ERROR_CODES)} error codes (npu-port doctor --explain CODE for one):"
    assert [line.split()[0] for line in lines[1:-1]] == [entry.code for entry in ERROR_CODES]
    assert lines[-1] == "  and any torch_npu ERR<submodule><code> code, decoded from torch_npu/utils/_error_code.py"


def test_json_variants(capsys):
    exit_code, out, _ = explain("ez1001", "--json", capsys=capsys)
    report = json.loads(out)
    assert exit_code == 0
    assert report == {"query": "ez1001", "codes": [lookup("EZ1001").as_dict()]}
    exit_code, out, _ = explain("E10035", "--json", capsys=capsys)
    assert exit_code == 2
    assert json.loads(out) == {"query": "E10035", "codes": [], "error": unknown_message("E10035")}
    exit_code, out, _ = explain("list", "--json", capsys=capsys)
    assert exit_code == 0 and [c["code"] for c in json.loads(out)["codes"]] == [e.code for e in ERROR_CODES]


def test_the_sites_code_table_is_the_generated_one():
    """The site's error-codes reference is :func:`error_codes.markdown_table`, generated when the site is built."""
    from ..docs import site

    assert site.pages_with("error-codes") == ["reference/error-codes.md"]
    assert site.hook().render("error-codes") == error_codes.markdown_table()


@pytest.mark.e2e
def test_explain_works_where_import_torch_fails(tmp_path):
    """--explain needs neither torch nor an NPU: it runs on the very machine whose torch is broken."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise RuntimeError('Failed to load the backend extension: torch_npu')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "npu_port", "doctor", "--explain", "error code:507015"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("507015  ACL_ERROR_RT_AICORE_EXCEPTION  (CANN runtime (ACL return code))\n")


def test_a_reader_that_stops_early_ends_the_output_quietly(monkeypatch, capsys):
    """``npu-port doctor --explain list | head``: the closed pipe is not a traceback (exit 141, as for SIGPIPE), and
    later writes go nowhere."""
    from npu_port.cli.main import EXIT_BROKEN_PIPE, main

    read_end, write_end = os.pipe()

    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

        def fileno(self):
            return write_end

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    try:
        assert main(["doctor", "--explain", "list"]) == EXIT_BROKEN_PIPE
        assert capsys.readouterr().err == ""
        os.write(write_end, b"after")  # write_end is /dev/null now
        os.close(write_end)
        assert os.read(read_end, 100) == b""
    finally:
        os.close(read_end)
