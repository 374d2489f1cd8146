"""The training recipe's frame features are the runtime's, bit for bit (no TensorFlow needed)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import sample_story
from edgecap.bundle import load_bundle
from edgecap.interpreter import make_cpu_interpreter
from edgecap.preprocess import Preprocessor, dequantize
from models.heldout import FrameEncoder

# models.export's normalisation (it imports TensorFlow, so it is not imported here);
# the first test checks the shipped bundle says the same.
PIXEL_MEAN = PIXEL_STD = 127.5


def _runtime_features(bundle_dir: Path, encoder: Path, bgr: np.ndarray) -> np.ndarray:
    # What the runtime computes for a BGR frame: the bundle's input spec, the
    # runtime's preprocessing and dequantisation around the encoder.
    interp = make_cpu_interpreter(encoder)
    (inp,), (out,) = interp.get_input_details(), interp.get_output_details()
    preprocess = Preprocessor(load_bundle(bundle_dir).input, inp)
    interp.set_tensor(inp["index"], preprocess(bgr))
    interp.invoke()
    return dequantize(interp.get_tensor(out["index"]), out)


@pytest.mark.parametrize("encoder", ["encoder.tflite", "encoder_float.tflite"])
def test_recipe_features_equal_the_runtimes(shipped_bundle: Path, encoder: str) -> None:
    b = load_bundle(shipped_bundle)
    assert b.input.mean == (PIXEL_MEAN,) * 3 and b.input.std == (PIXEL_STD,) * 3
    size = (b.input.width, b.input.height)
    frames = sample_story().frames[::5]
    recipe = FrameEncoder(shipped_bundle / encoder, [PIXEL_MEAN] * 3, [PIXEL_STD] * 3)
    for bgr in frames:
        small = cv2.resize(bgr, size, interpolation=cv2.INTER_AREA)
        rgb = cv2.cvtColor(small, cv2.COLOR_BGR2RGB)  # as models.train.load_windows gives them
        got = recipe(rgb)
        assert got.dtype == np.float32 and got.shape == (1, b.feature_size)
        np.testing.assert_array_equal(got, _runtime_features(shipped_bundle, shipped_bundle / encoder, small))


def test_windows_stack_features_per_frame(shipped_bundle: Path) -> None:
    b = load_bundle(shipped_bundle)
    rng = np.random.default_rng(0)
    windows = rng.integers(0, 256, (2, 3, b.input.height, b.input.width, 3), dtype=np.uint8)
    recipe = FrameEncoder(shipped_bundle / "encoder.tflite", [PIXEL_MEAN] * 3, [PIXEL_STD] * 3)
    feats = recipe.windows(windows)
    assert feats.shape == (2, 3, b.feature_size)
    np.testing.assert_array_equal(feats[1, 2], recipe(windows[1, 2])[0])
    assert not np.array_equal(feats[0, 0], feats[1, 2])
