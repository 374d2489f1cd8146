"""Frame preprocessing: resize, channel order, normalisation and quantisation for the encoder."""

from __future__ import annotations

from typing import Any, Dict

import cv2
import numpy as np

from edgecap.bundle import InputSpec
from edgecap.errors import SourceError

# Conversions of the other channel layouts a caller may hand over to BGR.
_TO_BGR = {1: cv2.COLOR_GRAY2BGR, 4: cv2.COLOR_BGRA2BGR}


def as_bgr(image: Any, what: str = "frame") -> np.ndarray:
    """Returns a frame as the HxWx3 uint8 BGR image the encoder's preprocessing takes.

    Any height and width is taken (frames are resized to the model's input).
    Gray (HxW or HxWx1) is converted to BGR and BGRA loses its alpha; other
    dtypes are refused rather than guessed at (a float image may be 0-1 or
    0-255, a uint16 one 10, 12 or 16 bits).

    Args:
      image: The frame, an array or anything ``np.asarray`` takes.
      what: What to call it in the message, e.g. ``frame 12``.

    Returns:
      The image itself when it is already HxWx3 uint8, else a converted copy.

    Raises:
      SourceError: If it is not a non-empty uint8 image of 1, 3 or 4 channels.
    """
    x = np.asarray(image)
    if x.ndim == 3 and x.shape[2] == 3 and x.dtype == np.uint8 and x.size:
        return x
    channels = 1 if x.ndim == 2 else (x.shape[2] if x.ndim == 3 else None)
    if channels not in (1, 3, 4) or not x.size:
        raise SourceError(f"{what}: expected an image HxWx3 (BGR), HxW or HxWx1 (gray) or "
                          f"HxWx4 (BGRA), got shape {x.shape}")
    if x.dtype != np.uint8:
        hint = ("np.clip(x * 255, 0, 255).astype(np.uint8) for floats in [0, 1]"
                if x.dtype.kind == "f" else "(x >> 8).astype(np.uint8) for 16-bit pixels")
        raise SourceError(f"{what}: expected uint8 pixels (0-255), got {x.dtype}: convert "
                          f"it, e.g. {hint}")
    return cv2.cvtColor(np.ascontiguousarray(x), _TO_BGR[channels])


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
        """Returns the ``[1, H, W, C]`` input tensor for one frame.

        Raises:
          SourceError: If the frame is not an image ``as_bgr`` takes.
        """
        frame = as_bgr(frame)
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
