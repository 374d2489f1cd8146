"""The S2VT-style RNN on the CPU: an encoder step per frame and a beam-search decoder per window."""

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


@dataclass(frozen=True)
class Decoded:
    """A decoded caption and how sure the decoder was of it.

    Attributes:
      tokens: Its token ids, without bos and eos.
      confidence: Mean log-probability of its tokens and of the eos that ended
        it (a caption cut at ``max_length`` has no eos term); <= 0, nearer 0 is
        surer.
      steps: Decoder step invokes it took (its cost).
    """

    tokens: List[int]
    confidence: float
    steps: int


@dataclass(frozen=True)
class _Hypothesis:
    tokens: List[int]
    log_prob: float  # sum over its terms
    ended: bool  # by eos (one term more than its tokens)
    h: np.ndarray
    c: np.ndarray

    @property
    def terms(self) -> int:
        return len(self.tokens) + self.ended


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Returns the log-probabilities of ``logits`` along the last axis, in float64."""
    x = logits.astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    return x - (top + np.log(np.exp(x - top).sum(axis=-1, keepdims=True)))


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Returns the flat indices of the ``k`` highest scores, best first; ties go to the lower index.

    The lower-index rule makes ``k == 1`` pick what ``np.argmax`` picks, so a
    beam of one is the greedy decoder token for token.
    """
    flat = scores.ravel()
    if k == 1:  # the greedy decoder's every step: argmax is the same pick, faster
        return np.array([np.argmax(flat)])
    k = min(k, flat.size)
    kth = np.partition(flat, flat.size - k)[flat.size - k]
    near = np.flatnonzero(flat >= kth)  # every tie of the k-th best, in index order
    return near[np.argsort(-flat[near], kind="stable")[:k]]


class RnnDecoder:
    """Runs the decoder step model from an encoder state to a token sequence, by beam search.

    Owns one interpreter; use it from one thread at a time.
    """

    def __init__(self, path: "str | os.PathLike[str]", num_threads: int = 1):
        self._run = _step_model(path, num_threads)

    def decode(self, state: State, bos: int, eos: int, max_length: int, beam: int = 1,
               length_penalty: float = 1.0) -> Decoded:
        """Returns the best caption a beam search of width ``beam`` finds, and its confidence.

        Each step extends every live hypothesis by one word and keeps the
        ``beam`` best of all extensions by summed log-probability (every
        candidate of a step has as many terms, so the sum ranks them fairly); a
        hypothesis whose best extension kept is eos is finished and leaves the
        beam, which narrows (about ``beam`` step invokes per word). Finished
        hypotheses of different lengths are ranked by summed log-probability
        over ``terms ** length_penalty``: 1 (the default) is the mean, the
        confidence; 0 the plain sum, which favours short captions. A beam of 1
        is the greedy decoder: the same tokens as taking the argmax each step.
        The search ends early once no live hypothesis can outrank the best
        finished one.

        Args:
          state: The encoder's state after the window's last frame.
          bos: Id of the first word fed to the decoder.
          eos: Id that ends the caption.
          max_length: Most words to emit.
          beam: Hypotheses kept each step, 1 or more.
          length_penalty: Exponent of the length normalisation, 0 or more.

        Returns:
          The ``Decoded`` tokens (without bos and eos) and confidence.
        """
        if beam == 1:
            return self._greedy(state, bos, eos, max_length)

        def rank(hyp: _Hypothesis) -> float:
            return hyp.log_prob / hyp.terms ** length_penalty

        live = [_Hypothesis([], 0.0, False, state.h, state.c)]
        done: List[_Hypothesis] = []
        steps = 0
        for _ in range(max_length):
            steps += len(live)
            outs = [self._run({"word": np.array([hyp.tokens[-1] if hyp.tokens else bos], np.int32),
                               "h": hyp.h, "c": hyp.c}) for hyp in live]
            scores = (np.array([hyp.log_prob for hyp in live])[:, None]
                      + log_softmax(np.concatenate([o["logits"] for o in outs])))
            vocab = scores.shape[1]
            kept = []
            for index in top_k(scores, beam):
                row, word = divmod(int(index), vocab)
                hyp, out = live[row], outs[row]
                if word == eos:
                    done.append(_Hypothesis(hyp.tokens, float(scores[row, word]), True, hyp.h, hyp.c))
                else:
                    kept.append(_Hypothesis(hyp.tokens + [word], float(scores[row, word]), False,
                                            out["h_out"], out["c_out"]))
            live = kept
            # Words to come only lower a sum and a caption has at most max_length
            # terms, so a live hypothesis can end no better than its sum over
            # max_length ** length_penalty: once the best finished one scores
            # that, the search is over (the result is the same).
            if not live or (done and max(map(rank, done))
                            >= max(hyp.log_prob for hyp in live) / max_length ** length_penalty):
                break
        else:
            done += live  # cut at max_length, without an eos term
        best = max(done, key=rank)
        return Decoded(best.tokens, best.log_prob / best.terms, steps)

    def _greedy(self, state: State, bos: int, eos: int, max_length: int) -> Decoded:
        """A beam of one without the search's bookkeeping (a caption a window, on the frame path).

        The same sums in the same order as ``decode`` takes them for ``beam=1``,
        so the tokens and the confidence are the search's, bit for bit.
        """
        h, c, word, tokens, total = state.h, state.c, bos, [], 0.0
        for step in range(1, max_length + 1):
            out = self._run({"word": np.array([word], np.int32), "h": h, "c": c})
            logits = out["logits"][0]
            # float32 logits a float32 step apart stay apart in float64 after the
            # shift by the log-sum and by the sum so far: the argmax is the search's.
            word = int(logits.argmax())
            x = logits.astype(np.float64)
            top = x.max()
            total = float(total + (x[word] - (top + np.log(np.exp(x - top).sum()))))
            if word == eos:
                return Decoded(tokens, total / (len(tokens) + 1), step)
            tokens.append(word)
            h, c = out["h_out"], out["c_out"]
        return Decoded(tokens, total / len(tokens), max_length)
