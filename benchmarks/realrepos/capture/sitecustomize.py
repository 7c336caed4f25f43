"""Observation hooks for the real-repository harness, loaded by Python at start-up (this folder goes on PYTHONPATH).

It changes no computation. With ``REALREPOS_CAPTURE_DIR`` set, the floating-point outputs of every module whose class
name is listed in ``REALREPOS_CAPTURE_CLASSES`` (comma-separated, e.g. ``Decoder`` for a diffusers VAE decoder,
``RAFT``) are saved, one file per call, under ``$REALREPOS_CAPTURE_DIR/rank<RANK>/`` — so the npu-port run and the
hand port can be compared beyond the 8-bit images the projects write. The hook is a global forward hook
(``torch.nn.modules.module.register_module_forward_hook``), registered right after ``torch`` is first imported so
that nothing is imported earlier than the project itself would import it.

With ``REALREPOS_NO_DISPLAY`` set, ``cv2.imshow`` saves the image (as ``display-NNNN.npy`` in the capture folder;
a float image times 255, as imshow shows it) and ``cv2.waitKey`` returns at once: RAFT's demo.py shows each flow in a
window and waits for a key, and there is no screen here.
"""

import importlib.abc
import importlib.machinery
import os
import sys

_DIR = os.environ.get("REALREPOS_CAPTURE_DIR")
_CLASSES = {name for name in os.environ.get("REALREPOS_CAPTURE_CLASSES", "").split(",") if name}
_counts = {}


def _folder():
    folder = os.path.join(_DIR, "rank" + os.environ.get("RANK", "0"))
    os.makedirs(folder, exist_ok=True)
    return folder


def _tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    if hasattr(value, "to_tuple"):  # diffusers / transformers output dataclasses
        return _tensors(value.to_tuple())
    return []


def _save_output(module, args, output):
    name = type(module).__name__
    if name not in _CLASSES:
        return None
    import torch

    index = _counts[name] = _counts.get(name, -1) + 1
    tensors = [t.detach().to("cpu", torch.float64) for t in _tensors(output) if t.is_floating_point()]
    path = os.path.join(_folder(), f"{name}-{index:04d}.pt")
    torch.save(tensors, path + ".tmp")
    os.replace(path + ".tmp", path)
    return None


def _after_torch():
    import torch

    torch.nn.modules.module.register_module_forward_hook(_save_output)


def _after_cv2():
    cv2 = sys.modules["cv2"]
    shown = [0]

    def imshow(title, image):
        import numpy as np

        pixels = np.asarray(image, dtype=np.float64)
        if np.asarray(image).dtype.kind == "f":  # cv2.imshow shows a float image times 255: keep 8-bit levels
            pixels = pixels * 255.0
        np.save(os.path.join(_folder(), f"display-{shown[0]:04d}.npy"), pixels)
        shown[0] += 1

    cv2.imshow = imshow
    cv2.waitKey = lambda *args, **kwargs: -1


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback once a top-level module has executed (the first time it is imported)."""

    def __init__(self, callbacks):
        self.callbacks = callbacks

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.callbacks:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        callback, exec_module = self.callbacks.pop(fullname), spec.loader.exec_module

        def exec_then_hook(module):
            exec_module(module)
            callback()

        spec.loader.exec_module = exec_then_hook
        return spec


_callbacks = {}
if _DIR and _CLASSES:
    _callbacks["torch"] = _after_torch
if _DIR and os.environ.get("REALREPOS_NO_DISPLAY"):
    _callbacks["cv2"] = _after_cv2
if _callbacks:
    sys.meta_path.insert(0, _AfterImport(_callbacks))
