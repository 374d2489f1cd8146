"""Frame preprocessing: resize, channel order, normalisation and quantisation for the encoder."""

from __future__ import annotations

from typing import Any, Dict

import cv2
import numpy as np

from edgecap.bundle import InputSpec


class Preprocessor:
    """Turns a BGR uint8 frame into the encoder's input tensor.

    Normalisation ``(x - mean) / std`` and quantisation ``x / scale + zero_point``
    fold into one per-channel affine map, so a frame costs one resize, one
    multiply-add and one cast.
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
            self.lo, self.hi = info.min, info.max

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        """Returns the ``[1, H, W, C]`` input tensor for one BGR uint8 frame."""
        if frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"expected an HxWx3 BGR frame, got shape {frame.shape}")
        if (frame.shape[1], frame.shape[0]) != self.size:
            frame = cv2.resize(frame, self.size, interpolation=cv2.INTER_AREA)
        if self.to_rgb:
            frame = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
        x = frame.astype(np.float32) * self.gain + self.offset
        if self.dtype.kind != "f":
            x = np.clip(np.rint(x), self.lo, self.hi)
        return x.astype(self.dtype)[None]


def dequantize(x: np.ndarray, detail: Dict[str, Any]) -> np.ndarray:
    """Returns float32 values of a tensor given its interpreter detail (no-op for floats)."""
    if x.dtype.kind == "f":
        return x.astype(np.float32, copy=False)
    scale, zero_point = detail["quantization"]
    return (x.astype(np.float32) - zero_point) * scale
