"""The tiny text-to-image pipeline's folder, built once for the diff tests that load it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def text2image_dir(tmp_path_factory):
    from npu_port.integrations.diffusers.tiny_text2image import build_tiny_text2image

    folder = tmp_path_factory.mktemp("diff-text2image") / "pipe"
    build_tiny_text2image(str(folder))
    return folder
