"""Frame preprocessing: resize, channel order, normalisation and quantisation for the encoder."""

from __future__ import annotations

from typing import Any, Dict

import cv2
import numpy as np

from edgecap.bundle import InputSpec


class Preprocessor:
    """Turns a BGR uint8 frame into the encoder's input tensor.

    Normalisation ``(x - mean) / std`` and quantisation ``x / scale + zero_point``
    fold into one per-channel affine map. For a quantized input that map takes
    only 256 values per channel, so it is a lookup table: a frame costs one
    resize, one ``cv2.LUT`` and one channel swap, all in OpenCV without the GIL.
    """

    def __init__(self, spec: InputSpec, input_detail: Dict[str, Any]):
        """Builds the map for an encoder input.

        Args:
          spec: The bundle's input spec.
          input_detail: The encoder interpreter's input detail (dtype, quantization).
        """
        self.size = (spec.width, spec.height)
        self.to_rgb = spec.color_order == "RGB"
        self.dtype = np.dtype(input_detail["dtype"])
        mean = np.asarray(spec.mean, np.float32)
        std = np.asarray(spec.std, np.float32)
        scale, zero_point = input_detail["quantization"]
        if self.dtype.kind == "f":
            self.gain, self.offset = 1.0 / std, -mean / std
        else:
            self.gain = 1.0 / (std * scale)
            self.offset = zero_point - mean / (std * scale)
            info = np.iinfo(self.dtype)
            # Indexed by the frame's own (BGR) channels; the swap to RGB comes after.
            order = [2, 1, 0] if self.to_rgb else [0, 1, 2]
            values = np.arange(256, dtype=np.float32)[:, None]
            table = np.clip(np.rint(values * self.gain[order] + self.offset[order]),
                            info.min, info.max).astype(self.dtype)
            self.table = np.ascontiguousarray(table.view(np.uint8).reshape(256, 1, 3))

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        """Returns the ``[1, H, W, C]`` input tensor for one BGR uint8 frame."""
        if frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"expected an HxWx3 BGR frame, got shape {frame.shape}")
        if frame.dtype != np.uint8:
            raise ValueError(f"expected a uint8 frame, got {frame.dtype}")
        if (frame.shape[1], frame.shape[0]) != self.size:
            frame = cv2.resize(frame, self.size, interpolation=cv2.INTER_AREA)
        if self.dtype.kind != "f":
            x = cv2.LUT(frame, self.table)
            if self.to_rgb:
                x = cv2.cvtColor(x, cv2.COLOR_BGR2RGB)
            return x.view(self.dtype)[None]
        if self.to_rgb:
            frame = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
        return (frame.astype(np.float32) * self.gain + self.offset)[None]


def dequantize(x: np.ndarray, detail: Dict[str, Any]) -> np.ndarray:
    """Returns float32 values of a tensor given its interpreter detail (no-op for floats)."""
    if x.dtype.kind == "f":
        return x.astype(np.float32, copy=False)
    scale, zero_point = detail["quantization"]
    return (x.astype(np.float32) - zero_point) * scale
