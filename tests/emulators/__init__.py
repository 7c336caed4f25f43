"""Emulators of third-party operators, used only by the test suite (see torch_npu_emulator.py)."""
