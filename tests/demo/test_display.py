"""The result image as the page shows it (scaled up by a whole factor, nearest-neighbour, labelled with its true size)
and the strategy pickers' reasons for what they leave out."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image

from npu_port.demo import choices as demo_choices
from npu_port.demo import display, formatting
from npu_port.reasons import Reason


@pytest.mark.parametrize(
    ("height", "width", "factor"),
    [(64, 64, 8), (128, 128, 4), (64, 128, 4), (100, 60, 5), (512, 512, 1), (1024, 768, 1), (3, 1, 170), (600, 2, 1)],
)
def test_the_factor_brings_the_longer_side_to_about_512_and_never_shrinks(height, width, factor):
    assert display.display_factor(height, width) == factor


@given(
    arrays(np.uint8, st.tuples(st.integers(1, 9), st.integers(1, 9), st.just(3))),
    st.integers(1, 6),
)
def test_each_source_pixel_becomes_a_k_by_k_block_of_itself(pixels, factor):
    scaled = display.scale_up(pixels, factor)
    height, width = pixels.shape[:2]
    assert scaled.shape == (height * factor, width * factor, 3) and scaled.dtype == np.uint8
    for row in range(height):
        for col in range(width):
            block = scaled[row * factor : (row + 1) * factor, col * factor : (col + 1) * factor]
            assert (block == pixels[row, col]).all()


def test_scale_up_refuses_a_factor_below_one():
    with pytest.raises(ValueError, match=r"^the display factor must be a whole number >= 1, got 0$"):
        display.scale_up(np.zeros((2, 2, 3), np.uint8), 0)


def test_the_label_gives_the_true_size_width_first():
    assert display.size_label(64, 64, 8) == "64 × 64 px, shown at 8×"
    assert display.size_label(64, 128, 4) == "128 × 64 px, shown at 4×"
    assert display.size_label(768, 1024, 1) == "1024 × 768 px, shown at its true size"


def test_for_display_scales_a_64_pixel_image_to_512_with_crisp_pixels():
    pixels = np.zeros((64, 64, 3), np.uint8)
    pixels[0, 0] = (255, 0, 0)
    pixels[0, 1] = (0, 255, 0)
    pixels[63, 63] = (1, 2, 3)
    shown, label = display.for_display(Image.fromarray(pixels))
    out = np.asarray(shown)
    assert shown.size == (512, 512) and label == "64 × 64 px, shown at 8×"
    assert (out[0:8, 0:8] == (255, 0, 0)).all() and (out[0:8, 8:16] == (0, 255, 0)).all()  # no blend at the edge
    assert (out[504:, 504:] == (1, 2, 3)).all() and (out[8:504, 16:504] == 0).all()
    assert len(np.unique(out.reshape(-1, 3), axis=0)) == 4  # nothing but the source's colours


# ------------------------------------------------------------------------------- what the pickers leave out, and why

NPU_REASON = Reason("package-missing", "torch_npu is not installed; pip install torch-npu")


def test_profiles_for_a_missing_device_and_run_only_profiles_are_listed_with_their_reasons():
    entries = [
        {"name": "sdpa", "available": True, "reasons": {}, "safe_math": {}, "extends": None},
        {
            "name": "ascend-910b",
            "available": False,
            "reasons": {
                "device": [Reason("package-missing", "needs an Ascend NPU: " + NPU_REASON)],
                "npu_fusion": [NPU_REASON],
            },
            "safe_math": {},
            "extends": "auto",
        },
        {"name": "cuda-safe-math", "available": True, "reasons": {}, "safe_math": {"fp32": True}, "extends": "sdpa"},
        {"name": "auto", "available": True, "reasons": {"npu_fusion": [NPU_REASON]}, "safe_math": {}, "extends": None},
    ]
    choices = demo_choices.strategy_choices(entries)
    assert choices.names == ["auto", "sdpa"]
    assert choices.unavailable == {
        "ascend-910b": "needs an Ascend NPU: torch_npu is not installed; pip install torch-npu",
        "cuda-safe-math": "its safe-math settings act only under npu-port run; here it would be plain sdpa",
    }
    assert formatting.unavailable_markdown(choices) == (
        "**Not available on this machine** (disabled; `npu-port strategies` says more):\n\n"
        "- ⊘ `ascend-910b` — needs an Ascend NPU: torch\\_npu is not installed; pip install torch-npu\n"
        "- ⊘ `cuda-safe-math` — its safe-math settings act only under npu-port run; here it would be plain sdpa"
    )
    with pytest.raises(demo_choices.InferenceError) as caught:
        demo_choices.check_strategy("ascend-910b", choices)
    assert str(caught.value) == (
        "strategy 'ascend-910b' cannot run here (needs an Ascend NPU: torch_npu is not installed; pip install "
        "torch-npu); choose one of: auto, sdpa"
    )
    assert formatting.unavailable_markdown(demo_choices.StrategyChoices(["auto"])) == ""
