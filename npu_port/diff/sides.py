"""The sides of ``npu-port diff``: a side spec (``--a device=cpu,dtype=float32,strategy=vanilla``) parsed and checked
before any work, and a side run now and captured into a dump.

A spec is comma-separated ``key=value`` pairs with the keys of :data:`KEYS`; ``fuse_ops`` lists its ops with ``+``
(``fuse_ops=rms_norm+rope``), since the comma separates pairs. What a spec leaves out comes from the command's own
options (``--device``, ``--dtype``, ``--strategy``, ...), so two sides differ only where their specs say.

A run loads the model as ``npu-port infer`` does (:func:`npu_port.infer.load_pipeline`) and generates one request
under :func:`~npu_port.diff.capture.capture`; a transformers model folder (``config.json``, no ``model_index.json``:
a text encoder) is loaded with ``AutoModel`` and encodes the prompt once. The dump's meta says what ran, so that a
later ``npu-port diff run.d --b ...`` can run the same request again.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ..errors import DiffError

#: The keys a side spec may set.
KEYS = ("device", "dtype", "strategy", "profile", "fuse_ops")
DTYPES = ("auto", "float32", "float16", "bfloat16")
#: Fixed token ids a text encoder without a saved tokenizer encodes (the same on every machine).
TOKENS = 16


def parse_spec(text: str, flag: str) -> Dict[str, Any]:
    """``key=value,...`` as a dict (``fuse_ops`` as a tuple of op names), or :class:`DiffError` in one line."""
    from ..strategy.spec import check_fuse_ops

    found: Dict[str, Any] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise DiffError(
                f"{flag} {text!r}: give key=value pairs separated by commas (keys: {', '.join(KEYS)}), e.g. "
                f"{flag} strategy=sdpa,dtype=bfloat16"
            )
        if key not in KEYS:
            raise DiffError(f"{flag} {text!r}: unknown key {key!r}; valid keys: {', '.join(KEYS)}")
        if key in found:
            raise DiffError(f"{flag} {text!r}: {key} is given twice")
        if not value:
            raise DiffError(f"{flag} {text!r}: {key} has no value")
        if key == "dtype" and value not in DTYPES:
            raise DiffError(f"{flag} {text!r}: unknown dtype {value!r}; valid dtypes: {', '.join(DTYPES)}")
        if key == "fuse_ops":
            try:
                value = tuple(check_fuse_ops([op.strip() for op in value.split("+")], f"{flag} fuse_ops"))
            except ValueError as exc:
                raise DiffError(f"{flag} {text!r}: {str(exc).splitlines()[0]}") from None
        found[key] = value
    if "strategy" in found and "profile" in found:
        raise DiffError(f"{flag} {text!r}: give strategy or profile, not both (a profile names its own strategy)")
    return found


def parse_fuse_ops(text: Optional[str], flag: str = "--fuse-ops") -> Tuple[str, ...]:
    """``--fuse-ops rms_norm,rope`` (or ``+`` between ops) as checked op names; empty for None."""
    from ..strategy.spec import check_fuse_ops

    if text is None:
        return ()
    ops = [op.strip() for op in text.replace("+", ",").split(",")]
    try:
        names = tuple(check_fuse_ops(ops, flag))
    except ValueError as exc:
        raise DiffError(str(exc).splitlines()[0]) from None
    if not names:
        raise DiffError(f"{flag} {text!r} names no op")
    return names


def transformers_folder(model: str) -> bool:
    """Whether ``model`` is a saved transformers model (a text encoder): ``config.json`` with ``architectures`` and
    no ``model_index.json``."""
    source = Path(os.path.expanduser(model))
    if not source.is_dir() or (source / "model_index.json").is_file() or not (source / "config.json").is_file():
        return False
    import json

    try:
        config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("architectures"))


@dataclass
class Side:
    """One run to capture now, every part of it checked: model, where, how (strategy or profile, fuse_ops) and the
    request."""

    label: str
    model: str
    device: Any  # torch.device
    dtype: Any  # torch.dtype
    strategy: str  # a strategy name, YAML path or "module:attr"; a profile's name or path when profile is set
    request: Any  # npu_port.infer.GenerationRequest
    profile: Optional[str] = None
    fuse_ops: Tuple[str, ...] = ()
    text_encoder_device: Any = None
    settings: Dict[str, Any] = field(default_factory=dict)

    def meta(self) -> Dict[str, Any]:
        """What the dump's meta records of this run (read back by :func:`request_from_meta`)."""
        from dataclasses import asdict

        request = {k: v for k, v in asdict(self.request).items() if k != "strategy"}
        return {
            "side": self.label,
            "model": self.model,
            "model_source": os.path.abspath(os.path.expanduser(self.model))
            if os.path.exists(os.path.expanduser(self.model))
            else self.model,
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "strategy": None if self.profile else self.strategy,
            "profile": self.profile,
            "fuse_ops": list(self.fuse_ops),
            "request": request,
        }


#: Request fields a dump's meta gives a spec side that the command line did not.
REQUEST_FIELDS = ("prompt", "negative_prompt", "class_label", "steps", "seed", "height", "width", "guidance_scale",
                  "frames", "vae_slicing", "vae_tiling")  # fmt: skip


def check_side(label: str, model: str, device: Optional[str], dtype: str, strategy: Optional[str],
               profile: Optional[str], fuse_ops: Tuple[str, ...], request: Any,
               text_encoder_device: Optional[str] = None) -> Side:  # fmt: skip
    """A :class:`Side` with its device, dtype, strategy and request checked (one line each, before any load)."""
    from ..device import get_device
    from ..infer.limits import UNKNOWN_MODEL
    from ..infer.models import describe_model, resolve_dtype
    from ..infer.strategies import check_strategy

    if strategy and profile:
        raise DiffError(f"side {label}: give a strategy or a profile, not both (a profile names its own strategy)")
    if not transformers_folder(model):
        plan = describe_model(model)
        (plan.limits or UNKNOWN_MODEL).check(request)
    resolved_device = get_device(device)
    resolved_dtype = resolve_dtype(dtype or "auto", resolved_device)
    name = profile or strategy or "auto"
    check_strategy(name)
    request.strategy = name
    encoder = get_device(text_encoder_device) if text_encoder_device else None
    return Side(label, model, resolved_device, resolved_dtype, name, request, profile, tuple(fuse_ops), encoder)


@contextlib.contextmanager
def _fused(target: Any, ops: Tuple[str, ...]):
    if not ops:
        yield None
        return
    from ..fuse.api import fuse_ops

    handle = fuse_ops(target, list(ops), strict=True)  # an op refused here is an error, never a silent plain run
    try:
        yield handle
    finally:
        handle.restore()


def run_side(side: Side, out: os.PathLike, *, full: Any = (), sample_size: Optional[int] = None,
             progress: bool = False, cache: Any = None, on_build: Any = None) -> Path:  # fmt: skip
    """Load ``side``'s model, run its request under :func:`capture` into the dump ``out``; returns the dump's path."""
    from .capture import capture

    options = {} if sample_size is None else {"sample_size": sample_size}
    if side.profile:
        from ..npu_setup import apply_npu_options

        apply_npu_options(side.profile)
    if transformers_folder(side.model):
        return _run_encoder(side, out, full, options, progress)
    from ..infer import generate, load_pipeline

    loaded = load_pipeline(side.model, side.device, side.dtype, text_encoder_device=side.text_encoder_device,
                           progress_bar=False, on_build=on_build, cache=cache)  # fmt: skip
    meta = side.meta()
    meta["kind"] = loaded.kind
    with _fused(loaded.pipe, side.fuse_ops):
        with capture(loaded.pipe, out, full=full, meta=meta, progress=progress, **options) as recorder:
            result = generate(loaded, side.request)
            recorder.note(strategy_resolved=result.strategy_resolved)
    return Path(recorder.path)


def _run_encoder(side: Side, out: os.PathLike, full: Any, options: Dict[str, Any], progress: bool) -> Path:
    """A transformers model folder: ``AutoModel`` in the side's dtype on its device, the prompt through the saved
    tokenizer (else :data:`TOKENS` fixed ids), one forward under the strategy."""
    import torch
    from transformers import AutoModel

    from ..strategy.api import set_attention_strategy
    from .capture import capture

    source = os.path.expanduser(side.model)
    try:
        model = AutoModel.from_pretrained(source).to(device=side.device, dtype=side.dtype).eval()
    except Exception as exc:  # noqa: BLE001 - any loader failure is one line naming the folder
        first = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        raise DiffError(f"cannot load the transformers model in {side.model!r}: {first}") from None
    ids = _token_ids(source, side.request.prompt, model)
    meta = side.meta()
    meta.update(kind="text-encoder", tokens=ids.tolist())
    handle = set_attention_strategy(side.strategy)
    try:
        with _fused(model, side.fuse_ops), torch.no_grad():
            with capture(model, out, full=full, meta=meta, progress=progress, **options) as recorder:
                model(input_ids=ids.to(side.device))
    finally:
        handle.restore()
    return Path(recorder.path)


def _token_ids(source: str, prompt: str, model: Any):
    import torch

    names = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "spiece.model")
    if any(os.path.isfile(os.path.join(source, name)) for name in names):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source)
        return tokenizer(prompt, return_tensors="pt")["input_ids"]
    vocab = int(getattr(model.config, "vocab_size", 0) or 1000)
    return (torch.arange(1, TOKENS + 1) % vocab).unsqueeze(0)
