"""Frame features of each clip's first window, computed once per video and encoder, then reused.

Training an RNN on a fixed encoder (``models.train_frozen``) needs every
clip's features, and decoding a real corpus through a 224x224 CNN is the
slow part; a second run, another RNN size or more epochs should not pay it
again. Features are computed exactly as the runtime computes them: frames
sampled by ``edgecap.sources.sample`` (the runtime's sampler), preprocessed
by ``edgecap.preprocess.Preprocessor`` and read back with ``dequantize``.

Layout: ``CACHE/<encoder key>/<clip key>.npy``, float32 ``[N,F]``. The
encoder key hashes the encoder file's bytes, its input normalisation and the
window (frames, rate); the clip key hashes the video's absolute path, size
and modification time, so an edited or replaced video is computed afresh.
Files are written whole (temporary file, then rename): a run killed halfway
leaves no torn entry. Needs only numpy, OpenCV and ``edgecap``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import numpy as np

from edgecap.bundle import InputSpec
from edgecap.errors import ConfigError
from edgecap.interpreter import make_cpu_interpreter
from edgecap.preprocess import Preprocessor, dequantize
from edgecap.sources import VideoFileSource, sample
from models.bundle_meta import InputNorm


@dataclass(frozen=True)
class Window:
    """Which frames of a clip are encoded: the first ``frames`` sampled at ``sample_fps``."""

    frames: int = 8
    sample_fps: float = 8.0


class TfliteFrameEncoder:
    """A TFLite frame encoder (int8, uint8 or float input) fed as the runtime feeds it.

    Takes BGR uint8 frames of any size, as OpenCV decodes them; the output is
    flattened to ``[F]`` (Coral's embedding extractors give ``[1,1,1,F]``).
    """

    def __init__(self, model: Path, norm: InputNorm, num_threads: int = 1):
        """Loads the encoder.

        Args:
          model: The ``.tflite`` file.
          norm: Channel order and normalisation its input expects.
          num_threads: Interpreter threads.
        """
        self._interp = make_cpu_interpreter(Path(model), num_threads)
        self._in = self._interp.get_input_details()[0]
        self._out = self._interp.get_output_details()[0]
        _, height, width, channels = (int(d) for d in self._in["shape"])
        spec = InputSpec(height=height, width=width, channels=channels,
                         color_order=norm.color_order, mean=tuple(norm.mean), std=tuple(norm.std))
        self._preprocess = Preprocessor(spec, self._in)
        self.calls = 0

    def __call__(self, bgr: np.ndarray) -> np.ndarray:
        """Returns the float32 feature ``[F]`` of one BGR uint8 frame."""
        self._interp.set_tensor(self._in["index"], self._preprocess(bgr))
        self._interp.invoke()
        self.calls += 1
        return dequantize(self._interp.get_tensor(self._out["index"]), self._out).reshape(-1)


def first_window(video: Path, window: Window) -> List[np.ndarray]:
    """Returns the BGR frames of a clip's first window, sampled as the runtime samples them.

    Raises:
      ConfigError: If the clip is shorter than one window.
    """
    with VideoFileSource(video) as src:
        frames = [f.image for f in itertools.islice(sample(src, window.sample_fps), window.frames)]
    if len(frames) < window.frames:
        raise ConfigError(f"{video}: shorter than one window of {window.frames} frames sampled "
                          f"at {window.sample_fps:g} fps: drop the clip from the index")
    return frames


def encoder_key(model: Path, norm: InputNorm, window: Window) -> str:
    """Returns the cache key of an encoder file, its input normalisation and the window."""
    h = hashlib.sha256(Path(model).read_bytes())
    h.update(json.dumps([norm.color_order, list(norm.mean), list(norm.std),
                         window.frames, window.sample_fps]).encode())
    return h.hexdigest()[:16]


def clip_key(video: Path) -> str:
    """Returns the cache key of a video file: its absolute path, size and modification time."""
    st = video.stat()
    ident = json.dumps([os.path.abspath(video), st.st_size, st.st_mtime_ns])
    return hashlib.sha256(ident.encode()).hexdigest()[:24]


class FeatureCache:
    """Per-clip window features of one encoder, kept in a folder (module docstring)."""

    def __init__(self, root: Path, model: Path, norm: InputNorm, window: Window = Window(),
                 num_threads: int = 1):
        """Opens (creating) the cache of one encoder.

        Args:
          root: The cache folder, shared by all encoders.
          model: The encoder ``.tflite``.
          norm: Its input normalisation.
          window: Which frames are encoded.
          num_threads: Interpreter threads for the clips not yet cached.
        """
        self.folder = Path(root) / encoder_key(model, norm, window)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._model, self._norm, self._threads = Path(model), norm, num_threads
        self.window = window
        self._encoder: Optional[TfliteFrameEncoder] = None
        self.computed = 0
        self.reused = 0

    def _encode(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        if self._encoder is None:  # loaded only when some clip is not cached
            self._encoder = TfliteFrameEncoder(self._model, self._norm, self._threads)
        return np.stack([self._encoder(f) for f in frames]).astype(np.float32)

    def features(self, video: Path) -> np.ndarray:
        """Returns the float32 features ``[N,F]`` of a clip's first window, cached.

        Raises:
          ConfigError: If the clip is shorter than one window.
        """
        path = self.folder / f"{clip_key(Path(video))}.npy"
        if path.is_file():
            try:
                cached = np.load(path, allow_pickle=False)
                if cached.ndim == 2 and len(cached) == self.window.frames:
                    self.reused += 1
                    return cached
            except (OSError, ValueError):
                pass  # unreadable entry: computed afresh and rewritten below
        out = self._encode(first_window(Path(video), self.window))
        fd, tmp = tempfile.mkstemp(prefix=".", suffix=".npy", dir=self.folder)
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, out, allow_pickle=False)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.computed += 1
        return out

    def many(self, videos: Sequence[Path],
             progress: Optional[Callable[[int, int], object]] = None) -> np.ndarray:
        """Returns features ``[B,N,F]`` of several clips; ``progress(done, total)`` after each."""
        out = []
        for i, video in enumerate(videos):
            out.append(self.features(video))
            if progress is not None:
                progress(i + 1, len(videos))
        return np.stack(out)
