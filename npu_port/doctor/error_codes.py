"""What the CANN / ACL / aclnn / torch_npu error codes people paste mean, and what to do: ``npu-port doctor --explain``.

Each entry is a fact with its source: the names and one-line meanings come from the headers and tables that define
the codes (CANN runtime ``rt_error_codes.h``, torch_npu's ``NPUErrorCodes.h`` and ``_error_code.py``, CANN's
aclError / aclnn return-code pages, its error-code reference, CANN's ``opbase`` error registry); causes and fixes
seen in practice come from the issue threads each entry cites. Where a code's own documentation says only "see the
log", the entry says how to get the log and the failing operator, and no more. cuda-morph's ``error`` command was
read for which codes people ask about, not for facts (several of its meanings disagree with the CANN headers, e.g.
its 507011 "device memory allocation failed" is ``ACL_ERROR_RT_MODEL_EXECUTE``).

Two code families are decoded by their form rather than listed one by one, because their sources define them
completely: torch_npu's ``ERR<submodule><code>`` (``torch_npu/utils/_error_code.py``), and, only to describe a code
this table lacks, CANN's six-character ``E<module><number>`` codes (CANN's "error code description" page) and ACL's
six-digit classes (the aclError page's numbering rules).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

# --- sources -------------------------------------------------------------------------------------------------------
RT_HEADER = (
    "https://github.com/hicann/runtime/blob/15c6c8dba7eb6bceeea8a32de42e7241bf35e6e0/include/external/acl/"
    "error_codes/rt_error_codes.h"
)
TORCH_NPU_ACL_CODES = (
    "https://github.com/Ascend/pytorch/blob/05900fb636a88234b887aa9130e51dcf1bbc7226/torch_npu/csrc/core/npu/"
    "NPUErrorCodes.h"
)
TORCH_NPU_ERR_CODES = (
    "https://github.com/Ascend/pytorch/blob/2010cdbe1b62fdae01b5b7ed1af353c89bd57983/torch_npu/utils/_error_code.py"
)
ACL_ERROR_PAGE = (
    "https://www.hiascend.com/document/detail/en/CANNCommunityEdition/910/API/runtimeapi/aclcppdevg_03_6666.html"
)
ACLNN_PAGE = (
    "https://www.hiascend.com/document/detail/en/CANNCommunityEdition/910/API/aolapi/atlasascendc_api_07_1205.html"
)
ERROR_CODE_FORMAT = "https://www.hiascend.com/document/detail/en/canncommercial/850/maintenref/troubleshooting/troubleshooting_0225.html"
INNER_ERRORS = (
    "https://www.hiascend.com/document/detail/zh/canncommercial/800/developmentguide/maintenref/troubleshooting/"
    "atlaserrorcode_15_0314.html"
)
OPBASE_ERRORS = (
    "https://github.com/hicann/opbase/blob/1173bf366cc1457425fd4b17a9dc9b7169c24346/src/nnopbase/composite_op/log/"
    "op_error_manager.cpp"
)
LAUNCH_BLOCKING = (
    "https://github.com/Ascend/pytorch/blob/bc7fb138b7ffd4c038b780b5a8cb9ea330bb8125/docs/en/api/"
    "environment_variable/ASCEND_LAUNCH_BLOCKING.md"
)
LOG_TO_STDOUT = (
    "https://www.hiascend.com/document/detail/en/canncommercial/800/maintenref/logreference/logreference_0009.html"
)
OP_PLUGIN_DOCS = "https://github.com/Ascend/op-plugin/blob/master/codegen/templates/_op_plugin_docs.py"
MEM_UCE_PAGE = (
    "https://www.hiascend.com/document/detail/en/CANNCommunityEdition/910/API/runtimeapi/aclcppdevg_03_0140.html"
)
COMPATIBILITY = "https://github.com/Ascend/pytorch/blob/master/COMPATIBILITY.en.md"
EZ3002_PAGE = (
    "https://www.hiascend.com/document/detail/en/canncommercial/800/maintenref/troubleshooting/"
    "atlaserrorcode_15_0309.html"
)
EZ3003_PAGE = (
    "https://www.hiascend.com/document/detail/en/CANNCommunityEdition/900/maintenref/troubleshooting/"
    "atlaserrorcode_15_0308.html"
)
EE1001_PAGE = (
    "https://www.hiascend.com/document/detail/zh/canncommercial/800/developmentguide/maintenref/troubleshooting/"
    "atlaserrorcode_15_0179.html"
)
EL0004_PAGE = (
    "https://www.hiascend.com/document/detail/en/CANNCommunityEdition/900/maintenref/troubleshooting/"
    "atlaserrorcode_15_0267.html"
)
VLLM_OMNI_6054 = "https://github.com/vllm-project/vllm-omni/pull/6054"
VLLM_ASCEND_11519 = "https://github.com/vllm-project/vllm-ascend/issues/11519"
FASTCHAT_2843 = "https://github.com/lm-sys/FastChat/pull/2843"
ASCEND_PYTORCH_7 = "https://github.com/Ascend/pytorch/issues/7"
PTOAS_341 = "https://github.com/hw-native-sys/PTOAS/pull/341"
PTOAS_875 = "https://github.com/hw-native-sys/PTOAS/pull/875"
FLA_NPU_431 = "https://github.com/flashserve/flash-linear-attention-npu/pull/431"

# --- advice shared by several entries -------------------------------------------------------------------------------
LOCATE = (
    "rerun with ASCEND_LAUNCH_BLOCKING=1 (operators run synchronously, so the traceback names the operator that "
    "failed) and ASCEND_SLOG_PRINT_TO_STDOUT=1 (CANN's log on the terminal)"
)
ASYNC = (
    "it is reported asynchronously, at the next synchronisation ('ACL stream synchronize failed, error code:...'), "
    "so the Python line in the traceback is usually not the operator at fault"
)
REPORT = "a 5xxxxx code is an internal error the script cannot fix: report it with CANN's log and the versions"
OOM_FIX = (
    "lower batch / resolution / frames; for attention the chunked strategy bounds score memory "
    '(npu_port.set_attention_strategy("chunked", target=pipe)); PYTORCH_NPU_ALLOC_CONF=expandable_segments:True '
    "reduces fragmentation; npu-smi info shows other processes using the device"
)
KERNEL_FIX = (
    f"{LOCATE}; check that operator's inputs against its documented limits (shape, dtype, layout); try the newest "
    "torch_npu / CANN pair"
)


@dataclass(frozen=True)
class ErrorCode:
    """One error code: what prints it, what it means in one line, its usual cause, the fix, and where that is from."""

    code: str
    name: str
    component: str
    summary: str
    cause: str
    fix: str
    sources: Tuple[str, ...]

    def as_dict(self) -> Dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "component": self.component,
            "summary": self.summary,
            "cause": self.cause,
            "fix": self.fix,
            "sources": list(self.sources),
        }


RUNTIME = "CANN runtime (ACL return code)"
ACL = "ACL (return code)"
ACLNN = "aclnn operator API (return code)"
TORCH_NPU = "torch_npu"


def _inner(code: str, module: str, cause: str, fix: str, *sources: str) -> ErrorCode:
    """An ``E?9999`` code: CANN's internal error of one module (its error-code reference lists them together)."""
    return ErrorCode(
        code,
        "Inner_Error",
        f"CANN {module}",
        f"internal error in CANN's {module}",
        cause,
        fix,
        (INNER_ERRORS, ERROR_CODE_FORMAT, *sources),
    )


ERROR_CODES: Tuple[ErrorCode, ...] = (
    # --- ACL / runtime return codes (numbers) ---------------------------------------------------------------------
    ErrorCode(
        "100000",
        "ACL_ERROR_INVALID_PARAM",
        ACL,
        "an ACL API rejected an argument (parameter verification failed)",
        "an ACL call (device, memory, stream API) got an argument it does not accept",
        "check the arguments of the call named in the message; CANN's log says which (ASCEND_SLOG_PRINT_TO_STDOUT=1)",
        (ACL_ERROR_PAGE, TORCH_NPU_ACL_CODES, "https://github.com/vllm-project/vllm-ascend/issues/2171"),
    ),
    ErrorCode(
        "107001",
        "ACL_ERROR_RT_INVALID_DEVICEID",
        RUNTIME,
        "invalid device id",
        "the code asked for an NPU index that this process cannot see",
        "use an index below torch.npu.device_count(); check ASCEND_RT_VISIBLE_DEVICES and npu-smi info",
        (RT_HEADER, TORCH_NPU_ACL_CODES),
    ),
    ErrorCode(
        "107002",
        "ACL_ERROR_RT_CONTEXT_NULL",
        RUNTIME,
        "no current device context in this thread or process",
        "NPU work (an allocation, a kernel) ran in a process or thread that never selected a device "
        "(no acl.rt.set_device / set_context there), typically a freshly started worker process; CANN prints it with "
        "EE1001 'context pointer null'",
        "call torch.npu.set_device(index) in each process (and thread) before its first NPU tensor",
        (RT_HEADER, TORCH_NPU_ACL_CODES, FASTCHAT_2843),
    ),
    ErrorCode(
        "107020",
        "ACL_ERROR_RT_TASK_TIMEOUT",
        RUNTIME,
        "a device task timed out",
        "a task on the device did not finish within its time limit; torch_npu treats 'error code is 107020' as an "
        "NPU timeout and gives the other processes a moment to exit before it does",
        f"in a multi-process job, find the process that failed first (its log has the cause); {LOCATE}",
        (RT_HEADER, TORCH_NPU_ERR_CODES),
    ),
    ErrorCode(
        "207001",
        "ACL_ERROR_RT_MEMORY_ALLOCATION",
        RUNTIME,
        "device out of memory",
        "an allocation on the NPU failed for lack of free device memory (the header: used only for out of memory)",
        OOM_FIX,
        (RT_HEADER, TORCH_NPU_ACL_CODES),
    ),
    ErrorCode(
        "207018",
        "ACL_ERROR_RT_DEVICE_OOM",
        RUNTIME,
        "the memory on the device is exhausted",
        "the device ran out of memory",
        OOM_FIX,
        (RT_HEADER, TORCH_NPU_ACL_CODES),
    ),
    ErrorCode(
        "507011",
        "ACL_ERROR_RT_MODEL_EXECUTE",
        RUNTIME,
        "model execution failed on the device",
        "a model (operators the runtime executes as one unit, such as a loaded or captured graph) failed; the "
        f"failing operator is in CANN's log, and {ASYNC}",
        f"run the same step without graph capture / compilation, then {LOCATE}",
        (RT_HEADER, TORCH_NPU_ACL_CODES, "https://github.com/vllm-project/vllm-ascend/issues/7676"),
    ),
    ErrorCode(
        "507013",
        "ACL_ERROR_RT_SYS_DMA",
        RUNTIME,
        "system DMA hardware execution error",
        "the device's DMA (memory copy) hardware reported an error",
        f"{REPORT} (ASCEND_SLOG_PRINT_TO_STDOUT=1 prints the log)",
        (RT_HEADER, TORCH_NPU_ACL_CODES, ACL_ERROR_PAGE),
    ),
    ErrorCode(
        "507014",
        "ACL_ERROR_RT_AICORE_TIMEOUT",
        RUNTIME,
        "an AI Core kernel ran past its time limit (aicore timeout)",
        "one operator call did too much work: the attention operators' docs say a large B*S*N*D can time out "
        f"('timeout or trap error') and advise splitting the sequence; {ASYNC}",
        f"split the work (the chunked strategy splits the sequence) or use smaller batch / sequence; {LOCATE}",
        (RT_HEADER, TORCH_NPU_ACL_CODES, OP_PLUGIN_DOCS, "https://github.com/vllm-project/vllm-ascend/issues/4914"),
    ),
    ErrorCode(
        "507015",
        "ACL_ERROR_RT_AICORE_EXCEPTION",
        RUNTIME,
        "a kernel failed on the AI Core (aicore exception)",
        "an operator's kernel faulted on the device, e.g. an out-of-range memory access by a kernel given inputs it "
        f"does not handle, or a kernel bug; {ASYNC}",
        KERNEL_FIX,
        (
            RT_HEADER,
            TORCH_NPU_ACL_CODES,
            LAUNCH_BLOCKING,
            "https://github.com/vllm-project/vllm-ascend/issues/5661",
            "https://github.com/MinghuasLab/flash-attention-npu/issues/237",
        ),
    ),
    ErrorCode(
        "507033",
        "ACL_ERROR_RT_DEV_SETUP_ERROR",
        RUNTIME,
        "the device could not be set up (failed to start the device)",
        "setting the device failed, e.g. not enough free device memory to open it (logged before it as EL0004 "
        "'Failed to allocate memory'), typically because other processes hold the device",
        "npu-smi info shows the processes on each device: stop stale ones or pick a free device "
        "(ASCEND_RT_VISIBLE_DEVICES)",
        (RT_HEADER, TORCH_NPU_ACL_CODES, PTOAS_341),
    ),
    ErrorCode(
        "507034",
        "ACL_ERROR_RT_VECTOR_CORE_TIMEOUT",
        RUNTIME,
        "a Vector Core kernel ran past its time limit",
        f"one operator call ran too long on the Vector Core; {ASYNC}",
        f"split the work or use smaller sizes; {LOCATE}",
        (RT_HEADER, TORCH_NPU_ACL_CODES, "https://github.com/vllm-project/vllm-ascend/issues/1972"),
    ),
    ErrorCode(
        "507035",
        "ACL_ERROR_RT_VECTOR_CORE_EXCEPTION",
        RUNTIME,
        "a kernel failed on the Vector Core (vector core exception)",
        "an operator's kernel faulted on the Vector Core (the AI Vector counterpart of 507015: inputs the kernel "
        f"does not handle, or a kernel bug); {ASYNC}",
        KERNEL_FIX,
        (RT_HEADER, TORCH_NPU_ACL_CODES, LAUNCH_BLOCKING, "https://github.com/vllm-project/vllm-ascend/issues/2763"),
    ),
    ErrorCode(
        "507053",
        "ACL_ERROR_RT_DEVICE_MEM_ERROR",
        RUNTIME,
        "uncorrectable device memory error (memory UCE)",
        "the device's memory reported an error the hardware cannot correct: a hardware fault, not the script",
        "stop using that device and report it with CANN's log to whoever runs the machine / Ascend support; "
        "rerun the job on another device",
        (RT_HEADER, MEM_UCE_PAGE, ACL_ERROR_PAGE),
    ),
    ErrorCode(
        "507054",
        "ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR",
        RUNTIME,
        "HBM multi-bit ECC error",
        "the device's HBM reported a multi-bit ECC error: a hardware fault, not the script",
        "stop using that device and report it with CANN's log; rerun the job on another device",
        (RT_HEADER, ACL_ERROR_PAGE),
    ),
    ErrorCode(
        "507899",
        "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
        RUNTIME,
        "internal error in the NPU driver",
        "the driver failed; Ascend ties driver and firmware versions to the CANN version, so a driver that does not "
        "match the installed CANN is the first thing to rule out",
        f"check (npu-smi info) that driver and firmware are the versions your CANN asks for; then {REPORT}",
        (RT_HEADER, TORCH_NPU_ACL_CODES, COMPATIBILITY),
    ),
    ErrorCode(
        "148049",
        "ACL_ERROR_INVALID_OPP_PATH",
        ACL,
        "ASCEND_OPP_PATH is not set, or wrong",
        "the operator package location, which CANN's set_env.sh exports as ASCEND_OPP_PATH, is missing",
        "source /usr/local/Ascend/ascend-toolkit/set_env.sh (or your CANN's set_env.sh) in this shell",
        (ACL_ERROR_PAGE, TORCH_NPU_ACL_CODES),
    ),
    # --- aclnn operator API status codes --------------------------------------------------------------------------
    ErrorCode(
        "161001",
        "ACLNN_ERR_PARAM_NULLPTR",
        ACLNN,
        "an aclnn operator got a null argument",
        "parameter check failed: an argument the operator requires was a null pointer (e.g. a tensor passed as None)",
        "read the AclNN_Parameter_Error (EZ1001) text printed with it: it names the argument",
        (ACLNN_PAGE,),
    ),
    ErrorCode(
        "161002",
        "ACLNN_ERR_PARAM_INVALID",
        ACLNN,
        "an aclnn operator rejected its arguments",
        "parameter check failed, e.g. two input dtypes that do not combine, shapes that do not broadcast, an empty "
        "tensor; printed together with AclNN_Parameter_Error(EZ1001) and a message naming the problem",
        "read the EZ1001 message and give the operator the dtypes / shapes it documents (cast or reshape first)",
        (ACLNN_PAGE, OPBASE_ERRORS),
    ),
    ErrorCode(
        "361001",
        "ACLNN_ERR_RUNTIME_ERROR",
        ACLNN,
        "an aclnn operator's call into the NPU runtime failed",
        "the operator called a runtime API that failed (the aclnn page: a memory error in that call)",
        "look for the runtime code printed with it (e.g. 207001, out of memory) and explain that",
        (ACLNN_PAGE,),
    ),
    ErrorCode(
        "561000",
        "ACLNN_ERR_INNER",
        ACLNN,
        "internal error in an aclnn operator",
        "the operator failed internally; the EZ9999 text printed with it has details",
        f"{LOCATE}; then report it with the versions",
        (ACLNN_PAGE,),
    ),
    ErrorCode(
        "561002",
        "ACLNN_ERR_INNER_TILING_ERROR",
        ACLNN,
        "an aclnn operator failed to tile its NPU kernel",
        "the operator could not split its work for these shapes",
        "check the shapes against the operator's documented limits; otherwise report it with the shapes",
        (ACLNN_PAGE,),
    ),
    ErrorCode(
        "561003",
        "ACLNN_ERR_INNER_FIND_KERNEL_ERROR",
        ACLNN,
        "no NPU kernel found for an operator",
        "the operator's kernel binary could not be found, possibly because the operator binary package is not "
        "installed",
        "install CANN's operator (kernels) package for this chip, the same version as the toolkit, and source "
        "set_env.sh",
        (ACLNN_PAGE,),
    ),
    ErrorCode(
        "561103",
        "ACLNN_ERR_INNER_NULLPTR",
        ACLNN,
        "null pointer inside an aclnn operator",
        "an internal null pointer; seen when a custom-op package (e.g. fla_npu, MindIE-SD) adds its operators to "
        "ASCEND_CUSTOM_OPP_PATH after CANN already registered operators in this process",
        "for a custom-op package: put its operator directory on ASCEND_CUSTOM_OPP_PATH before starting Python, or "
        "import the package before the first NPU operator; otherwise report it",
        (ACLNN_PAGE, FLA_NPU_431),
    ),
    ErrorCode(
        "561107",
        "ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND",
        ACLNN,
        "ASCEND_OPP_PATH is not set",
        "the environment variable ASCEND_OPP_PATH, which CANN's set_env.sh exports, was not found",
        "source /usr/local/Ascend/ascend-toolkit/set_env.sh (or your CANN's set_env.sh)",
        (ACLNN_PAGE,),
    ),
    ErrorCode(
        "561112",
        "ACLNN_ERR_INNER_OPP_KERNEL_PKG_NOT_FOUND",
        ACLNN,
        "the operator binary kernel library is not loaded",
        "CANN's binary kernel package was not found / loaded",
        "install CANN's operator (kernels) package for this chip, the same version as the toolkit",
        (ACLNN_PAGE,),
    ),
    # --- CANN error codes (E + module + number) --------------------------------------------------------------------
    ErrorCode(
        "EZ1001",
        "AclNN_Parameter_Error",
        "CANN aclnn operators",
        "an aclnn operator rejected its call; the text after the code says why",
        "printed with aclnn status 161001 / 161002: (a) an argument check (dtype, shape, empty tensor); or (b) "
        "'Get regInfo failed, The binary_info_config.json of socVersion [X] does not support opType [Y]': no kernel "
        "of operator Y is registered for this chip, because it is not built for the chip or because a custom-op "
        "package (MindIE-SD) put its operators on ASCEND_CUSTOM_OPP_PATH after CANN's first operator lookup, which "
        "lasts for the whole process",
        "(a) give the operator the dtypes / shapes it documents; (b) import the custom-op package (import mindiesd) "
        "before the first NPU operator, or export its directories on ASCEND_CUSTOM_OPP_PATH before starting Python; "
        "an operator built only for other chips cannot run on this one",
        (OPBASE_ERRORS, VLLM_OMNI_6054, VLLM_ASCEND_11519),
    ),
    ErrorCode(
        "EZ9903",
        "AclNN_Runtime_Error",
        "CANN aclnn operators",
        "an aclnn operator hit a runtime error",
        "a runtime call inside the operator failed; CANN's registry gives no cause beyond the message",
        "collect the plog when it happens and locate the fault by it (CANN's advice); ASCEND_SLOG_PRINT_TO_STDOUT=1 "
        "prints it",
        (OPBASE_ERRORS, LOG_TO_STDOUT),
    ),
    ErrorCode(
        "EZ3002",
        "Unsupported_Operator",
        "CANN public operator errors",
        "an operator type is unsupported (specification mismatch)",
        "the operator type is unsupported in the operator information library for these inputs (specification "
        "mismatch)",
        "replace or remove that operator, or request support from Ascend",
        (EZ3002_PAGE,),
    ),
    ErrorCode(
        "EZ3003",
        "Unsupported_Operator",
        "CANN public operator errors",
        "no operator kernel or engine for an operator type",
        "no operator information library has the operator type",
        "check that CANN's OPP (operator package) component is installed properly; otherwise request support for "
        "the operator type",
        (EZ3003_PAGE,),
    ),
    ErrorCode(
        "EE1001",
        "Invalid_Argument",
        "CANN runtime",
        "a runtime API got an invalid argument; 'Reason:' says which",
        "a catch-all runtime argument error; e.g. 'rtGetDevMsg execute failed, reason=[context pointer null]' "
        "(with 107002) when a process uses the NPU before selecting a device",
        "check the argument range and the order of calls (Ascend's advice); for 'context pointer null' call "
        "torch.npu.set_device(index) first in that process",
        (EE1001_PAGE, FASTCHAT_2843),
    ),
    ErrorCode(
        "EL0004",
        "Memory_Allocation_Failure",
        "CANN driver",
        "the driver could not allocate memory",
        "available memory is insufficient (Ascend's text); at device set-up it comes with 507033",
        "free memory: close applications not in use (npu-smi info lists the processes on each device) or make the "
        "job smaller",
        (EL0004_PAGE, PTOAS_341),
    ),
    _inner(
        "EZ9999",
        "aclnn operators",
        "an internal error in the operator layer (CANN's registry: AclNN_Inner_Error); when the lines after it show "
        "'aicore exception' or core error info, a kernel faulted on the device (see 507015)",
        "check that the CANN packages (toolkit and kernels) are complete and the same version, and that set_env.sh "
        f"is sourced (CANN's advice); then {LOCATE}",
        OPBASE_ERRORS,
        PTOAS_875,
    ),
    _inner(
        "EE9999",
        "runtime",
        "an internal error in CANN's runtime; the lines after it and the ACL code printed with it (often 507015, "
        "507035 or 507014) say more",
        f"explain the ACL code printed with it; otherwise {LOCATE} and report it",
    ),
    _inner(
        "E39999",
        "AI CPU module",
        "an internal error in CANN's AI CPU module (operators run on the AI CPU rather than the AI Core)",
        f"{LOCATE}; report it with the log",
    ),
    _inner(
        "EI9999",
        "HCCL (collective communication)",
        "an internal error in HCCL during a collective (torch.distributed on hccl)",
        "the log of the first rank that failed usually names the cause; report it with every rank's log",
    ),
    _inner(
        "EH9999",
        "ACL",
        "an internal error in ACL; '[Init][Env]init env failed' at the first .npu() means Python packages CANN needs "
        "are missing",
        "pip install decorator sympy cffi protobuf attrs pyyaml scipy psutil (the list in Ascend/pytorch#7), then "
        "retry; otherwise report it with CANN's log",
        ASCEND_PYTORCH_7,
    ),
    # --- torch_npu's own codes (ERR<submodule><code>) -------------------------------------------------------------
    ErrorCode(
        "ERR99999",
        "UNKNOWN application exception",
        TORCH_NPU,
        "torch_npu's exit line after an exception that did not come from torch_npu",
        "torch_npu's exception handler prints '[ERROR] ... ERR99999 UNKNOWN applicaiton exception' (sic) when the "
        "process ends on any uncaught exception raised by PyTorch, another library or the script itself (an "
        "ImportError, a PermissionError, ...): it is not an NPU error",
        "read the traceback above it: that exception is the real error (run npu-port doctor --explain on it if it "
        "carries an NPU code)",
        (TORCH_NPU_ERR_CODES,),
    ),
)

#: torch_npu's ``_SubModuleID`` and ``ErrCode`` (torch_npu/utils/_error_code.py): ``ERR{submodule:02}{code:03}``.
TORCH_NPU_SUBMODULES: Dict[int, str] = {0: "PTA", 1: "OPS", 2: "DIST", 3: "GRAPH", 4: "PROF", 99: "UNKNOWN"}
TORCH_NPU_ERRORS: Dict[int, str] = {
    0: "success",
    1: "invalid parameter",
    2: "invalid type",
    3: "invalid value",
    4: "invalid pointer",
    5: "internal error",
    6: "memory error",
    7: "feature not supported",
    8: "resource not found",
    9: "resource unavailable",
    10: "system call failed",
    11: "timeout error",
    12: "permission error",
    100: "call acl api failed",
    200: "call hccl api failed",
    300: "call ge api failed",
    999: "application exception",
}
_SUBMODULE_MEANING = {
    "PTA": "torch_npu's core",
    "OPS": "an operator",
    "DIST": "torch.distributed on hccl",
    "GRAPH": "graph mode",
    "PROF": "the profiler",
    "UNKNOWN": "an unknown component",
}
#: CANN's module letters (the second character of ``E?????``), from its error-code description page.
CANN_MODULES: Dict[str, str] = {
    "1": "GE",
    "2": "FE",
    "3": "AI CPU",
    "4": "TE Fusion",
    "7": "vector operator plugin",
    "8": "vector operator",
    "B": "TBE Pass compilation tool",
    "C": "Auto Tune",
    "D": "RL Tune",
    "E": "runtime",
    "F": "LxFusion and AutoDeploy",
    "G": "AOE",
    "H": "ACL",
    "I": "HCCL",
    "J": "HCCP",
    "K": "Profiling",
    "L": "driver",
    "M": "queue scheduling",
    "N": "DVPP",
    "O": "AMCT",
    "P": "Dump",
    "Z": "operator / aclnn",
}
#: The aclError page's numbering rules: the first digit of a six-digit return code is its class.
ACL_CLASSES: Dict[str, str] = {
    "1": "environment or code-logic error the user can fix",
    "2": "resources (stream, memory) or arguments that do not match the hardware",
    "3": "service error (e.g. a queue full or empty)",
    "5": "internal software / hardware error: report it with the log",
}

_BY_CODE: Dict[str, ErrorCode] = {entry.code: entry for entry in ERROR_CODES}
#: A code anywhere in pasted text: ``E`` + module + 4 digits, torch_npu's ``ERR`` + 5 digits, or a 6-digit number
#: standing alone (not part of a longer number or word, so PIDs and timestamps inside longer runs do not match).
_TOKEN = re.compile(r"(?<![0-9A-Za-z_])(E[0-9A-Z][0-9]{4}|ERR[0-9]{5}|[0-9]{6})(?![0-9A-Za-z_])", re.IGNORECASE)
LIST_WORD = "list"


def tokens(text: str) -> List[str]:
    """Every code-shaped token in ``text``, upper-cased, in order, without repeats."""
    found = [match.group(1).upper() for match in _TOKEN.finditer(text)]
    return list(dict.fromkeys(found))


def lookup(code: str) -> Optional[ErrorCode]:
    """The entry for one code (any case), including any torch_npu ``ERR`` code its source table defines."""
    code = code.strip().upper()
    return _BY_CODE.get(code) or _torch_npu_code(code)


def _torch_npu_code(code: str) -> Optional[ErrorCode]:
    match = re.fullmatch(r"ERR([0-9]{2})([0-9]{3})", code)
    if match is None:
        return None
    submodule = TORCH_NPU_SUBMODULES.get(int(match.group(1)))
    error = TORCH_NPU_ERRORS.get(int(match.group(2)))
    if submodule is None or error is None:
        return None
    where = _SUBMODULE_MEANING[submodule]
    if error.startswith("call "):
        library = error.split()[1].upper()
        cause = (
            f"{where}: a call to {library} failed; the same message carries {library}'s own code "
            "('error code is NNNNNN')"
        )
        fix = "explain the library's code too: npu-port doctor --explain '<the whole error line>' finds both"
    else:
        cause = f"torch_npu reports '{error}' from {where}; the text before the code says what"
        fix = "read the message printed with the code; it names the argument or resource"
    return ErrorCode(
        code, f"{submodule} {error}", TORCH_NPU, f"torch_npu {submodule}: {error}", cause, fix, (TORCH_NPU_ERR_CODES,)
    )


def find(text: str) -> List[ErrorCode]:
    """The known codes in ``text`` (a code, or a pasted log line), in the order they appear."""
    return [entry for entry in (lookup(token) for token in tokens(text)) if entry is not None]


def describe_form(token: str) -> Optional[str]:
    """What a code this table lacks is, by its form alone, or None when it has no known form."""
    token = token.upper()
    if re.fullmatch(r"E[0-9A-Z][0-9]{4}", token):
        module = CANN_MODULES.get(token[1])
        if module is None:
            return None
        kind = "internal" if int(token[2:]) >= 9000 else "user"
        return f"a CANN {module} error code, {kind} class"
    if re.fullmatch(r"[0-9]{6}", token):
        klass = ACL_CLASSES.get(token[0])
        return f"an ACL return code of class {token[0]}: {klass}" if klass else None
    if re.fullmatch(r"ERR[0-9]{5}", token):
        return "a torch_npu error code, ERR<submodule><code>, with a submodule or code torch_npu does not define"
    return None


def unknown_message(query: str) -> str:
    """The one line for a query with no known code in it."""
    found = tokens(query)
    count = f"npu-port doctor --explain {LIST_WORD} shows the {len(ERROR_CODES)} codes it explains"
    if not found:
        return f"npu-port doctor --explain: no error code in {query!r}; {count}"
    if len(found) == 1:
        form = describe_form(found[0])
        what = f" (by its form: {form})" if form else ""
        return f"npu-port doctor --explain: {found[0]} is not a code npu-port knows{what}; {count}"
    return f"npu-port doctor --explain: none of {', '.join(found)} is a code npu-port knows; {count}"


def render(entries: Sequence[ErrorCode]) -> str:
    """Text for people: one block per code."""
    blocks = []
    for entry in entries:
        lines = [
            f"{entry.code}  {entry.name}  ({entry.component})",
            f"  what:   {entry.summary}",
            f"  cause:  {entry.cause}",
            f"  fix:    {entry.fix}",
        ]
        lines += [f"  {'source:' if i == 0 else '       '} {url}" for i, url in enumerate(entry.sources)]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def render_list() -> str:
    width = max(len(entry.code) for entry in ERROR_CODES)
    lines = [f"npu-port explains {len(ERROR_CODES)} error codes (npu-port doctor --explain CODE for one):"]
    lines += [f"  {entry.code:<{width}}  {entry.name}: {entry.summary}" for entry in ERROR_CODES]
    lines.append("  and any torch_npu ERR<submodule><code> code, decoded from torch_npu/utils/_error_code.py")
    return "\n".join(lines)


def markdown_table() -> str:
    """The table of codes the site's error-codes reference shows (docs/hooks/generated.py renders it)."""
    lines = ["| code | name | what it means |", "|---|---|---|"]
    lines += [f"| `{entry.code}` | `{entry.name}` | {entry.summary} |" for entry in ERROR_CODES]
    return "\n".join(lines) + "\n"
