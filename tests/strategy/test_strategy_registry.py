"""Strategies as data: the built-in files, the schema's exact errors (file, line, valid choices), the registry."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

import npu_port
from npu_port.errors import StrategyError, StrategyFileError, UnknownStrategyError
from npu_port.strategy import registry
from npu_port.strategy.registry import get_strategy, load_strategy_file, unregister_strategy
from npu_port.strategy.schema import KEYS
from npu_port.strategy.spec import OPTIONS, parse_size

BUILTINS = ["auto", "chunked", "custom-processor", "flash", "npu", "sdpa", "vanilla", "xformers"]
PROFILES = ["ascend-910b", "cpu-fallback", "cuda-safe-math", "hopper-safe"]
STRATEGIES_DIR = Path(__file__).resolve().parents[2] / "strategies"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def test_builtins_and_profiles_are_listed_in_order():
    assert npu_port.list_strategies() == BUILTINS + PROFILES
    assert npu_port.list_strategies("strategy") == BUILTINS
    assert npu_port.list_strategies("profile") == PROFILES


@pytest.mark.parametrize(
    "name, select, candidates",
    [
        ("vanilla", "fixed", ("math",)),
        ("sdpa", "fixed", ("sdpa",)),
        ("chunked", "fixed", ("chunked",)),
        ("npu", "first", ("npu_fused_infer", "npu_fusion")),
        ("xformers", "fixed", ("xformers",)),
        ("flash", "fixed", ("flash_attn",)),
        ("auto", "measure", ("npu_fused_infer", "npu_fusion", "flash_attn", "xformers", "sdpa", "chunked", "math")),
        ("custom-processor", "fixed", ()),
    ],
)
def test_builtin_definitions(name, select, candidates):
    strategy = get_strategy(name)
    assert (strategy.select, strategy.candidates) == (select, candidates)
    assert strategy.description
    assert strategy.source == str(STRATEGIES_DIR / f"{name}.yaml")


def test_environment_variables_of_builtins():
    assert get_strategy("vanilla").env == {
        "DIFFUSERS_ATTN_BACKEND": "_native_math",
        "DIFFUSERS_ATTENTION_TYPE": "vanilla",
    }
    assert get_strategy("npu").env["DIFFUSERS_ATTN_BACKEND"] == "_native_npu"
    assert get_strategy("chunked").env == {}  # diffusers has no chunked backend: leave it alone


def test_profiles_extend_a_strategy_and_carry_device_options():
    hopper = get_strategy("hopper-safe")
    assert (hopper.kind, hopper.extends, hopper.base, hopper.device) == ("profile", "sdpa", "sdpa", "cuda")
    assert hopper.options["sdpa_backends"] == ("efficient", "math")  # flash off, mem-efficient on
    assert hopper.env["DIFFUSERS_ATTENTION_TYPE"] == "sdpa"  # inherited
    assert hopper.env["DIFFUSERS_ATTN_BACKEND"] == "_native_efficient"  # overridden
    ascend = get_strategy("ascend-910b")
    assert ascend.select == "measure" and ascend.base == "auto"
    assert ascend.npu == {"jit_compile": False}
    assert ascend.acl_options["ACL_PRECISION_MODE"] == "must_keep_origin_dtype"
    assert get_strategy("cpu-fallback").options["memory_budget"] == 1 << 30


def test_every_shipped_file_passes_the_schema_and_uses_safe_yaml_only():
    for path in sorted(STRATEGIES_DIR.rglob("*.yaml")):
        strategy = load_strategy_file(path)
        assert strategy.name == path.stem
        assert "!!" not in path.read_text()


def test_unknown_name_lists_every_strategy_and_where_yaml_was_searched():
    with pytest.raises(UnknownStrategyError) as info:
        get_strategy("flahs")
    assert isinstance(info.value, ValueError)
    assert str(info.value) == (
        "unknown attention strategy 'flahs'; valid strategies: " + ", ".join(BUILTINS + PROFILES) + "; "
        f"YAML searched: {STRATEGIES_DIR}, {STRATEGIES_DIR / 'profiles'}"
    )


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("description: x\nkernal: sdpa\n", 2, f"unknown key 'kernal'; valid keys: {', '.join(KEYS)}"),
        ("description: x\nkernel: sdpaa\n", 2, "unknown kernel 'sdpaa'; valid kernels: "),
        ("description: x\nkernel: [sdpa]\n", 2, "kernel must be a string, got list ['sdpa']"),
        ("description: x\ncandidates: sdpa\n", 2, "candidates must be a non-empty list of kernel names, got 'sdpa'"),
        (
            "description: x\nkernel: sdpa\ncandidates: [math]\n",
            3,
            "give either kernel (one) or candidates (several), not both",
        ),
        (
            "description: x\nkernel: sdpa\nselect: fastest\n",
            3,
            "select must be one of fixed, first, measure; got 'fastest'",
        ),
        (
            "description: x\nkernel: sdpa\noptions:\n  memory_budget: lots\n",
            4,
            "memory_budget must be a byte count or a size such as '512MiB' (units: B, KiB, MiB, GiB, TiB, KB, MB, "
            "GB, TB), got 'lots'",
        ),
        (
            "description: x\nkernel: sdpa\noptions:\n  repeat: 3\n",
            4,
            f"unknown strategy option 'repeat'; valid options: {', '.join(OPTIONS)}",
        ),
        (
            "description: x\nkernel: sdpa\noptions:\n  sdpa_backends: [flash, fast]\n",
            4,
            "unknown SDPA backend 'fast' in sdpa_backends; valid backends: flash, efficient, cudnn, math, overrideable",
        ),
        (
            "description: x\nkernel: sdpa\nenv:\n  TASK_QUEUE_ENABLE: 2\n",
            3,
            "environment variable TASK_QUEUE_ENABLE must be a string (quote it in YAML), got 2",
        ),
        (
            "description: x\nprocessor: my package:Thing\n",
            2,
            "processor must be an import path 'package.module:Class', got 'my package:Thing'",
        ),
        (
            "description: x\nkernel: chunked\nkernel_options:\n  chunked:\n    max_byte: 10\n",
            4,
            "kernel 'chunked' has no option 'max_byte'; valid options: max_bytes, query_block, key_block, upcast",
        ),
        ("description: x\nkernel: sdpa\nnpu:\n  jit: false\n", 4, "unknown npu setting 'jit'; valid settings: "),
        ("description: x\nkernel: sdpa\nsafe_math:\n  fp64: true\n", 4, "unknown safe_math setting 'fp64'; valid "),
        ("description: x\nkernel: sdpa\nsafe_math:\n  tf32: 0\n", 4, "safe_math.tf32 must be true or false, got 0"),
        (
            "description: x\nkernel: sdpa\nacl_options:\n  ACL_PRECISON_MODE: must_keep_origin_dtype\n",
            4,
            "unknown ACL option 'ACL_PRECISON_MODE'; valid options: ACL_PRECISION_MODE, ",
        ),
        ("description: x\nkernel: sdpa\ndescription: y\n", 3, "duplicate key 'description'"),
        ("kernel: sdpa\n", 1, "description is required (one line shown by npu-port strategies)"),
        ("description: x\nkernel: sdpa\nextends: nothere\n", 3, "unknown attention strategy 'nothere'"),
        ("- a\n- b\n", 1, "a strategy file must be a mapping of keys"),
        ("description: x\nkernel: [sdpa\n", 3, "not valid YAML: "),
        ("description: !!python/object/apply:os.system [echo hi]\n", 1, "not valid YAML: "),
    ],
)
def test_schema_errors_name_file_line_and_valid_choices(tmp_path, text, line, message):
    path = write(tmp_path, "mine.yaml", text)
    with pytest.raises(StrategyFileError) as info:
        load_strategy_file(path)
    assert (info.value.path, info.value.line) == (str(path.resolve()), line)
    assert str(info.value).startswith(f"{path.resolve()}:{line}: {message}")


def test_yaml_is_never_evaluated(tmp_path):
    marker = tmp_path / "evaluated"
    path = write(tmp_path, "evil.yaml", f"description: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(StrategyFileError):
        load_strategy_file(path)
    assert not marker.exists()


def test_extends_cycle_is_an_error(tmp_path, monkeypatch):
    write(tmp_path, "one.yaml", "description: x\nextends: two\n")
    write(tmp_path, "two.yaml", "description: y\nextends: one\n")
    monkeypatch.setenv("NPU_PORT_STRATEGY_PATH", str(tmp_path))
    with pytest.raises(StrategyFileError, match="extends"):
        get_strategy("one")


def test_user_strategy_from_the_search_path_and_by_path(tmp_path, monkeypatch):
    path = write(
        tmp_path,
        "low-memory.yaml",
        """
        description: chunked with a small budget, SDPA first when it fits
        extends: auto
        candidates: [sdpa, chunked]
        options:
          memory_budget: 64MiB
          repeats: 3
        kernel_options:
          chunked: {query_block: 128}
        """,
    )
    monkeypatch.setenv("NPU_PORT_STRATEGY_PATH", str(tmp_path))
    assert npu_port.list_strategies()[-1] == "low-memory"
    strategy = get_strategy("low-memory")
    assert strategy.select == "measure"  # new candidates keep the parent's way of choosing
    assert strategy.candidates == ("sdpa", "chunked")
    assert strategy.options == {"memory_budget": 64 << 20, "repeats": 3}
    assert strategy.kernel_options == {"chunked": {"query_block": 128}}
    assert load_strategy_file(str(path)) is strategy  # parsed once while unchanged


def test_user_file_may_not_take_a_builtin_name(tmp_path, monkeypatch):
    write(tmp_path, "sdpa.yaml", "description: mine\nkernel: math\n")
    monkeypatch.setenv("NPU_PORT_STRATEGY_PATH", str(tmp_path))
    with pytest.warns(UserWarning, match="'sdpa' is a built-in strategy name; rename the file"):
        assert "sdpa" in npu_port.list_strategies()  # reported and skipped; the built-in keeps its name
    assert get_strategy("sdpa").candidates == ("sdpa",)


def test_register_strategy_in_code():
    strategy = npu_port.register_strategy(
        "test-low-mem", description="test", candidates=["sdpa", "chunked"], options={"memory_budget": "8MiB"}
    )
    try:
        assert get_strategy("test-low-mem") is strategy
        assert strategy.select == "first" and strategy.options["memory_budget"] == 8 << 20
        assert "test-low-mem" in npu_port.list_strategies()
        with pytest.raises(ValueError, match="already registered; pass replace=True"):
            npu_port.register_strategy("test-low-mem", kernel="math")
        replaced = npu_port.register_strategy("test-low-mem", kernel="math", replace=True)
        assert get_strategy("test-low-mem") is replaced
    finally:
        unregister_strategy("test-low-mem")
    assert "test-low-mem" not in npu_port.list_strategies()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="sdpa", kernel="math"), "'sdpa' is a built-in strategy; register yours under another name"),
        (dict(name="Bad Name", kernel="math"), "strategy name must be lower-case letters"),
        (dict(name="x-none"), "strategy 'x-none' needs kernel, candidates, processor or extends"),
        (dict(name="x-k", kernel="nope"), "unknown kernel 'nope' in strategy 'x-k'; valid kernels: math, sdpa"),
        (dict(name="x-o", kernel="math", options={"budget": 1}), "unknown strategy option 'budget'"),
    ],
)
def test_register_strategy_errors(kwargs, message):
    name = kwargs.pop("name")
    with pytest.raises(ValueError) as info:
        npu_port.register_strategy(name, **kwargs)
    assert str(info.value).startswith(message)


def test_overrides_are_validated_like_yaml():
    sdpa = get_strategy("sdpa")
    assert sdpa.with_overrides(memory_budget="1GiB").options["memory_budget"] == 1 << 30
    with pytest.raises(ValueError) as info:
        sdpa.with_overrides(budget=1)
    assert str(info.value).startswith("unknown option 'budget' for strategy 'sdpa'; valid options: cache, candidates")
    with pytest.raises(ValueError, match="compute_dtype must be one of null, float16, bfloat16; got 'half'"):
        sdpa.with_overrides(compute_dtype="half")
    with pytest.raises(ValueError, match="processor= is for the custom-processor strategy, not 'sdpa'"):
        sdpa.with_overrides(processor="pkg.mod:Proc")
    custom = get_strategy("custom-processor").with_overrides(processor="pkg.mod:Proc")
    assert custom.processor == "pkg.mod:Proc"


@pytest.mark.parametrize(
    "text, size", [(1, 1), ("512MiB", 512 << 20), ("2GiB", 2 << 30), ("1.5 KiB", 1536), ("3GB", 3 * 10**9)]
)
def test_sizes(text, size):
    assert parse_size(text) == size


def test_resolve_accepts_names_paths_import_paths_and_classes(tmp_path):
    path = write(tmp_path, "mine.yaml", "description: mine\nkernel: math\n")
    assert registry.resolve(str(path)).name == "mine"
    assert registry.resolve(path).name == "mine"
    custom = registry.resolve("tests.strategy.test_strategy_registry:ProcessorForTests")
    assert custom.processor is ProcessorForTests and custom.is_custom_processor
    assert registry.resolve(ProcessorForTests).processor is ProcessorForTests
    with pytest.raises(StrategyError) as info:
        registry.resolve("tests.strategy.test_strategy_registry:Missing")
    assert str(info.value) == (
        "module 'tests.strategy.test_strategy_registry' has no attribute 'Missing' (for 'tests.strategy.test_strategy_registry:Missing')"
    )
    with pytest.raises(StrategyError, match="cannot import module 'no_such_module_xyz'"):
        registry.resolve("no_such_module_xyz:Thing")
    with pytest.raises(TypeError, match="strategy must be a name, a YAML path"):
        registry.resolve(3)


class ProcessorForTests:
    def __call__(self, attn, hidden_states, **kwargs):  # pragma: no cover - only its type is used here
        return hidden_states


def test_shipped_files_are_plain_yaml():
    for path in STRATEGIES_DIR.rglob("*.yaml"):
        assert isinstance(yaml.safe_load(path.read_text()), dict)
