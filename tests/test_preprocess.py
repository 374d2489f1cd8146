"""The encoder's input: the lookup table equals the affine normalise-and-quantise map."""

from __future__ import annotations

import numpy as np
import pytest

from edgecap.bundle import InputSpec
from edgecap.preprocess import Preprocessor


def _affine(frame, spec, scale, zero_point, dtype):
    # The definition: RGB, (x - mean) / std, then x / scale + zero_point, rounded and clipped.
    rgb = frame[..., ::-1] if spec.color_order == "RGB" else frame
    x = (rgb.astype(np.float64) - np.asarray(spec.mean)) / np.asarray(spec.std)
    info = np.iinfo(dtype)
    return np.clip(np.rint(x / scale + zero_point), info.min, info.max).astype(dtype)


@pytest.mark.parametrize("order", ["RGB", "BGR"])
@pytest.mark.parametrize("dtype, scale, zero_point", [
    (np.int8, 0.0078125, -1), (np.uint8, 0.0186, 118), (np.int8, 0.031, 40),
])
def test_lookup_table_equals_the_affine_map(order, dtype, scale, zero_point):
    spec = InputSpec(height=16, width=16, channels=3, color_order=order,
                     mean=(123.7, 116.3, 103.5), std=(58.4, 57.1, 57.4))
    pre = Preprocessor(spec, {"dtype": dtype, "quantization": (scale, zero_point)})
    # Every value in every channel, at the input size (no resize).
    values = np.arange(256, dtype=np.uint8)
    frame = np.stack([values, values[::-1], np.roll(values, 7)], axis=-1).reshape(16, 16, 3)
    got = pre(frame)
    assert got.shape == (1, 16, 16, 3) and got.dtype == dtype
    expected = _affine(frame, spec, scale, zero_point, dtype)
    # float32 against float64 arithmetic may round a value sitting on .5 differently.
    assert np.abs(got[0].astype(int) - expected.astype(int)).max() <= 1
    assert (got[0] == expected).mean() > 0.99


def test_float_input_is_normalised_and_resized():
    spec = InputSpec(height=8, width=8, channels=3, color_order="RGB",
                     mean=(127.5,) * 3, std=(127.5,) * 3)
    pre = Preprocessor(spec, {"dtype": np.float32, "quantization": (0.0, 0)})
    frame = np.zeros((20, 30, 3), np.uint8)
    frame[..., 0] = 255  # blue in BGR
    x = pre(frame)
    assert x.shape == (1, 8, 8, 3) and x.dtype == np.float32
    np.testing.assert_allclose(x[0, 0, 0], [-1.0, -1.0, 1.0])

