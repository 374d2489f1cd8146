"""The S2VT-style RNN on the CPU: an encoder step per frame and a greedy decoder per window."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List

import numpy as np

from edgecap.interpreter import TensorIO, make_cpu_interpreter


@dataclass(frozen=True)
class State:
    """LSTM state (h, c), each ``[1, hidden]`` float32."""

    h: np.ndarray
    c: np.ndarray

    @classmethod
    def zeros(cls, hidden_size: int) -> "State":
        """Returns the state a window starts from: h and c all zeros."""
        z = np.zeros((1, hidden_size), np.float32)
        return cls(z, z)


def _step_model(path: "str | os.PathLike[str]", num_threads: int) -> TensorIO:
    # A signature runner resizes every input and re-allocates tensors on each
    # call; a step's shapes never change, so tensors are bound by index once.
    return TensorIO.from_signature(make_cpu_interpreter(path, num_threads))


class RnnEncoder:
    """Runs the encoder step model: reads one frame feature, carries (h, c).

    Owns one interpreter; use it from one thread at a time.
    """

    def __init__(self, path: "str | os.PathLike[str]", num_threads: int = 1):
        self._run = _step_model(path, num_threads)

    def step(self, feature: np.ndarray, state: State) -> State:
        """Returns the state after reading ``feature`` (any shape with F values)."""
        out = self._run({"feature": feature.reshape(1, -1).astype(np.float32, copy=False),
                         "h": state.h, "c": state.c})
        return State(out["h_out"], out["c_out"])


class RnnDecoder:
    """Runs the decoder step model greedily from an encoder state to a token sequence.

    Owns one interpreter; use it from one thread at a time.
    """

    def __init__(self, path: "str | os.PathLike[str]", num_threads: int = 1):
        self._run = _step_model(path, num_threads)

    def decode(self, state: State, bos: int, eos: int, max_length: int) -> List[int]:
        """Returns the greedy caption's token ids, without bos and eos.

        Args:
          state: The encoder's state after the window's last frame.
          bos: Id of the first word fed to the decoder.
          eos: Id that ends the caption.
          max_length: Most words to emit.
        """
        word, h, c = bos, state.h, state.c
        ids: List[int] = []
        for _ in range(max_length):
            out = self._run({"word": np.array([word], np.int32), "h": h, "c": c})
            word = int(np.argmax(out["logits"][0]))
            if word == eos:
                break
            ids.append(word)
            h, c = out["h_out"], out["c_out"]
        return ids
