"""``npu-port run --report`` attributes truthfully (tests/fixtures/attribution_project): a project whose strategy comes
from ``pipe.enable_xformers_memory_efficient_attention()`` has every routed attention call counted at the top level
(as many as its attention modules' forward calls, counted by the project itself), and each CUDA call is booked to
whoever made it — the project's own lines under ``by_rule``, what torch and diffusers did on their own account
(seeding CUDA in ``torch.manual_seed``, importing xformers and flash_attn because the drop-ins exist) under
``by_library``, never under the project line that called the library."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npu_port.integrations.diffusers.tiny_text2image import build_tiny_text2image
from npu_port.support import supported

FIXTURE = Path(__file__).parents[1] / "fixtures" / "attribution_project"
#: From where CLIP's attention is routed too (so the text encoder's forwards are routed calls).
CLIP_ROUTED_FROM = supported("transformers").features["text encoders routed (transformers AttentionInterface)"]
#: The CUDA calls the project's own lines make, by the rule that lists them: the text on the line.
PROJECT_CALLS = {
    "NPU120": "pipe.enable_xformers_memory_efficient_attention()",
    "NPU302": "torch.cuda.empty_cache()",
    "NPU303": "torch.cuda.manual_seed_all(0)",
    "NPU309": 'torch.Generator(device="cuda")',
}
HOOKED = "StableDiffusionPipeline.enable_xformers_memory_efficient_attention()"


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    root = tmp_path_factory.mktemp("attribution")
    project = root / "project"
    shutil.copytree(FIXTURE, project)
    build_tiny_text2image(str(root / "models"))
    env = {k: v for k, v in os.environ.items() if k not in ("NPU_PORT_DEVICE", "PYTHONPATH")}
    env.update(PYTHONWARNINGS="ignore", NPU_PORT_CACHE_DIR=str(root / "cache"))
    command = [sys.executable, "-m", "npu_port", "run", "--device", "cpu", "--report", "r.json", "generate.py",
               "--models", str(root / "models")]  # fmt: skip
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return project, json.loads(done.stdout.splitlines()[-1]), json.loads((project / "r.json").read_text())


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.diffusers_min("0.15")  # diffusers' Attention with processors (older: legacy classes, other tests)
@pytest.mark.transformers_min(CLIP_ROUTED_FROM)
def test_every_routed_attention_call_is_counted_at_the_top_level(ran):
    _, printed, report = ran
    forwards = printed["attention_forwards"]
    assert forwards.get("Attention") and (forwards.get("CLIPAttention") or forwards.get("CLIPSdpaAttention"))
    calls = report["attention_calls"]
    assert sum(calls.values()) == sum(forwards.values()), (calls, forwards)
    assert report["attention_routes"] == [{"via": HOOKED, "strategy": "auto", "calls": calls}]
    assert report["strategy"] == {"requested": "auto", "resolved": "+".join(calls)}  # what ran, not "auto"
    (hooked,) = report["enable_xformers_routed"]
    assert hooked["calls"] == calls


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.diffusers_min("0.15")
@pytest.mark.transformers_min(CLIP_ROUTED_FROM)
def test_no_library_call_is_booked_to_a_project_line(ran):
    project, _, report = ran
    script = project / "generate.py"
    lines = script.read_text().splitlines()
    line_of = {
        code: [n for n, text in enumerate(lines, 1) if pattern in text] for code, pattern in PROJECT_CALLS.items()
    }
    assert all(len(found) == 1 for found in line_of.values()), line_of
    # each project entry is the very line that makes that CUDA call, once: nothing else lands on a project line
    assert report["by_rule"] == {
        code: {"name": report["by_rule"][code]["name"], "count": 1, "where": [f"{script}:{line_of[code][0]}"]}
        for code in PROJECT_CALLS
    }
    libraries = report["by_library"]
    places = [place for codes in libraries.values() for item in codes.values() for place in item["where"]]
    assert places and not any(place.startswith(str(project)) for place in places), places
    # torch.manual_seed(0) seeds CUDA itself: torch's call, placed in torch
    assert libraries["torch"]["NPU303"]["count"] == 1
    assert all(os.sep + "torch" + os.sep in place for place in libraries["torch"]["NPU303"]["where"])
    # diffusers imports xformers (and flash_attn where it has a dispatcher) because the drop-ins exist; it moves the
    # pipeline's models itself when the project calls pipe.to("cuda")
    diffusers = libraries["diffusers"]
    assert diffusers["NPU102"]["count"] >= 1 and "NPU310" in diffusers
    assert all(os.sep + "diffusers" + os.sep in place for item in diffusers.values() for place in item["where"])
    assert report["drop_ins"]["imported_by"]["xformers"]["xformers"].startswith("diffusers.")
