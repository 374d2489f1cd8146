"""Held-out check of an exported bundle: the features and captions its TFLite files give.

Captions come from the runtime's own captioner (edgecap.captioner), so the
recipe's figures are the product's; ``edgecap eval`` is the full evaluation.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Union

import numpy as np

from edgecap.bundle import InputSpec
from edgecap.interpreter import make_cpu_interpreter
from edgecap.preprocess import Preprocessor, dequantize


class FrameEncoder:
    """Runs a TFLite frame encoder (int8 or float) on RGB uint8 frames, float features out.

    Inputs are made by the runtime's own ``Preprocessor`` and outputs read with
    its ``dequantize``, so the features the recipe fine-tunes the RNN on are
    bit for bit the ones the runtime feeds it: normalising and quantising in
    numpy here instead rounds the ties of ``(x - 127.5) / 127.5`` the other way
    for most pixel values.
    """

    def __init__(self, model: Union[Path, bytes], mean: Sequence[float], std: Sequence[float],
                 num_threads: int = 1):
        """Loads the encoder.

        Args:
          model: Path or bytes of the encoder.
          mean: Per-channel normalisation mean (RGB order).
          std: Per-channel normalisation std (RGB order).
          num_threads: Interpreter threads.
        """
        self._interp = make_cpu_interpreter(model, num_threads)
        self._inp = self._interp.get_input_details()[0]
        self._out = self._interp.get_output_details()[0]
        _, height, width, channels = (int(d) for d in self._inp["shape"])
        spec = InputSpec(height=height, width=width, channels=channels, color_order="RGB",
                         mean=tuple(float(m) for m in mean), std=tuple(float(s) for s in std))
        self._preprocess = Preprocessor(spec, self._inp)

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        """Returns the float feature ``[1,F]`` of one RGB uint8 frame at the encoder's size."""
        # The runtime preprocesses frames as OpenCV gives them: BGR.
        x = self._preprocess(np.ascontiguousarray(frame[..., ::-1]))
        self._interp.set_tensor(self._inp["index"], x)
        self._interp.invoke()
        return dequantize(self._interp.get_tensor(self._out["index"]), self._out)

    def windows(self, windows: np.ndarray) -> np.ndarray:
        """Returns features ``[B,N,F]`` of windows ``[B,N,S,S,3]``."""
        return np.stack([np.concatenate([self(f) for f in w]) for w in windows])


def caption_windows(bundle_dir: Path, windows: np.ndarray, reference: bool = False) -> List[str]:
    """Captions RGB uint8 windows ``[B,N,S,S,3]`` with the runtime's own captioner (its default beam).

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
