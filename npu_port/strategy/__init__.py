"""Attention strategies: which kernels run attention, chosen by rule or by measurement, applied reversibly.

``spec`` (what a strategy is) <- ``schema``/``loader`` (YAML files) <- ``registry`` (names) <- ``router`` (per-call
choice; ``measure``/``cache`` for auto) <- ``api`` (``set_attention_strategy`` and its handle; ``tally`` counts what
every applied router routed, for ``npu-port run``). The YAML files
themselves live in the ``npu_port.strategies`` data package (top-level ``strategies/``).
"""
