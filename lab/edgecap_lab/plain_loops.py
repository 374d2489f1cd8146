"""Plain captioning loops, written without edgecap's scheduler or captioner: the host bench's baselines.

What a user writes against the TFLite interpreter and OpenCV alone, to
caption a video file with a bundle: decode, sample, preprocess, the CNN, the
RNN encoder step of every window the frame belongs to and, when a window
ends, a greedy decoder. ``edgecap.interpreter`` only picks the backend; the
bundle's files and numbers come from ``edgecap.bundle``. Three ways to use
the cores:

* ``one_thread``: everything in the calling thread, the CNN's interpreter on
  ``cnn_threads`` kernel threads (1: the plain one-thread loop; every core:
  the plain all-cores loop, XNNPACK's threads);
* ``two_threads``: a producer thread decodes, samples and preprocesses into a
  bounded ``queue.Queue``, one frame a put; the calling thread runs the models.

Each returns a ``LoopRun``: the sampled frames, wall and CPU seconds from
opening the file to the last caption (interpreters are opened before), and
the captions' tokens, so the bench checks that every loop and edgecap
caption alike.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import cv2
import numpy as np

from edgecap.bundle import Bundle
from edgecap.interpreter import make_cpu_interpreter

# Frames the producer of ``two_threads`` may be ahead of the models.
QUEUE_FRAMES = 32


@dataclass
class LoopRun:
    """One run of a loop over a video file.

    Attributes:
      frames: Sampled frames that went through the CNN.
      seconds: Wall time from opening the file to the last caption.
      cpu_seconds: CPU time of the process (every thread) meanwhile.
      captions: Each window's tokens, in order.
    """

    frames: int
    seconds: float
    cpu_seconds: float
    captions: List[List[int]] = field(default_factory=list)

    @property
    def fps(self) -> float:
        """Sampled frames a second."""
        return self.frames / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_ms_per_frame(self) -> float:
        """CPU milliseconds a sampled frame, all threads."""
        return 1e3 * self.cpu_seconds / self.frames if self.frames else 0.0


def _indices(details: Dict[str, Dict[str, Any]]) -> Dict[str, int]:
    return {name: d["index"] for name, d in details.items()}


class _Reader:
    """Decodes a file, keeps the frames on the bundle's sampling clock and preprocesses them."""

    def __init__(self, bundle: Bundle, detail: Dict[str, Any]) -> None:
        spec = bundle.input
        self.size = (spec.width, spec.height)
        self.rgb = spec.color_order == "RGB"
        self.period = 1.0 / bundle.window.sample_fps if bundle.window.sample_fps > 0 else 0.0
        self.dtype = np.dtype(detail["dtype"])
        mean = np.asarray(spec.mean, np.float32)
        std = np.asarray(spec.std, np.float32)
        scale, zero_point = detail["quantization"]
        if self.dtype.kind == "f":
            self.gain, self.offset = 1.0 / std, -mean / std
        else:
            # (x - mean) / std / scale + zero_point takes 256 values a channel: a lookup table.
            gain, offset = 1.0 / (std * scale), zero_point - mean / (std * scale)
            info = np.iinfo(self.dtype)
            values = np.arange(256, dtype=np.float32)[:, None]
            table = np.clip(np.rint(values * gain + offset), info.min, info.max).astype(self.dtype)
            self.table = np.ascontiguousarray(table.view(np.uint8).reshape(256, 1, 3))

    def inputs(self, path: Path) -> Iterator[np.ndarray]:
        """Yields the CNN's input tensor of every sampled frame of the file.

        Every frame is decoded (``grab``), only the sampled ones converted to BGR (``retrieve``).
        """
        capture = cv2.VideoCapture(str(path))
        fps = capture.get(cv2.CAP_PROP_FPS) or 30.0
        due, i = 0.0, 0
        try:
            while capture.grab():
                t, i = i / fps, i + 1
                if self.period and t + 1e-6 < due:
                    continue
                due += self.period
                ok, frame = capture.retrieve()
                if not ok:
                    return
                yield self.preprocess(frame)
        finally:
            capture.release()

    def preprocess(self, frame: np.ndarray) -> np.ndarray:
        """Resizes, reorders and quantizes one BGR frame into a ``[1, H, W, C]`` tensor."""
        if (frame.shape[1], frame.shape[0]) != self.size:
            frame = cv2.resize(frame, self.size, interpolation=cv2.INTER_AREA)
        if self.rgb:
            frame = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
        if self.dtype.kind == "f":
            return (frame.astype(np.float32) * self.gain + self.offset)[None]
        return cv2.LUT(frame, self.table).view(self.dtype)[None]


class _Models:
    """The CNN, the RNN encoder step per open window and the greedy decoder, on plain interpreters."""

    def __init__(self, bundle: Bundle, cnn_threads: int) -> None:
        self.cnn = make_cpu_interpreter(bundle.encoder, cnn_threads)
        self.cnn_in = self.cnn.get_input_details()[0]
        out = self.cnn.get_output_details()[0]
        self.cnn_out = out["index"]
        self.out_scale, self.out_zero = out["quantization"]
        self.float_out = np.dtype(out["dtype"]).kind == "f"
        steps = bundle.steps()
        self.enc = make_cpu_interpreter(steps.encoder_step, 1)
        runner = self.enc.get_signature_runner()
        self.enc_in, self.enc_out = _indices(runner.get_input_details()), _indices(runner.get_output_details())
        self.dec = make_cpu_interpreter(steps.decoder_step, 1)
        runner = self.dec.get_signature_runner()
        self.dec_in, self.dec_out = _indices(runner.get_input_details()), _indices(runner.get_output_details())
        self.hidden = bundle.hidden_size
        self.window = bundle.window
        self.tokens = bundle.tokens
        self.max_length = bundle.max_caption_length
        self.open: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        self.k = 0
        self.captions: List[List[int]] = []

    def frame(self, x: np.ndarray) -> None:
        """Runs one sampled frame through the CNN and the RNN; decodes each window it ends."""
        cnn = self.cnn
        cnn.set_tensor(self.cnn_in["index"], x)
        cnn.invoke()
        raw = cnn.get_tensor(self.cnn_out)
        feature = (raw.astype(np.float32) if self.float_out
                   else (raw.astype(np.float32) - self.out_zero) * self.out_scale).reshape(1, -1)
        frames, stride = self.window.frames, self.window.stride
        k, self.k = self.k, self.k + 1
        enc, ins, outs = self.enc, self.enc_in, self.enc_out
        for n in range(max(0, -(-(k - frames + 1) // stride)), k // stride + 1):
            h, c = self.open.get(n) or (np.zeros((1, self.hidden), np.float32),) * 2
            enc.set_tensor(ins["feature"], feature)
            enc.set_tensor(ins["h"], h)
            enc.set_tensor(ins["c"], c)
            enc.invoke()
            self.open[n] = (enc.get_tensor(outs["h_out"]), enc.get_tensor(outs["c_out"]))
            if k == n * stride + frames - 1:
                self.captions.append(self.greedy(*self.open.pop(n)))

    def greedy(self, h: np.ndarray, c: np.ndarray) -> List[int]:
        """The caption of a window's final state, taking the likeliest word each step."""
        dec, ins, outs = self.dec, self.dec_in, self.dec_out
        word, tokens = self.tokens.bos, []
        for _ in range(self.max_length):
            dec.set_tensor(ins["word"], np.array([word], np.int32))
            dec.set_tensor(ins["h"], h)
            dec.set_tensor(ins["c"], c)
            dec.invoke()
            word = int(np.argmax(dec.get_tensor(outs["logits"])))
            if word == self.tokens.eos:
                break
            tokens.append(word)
            h, c = dec.get_tensor(outs["h_out"]), dec.get_tensor(outs["c_out"])
        return tokens


def one_thread(bundle: Bundle, path: Path, cnn_threads: int = 1) -> LoopRun:
    """Captions ``path`` in the calling thread, the CNN on ``cnn_threads`` kernel threads.

    Returns:
      The ``LoopRun``.
    """
    models = _Models(bundle, cnn_threads)
    reader = _Reader(bundle, models.cnn_in)
    t0, c0 = time.perf_counter(), time.process_time()
    frames = 0
    for x in reader.inputs(path):
        models.frame(x)
        frames += 1
    return LoopRun(frames, time.perf_counter() - t0, time.process_time() - c0, models.captions)


def two_threads(bundle: Bundle, path: Path, cnn_threads: int = 1) -> LoopRun:
    """Captions ``path`` with a producer thread (decode, sample, preprocess) and the models in this one.

    Returns:
      The ``LoopRun``.
    """
    models = _Models(bundle, cnn_threads)
    reader = _Reader(bundle, models.cnn_in)
    frames: "queue.Queue[Any]" = queue.Queue(QUEUE_FRAMES)
    end = object()

    def produce() -> None:
        try:
            for x in reader.inputs(path):
                frames.put(x)
        except BaseException as exc:  # the consumer raises it
            frames.put(exc)
        frames.put(end)

    t0, c0 = time.perf_counter(), time.process_time()
    producer = threading.Thread(target=produce, name="plain-producer", daemon=True)
    producer.start()
    count = 0
    while True:
        x = frames.get()
        if x is end:
            break
        if isinstance(x, BaseException):
            raise x
        models.frame(x)
        count += 1
    producer.join()
    return LoopRun(count, time.perf_counter() - t0, time.process_time() - c0, models.captions)
