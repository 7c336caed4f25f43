"""Compare what two runs of one project wrote: the npu-port run of the original and the hand port.

usage: compare.py RUN_DIR_A RUN_DIR_B [--json]

Every file both runs wrote is compared by content, matched by its path relative to the run folder (a timestamped
folder name, as AnimateDiff's samples/<config>-<time>, is matched by its position instead):
- images (.png .jpg .gif, every frame) and .npy arrays: max |a - b| in 8-bit levels ("image" column);
- tensors (.pt, .pth, .bin state dicts, .npz) and the captured module outputs under capture/: max |a - b| in the
  values' own units ("float" column).
A file present in one run only is listed as missing; a NaN or inf in either run is "non-finite" — never "within"
anything. Logs and npu-port's report are not compared.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

import numpy as np

SKIP = {"log.txt", "report.json", "command.txt", "exit_code.txt", "time.txt"}
IMAGE = (".png", ".jpg", ".jpeg", ".gif")
TENSOR = (".pt", ".pth", ".bin", ".ckpt")
TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}")


def _files(root: str) -> dict:
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, root)
            if relative in SKIP or name.startswith("report") or name.endswith(".tmp"):
                continue
            found[TIMESTAMP.sub("<time>", relative)] = path
    return found


def _image_arrays(path: str) -> list:
    from PIL import Image, ImageSequence

    with Image.open(path) as image:
        return [np.asarray(frame.convert("RGB"), dtype=np.float64) for frame in ImageSequence.Iterator(image)]


def _tensor_arrays(path: str) -> list:
    import torch

    value = torch.load(path, map_location="cpu", weights_only=False)
    arrays = []

    def walk(item):
        if isinstance(item, torch.Tensor):
            if item.is_floating_point() or item.is_complex():
                arrays.append(item.detach().to(torch.float64).numpy())
            else:
                arrays.append(item.detach().numpy().astype(np.float64))
        elif isinstance(item, dict):
            for key in sorted(item):
                walk(item[key])
        elif isinstance(item, (list, tuple)):
            for element in item:
                walk(element)

    walk(value)
    return arrays


def _arrays(path: str) -> tuple:
    """(kind, list of float64 arrays) for a file we know how to read, else (None, [])."""
    lower = path.lower()
    if lower.endswith(IMAGE):
        return "image", _image_arrays(path)
    if lower.endswith(".npy"):
        return "image", [np.load(path).astype(np.float64)]
    if lower.endswith(".npz"):
        with np.load(path) as data:
            return "image", [data[key].astype(np.float64) for key in sorted(data.files)]
    if lower.endswith(TENSOR):
        return "float", _tensor_arrays(path)
    return None, []


def compare(run_a: str, run_b: str) -> dict:
    files_a, files_b = _files(run_a), _files(run_b)
    result = {
        "compared": 0,
        "float": None,
        "image": None,
        "worst": {},
        "float_scale": None,
        "missing": sorted(set(files_a) ^ set(files_b)),
        "nonfinite": [],
        "mismatched": [],
    }
    for relative in sorted(set(files_a) & set(files_b)):
        kind, arrays_a = _arrays(files_a[relative])
        if kind is None:
            continue
        _, arrays_b = _arrays(files_b[relative])
        result["compared"] += 1
        if len(arrays_a) != len(arrays_b) or any(a.shape != b.shape for a, b in zip(arrays_a, arrays_b)):
            result["mismatched"].append(relative)
            continue
        if not all(np.isfinite(a).all() and np.isfinite(b).all() for a, b in zip(arrays_a, arrays_b)):
            result["nonfinite"].append(relative)
            continue
        worst = max((float(np.max(np.abs(a - b))) for a, b in zip(arrays_a, arrays_b) if a.size), default=0.0)
        if result[kind] is None or worst > result[kind]:
            result[kind], result["worst"][kind] = worst, relative
            if kind == "float":  # the size of the values that differ most, to read the difference against
                result["float_scale"] = max((float(np.max(np.abs(b))) for b in arrays_b if b.size), default=0.0)
    result["verdict"] = _verdict(result)
    return result


def _verdict(result: dict) -> str:
    if result["compared"] == 0:
        return "nothing to compare"
    if result["nonfinite"] or result["mismatched"] or result["missing"]:
        return "differs"
    return "compared"


def fmt(value) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if math.isfinite(value) and value >= 0.01:
        return f"{value:.3g}"
    return f"{value:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args()
    result = compare(args.run_a, args.run_b)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['compared']} files compared; max|diff| float {fmt(result['float'])} "
            f"(values up to {fmt(result['float_scale'])}), "
            f"image {fmt(result['image'])} (8-bit levels); {result['verdict']}"
        )
        for key in ("missing", "nonfinite", "mismatched"):
            if result[key]:
                print(f"  {key}: {', '.join(result[key][:8])}")
    sys.exit(0)


if __name__ == "__main__":
    main()
