"""Integrations with other libraries (diffusers today), kept at the edge of npu-port.

An integration imports the core (``npu_port.attn`` and friends) and the library it adapts; the core never imports
an integration. That keeps ``import npu_port`` free of optional packages and lets the attention kernels, the masks
and the device layer be tested without diffusers installed. Each integration imports its library lazily, inside
the functions that need it, so importing this package costs nothing either.
"""
