"""The one table from what ``npu-port run`` counts to scan rule codes (npu_port/runtime/handled.py), against the scan
registry and against what each mechanism really counts: run's ``by_rule`` and ``npu-port scan``'s "handled" must
name the same patterns."""

from __future__ import annotations

import torch

from npu_port.device.redirect import redirect_cuda
from npu_port.device.redirect.install import FACTORY_FUNCTIONS
from npu_port.dropins import flash_attn_impl, xformers_fmha_impl
from npu_port.dropins.install import CALLS, DROP_INS, XFORMERS_CALLS
from npu_port.fallbacks.registry import BUILTIN_FALLBACKS
from npu_port.integrations.legacy_attention.contract import XFORMERS_SETTER
from npu_port.integrations.legacy_attention.xformers_hook import ENABLE
from npu_port.runtime import handled
from npu_port.scan.engine import scan_file
from npu_port.scan.rule import rules
from npu_port.scan.rules import _attention_calls, _device
from npu_port.scan.rules.npu304_cuda_api_redirected import ELSEWHERE

REGISTRY = {rule.code: rule for rule in rules()}
HANDLED = {code for code, rule in REGISTRY.items() if rule.severity == "handled"}
CODES = {code for table in handled.RULES.values() for code in table.values()}


def test_every_code_is_a_handled_rule_whose_handled_by_names_the_mechanism():
    for mechanism, table in handled.RULES.items():
        for kind, code in table.items():
            rule = REGISTRY[code]
            assert rule.severity == "handled", (kind, code)
            assert mechanism in rule.handled_by, (kind, code, rule.handled_by)
    assert handled.NAMES == {code: REGISTRY[code].name for code in CODES}


def test_every_handled_rule_is_reached_by_run_or_said_not_to_be():
    assert CODES | set(handled.NOT_BY_RUN) == HANDLED
    assert CODES & set(handled.NOT_BY_RUN) == set()
    assert all(REGISTRY[code].severity == "handled" for code in handled.NOT_BY_RUN)


def test_every_kind_the_redirect_counts_is_mapped_to_a_rule_or_said_not_to_be():
    import safetensors.torch  # noqa: F401 - the redirect wraps the loaders imported so far; alone, nothing had

    with redirect_cuda("cpu") as redirect:
        kinds = redirect.hit_log().kinds
    mapped, not_a_rule = set(handled.RULES[handled.REDIRECT]), set(handled.NOT_A_RULE[handled.REDIRECT])
    assert mapped & not_a_rule == set()
    assert kinds - mapped - not_a_rule == set()
    missing_here = {f"torch.{name}" for name in FACTORY_FUNCTIONS if not hasattr(torch, name)}
    assert (mapped | not_a_rule) - kinds <= missing_here  # nothing in the table that the redirect never counts


def _handled_codes(tmp_path, line):
    """The handled codes ``npu-port scan`` gives ``line`` inside a function (never at import time)."""
    path = tmp_path / "probe.py"
    path.write_text(f"import torch\n\n\ndef f():\n    {line}\n")
    return {f.code for f in scan_file(str(path), False, rules()).findings if f.severity == "handled"}


def test_each_torch_cuda_kind_has_the_code_the_scan_gives_that_call(tmp_path):
    table = handled.RULES[handled.REDIRECT]
    with redirect_cuda("cpu") as redirect:
        kinds = sorted(k for k in redirect.hit_log().kinds if k.startswith("torch.cuda."))
    arguments = {"set_device": "0", "manual_seed": "0", "manual_seed_all": "0", "set_rng_state": "s"}
    for kind in kinds:
        name = kind[len("torch.cuda.") :]
        if name.startswith("nvtx."):
            arguments[name] = '"x"'
        expected = {table[kind]} if kind in table else set()
        assert _handled_codes(tmp_path, f"{kind}({arguments.get(name, '')})") == expected, kind


def test_the_cuda_calls_the_scan_calls_handled_but_run_cannot_count_are_classes():
    counted = {kind[len("torch.cuda.") :] for kind, code in handled.RULES[handled.REDIRECT].items() if code == "NPU304"}
    scan_304 = {n for n in _device.REDIRECTED if _device.classify(n) == _device.RAISES and n not in ELSEWHERE}
    assert scan_304 - counted == set(handled.UNCOUNTED_CLASSES)


def test_each_other_redirect_kind_has_the_code_the_scan_gives_its_pattern(tmp_path):
    table = handled.RULES[handled.REDIRECT]
    patterns = {
        "Tensor.cuda": "x.cuda()",
        "Module.cuda": "model.cuda()",
        "autocast": 'torch.autocast("cuda")',
        "GradScaler": "torch.amp.GradScaler()",
        "torch.Generator": 'torch.Generator("cuda")',
        "torch.zeros": 'torch.zeros(2, device="cuda")',
        "Tensor.new_zeros": 'x.new_zeros(2, device="cuda")',
        "Tensor.to": 'x.to("cuda")',
        "Module.to": 'model.to(device="cuda:0")',
        "torch.load": 'torch.load("ckpt.pt", map_location="cuda")',
        "torch.set_default_device": 'torch.set_default_device("cuda")',
        "init_process_group": 'torch.distributed.init_process_group(backend="nccl")',
        "new_group": 'torch.distributed.new_group([0, 1], backend="nccl")',
        "torch.backends.cuda.sdp_kernel": "torch.backends.cuda.sdp_kernel(enable_math=False)",
    }
    for kind, line in patterns.items():
        assert _handled_codes(tmp_path, line) == {table[kind]}, kind


def test_the_drop_ins_fallbacks_and_hook_are_mapped_by_what_they_serve_and_count():
    served = {name: handled.FLASH_ATTN_DROPIN if r.name == "flash_attn" else handled.XFORMERS_DROPIN
              for r in DROP_INS for name in r.modules}  # fmt: skip
    for name, mechanism in served.items():
        assert handled.RULES[mechanism][name] == ("NPU101" if mechanism == handled.FLASH_ATTN_DROPIN else "NPU102")
    xformers_calls = {kind for kind, code in handled.RULES[handled.XFORMERS_DROPIN].items() if code == "NPU112"}
    assert set(handled.RULES[handled.XFORMERS_DROPIN]) - xformers_calls == {
        n for n, m in served.items() if m == handled.XFORMERS_DROPIN
    }
    assert xformers_fmha_impl.memory_efficient_attention.__wrapped__  # imported: its kinds are registered
    assert (
        xformers_calls == XFORMERS_CALLS.kinds == {"memory_efficient_attention", "memory_efficient_attention_forward"}
    )
    calls = {kind for kind, code in handled.RULES[handled.FLASH_ATTN_DROPIN].items() if code == "NPU110"}
    assert flash_attn_impl.flash_attn_func.__wrapped__  # imported: its functions' kinds are registered
    assert calls == CALLS.kinds == set(_attention_calls.FLASH_CAUSAL_AT)  # what the scan calls a flash_attn call
    assert handled.RULES[handled.FALLBACK] == {name: "NPU103" for name in BUILTIN_FALLBACKS}
    assert set(handled.RULES[handled.XFORMERS_HOOK]) == {ENABLE, XFORMERS_SETTER}


def _hit(project, where, **libraries):
    """A kind's entry of ``HitLog.snapshot()``: the project's hits and places, then each library's ``(count, where)``."""
    return {
        "count": project + sum(count for count, _ in libraries.values()),
        "project": project,
        "where": where,
        "libraries": {name: {"count": count, "where": places} for name, (count, places) in libraries.items()},
    }


def test_by_rule_merges_mechanisms_first_come_and_leaves_out_what_is_no_rule():
    sources = [
        (handled.REDIRECT, {
            "Tensor.to": _hit(2, [(5, ("/p/a.py", 9)), (1, ("/p/a.py", 3))]),
            "torch.zeros": _hit(4, [(3, ("/p/b.py", 1)), (7, ("/p/a.py", 3))]),
            "Tensor.cuda": _hit(1, [(4, ("/p/a.py", 2))]),
            "Tensor.pin_memory": _hit(8, [(0, ("/p/a.py", 1))]),  # no rule's pattern
        }),
        (handled.FLASH_ATTN_DROPIN, {"flash_attn": _hit(1, [(2, ("/p/m.py", 4))])}),
        (handled.XFORMERS_HOOK, None),  # diffusers never imported: not hooked
        (handled.DEVICE_CHECKS, handled.device_check_hits([
            {"file": "/p/m.py", "line": 7, "hits": 0},
            {"file": "/p/m.py", "line": 8, "hits": 3},
        ])),
    ]  # fmt: skip
    assert handled.by_rule(sources) == {
        "NPU101": {"name": "flash-attn-import", "count": 1, "where": ["/p/m.py:4"]},
        "NPU301": {"name": "cuda-method", "count": 1, "where": ["/p/a.py:2"]},
        "NPU310": {"name": "cuda-device-literal", "count": 6, "where": ["/p/a.py:3", "/p/b.py:1", "/p/a.py:9"]},
        "NPU390": {"name": "device-type-check", "count": 3, "where": ["/p/m.py:8"]},
    }
    assert list(handled.by_rule(sources)) == ["NPU101", "NPU301", "NPU310", "NPU390"]
    assert handled.by_library(sources) == {}


def test_what_a_library_made_is_listed_under_it_never_under_the_project():
    torch_file, diffusers_file = "/v/site-packages/torch/random.py", "/v/site-packages/diffusers/models/a.py"
    sources = [
        (handled.REDIRECT, {
            "torch.cuda.manual_seed_all": _hit(1, [(4, ("/p/a.py", 3))], torch=(2, [(1, (torch_file, 46))])),
            "torch.cuda.empty_cache": _hit(0, [], diffusers=(1178, [(2, (diffusers_file, 9))])),
            "memory_stats": _hit(0, [], diffusers=(5, [(3, (diffusers_file, 1))])),  # no rule's pattern
        }),
        (handled.XFORMERS_DROPIN, {
            "xformers": _hit(0, [], diffusers=(1, [(5, (diffusers_file, 30))])),
            "xformers.ops": _hit(0, [], diffusers=(1, [(6, (diffusers_file, 30))])),  # one import statement
        }),
        (handled.FLASH_ATTN_DROPIN, {"flash_attn_func": _hit(0, [], **{"(no caller)": (2, [])})}),
    ]  # fmt: skip
    assert handled.by_rule(sources) == {"NPU303": {"name": "cuda-seed", "count": 1, "where": ["/p/a.py:3"]}}
    assert handled.by_library(sources) == {
        "(no caller)": {"NPU110": {"name": "flash-attn-call", "count": 2, "where": []}},
        "diffusers": {
            "NPU102": {"name": "xformers-import", "count": 1, "where": [f"{diffusers_file}:30"]},
            "NPU302": {"name": "cuda-sync-memory", "count": 1178, "where": [f"{diffusers_file}:9"]},
        },
        "torch": {"NPU303": {"name": "cuda-seed", "count": 2, "where": [f"{torch_file}:46"]}},
    }
    lines = handled.format_by_rule(handled.by_rule(sources), folder="/p", libraries=handled.by_library(sources))
    assert lines == [
        "  handled, by scan rule (npu-port scan lists these codes as handled):",
        "    NPU303 cuda-seed x1  (a.py:3)",
        "  handled inside libraries (calls their own code made, not lines of yours):",
        "    (no caller) NPU110 flash-attn-call x2",
        "    diffusers NPU102 xformers-import x1  (diffusers/models/a.py:30)",
        "    diffusers NPU302 cuda-sync-memory x1178  (diffusers/models/a.py:9)",
        "    torch NPU303 cuda-seed x2  (torch/random.py:46)",
    ]


def test_by_rule_keeps_the_first_few_places():
    where = [(order, ("/p/a.py", order)) for order in range(9, -1, -1)]
    result = handled.by_rule([(handled.REDIRECT, {"Tensor.to": _hit(10, where)})])
    assert result["NPU310"]["where"] == [f"/p/a.py:{line}" for line in range(5)]


def test_the_summary_lines_list_codes_in_order_with_paths_relative_to_the_folder(tmp_path):
    inside = str(tmp_path / "pkg" / "m.py")
    lines = handled.format_by_rule(
        {
            "NPU101": {"name": "flash-attn-import", "count": 1, "where": [f"{inside}:2"]},
            "NPU310": {"name": "cuda-device-literal", "count": 12, "where": ["/elsewhere/x.py:3", f"{inside}:9"]},
        },
        folder=str(tmp_path),
    )
    assert lines == [
        "  handled, by scan rule (npu-port scan lists these codes as handled):",
        "    NPU101 flash-attn-import x1  (pkg/m.py:2)",
        "    NPU310 cuda-device-literal x12  (/elsewhere/x.py:3, pkg/m.py:9)",
    ]
    assert handled.format_by_rule({}) == ["  handled, by scan rule: none"]
