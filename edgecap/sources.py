"""Frame sources: video files, cameras (latest-frame semantics) and in-memory frames."""

from __future__ import annotations

import errno
import os
import stat
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Union

import numpy as np

# FFmpeg's messages ("moov atom not found", "ac-tex damaged") and OpenCV's own
# ("[ WARN:0] can't open camera by index") would break the one line edgecap
# prints for a bad source. FFmpeg's level is read when OpenCV first opens a
# video, OpenCV's is set below: whoever sets either variable keeps its messages.
os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
import cv2  # noqa: E402

from edgecap.errors import SourceError  # noqa: E402
from edgecap.preprocess import as_bgr  # noqa: E402

if "OPENCV_LOG_LEVEL" not in os.environ:
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)

# Reads tried after a failed one to tell a damaged stretch (the decoder resumes)
# from the end of the stream.
_RESYNC_READS = 8

SourceLike = Union[str, int, "os.PathLike[str]", Iterable[np.ndarray]]


@dataclass(frozen=True)
class Frame:
    """One frame of a source.

    Attributes:
      index: Position in the source before sampling (0-based).
      timestamp: Seconds since the source started.
      image: HxWx3 uint8, BGR as OpenCV gives it.
    """

    index: int
    timestamp: float
    image: np.ndarray


class FrameSource:
    """Base of all sources: iterate for frames, ``close()`` to release.

    Attributes:
      live: True for cameras: frames arrive in real time and only the newest
        is kept while the consumer is busy.
      dropped: Frames a live source discarded because a newer one arrived.
      name: What the user passed, for messages.
    """

    live = False
    name = "frames"

    def __init__(self) -> None:
        self.dropped = 0

    def __iter__(self) -> Iterator[Frame]:
        raise NotImplementedError

    def close(self) -> None:
        """Releases the source; safe to call twice."""

    def __enter__(self) -> "FrameSource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ArraySource(FrameSource):
    """Frames from memory: a ``[T,H,W,C]`` array or any iterable of uint8 images.

    Each image is taken as ``preprocess.as_bgr`` takes it: BGR, gray (2-D or
    one channel) or BGRA, any size; anything else raises ``SourceError``.
    """

    def __init__(self, frames: Iterable[np.ndarray], fps: float):
        super().__init__()
        self._frames = frames
        self.fps = fps

    def __iter__(self) -> Iterator[Frame]:
        for i, image in enumerate(self._frames):
            yield Frame(i, i / self.fps, as_bgr(image, f"frame {i}"))


def _check_openable(path: Path) -> None:
    """Raises ``SourceError`` with the system's reason if ``path`` cannot be opened at all.

    Raises:
      SourceError: The open fails, e.g. the process is out of file descriptors
        (EMFILE), which OpenCV would report as a file it cannot decode.
    """
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as e:
        fix = ("the process has too many files open: raise LimitNOFILE or find what holds them"
               if e.errno in (errno.EMFILE, errno.ENFILE) else "check the file")
        raise SourceError(f"{path}: cannot open: {e.strerror or e} ({errno.errorcode.get(e.errno, e.errno)}); "
                          f"{fix}") from None


class VideoFileSource(FrameSource):
    """Every frame of a video file, in order."""

    def __init__(self, path: Path):
        super().__init__()
        self.name = str(path)
        if not path.exists():
            raise SourceError(f"{path}: no such video file: check the path")
        if not path.is_file():
            raise SourceError(f"{path}: not a file: pass a video file such as clip.mp4")
        if not os.access(path, os.R_OK):  # else OpenCV would call it "not a video"
            raise SourceError(f"{path}: permission denied: make it readable (chmod a+r) or "
                              "run as a user who may read it")
        self._cap = cv2.VideoCapture(str(path))
        ok, first = self._cap.read() if self._cap.isOpened() else (False, None)
        if not ok:
            self._cap.release()
            _check_openable(path)  # OpenCV says "not a video" for any open that fails
            raise SourceError(f"{path}: not a video OpenCV can decode: pass a video file "
                              "such as .mp4 or .avi")
        self._first: Optional[np.ndarray] = first
        fps = self._cap.get(cv2.CAP_PROP_FPS)
        # Some containers report 0 or absurd rates; timestamps then assume 30 fps.
        self.fps = fps if 0 < fps < 1000 else 30.0
        # The container's own count (0 when it has none): a read failing before it is damage.
        self.frame_count = max(0, int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT)))

    def __iter__(self) -> Iterator[Frame]:
        """Yields every frame, then raises ``SourceError`` if decoding stopped before the end.

        Raises:
          SourceError: If a read failed before the last frame the container
            lists, or the decoder resumed after a failed read (a damaged
            stretch): the frames before it have been yielded.
        """
        index, image = 0, self._first
        self._first = None
        while image is not None:
            yield Frame(index, index / self.fps, image)
            ok, image = self._cap.read()
            image = image if ok else None
            index += 1
        # Frames past the damage are not decoded: windows would silently span the gap.
        at = f"frame {index} ({index / self.fps:.2f} s)"
        fix = ("windows before it are captioned, none after: re-encode or replace the file "
               "(ffmpeg -i IN -c:v libx264 OUT.mp4)")
        if any(self._cap.grab() for _ in range(_RESYNC_READS)):
            raise SourceError(f"{self.name}: damaged at {at}: decoding stopped there after "
                              f"{index} frames" + (f" of {self.frame_count}" if self.frame_count
                                                   else "") + f"; {fix}")
        if index < self.frame_count:
            raise SourceError(f"{self.name}: ended at {at}, but the file lists "
                              f"{self.frame_count} frames: it is truncated or damaged; {fix}")

    def close(self) -> None:
        self._cap.release()


class CameraSource(FrameSource):
    """A camera read by its own thread, which keeps only the newest frame.

    A slow consumer therefore always gets the most recent image, and frames it
    could not take are counted in ``dropped`` instead of queuing up. The reader
    thread owns the capture and releases it when it ends, so ``close()`` never
    waits longer than ``CLOSE_TIMEOUT_S`` on a read that hangs (an unplugged
    V4L2 camera) and never releases the capture under a read.
    """

    live = True
    CLOSE_TIMEOUT_S = 2.0

    def __init__(self, device: Union[int, str]):
        super().__init__()
        self.name = f"camera {device}"
        if isinstance(device, str) and not os.path.exists(device):
            raise SourceError(f"{self.name}: no such device: check the path (ls /dev/video*) "
                              "and that the camera is plugged in")
        self._cap = cv2.VideoCapture(device)
        if not self._cap.isOpened():
            self._cap.release()
            # On Linux, V4L2 opens index N (below 100: higher ones name a backend) as /dev/videoN.
            if (isinstance(device, int) and 0 <= device < 100 and sys.platform.startswith("linux")
                    and not os.path.exists(f"/dev/video{device}")):
                raise SourceError(f"{self.name}: no such device (/dev/video{device}): check "
                                  "ls /dev/video* and that the camera is plugged in")
            raise SourceError(f"{self.name}: cannot be opened: check that it is a camera and "
                              "that no other process holds it")
        self._cond = threading.Condition()
        self._latest: Optional[Frame] = None
        self._ended = False
        self._error: Optional[str] = None
        self._stop = threading.Event()
        self._t0: Optional[float] = None
        self._thread = threading.Thread(target=self._read, name=f"edgecap-{self.name}",
                                        daemon=True)
        self._thread.start()

    def _read(self) -> None:
        index = 0
        try:
            while not self._stop.is_set():
                ok, image = self._cap.read()
                if not ok:
                    break
                now = time.monotonic()
                self._t0 = now if self._t0 is None else self._t0
                with self._cond:
                    if self._latest is not None:
                        self.dropped += 1
                    self._latest = Frame(index, now - self._t0, image)
                    self._cond.notify()
                index += 1
        except cv2.error as exc:
            # OpenCV's messages span lines; the consumer reports one.
            self._error = " ".join(str(exc).split()) or type(exc).__name__
        finally:
            self._cap.release()
            with self._cond:
                self._ended = True
                self._cond.notify()

    def __iter__(self) -> Iterator[Frame]:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._latest is not None or self._ended)
                frame, self._latest = self._latest, None
            if frame is None:
                break
            yield frame
        if self._error is not None:
            raise SourceError(f"{self.name}: read failed ({self._error}); check that it is still plugged in")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.CLOSE_TIMEOUT_S)


def is_camera_path(text: str) -> bool:
    """True for a camera device: a /dev/video path or any character device."""
    if text.startswith("/dev/video"):
        return True
    try:
        return stat.S_ISCHR(os.stat(text).st_mode)
    except OSError:
        return False


def open_source(source: SourceLike, fps: Optional[float] = None) -> FrameSource:
    """Opens what a user passes as a video source.

    Args:
      source: A video file path; a camera as a device path (``/dev/video0``) or
        index (``0``, or ``"0"`` when no file of that name exists); or frames:
        a ``[T,H,W,C]`` array or an iterable of uint8 images (BGR, gray or
        BGRA, any size; see ``preprocess.as_bgr``).
      fps: Rate of in-memory frames (ignored for files and cameras).

    Returns:
      A ``FrameSource``; close it when done.

    Raises:
      SourceError: If the file or camera cannot be opened, or a frames array
        is not of uint8 images.
    """
    if isinstance(source, FrameSource):
        return source
    if isinstance(source, bool):
        raise SourceError(f"{source!r} is not a video source: pass a path, a camera or frames")
    if isinstance(source, int):
        return CameraSource(source)
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        # A video file named like a number ("2024") is that file, not camera 2024.
        if text.isdigit() and not os.path.isfile(text):
            return CameraSource(int(text))
        if is_camera_path(text):
            return CameraSource(text)
        return VideoFileSource(Path(text))
    if isinstance(source, np.ndarray):
        # Checked here, before the run: an array's frames all share its shape and dtype.
        if source.ndim != 4:
            raise SourceError(f"frames array must be [T,H,W,C] (C = 3 for BGR, 1 for gray, "
                              f"4 for BGRA), got shape {source.shape}; one frame? pass [frame]")
        if len(source):
            as_bgr(source[0], "frames array")
    if not hasattr(source, "__iter__"):
        raise SourceError(f"{type(source).__name__} is not a video source: pass a path, "
                          "a camera or an iterable of frames")
    return ArraySource(source, fps or 30.0)


def sample(frames: Iterable[Frame], sample_fps: float) -> Iterator[Frame]:
    """Yields the frames that fall on a ``sample_fps`` clock (all of them when it is 0).

    The clock is kept on source timestamps, so a 30 fps file sampled at 8 fps
    keeps 8 frames a second however the rates divide.
    """
    if sample_fps <= 0:
        yield from frames
        return
    period = 1.0 / sample_fps
    next_t: Optional[float] = None
    for frame in frames:
        # The tolerance absorbs float error when the rates divide exactly.
        if next_t is None or frame.timestamp + 1e-6 >= next_t:
            next_t = (frame.timestamp if next_t is None else next_t) + period
            # A source that stalled should not owe a burst of samples afterwards.
            if frame.timestamp >= next_t:
                next_t = frame.timestamp + period
            yield frame
