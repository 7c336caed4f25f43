"""README_NPU.md stays the Ascend landing page: short, README's two quick-start commands verbatim, the whole
checklist, and one link to each page an Ascend user comes for."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "README_NPU.md").read_text(encoding="utf-8")


def _readme_quick_start(kind):
    """The command README.md shows under its ``<!-- quick-start: KIND -->`` marker (the one CI runs)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.search(rf"<!-- quick-start: {kind} -->\n```bash\n(.*?)\n```", readme, flags=re.S).group(1)


def test_it_is_a_landing_page_of_at_most_200_lines():
    assert len(TEXT.splitlines()) <= 200


def test_it_shows_readmes_two_quick_start_commands_verbatim_without_the_ci_markers():
    blocks = re.findall(r"```bash\n(.*?)\n```", TEXT.split("## Quick start", 1)[1].split("\n## ", 1)[0], flags=re.S)
    assert blocks == [_readme_quick_start("main"), _readme_quick_start("tests")]
    assert "quick-start:" not in TEXT  # only README.md carries the markers .ci/run extracts


def test_the_checklist_keeps_all_six_steps():
    checklist = TEXT.split("## Checklist on a real Ascend machine", 1)[1].split("\n## ", 1)[0]
    steps = re.findall(r"^(\d)\. ", checklist, flags=re.M)
    assert steps == ["1", "2", "3", "4", "5", "6"]
    for command in (
        "npu-smi info",
        "npu-port doctor --format json > doctor.json",
        "npu-port kernels",
        "apply_npu_options('ascend-910b')",
        "benchmarks/kernel_check.py --device npu",
        "benchmarks/chunked_memory.py --device npu",
        "tests/fixtures/redirect/run_redirected.py npu",
    ):
        assert command in checklist


def test_it_links_to_each_ascend_page_and_every_linked_docs_page_is_one_the_site_has():
    links = set(re.findall(r"\]\((docs/[^)#\s]+)", TEXT))
    assert links >= {
        "docs/tutorials/run-a-pipeline-on-an-npu.md",
        "docs/how-to/several-npus.md",
        "docs/how-to/plan-before-the-hardware.md",
        "docs/how-to/fix-a-cann-error.md",
        "docs/how-to/cuda-only-packages.md",
        "docs/how-to/ascend-runtime-options.md",
        "docs/explanation/ascend.md",
        "docs/explanation/masks-and-polarity.md",
        "docs/reference/error-codes.md",
    }
    assert [link for link in sorted(links) if not (ROOT / link).is_file()] == []
