"""Held-out check of an exported bundle: the features and captions its TFLite files give.

Captions come from the runtime's own captioner (edgecap.captioner), so the
recipe's figures are the product's; ``edgecap eval`` is the full evaluation.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Union

import numpy as np

from edgecap.interpreter import make_cpu_interpreter


class FrameEncoder:
    """Runs a TFLite frame encoder (int8 or float) on RGB uint8 frames, float features out."""

    def __init__(self, model: Union[Path, bytes], mean: Sequence[float], std: Sequence[float],
                 num_threads: int = 1):
        """Loads the encoder.

        Args:
          model: Path or bytes of the encoder.
          mean: Per-channel normalisation mean.
          std: Per-channel normalisation std.
          num_threads: Interpreter threads.
        """
        self._interp = make_cpu_interpreter(model, num_threads)
        self._inp = self._interp.get_input_details()[0]
        self._out = self._interp.get_output_details()[0]
        self._mean = np.asarray(mean, np.float32)
        self._std = np.asarray(std, np.float32)

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        """Returns the float feature ``[1,F]`` of one RGB uint8 frame at the encoder's size."""
        x = (frame.astype(np.float32) - self._mean) / self._std
        if self._inp["dtype"] != np.float32:
            scale, zero = self._inp["quantization"]
            info = np.iinfo(self._inp["dtype"])
            x = np.clip(np.round(x / scale) + zero, info.min, info.max)
        self._interp.set_tensor(self._inp["index"], x[None].astype(self._inp["dtype"]))
        self._interp.invoke()
        y = self._interp.get_tensor(self._out["index"])
        if self._out["dtype"] != np.float32:
            scale, zero = self._out["quantization"]
            y = (y.astype(np.float32) - zero) * scale
        return y.astype(np.float32)

    def windows(self, windows: np.ndarray) -> np.ndarray:
        """Returns features ``[B,N,F]`` of windows ``[B,N,S,S,3]``."""
        return np.stack([np.concatenate([self(f) for f in w]) for w in windows])


def caption_windows(bundle_dir: Path, windows: np.ndarray, reference: bool = False) -> List[str]:
    """Greedily captions RGB uint8 windows ``[B,N,S,S,3]`` with the runtime's own captioner.

    Args:
      bundle_dir: The exported bundle.
      windows: Preprocessed windows, as the recipe trains on them.
      reference: Use the bundle's float ``reference_encoder`` instead of the int8 one.
    """
    from edgecap.captioner import EdgeCaptioner

    with EdgeCaptioner(bundle_dir, reference_encoder=reference, pipelined=False,
                       num_threads=1) as cap:
        # The runtime takes frames as OpenCV gives them: BGR.
        return [cap.caption_frames(np.ascontiguousarray(w[..., ::-1]))[0].text for w in windows]


def exact_match(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Fraction of predictions equal to one of their references."""
    hits = sum(p in refs for p, refs in zip(predictions, references))
    return hits / max(len(predictions), 1)
