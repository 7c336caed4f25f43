"""``mkdocs build --strict`` as CI runs it: the whole site builds with no warning (a broken link or anchor, a page
missing from the nav, a reference mkdocstrings cannot resolve all fail), and an unknown placeholder fails the build
with the hook's line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from . import site


def _build(config, out):
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.mark.e2e
def test_the_site_builds_strict(tmp_path):
    done = _build(site.ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-6000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "npu-port scan" in cli and "<!-- generated" not in cli
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert 'id="npu_port.attn.api.attention"' in api


@pytest.mark.e2e
def test_an_unknown_placeholder_fails_the_build_with_one_clear_line(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n<!-- generated: rules -->\n", encoding="utf-8")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"site_name: t\ndocs_dir: docs\nhooks:\n  - {site.HOOK}\n", encoding="utf-8")
    done = _build(config, tmp_path / "site")
    assert done.returncode == 1
    assert (
        "ERROR   -  index.md: unknown generated table 'rules'; valid names: api, cli, scan-rules, error-codes, "
        "torch-npu-pairing, strategy-keys, coverage, compat\n" in done.stderr
    )
    assert "Traceback" not in done.stderr
