"""The captioning API: ``EdgeCaptioner`` turns a video source into ``Caption`` records."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Union

import numpy as np

from edgecap.bundle import Bundle, WindowSpec, load_bundle
from edgecap.errors import ConfigError
from edgecap.interpreter import make_cpu_interpreter
from edgecap.preprocess import Preprocessor, dequantize
from edgecap.rnn import RnnDecoder, RnnEncoder, State
from edgecap.sources import Frame, SourceLike, open_source, sample

STAGES = ("preprocess", "cnn", "rnn_step", "decode")


@dataclass
class Caption:
    """The sentence for one window of sampled frames.

    Attributes:
      text: The caption.
      tokens: Its token ids (without bos/eos).
      window: Window number in the stream (0-based).
      start_frame: Source index of the window's first sampled frame.
      end_frame: Source index of its last sampled frame.
      start_time: Source timestamp (s) of the first frame.
      end_time: Source timestamp (s) of the last frame.
      stage_ms: Milliseconds each stage spent on this window's frames.
      latency_ms: From the window's last frame leaving the source to this caption.
    """

    text: str
    tokens: List[int]
    window: int
    start_frame: int
    end_frame: int
    start_time: float
    end_time: float
    stage_ms: Dict[str, float] = field(default_factory=dict)
    latency_ms: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        """Returns the record as JSON-ready plain types."""
        return dataclasses.asdict(self)


class FrameEncoder:
    """Runs a whole CNN encoder on the CPU: BGR frame in, float feature vector out.

    Owns its interpreter; use it from one thread at a time.
    """

    def __init__(self, bundle: Bundle, model: "str | os.PathLike[str]", num_threads: int):
        self._interp = make_cpu_interpreter(model, num_threads)
        self._in = self._interp.get_input_details()[0]
        self._out = self._interp.get_output_details()[0]
        self.preprocess = Preprocessor(bundle.input, self._in)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Returns the float feature for a preprocessed input tensor."""
        self._interp.set_tensor(self._in["index"], x)
        self._interp.invoke()
        return dequantize(self._interp.get_tensor(self._out["index"]), self._out)


@dataclass
class _Window:
    number: int
    state: State
    first: Optional[Frame] = None
    stage_ms: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))


def _windows_of(k: int, spec: WindowSpec) -> range:
    """Window numbers whose span of sampled frames contains sample ``k``."""
    first = max(0, -(-(k - spec.frames + 1) // spec.stride))
    return range(first, k // spec.stride + 1)


class EdgeCaptioner:
    """Captions video with a model bundle.

    Use it as a context manager, or call ``close()``::

        with EdgeCaptioner("models/demo/bundle") as cap:
            for caption in cap.stream("clip.mp4"):
                print(caption.start_time, caption.text)
    """

    def __init__(
        self,
        bundle: Union[str, "os.PathLike[str]", Bundle],
        *,
        frames: Optional[int] = None,
        stride: Optional[int] = None,
        sample_fps: Optional[float] = None,
        num_threads: Optional[int] = None,
        reference_encoder: bool = False,
    ):
        """Loads the bundle and creates its interpreters.

        Args:
          bundle: A bundle directory or a loaded ``Bundle``.
          frames: Sampled frames per window (default: the bundle's).
          stride: Sampled frames between window starts (default: the bundle's).
          sample_fps: Rate frames are sampled from sources; 0 keeps every frame
            (default: the bundle's).
          num_threads: CPU threads for the interpreters (default: all cores).
          reference_encoder: Use the bundle's float reference encoder instead of
            the int8 one (for measuring quantisation loss).

        Raises:
          BundleError: If the bundle fails validation.
          ConfigError: If an override is out of range or no reference encoder exists.
        """
        self.bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
        w = self.bundle.window
        self.window = WindowSpec(
            frames=w.frames if frames is None else frames,
            stride=w.stride if stride is None else stride,
            sample_fps=w.sample_fps if sample_fps is None else sample_fps,
        )
        if self.window.frames <= 0 or self.window.stride <= 0 or self.window.sample_fps < 0:
            raise ConfigError(f"window {self.window}: frames and stride must be > 0 and "
                              "sample_fps >= 0")
        threads = num_threads or os.cpu_count() or 1
        model = self.bundle.encoder
        if reference_encoder:
            if self.bundle.reference_encoder is None:
                raise ConfigError(f"{self.bundle.root}: bundle has no reference_encoder; "
                                  "re-export it with the float encoder")
            model = self.bundle.reference_encoder
        self._encoder = FrameEncoder(self.bundle, model, threads)
        self._rnn = RnnEncoder(self.bundle.encoder_step, threads)
        self._decoder = RnnDecoder(self.bundle.decoder_step, threads)

    def caption_frames(self, frames: Iterable[np.ndarray]) -> List[Caption]:
        """Captions frames that are already sampled, one caption per complete window.

        Args:
          frames: HxWx3 uint8 BGR images, a ``[T,H,W,3]`` array or any iterable.

        Returns:
          The captions of every complete window, in order.
        """
        return list(self.stream(frames, fps=0))

    def stream(self, source: SourceLike, fps: Optional[float] = None) -> Iterator[Caption]:
        """Yields a ``Caption`` as each window of sampled frames completes.

        A trailing window with fewer than ``frames`` frames is not captioned.

        Args:
          source: A video file path, a camera (``/dev/video0`` or an index) or
            an iterable of HxWx3 uint8 BGR frames.
          fps: Rate of in-memory frames; 0 or None treats each one as a sampled
            frame. Files and cameras carry their own timing.

        Raises:
          SourceError: If the source cannot be opened or read.
        """
        sample_fps = self.window.sample_fps
        in_memory_rate = fps or sample_fps or 30.0
        src = open_source(source, fps=in_memory_rate)
        try:
            open_windows: Dict[int, _Window] = {}
            for k, frame in enumerate(sample(src, sample_fps)):
                numbers = _windows_of(k, self.window)
                if not numbers:
                    continue  # stride > frames: this frame is in no window
                t0 = time.perf_counter()
                x = self._encoder.preprocess(frame.image)
                t1 = time.perf_counter()
                feature = self._encoder(x)
                t2 = time.perf_counter()
                for n in numbers:
                    win = open_windows.get(n)
                    if win is None:
                        win = open_windows[n] = _Window(n, State.zeros(self.bundle.hidden_size),
                                                        first=frame)
                    ts = time.perf_counter()
                    win.state = self._rnn.step(feature, win.state)
                    win.stage_ms["rnn_step"] += (time.perf_counter() - ts) * 1e3
                    win.stage_ms["preprocess"] += (t1 - t0) * 1e3
                    win.stage_ms["cnn"] += (t2 - t1) * 1e3
                    if k == n * self.window.stride + self.window.frames - 1:
                        yield self._finish(open_windows.pop(n), frame, t0)
        finally:
            src.close()

    def _finish(self, win: _Window, last: Frame, arrived: float) -> Caption:
        t = time.perf_counter()
        tok = self.bundle.tokens
        ids = self._decoder.decode(win.state, tok.bos, tok.eos, self.bundle.max_caption_length)
        done = time.perf_counter()
        win.stage_ms["decode"] = (done - t) * 1e3
        assert win.first is not None
        return Caption(
            text=self.bundle.detokenize(ids),
            tokens=ids,
            window=win.number,
            start_frame=win.first.index,
            end_frame=last.index,
            start_time=win.first.timestamp,
            end_time=last.timestamp,
            stage_ms={k: round(v, 3) for k, v in win.stage_ms.items()},
            latency_ms=round((done - arrived) * 1e3, 3),
        )

    def close(self) -> None:
        """Releases the interpreters; the captioner cannot be used afterwards."""
        self._encoder = self._rnn = self._decoder = None  # type: ignore[assignment]

    def __enter__(self) -> "EdgeCaptioner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
