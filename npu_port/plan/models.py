"""Recording a diffusers pipeline — a tiny built-in one or a local directory — for ``npu-port plan --model``.

The pipeline is loaded on this machine's CPU in the dtype the target would use, as ``npu-port infer`` loads it
(:func:`npu_port.infer.models.load_pipeline`), and called once with ``npu-port infer``'s arguments for the request
(:func:`npu_port.infer.run.call_arguments`: size, frames, true CFG, ...), so the calls recorded are the ones an
``npu-port infer`` run on the device would make, at the size asked for.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Callable, Iterator, Optional

import torch

from ..attn.target import Target
from ..errors import PlanError
from ..infer.models import TINY_MODELS, describe_model, load_pipeline, resolve_dtype
from ..infer.run import GenerationRequest, call_arguments, check_request
from ..upstream.diffusers import pipelines as upstream_pipelines
from .assess import Plan, assess
from .record import Recording, record_calls, recording_strategy

#: Denoising steps a plan runs by default: every step makes the same calls, so two show the pattern and the count.
DEFAULT_STEPS = 2
#: The diffusers logger that warns about half precision on a CPU.
PIPELINE_LOGGER = upstream_pipelines.PIPELINE_LOGGER


def plan_dtype(dtype: str, target: Target) -> torch.dtype:
    """``--dtype`` for the target: ``auto`` is what ``npu-port infer`` would pick there (float16 on an accelerator)."""
    return resolve_dtype(dtype, target.device_type)


def check_model(model: str, request: GenerationRequest) -> None:
    """Refuse an unknown model or a size it cannot make, before anything is loaded (one line, the valid choices).
    A plan runs the model here, so it takes a built-in name or a local directory, not a hub id."""
    if model not in TINY_MODELS and not os.path.isdir(os.path.expanduser(model)):
        raise PlanError(
            f"model {model!r} is neither a built-in model nor a local diffusers directory; a plan runs the model on "
            f"this machine: give a directory (saved with pipe.save_pretrained(DIR)) or one of: {', '.join(TINY_MODELS)}"
        )
    limits = describe_model(model).limits  # a directory without model_index.json is refused here
    assert limits is not None  # only hub ids have none
    limits.check(request)


def check_diffusers() -> None:
    """A pipeline plan runs diffusers here: say how to install it when it is missing (not a traceback later)."""
    from .._optional import extra_hint, probe

    status = probe("diffusers")
    if not status.ok:
        what = str(status.reason).split("; ")[0]  # without the probe's generic hint: the extra's is better
        raise PlanError(
            f"a plan of a pipeline runs it here with diffusers, and {what}; install it with "
            f"{extra_hint('diffusers')} (a script is planned with npu-port run --plan)"
        )


class _HalfOnCpuNote(logging.Filter):
    """diffusers warns that a float16 pipeline "will fail" on a CPU; the plan runs it there on purpose (the target's
    dtype), and the small models run fine."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "cannot run with `cpu` device" not in record.getMessage()


@contextlib.contextmanager
def _quiet_half_on_cpu() -> Iterator[None]:
    logger = logging.getLogger(PIPELINE_LOGGER)
    note = _HalfOnCpuNote()
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)


def record_model(
    model: str,
    dtype: torch.dtype,
    request: GenerationRequest,
    strategy: Any = "npu",
    on_build: Optional[Callable[[str], None]] = None,
) -> Recording:
    """Load ``model`` on the CPU in ``dtype`` and record one generation for ``request`` (strategy applied to the
    pipeline, as ``npu-port infer`` applies it)."""
    recording_strategy(strategy)
    check_model(model, request)
    check_diffusers()
    with _quiet_half_on_cpu():
        loaded = load_pipeline(model, torch.device("cpu"), dtype, progress_bar=False, on_build=on_build)
        check_request(loaded, request)
        generator = torch.Generator("cpu").manual_seed(request.seed)
        arguments = call_arguments(loaded, request, generator)

        def run() -> Any:
            with torch.no_grad():
                return loaded.pipe(**arguments)

        return record_calls(run, target_model=loaded.pipe, strategy=strategy)


def plan_model(
    model: str,
    target: Target,
    strategy: Any = "npu",
    *,
    dtype: str = "auto",
    steps: int = DEFAULT_STEPS,
    height: Optional[int] = None,
    width: Optional[int] = None,
    frames: Optional[int] = None,
    verbose: bool = False,
    on_build: Optional[Callable[[str], None]] = None,
) -> Plan:
    """Record ``model`` (a built-in tiny pipeline or a local diffusers directory) here and judge it for ``target``."""
    chosen = plan_dtype(dtype, target)
    request = GenerationRequest(steps=steps, height=height, width=width, frames=frames)
    recording = record_model(model, chosen, request, strategy, on_build)
    return assess(recording, target, strategy, model=model, dtype=str(chosen).replace("torch.", ""), verbose=verbose)
