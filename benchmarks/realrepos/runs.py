"""The runs of the real-projects harness: each project's own entry points with the arguments, inputs and flags
``run.py`` gives them (a table; ``run.py`` executes it and compares the outputs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

DIRNAME = {"tav": "Tune-A-Video", "animatediff": "AnimateDiff", "dit": "DiT", "raft": "RAFT"}
#: How much further from the float64 reference npu-port's half-precision output may be than the hand port's.
HALF_RATIO = 2.0


@dataclass
class Run:
    id: str
    project: str
    entry: str  # a script path in the repository, or "-m module"
    args: List[str]
    capture: str = ""  # class names whose forward outputs are saved (capture/sitecustomize.py)
    npu_flags: List[str] = field(default_factory=list)
    nproc: int = 1  # > 1: under torchrun
    cwd_repo: bool = False  # the project reads paths relative to its own root (RAFT: sys.path.append('core'))
    repo_on_path: bool = False  # PYTHONPATH=repo (AnimateDiff's package beside scripts/)
    links: Dict[str, str] = field(default_factory=dict)  # names made in the working folder -> input paths
    no_display: bool = False
    note: str = ""
    hand_entry: str = ""  # the hand port's entry point when it is not the edited copy's (the README snippet)
    #: for a half-precision run: the hand port in float64, run as the "reference64" variant; npu-port's and the hand
    #: port's outputs are then each compared with it, and npu-port may be at most HALF_RATIO times further off
    reference_entry: str = ""
    collect: str = ""  # a glob of files the project writes in the working folder, moved into the run's folder


SD = "{inputs}/sd"
ANIMATE = [
    "--pretrained-model-path",
    SD,
    "--inference-config",
    "{inputs}/inference.yaml",
    "--config",
    "{inputs}/prompts.yaml",
    "--L",
    "4",
    "--W",
    "32",
    "--H",
    "32",
]
DIT = [
    "--model",
    "DiT-S/8",
    "--image-size",
    "256",
    "--num-sampling-steps",
    "2",
    "--ckpt",
    "{inputs}/DiT-S-8-tiny.pt",
    "--vae",
    "mse",
]
RAFT_MODEL = ["--model", "{inputs}/raft-small-tiny.pth", "--small"]

RUNS = [
    Run(
        "tav-train",
        "tav",
        "train_tuneavideo.py",
        ["--config", "{inputs}/config.yaml"],
        "Decoder",
        note="the repo's config shape: xformers on; 1 training step, validation = DDIM inversion + sampling",
    ),
    Run(
        "tav-train-noxformers",
        "tav",
        "train_tuneavideo.py",
        ["--config", "{inputs}/config-noxformers.yaml"],
        "Decoder",
        note="enable_xformers_memory_efficient_attention: False (past the xformers crash)",
    ),
    Run(
        "tav-train-fp16-noxformers",
        "tav",
        "train_tuneavideo.py",
        ["--config", "{inputs}/config-fp16-noxformers.yaml"],
        "Decoder",
        note="the repo's mixed_precision: fp16",
    ),
    Run(
        "tav-readme-inference",
        "tav",
        "{inputs}/readme_inference.py",
        [],
        "Decoder",
        cwd_repo=True,
        repo_on_path=True,
        hand_entry="{inputs}/readme_inference_handport.py",
        reference_entry="{inputs}/readme_inference_float64.py",
        collect="*.gif",
        note="the README's inference snippet (float16, .to('cuda'), pipe.enable_xformers...), run from the repo root",
    ),
    Run(
        "animatediff-m",
        "animatediff",
        "-m scripts.animate",
        ANIMATE,
        "Decoder",
        repo_on_path=True,
        note="the README's way: python -m scripts.animate",
    ),
    Run(
        "animatediff-script",
        "animatediff",
        "scripts/animate.py",
        ANIMATE,
        "Decoder",
        repo_on_path=True,
        note="script path, PYTHONPATH=repo",
    ),
    Run(
        "animatediff-script-noxformers",
        "animatediff",
        "scripts/animate.py",
        ANIMATE + ["--without-xformers"],
        "Decoder",
        repo_on_path=True,
        note="--without-xformers (past the xformers crash)",
    ),
    Run(
        "dit-sample",
        "dit",
        "sample.py",
        DIT + ["--seed", "0"],
        "Decoder",
        links={"stabilityai": "{inputs}/stabilityai"},
    ),
    Run(
        "dit-sample-ddp",
        "dit",
        "sample_ddp.py",
        DIT + ["--per-proc-batch-size", "2", "--num-fid-samples", "4", "--sample-dir", "samples", "--global-seed", "0"],
        "Decoder",
        npu_flags=["--cuda-available"],
        nproc=2,
        links={"stabilityai": "{inputs}/stabilityai"},
        note="torchrun --nproc_per_node 2; --cuda-available for its assert",
    ),
    Run("raft-evaluate", "raft", "evaluate.py", RAFT_MODEL + ["--dataset", "sintel"], "RAFT", cwd_repo=True),
    Run(
        "raft-evaluate-alt",
        "raft",
        "evaluate.py",
        RAFT_MODEL + ["--dataset", "sintel", "--alternate_corr"],
        "RAFT",
        cwd_repo=True,
        note="hand port: all-pairs CorrBlock",
    ),
    Run(
        "raft-demo",
        "raft",
        "demo.py",
        RAFT_MODEL + ["--path", "{inputs}/demo-frames"],
        "RAFT",
        cwd_repo=True,
        no_display=True,
        note="cv2.imshow saved, waitKey returns (no screen)",
    ),
    Run(
        "raft-demo-alt",
        "raft",
        "demo.py",
        RAFT_MODEL + ["--path", "{inputs}/demo-frames", "--alternate_corr"],
        "RAFT",
        cwd_repo=True,
        no_display=True,
    ),
]
