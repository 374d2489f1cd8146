"""Held-out check of an exported bundle: greedy captions from its TFLite files alone.

This is the recipe's own check that the exported files caption as the Keras
model did; the runtime's captioner (edgecap.captioner) is the product code path
and ``edgecap eval`` the full evaluation.
"""

from __future__ import annotations

import json
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


class TfliteCaptioner:
    """Captions preprocessed windows with a bundle's encoder (int8 or reference) and step models."""

    def __init__(self, bundle_dir: Path, reference: bool = False, num_threads: int = 1):
        """Loads the bundle's models.

        Args:
          bundle_dir: The bundle directory.
          reference: Use ``reference_encoder`` (float) instead of ``encoder``.
          num_threads: Interpreter threads.
        """
        meta = json.loads((bundle_dir / "bundle.json").read_text())
        encoder_file = meta["reference_encoder" if reference else "encoder"]
        self._encoder = FrameEncoder(bundle_dir / encoder_file, meta["input"]["mean"],
                                     meta["input"]["std"], num_threads)
        self._enc_step = make_cpu_interpreter(
            bundle_dir / meta["rnn"]["encoder_step"], num_threads
        ).get_signature_runner("serving_default")
        self._dec_step = make_cpu_interpreter(
            bundle_dir / meta["rnn"]["decoder_step"], num_threads
        ).get_signature_runner("serving_default")
        self._vocab = (bundle_dir / meta["vocab"]).read_text(encoding="utf-8").splitlines()
        self._hidden = meta["rnn"]["hidden_size"]
        self._max_len = meta["max_caption_length"]
        self._bos, self._eos = meta["tokens"]["bos"], meta["tokens"]["eos"]

    def caption(self, window: np.ndarray) -> str:
        """Greedily captions one window of RGB uint8 frames ``[N,S,S,3]``."""
        h = np.zeros((1, self._hidden), np.float32)
        c = np.zeros_like(h)
        for frame in window:
            state = self._enc_step(feature=self._encoder(frame), h=h, c=c)
            h, c = state["h_out"], state["c_out"]
        word = self._bos
        words: List[str] = []
        for _ in range(self._max_len + 1):
            out = self._dec_step(word=np.array([word], np.int32), h=h, c=c)
            h, c = out["h_out"], out["c_out"]
            word = int(np.argmax(out["logits"][0]))
            if word == self._eos:
                break
            words.append(self._vocab[word])
        return " ".join(words)


def exact_match(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Fraction of predictions equal to one of their references."""
    hits = sum(p in refs for p, refs in zip(predictions, references))
    return hits / max(len(predictions), 1)
