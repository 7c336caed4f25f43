"""``npu-port plan``: which attention calls of a model would run fused on another device, found out on this one.

Most ports are planned before there is NPU time. A plan runs the model here (CPU), records every attention call
npu-port routes — and every direct SDPA call it does not — grouped by signature, and judges each signature for the
target device with the strategy's own rule and the kernels' static ``reasons``: the kernel that would run it, whether
that is one fused op (no score matrix in device memory), the memory it needs, and why each other candidate would not.

The Python API (stable; the coverage tests and ``npu-port plan`` / ``npu-port run --plan`` use it)::

    from npu_port.attn.target import Target
    from npu_port.plan import assess, record_calls

    recording = record_calls(lambda: pipe(prompt, num_inference_steps=2), target_model=pipe, strategy="npu")
    plan = assess(recording, Target.of("npu", "910B"))          # strategy: the recording's unless given
    plan.calls, plan.fused                                      # counts of calls (not signatures)
    plan.signatures                                             # [SignaturePlan]: count, kernel, fused, bytes, reasons
    print(plan.summary())    # fused: 12/12 attention calls (100%) on npu (910B) with strategy npu
    plan.to_dict()           # JSON-ready: calls, fused, device, chip, strategy, model, signatures

- :func:`record_calls` ``(run, target_model=None, strategy="npu") -> Recording``: runs ``run()`` here while
  recording. ``target_model`` is what the recording strategy is applied to (a diffusers pipeline or a bare diffusers
  model, as ``set_attention_strategy(target=...)`` takes); None applies it process-wide (``npu_port.attention``, the
  flash_attn / xformers drop-ins, legacy attention). Calls compute correctly here (sdpa, else math), so a whole
  pipeline runs. ``recording.calls``, ``recording.entries`` ([Recorded]: signature, count, a data-free call),
  ``recording.result`` (what ``run()`` returned).
- :func:`assess` ``(recording, target, strategy=None, *, model=None, dtype=None, verbose=False) -> Plan``.
- :func:`plan_model` ``(model, target, strategy="npu", *, dtype="auto", steps=2, height=None, width=None,
  frames=None, verbose=False) -> Plan``: a tiny built-in pipeline or a local diffusers directory, loaded here in the
  target's dtype and run once — what ``npu-port plan --model`` runs.

Limits: the calls are those of this run, at the sizes it used (a plan for 1024x1024 must run at 1024x1024); a model
that takes other code paths on the device (``if device.type == "npu"``) is recorded on its CPU path; attention that
is computed by hand (``bmm`` + ``softmax``) and routed by no integration is not seen at all; SDPA imported by name
before the run (``from torch.nn.functional import scaled_dot_product_attention``) is not seen either.
"""

from __future__ import annotations

from .assess import Plan, SignaturePlan, assess
from .models import plan_model
from .record import Recorded, Recording, record_calls
from .signature import MaskForm, Signature

__all__ = [
    "MaskForm",
    "Plan",
    "Recorded",
    "Recording",
    "Signature",
    "SignaturePlan",
    "assess",
    "plan_model",
    "record_calls",
]
