"""Make the hand-ported copy of a project: the few edits a person makes to run CUDA-written code on a CPU.

usage: handport.py {tav,animatediff,dit,raft} --repo FETCHED_REPO --out DIR

The copy is the repository's files (no .git) with the edits below applied; each edit must match exactly the number
of times given, so a changed upstream file is noticed instead of half-ported. The same list is in README.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys

# project -> [(file, pattern (regex), replacement, expected number of matches)]
EDITS = {
    "tav": [
        # no xformers here: skip it instead of raising "xformers is not available"
        (
            "train_tuneavideo.py",
            r"    if enable_xformers_memory_efficient_attention:\n",
            "    if enable_xformers_memory_efficient_attention and is_xformers_available():\n",
            1,
        ),
    ],
    "animatediff": [
        # .cuda() / .to("cuda") -> the CPU (xformers is skipped by the script itself when it is not installed)
        ("scripts/animate.py", r"\.cuda\(\)", ".cpu()", 5),
        ("scripts/animate.py", r'\.to\("cuda"\)', '.to("cpu")', 2),
    ],
    "dit": [
        # sample.py already falls back to the CPU; sample_ddp.py: no GPU assert, gloo, CPU device
        ("sample_ddp.py", r"    assert torch\.cuda\.is_available\(\), .*\n", "", 1),
        ("sample_ddp.py", r'dist\.init_process_group\("nccl"\)', 'dist.init_process_group("gloo")', 1),
        ("sample_ddp.py", r"device = rank % torch\.cuda\.device_count\(\)", 'device = "cpu"', 1),
        ("sample_ddp.py", r"    torch\.cuda\.set_device\(device\)\n", "", 1),
    ],
    "raft": [
        ("evaluate.py", r"\.cuda\(\)", ".cpu()", 12),
        ("demo.py", r"DEVICE = 'cuda'", "DEVICE = 'cpu'", 1),
        # alt_cuda_corr is a CUDA extension: use the all-pairs correlation (same values) for --alternate_corr
        (
            "core/raft.py",
            r"        if self\.args\.alternate_corr:\n",
            "        if False:  # hand port: no alt_cuda_corr\n",
            1,
        ),
    ],
}


def port(project: str, repo: str, out: str) -> None:
    if os.path.exists(out):
        shutil.rmtree(out)
    shutil.copytree(repo, out, ignore=shutil.ignore_patterns(".git"), symlinks=True)
    for relative, pattern, replacement, expected in EDITS[project]:
        path = os.path.join(out, relative)
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        text, count = re.subn(pattern, replacement, text)
        if count != expected:
            sys.exit(f"handport.py: {relative}: {pattern!r} matched {count} times, expected {expected}")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    print(f"handport.py: {project}: {len(EDITS[project])} edits applied in {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("project", choices=sorted(EDITS))
    parser.add_argument("--repo", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    port(args.project, os.path.abspath(args.repo), os.path.abspath(args.out))


if __name__ == "__main__":
    main()
