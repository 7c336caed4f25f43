"""npu-port's diffusers integration: route every attention computation of a diffusers model or pipeline to one
SDPA-compatible attention function (an npu-port kernel or the strategy router), reversibly.

The strategy API calls :func:`apply_to_target`; everything else here is how it works:

* :mod:`.classes` — the diffusers classes we rely on, as the diffusers adapter (:mod:`npu_port.upstream.diffusers`)
  finds them in the installed version; what it cannot find declines (the modules stay on diffusers' path, reported);
* :mod:`.targets` — what a target is and which attention modules it holds;
* :mod:`.processor` — the processor that replaces diffusers' standard ones (their steps, our attention core);
* :mod:`.routing` — the per-module route (a context variable set by forward hooks) and call counting;
* :mod:`.patches` — the shared, reversible patches that route kept processors: the SDPA / dispatcher globals their
  code calls, or their class's ``__call__`` in place;
* :mod:`.scores` — recompiling processors that go through ``get_attention_scores`` + ``torch.bmm`` (``AttnProcessor``,
  sliced, added-KV, custom-diffusion) with that pair routed;
* :mod:`.watch` — noticing a processor set later on any targeted module (routed the moment it is set);
* :mod:`.applied` — the record of one application (held weakly: a dropped model is freed), its live states and
  ``restore()``;
* :mod:`.apply` — putting it together, all or nothing.

Importing this package does not import diffusers; the first :func:`apply_to_target` does.
"""

from .applied import ACTIONS, AppliedAttention, ModuleChange
from .apply import apply_to_target
from .processor import RoutedAttnProcessor
from .routing import Route, Tally, active_route, current_route

__all__ = [
    "ACTIONS",
    "AppliedAttention",
    "ModuleChange",
    "Route",
    "RoutedAttnProcessor",
    "Tally",
    "active_route",
    "apply_to_target",
    "current_route",
]
