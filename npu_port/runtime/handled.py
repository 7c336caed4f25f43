"""Which scan rule each thing ``npu-port run`` handled is an instance of: the one table from a mechanism's hit kind
to a rule code, and the report's ``by_rule`` section built from it (``npu-port scan`` lists the same codes as
"handled", so the two can be compared) — the calls the project's own code made — with ``by_library`` beside it: the
calls torch or an installed package made on its own account (who made a call: :mod:`npu_port.hits`).

Each mechanism counts what it answered in a :class:`npu_port.hits.HitLog` under kinds of its own — the CUDA
redirect per patched entry point (``"Tensor.cuda"``, ``"torch.cuda.synchronize"``), a drop-in or fallback per module
served, the flash_attn drop-in per function called, diffusers' xformers hook per switch, the device-type checks per
rewritten expression — and :data:`RULES` says which rule's pattern each kind is. The codes are plain strings:
importing the scan registry (``npu_port.scan``) would add about 30 ms to the start of every program ``npu-port run``
starts. ``tests/runtime/test_handled.py`` checks the table against the registry: every code in it is a registered
``handled`` rule whose ``handled_by`` names the mechanism, every ``handled`` rule is reached by some mechanism or is
in :data:`NOT_BY_RUN` with why, and every kind a mechanism counts is in :data:`RULES` or in :data:`NOT_A_RULE`.

What run does that is no rule's pattern is reported in its own sections only: the strategy's attention calls,
legacy attention classes routed (NPU401 finds hand-written attention, a ``perf`` finding: routing a legacy class is
how run serves some of it, not all), ``--override``, safe math, Ascend options.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..device.redirect.cuda_api import LEGACY_TENSOR_TYPES
from ..device.redirect.install import (
    CUDA_SAVED,
    DEVICE_MAP_ON_CPU,
    FACTORY_FUNCTIONS,
    TENSOR_FACTORY_METHODS,
    UNAVAILABLE,
    UNPINNED,
)
from ..hits import PLACES

#: The mechanisms, as the rules' ``handled_by`` names them.
REDIRECT = "the CUDA redirect"
FLASH_ATTN_DROPIN = "the flash_attn drop-in"
XFORMERS_DROPIN = "the xformers drop-in"
FALLBACK = "compiled-extension fallback"
XFORMERS_HOOK = "xformers hook"
DEVICE_CHECKS = "device-type checks"

#: The one kind of the device-type checks: an expression rewritten by :mod:`.device_checks` answered "cuda".
DEVICE_CHECK = "device-type check"

#: Rule code -> its name in the registry (for the report, without importing the registry).
NAMES: Dict[str, str] = {
    "NPU101": "flash-attn-import",
    "NPU102": "xformers-import",
    "NPU103": "cuda-extension-fallback",
    "NPU110": "flash-attn-call",
    "NPU112": "xformers-call",
    "NPU120": "diffusers-xformers-switch",
    "NPU301": "cuda-method",
    "NPU302": "cuda-sync-memory",
    "NPU303": "cuda-seed",
    "NPU304": "cuda-api-redirected",
    "NPU307": "cuda-autocast",
    "NPU308": "cuda-grad-scaler",
    "NPU309": "cuda-generator",
    "NPU310": "cuda-device-literal",
    "NPU311": "nccl-backend",
    "NPU313": "cuda-set-device",
    "NPU314": "sdp-kernel",
    "NPU390": "device-type-check",
}


#: ``torch.cuda`` calls the redirect answers, by the rule that reports them (names after ``torch.cuda.``).
SYNC_MEMORY = ("synchronize", "empty_cache", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats",
               "mem_get_info")  # fmt: skip
SEEDING = ("manual_seed", "manual_seed_all", "seed", "seed_all")
RAISING = ("current_device", "get_device_name", "get_device_properties", "get_device_capability", "initial_seed",
           "get_rng_state", "reset_max_memory_allocated", "reset_max_memory_cached", "reset_accumulated_memory_stats",
           "memory_summary", "set_per_process_memory_fraction", "ipc_collect", "init", "Event", "current_stream",
           "default_stream", "nvtx.range_push", "nvtx.range_pop", "nvtx.range", "nvtx.mark")  # fmt: skip
#: ... those that answer without CUDA anyway, but nothing of the target (0, {}): NPU304 reports them, handled, since
#: the redirect answers the target's figures ...
TARGET_FIGURES = ("memory_reserved", "max_memory_reserved", "memory_stats")
#: ... and those that answer without CUDA anyway (0, False, a null context): no rule reports them.
ANSWERING = ("device_count", "is_bf16_supported", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
             "stream")  # fmt: skip


def _cuda(code: str, names: Iterable[str]) -> Dict[str, str]:
    return {f"torch.cuda.{name}": code for name in names}


#: Mechanism -> {hit kind -> the rule whose pattern a hit of that kind handled}. Where the two are not one to one:
RULES: Dict[str, Dict[str, str]] = {
    REDIRECT: {
        # NPU301: the three methods (`storage.cuda()`: what `map_location=lambda storage, loc: storage.cuda()` calls).
        "Tensor.cuda": "NPU301",
        "Module.cuda": "NPU301",
        "Storage.cuda": "NPU301",
        # NPU302 is the six calls npu-port fix rewrites to npu_port.device helpers; the other memory counters
        # (memory_reserved, memory_stats...) answer 0 without CUDA and no rule reports them: NOT_A_RULE.
        **_cuda("NPU302", SYNC_MEMORY),
        **_cuda("NPU303", SEEDING),
        # NPU304: every other call that raises without CUDA and that the redirect answers. Stream, device and the
        # legacy tensor types are answered as classes (isinstance keeps working), which nothing counts: NPU304
        # findings of those are handled but never listed by run.
        **_cuda("NPU304", RAISING + TARGET_FIGURES),
        # NPU307 / NPU308: torch.amp's __init__, which torch.cuda.amp's classes call too. GradScaler() without a
        # device means CUDA, and counts, as NPU308 reports it.
        "autocast": "NPU307",
        "GradScaler": "NPU308",
        "torch.Generator": "NPU309",
        # NPU310 is where a CUDA device is *written* (a "cuda" string, torch.device("cuda", i)); the redirect counts
        # where one *reaches* torch — a device variable set from a literal once counts at every use, and a CUDA
        # ordinal (`.to(local_rank)`, which no rule reports) counts too.
        **{f"torch.{name}": "NPU310" for name in FACTORY_FUNCTIONS},
        **{f"Tensor.{name}": "NPU310" for name in TENSOR_FACTORY_METHODS},
        "torch.set_default_device": "NPU310",
        "torch.get_device_module": "NPU310",
        "Tensor.to": "NPU310",
        "Module.to": "NPU310",
        "Module.to_empty": "NPU310",
        "torch.load": "NPU310",  # map_location naming a CUDA device (without one: CUDA_SAVED, NOT_A_RULE)
        "DataLoader": "NPU310",  # pin_memory_device="cuda" (a *_device keyword)
        "from_pretrained": "NPU310",  # device_map naming a CUDA device, alone or as a dict's value
        "load_file": "NPU310",  # safetensors' load_file(path, device="cuda"), at the caller's line
        # NPU311: a backend naming nccl; one wrapper serves deepspeed's init_distributed and argparse defaults alike.
        "init_process_group": "NPU311",
        "new_group": "NPU311",
        "torch.cuda.set_device": "NPU313",
        "torch.backends.cuda.sdp_kernel": "NPU314",
    },
    # NPU101 / NPU102 report *unguarded* imports; a drop-in served to a guarded import (NPU106) or to a library
    # (diffusers imports xformers) counts too. A module is served once per process: its first importer is the place.
    FLASH_ATTN_DROPIN: {
        "flash_attn": "NPU101",
        "flash_attn.flash_attn_interface": "NPU101",
        "flash_attn.bert_padding": "NPU101",
        # NPU110: calls that returned (an argument the drop-in refuses raises: NPU111, not handled)
        "flash_attn_func": "NPU110",
        "flash_attn_qkvpacked_func": "NPU110",
        "flash_attn_kvpacked_func": "NPU110",
        "flash_attn_varlen_func": "NPU110",
        "flash_attn_varlen_qkvpacked_func": "NPU110",
        "flash_attn_varlen_kvpacked_func": "NPU110",
        "flash_attn_with_kvcache": "NPU110",
    },
    XFORMERS_DROPIN: {
        "xformers": "NPU102",
        "xformers.ops": "NPU102",
        "xformers.ops.fmha": "NPU102",
        "xformers.ops.fmha.attn_bias": "NPU102",
        # NPU112: calls that returned (a bias or function the drop-in lacks raises: NPU113, not handled)
        "memory_efficient_attention": "NPU112",
        "memory_efficient_attention_forward": "NPU112",
    },
    FALLBACK: {"alt_cuda_corr": "NPU103", "raft_alt_cuda_corr": "NPU103"},
    # NPU120 also reports `_use_memory_efficient_attention_xformers = True` and a project's own copy of the setter
    # (`FullyFrameAttention.set_use_memory_efficient_attention_xformers(True)`): run meets those by routing the legacy
    # class (the setter becomes a no-op), which NPU120's handled_by does not name, and they are not counted here.
    XFORMERS_HOOK: {
        "enable_xformers_memory_efficient_attention": "NPU120",
        "set_use_memory_efficient_attention_xformers": "NPU120",
    },
    DEVICE_CHECKS: {DEVICE_CHECK: "NPU390"},
}

#: Kinds a mechanism counts that are no rule's pattern, and why.
NOT_A_RULE: Dict[str, Dict[str, str]] = {
    REDIRECT: {
        **_cuda("answers without CUDA (0, {}, False, a null context): no rule reports it", ANSWERING),
        UNAVAILABLE: "the honest False answer, counted for the --cuda-available hint: nothing handled (NPU306 is a "
        "perf finding)",
        CUDA_SAVED: "torch.load without map_location of a CUDA-saved checkpoint: no CUDA is written in the code",
        "Tensor.pin_memory": "a no-op on a cpu target: pinning only speeds host-to-device copies",
        UNPINNED: "pin_memory=True is no CUDA pattern: on a cpu target, which has nothing to pin for, it is dropped "
        "(safetensors' CUDA loads stage through it)",
        DEVICE_MAP_ON_CPU: "an ordinal or an automatic device_map names no CUDA device (no rule reports it): on a cpu "
        "target torch.device(0) finds no accelerator, so the map is put on the cpu",
        "DistributedDataParallel": "device_ids mapped (or dropped on a cpu): no rule reports them",
    },
}

#: ``handled`` rules that ``npu-port run`` reaches through another rule's pattern, or not at all, and why.
NOT_BY_RUN: Dict[str, str] = {
    "NPU316": "run answers torch.cuda.device_count() with the target's count (0 while accelerate computes an "
    "automatic device_map for a cpu target), and counts none: most calls are no rule's pattern (a count that picks a "
    "path); NPU316 is the few that would stop the program with 0",
    "NPU601": "a requirements pin is read by pip, not run: the import it stands for counts as NPU101 / NPU102",
    "NPU651": "a config file's xformers / flash switch is read by the project: run counts what it leads to, the "
    "drop-in import (NPU101 / NPU102) or diffusers' switch (NPU120)",
    "NPU653": "a command-line option's xformers / flash switch is read by the project: run counts what it leads to, "
    "the drop-in import (NPU101 / NPU102) or diffusers' switch (NPU120)",
}

#: The CUDA legacy tensor types, answered as classes and not counted (see NPU304 above).
UNCOUNTED_CLASSES = ("Stream", "device", *LEGACY_TENSOR_TYPES)

#: HitLog.snapshot(): {kind: {"count", "project", "where": [(order, place)], "libraries": {name: {"count", "where"}}}}
Snapshot = Mapping[str, Mapping[str, Any]]


def device_check_hits(rewrites: Sequence[Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """The device-type checks' record (:meth:`DeviceChecks.summary`) as a hit snapshot: the rewrites that answered
    "cuda" at least once, in the order they were made (all the project's: only its own files are rewritten)."""
    answered = [item for item in rewrites if item["hits"]]
    if not answered:
        return {}
    count = sum(item["hits"] for item in answered)
    where = [(index, (item["file"], item["line"])) for index, item in enumerate(answered)]
    return {DEVICE_CHECK: {"count": count, "project": count, "where": where, "libraries": {}}}


def by_rule(sources: Iterable[Tuple[str, Optional[Snapshot]]]) -> Dict[str, Dict[str, Any]]:
    """``{code: {"name", "count", "where": ["file:line", ...]}}``, sorted by code, from ``(mechanism, snapshot)``
    pairs: the hits the project's own code made (see :mod:`npu_port.hits`); ``where`` holds the first
    :data:`~npu_port.hits.PLACES` places, first-come across mechanisms. Kinds in :data:`NOT_A_RULE` are left out."""
    return _by_rule((code, hit["project"], hit["where"]) for code, hit in _coded(sources))


def by_library(sources: Iterable[Tuple[str, Optional[Snapshot]]]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """``{library: {code: {"name", "count", "where"}}}``, sorted by name then code: the hits a library made (torch,
    an installed package; ``"(no caller)"`` for callbacks with no caller frame), as :func:`by_rule` lists the
    project's."""
    hits: Dict[str, List[Tuple[str, int, Sequence[Any]]]] = {}
    for code, hit in _coded(sources):
        for library, item in hit["libraries"].items():
            hits.setdefault(library, []).append((code, item["count"], item["where"]))
    return {library: _by_rule(hits[library]) for library in sorted(hits)}


def _coded(sources: Iterable[Tuple[str, Optional[Snapshot]]]) -> Iterable[Tuple[str, Mapping[str, Any]]]:
    """``(code, hit)`` for every kind hit that is a rule's pattern."""
    for mechanism, snapshot in sources:
        table = RULES.get(mechanism, {})
        for kind, hit in (snapshot or {}).items():
            code = table.get(kind)
            if code is not None:
                yield code, hit


def _by_rule(hits: Iterable[Tuple[str, int, Sequence[Any]]]) -> Dict[str, Dict[str, Any]]:
    counts: Dict[str, int] = {}
    places: Dict[str, List[Tuple[int, Tuple[str, int]]]] = {}
    for code, count, where in hits:
        if count:
            counts[code] = counts.get(code, 0) + count
            places.setdefault(code, []).extend(where)
    result = {}
    for code in sorted(counts):
        shown: List[str] = []
        for _, (filename, line) in sorted(places[code], key=lambda item: item[0]):
            text = f"{filename}:{line}"
            if text not in shown:
                shown.append(text)
        count = counts[code]
        if code in IMPORT_CODES and shown:  # `import xformers.ops` serves two modules from one line: one import
            count = len(shown)
        result[code] = {"name": NAMES[code], "count": count, "where": shown[:PLACES]}
    return result


#: Codes whose hits are modules served: each is served once per process, from the line that first imported it, and
#: an import statement counts once however many modules it made the drop-in serve (a package and its submodule).
IMPORT_CODES = frozenset(("NPU101", "NPU102", "NPU103"))


def format_by_rule(
    handled: Mapping[str, Mapping[str, Any]],
    folder: Optional[str] = None,
    libraries: Optional[Mapping[str, Mapping[str, Mapping[str, Any]]]] = None,
) -> List[str]:
    """The summary's lines for ``by_rule`` (paths under ``folder``, default the working directory, made relative),
    then for ``by_library`` when a library made calls (paths below ``site-packages``)."""
    folder = os.path.abspath(folder or os.getcwd())
    if not handled:
        lines = ["  handled, by scan rule: none"]
    else:
        lines = ["  handled, by scan rule (npu-port scan lists these codes as handled):"]
        lines += [_line(f"    {code}", item, folder) for code, item in handled.items()]
    if libraries:
        lines.append("  handled inside libraries (calls their own code made, not lines of yours):")
        for library, codes in libraries.items():
            lines += [_line(f"    {library} {code}", item, folder) for code, item in codes.items()]
    return lines


def _line(head: str, item: Mapping[str, Any], folder: str) -> str:
    where = ", ".join(_shown(place, folder) for place in item["where"])
    return f"{head} {item['name']} x{item['count']}" + (f"  ({where})" if where else "")


def _shown(place: str, folder: str) -> str:
    filename, _, line = place.rpartition(":")
    if os.path.isabs(filename) and filename.startswith(folder + os.sep):
        filename = os.path.relpath(filename, folder)
    else:
        for marker in (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep):
            if marker in filename:
                filename = filename.split(marker, 1)[1]
                break
    return f"{filename}:{line}"
