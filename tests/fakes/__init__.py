"""Stand-ins for optional GPU packages (xformers, flash_attn) that follow their documented contracts, for tests."""
