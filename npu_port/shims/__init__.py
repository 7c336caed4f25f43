"""Stand-ins for packages a CUDA project imports but this machine cannot have (flash_attn, xformers, compiled CUDA
extensions), served by an import hook (:mod:`.finder`) that a real, working package always wins over."""
