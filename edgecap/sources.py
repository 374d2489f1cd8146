"""Frame sources: video files, cameras (latest-frame semantics) and in-memory frames."""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import stat
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple, Union

import numpy as np

# FFmpeg's messages ("moov atom not found", "ac-tex damaged") and OpenCV's own
# ("[ WARN:0] can't open camera by index") would break the one line edgecap
# prints for a bad source. FFmpeg's level is read when OpenCV first opens a
# video, OpenCV's is set below: whoever sets either variable keeps its messages.
os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
import cv2  # noqa: E402

from edgecap import containers  # noqa: E402
from edgecap.errors import SourceError  # noqa: E402
from edgecap.limits import MAX_CAMERA_INDEX  # noqa: E402
from edgecap.preprocess import as_bgr  # noqa: E402

_log = logging.getLogger("edgecap")

if "OPENCV_LOG_LEVEL" not in os.environ:
    # OpenCV 4.12 and later have cv2.utils.logging; 4.11, which pip takes beside numpy<2
    # (Coral's tflite-runtime), has only cv2.setLogLevel. 0 is LOG_LEVEL_SILENT in both.
    _cv_log = getattr(cv2.utils, "logging", None)
    (_cv_log.setLogLevel if _cv_log is not None else cv2.setLogLevel)(0)

# Reads tried after a failed one to tell a damaged stretch (the decoder resumes)
# from the end of the stream.
_RESYNC_READS = 8
# Frames larger than this (long side, pixels) are scaled down as they are read:
# the model sees a few hundred pixels, and an 8K frame held in a queue is 100 MB.
MAX_FRAME_SIDE = 1920
# Above 4K UHD a frame-threaded decoder holds a frame per thread: decode on one.
_HUGE_PIXELS = 3840 * 2160
# A container rate outside this is a missing or broken header, not a camera's.
_MAX_FPS = 100_000.0
# The rate assumed when neither the container nor the timestamps give one.
_DEFAULT_FPS = 30.0
# Frame intervals further apart than this ratio make a variable-rate clip.
_VFR_RATIO = 1.5
# A container's frame count past this is a placeholder (a piped AVI says 2**30).
_MAX_FRAME_COUNT = 100_000_000
# Network streams OpenCV's FFmpeg backend opens by URL.
STREAM_SCHEMES = ("rtsp", "rtsps", "rtmp", "rtmps", "http", "https", "udp", "tcp", "srt")
_URL = re.compile(r"^(%s)://" % "|".join(STREAM_SCHEMES), re.IGNORECASE)
# A network stream that does not answer within this is reported, not waited on.
STREAM_TIMEOUT_MS = 10_000

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

    An iterator (a generator) is read on a thread of its own (``edgecap-frames``),
    one image when the consumer asks for it, so that ``close()`` from any thread
    ends the iteration at once even while the iterator blocks; the iterator
    itself is then closed by that thread when its ``next()`` returns.
    """

    CLOSE_TIMEOUT_S = 0.5

    def __init__(self, frames: Iterable[np.ndarray], fps: float):
        super().__init__()
        self._frames = frames
        self.fps = fps
        self._closed = threading.Event()
        self._cond = threading.Condition()
        self._reader: Optional[threading.Thread] = None

    def __iter__(self) -> Iterator[Frame]:
        images = self._read_ahead() if isinstance(self._frames, Iterator) else iter(self._frames)
        for i, image in enumerate(images):
            yield Frame(i, i / self.fps, as_bgr(image, f"frame {i}"))

    def _read_ahead(self) -> Iterator[np.ndarray]:
        """The iterator's images, each read on the reading thread when the consumer asks for it (none ahead)."""
        box: List[Any] = []  # ("image", x), ("end", None) or ("error", exc)
        wanted = [False]
        frames = self._frames

        def read() -> None:
            try:
                while True:
                    with self._cond:
                        self._cond.wait_for(lambda: wanted[0] or self._closed.is_set())
                        if self._closed.is_set():
                            return
                        wanted[0] = False
                    try:
                        item: Any = ("image", next(frames))  # type: ignore[call-overload]
                    except StopIteration:
                        item = ("end", None)
                    except BaseException as exc:  # raised again in the consumer's thread
                        item = ("error", exc)
                    with self._cond:
                        box.append(item)
                        self._cond.notify_all()
                    if item[0] != "image":
                        return
            finally:
                close = getattr(frames, "close", None)
                if close is not None:
                    close()

        self._reader = threading.Thread(target=read, name="edgecap-frames", daemon=True)
        self._reader.start()
        try:
            while True:
                with self._cond:
                    wanted[0] = True
                    self._cond.notify_all()
                    self._cond.wait_for(lambda: box or self._closed.is_set())
                    if self._closed.is_set():
                        return
                    kind, value = box.pop()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            self.close()  # a consumer that stops early lets the reading thread go too

    def close(self) -> None:
        """Ends the iteration, from any thread; waits up to ``CLOSE_TIMEOUT_S`` for the reading thread.

        A generator that blocks is left to return, on its daemon thread.
        """
        with self._cond:
            self._closed.set()
            self._cond.notify_all()
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(self.CLOSE_TIMEOUT_S)


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


def _fit(image: np.ndarray) -> np.ndarray:
    """Returns the image scaled down so its long side is at most ``MAX_FRAME_SIDE``."""
    h, w = image.shape[:2]
    if max(h, w) <= MAX_FRAME_SIDE:
        return image
    scale = MAX_FRAME_SIDE / max(h, w)
    return cv2.resize(image, (max(1, round(w * scale)), max(1, round(h * scale))),
                      interpolation=cv2.INTER_AREA)


def _open_capture(source: str, threads: Optional[int] = None) -> Any:
    """Opens a video file, decoded on ``threads`` threads (None: FFmpeg's own threads); past 4K UHD on one.

    A frame-threaded decoder holds a frame per thread (an 8K frame is 50 MB
    before conversion), so the file is opened on one thread first, which
    learns the size at little cost, and reopened on all of them when its
    frames are smaller.
    """
    cap = cv2.VideoCapture(source, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, threads or 1])
    if cap.isOpened():
        w, h = cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT)
        if threads is not None or w * h > _HUGE_PIXELS:
            return cap
        cap.release()
    return cv2.VideoCapture(source)


class _FrameTimes:
    """A file's frame timestamps from the container's, made to start at 0, and whether the rate varies."""

    def __init__(self, origin_ms: float, fps: float) -> None:
        self._origin, self._fps = origin_ms, fps
        self._previous = 0.0
        self.shortest: Optional[float] = None
        self.longest: Optional[float] = None
        self.variable = False

    def next(self, ms: Optional[float]) -> float:
        """The next frame's timestamp (s), from its container position ``ms`` (None: missing)."""
        # A missing or backwards timestamp (a broken stream) steps on at the nominal rate.
        stamped = None if ms is None else (ms - self._origin) / 1000.0
        previous = self._previous
        t = stamped if stamped is not None and stamped > previous else previous + 1.0 / self._fps
        step, self._previous = t - previous, t
        self.shortest = step if self.shortest is None else min(self.shortest, step)
        self.longest = step if self.longest is None else max(self.longest, step)
        self.variable = self.variable or self.longest > _VFR_RATIO * self.shortest
        return t


class VideoFileSource(FrameSource):
    """Every frame of a video file, in order, each at its own timestamp.

    Timestamps are the container's, frame by frame (variable-rate clips from
    phones included), made to start at 0; ``fps`` is the container's nominal
    rate, or one estimated from the timestamps when the header's is missing or
    absurd. Frames larger than ``MAX_FRAME_SIDE`` are scaled down as read, and
    rotation metadata is applied (OpenCV turns the frames upright).

    Args:
      path: The file.
      decode_threads: Threads FFmpeg decodes on (None: its own choice, a
        thread per core). One where the reader runs beside other work already:
        FFmpeg's frame threads then only add their hand-offs (the demo's clip
        took 1.8-3.0x the CPU a frame on them, measured on a 2-core host).
    """

    def __init__(self, path: Path, decode_threads: Optional[int] = None):
        super().__init__()
        self.name = str(path)
        if not path.exists():
            raise SourceError(f"{path}: no such video file: check the path")
        if not path.is_file():
            raise SourceError(f"{path}: not a file: pass a video file such as clip.mp4")
        if not os.access(path, os.R_OK):  # else OpenCV would call it "not a video"
            raise SourceError(f"{path}: permission denied: make it readable (chmod a+r) or "
                              "run as a user who may read it")
        self._path = path
        self._cap = _open_capture(str(path), decode_threads)
        ok, first = self._cap.read() if self._cap.isOpened() else (False, None)
        if not ok:
            self._cap.release()
            _check_openable(path)  # OpenCV says "not a video" for any open that fails
            hurt = containers.damage(path)
            if hurt is not None:
                raise SourceError(f"{path}: {hurt.what}, and no frame can be read from it: "
                                  "replace the file, or recover it (untrunc, with a good file "
                                  "from the same camera)")
            raise SourceError(f"{path}: not a video OpenCV can decode: pass a video file "
                              "such as .mp4 or .avi")
        self._first: Optional[np.ndarray] = first
        self._first_ms = self._position_ms()
        fps = self._cap.get(cv2.CAP_PROP_FPS)
        # Placeholders (0, a piped AVI's 2**30) count for nothing.
        count = self._cap.get(cv2.CAP_PROP_FRAME_COUNT)
        self.frame_count = int(count) if math.isfinite(count) and 0 < count < _MAX_FRAME_COUNT else 0
        self.fps = fps if math.isfinite(fps) and 0 < fps <= _MAX_FPS else self._estimate_fps()
        self.variable_rate = False

    def _position_ms(self) -> Optional[float]:
        ms = self._cap.get(cv2.CAP_PROP_POS_MSEC)
        return ms if math.isfinite(ms) and ms >= 0 else None

    def _estimate_fps(self) -> float:
        # A second capture decodes a few frames, only for a file whose header has no usable rate.
        probe = cv2.VideoCapture(str(self._path))
        stamps: List[float] = []
        try:
            while len(stamps) < 16 and probe.grab():
                ms = probe.get(cv2.CAP_PROP_POS_MSEC)
                if math.isfinite(ms):
                    stamps.append(ms)
        finally:
            probe.release()
        steps = [b - a for a, b in zip(stamps, stamps[1:]) if b > a]
        return 1000.0 / float(np.median(steps)) if steps else _DEFAULT_FPS

    def __iter__(self) -> Iterator[Frame]:
        """Yields every frame, then raises ``SourceError`` if decoding stopped before the end (see ``frames``)."""
        return self.frames()

    def frames(self, keep: Optional[Callable[[float], bool]] = None) -> Iterator[Frame]:
        """Yields the frames ``keep`` wants, then raises ``SourceError`` if decoding stopped before the end.

        Every frame is decoded (a video's frames depend on each other), but
        only those kept are converted to BGR: ``sample`` skips most frames of a
        30 fps file at 8 fps, and a 1080p frame's conversion costs milliseconds.

        Args:
          keep: Called with each frame's timestamp, in order; False skips the
            frame. None keeps every frame.

        Raises:
          SourceError: If a read failed before the last frame the container
            lists, the decoder resumed after a failed read (a damaged stretch),
            or the container was cut off (``containers.damage``): the frames
            before it have been yielded.
        """
        index, image = 0, self._first
        self._first = None
        times = _FrameTimes(self._first_ms or 0.0, self.fps)
        t = 0.0
        spare = None  # a buffer the next conversion may write into
        ok = image is not None
        if ok and keep is not None and not keep(t):
            image = None
        while ok:
            if image is not None:
                fitted = _fit(image)
                yield Frame(index, t, fitted)
                # A frame scaled down was copied: its full-size buffer takes the next
                # conversion (an 8K frame is 100 MB); one passed on as read must not be overwritten.
                spare = image if fitted is not image else None
            ok = self._cap.grab()
            index += 1
            if not ok:
                break
            t = times.next(self._position_ms())
            if times.variable and not self.variable_rate:
                self.variable_rate = True
                _log.warning("edgecap: %s: variable frame rate (%.3g to %.3g fps so far): windows "
                             "are timed by each frame's own timestamp", self.name, 1 / times.longest,
                             1 / times.shortest)
            image = None
            if keep is None or keep(t):
                ok, image = self._cap.retrieve(spare)
                spare = None
        self._check_end(index, t)

    def _check_end(self, index: int, t: float) -> None:
        """After the last frame read (``index`` frames, the last at ``t``): raises if decoding stopped early.

        Frames past the damage are not decoded: windows would silently span the gap.
        """
        at = f"frame {index} ({t + 1.0 / self.fps:.2f} s)"
        fix = ("windows before it are captioned, none after: re-encode or replace the file "
               "(ffmpeg -i IN -c:v libx264 OUT.mp4)")
        if any(self._cap.grab() for _ in range(_RESYNC_READS)):
            raise SourceError(f"{self.name}: damaged at {at}: decoding stopped there after "
                              f"{index} frames" + (f" of {self.frame_count}" if self.frame_count
                                                   else "") + f"; {fix}")
        hurt = containers.damage(self._path)
        if hurt is not None and hurt.cut:
            raise SourceError(f"{self.name}: {hurt.what}: the recording ends at {at}; {fix}")
        if hurt is not None:
            _log.warning("edgecap: %s: %s: its %d frames were read whole, but a recording cut "
                         "off between two frames cannot be told from a finished one", self.name,
                         hurt.what, index)
        elif index < self.frame_count:
            raise SourceError(f"{self.name}: ended at {at}, but the file lists "
                              f"{self.frame_count} frames: it is truncated or damaged; {fix}")

    def close(self) -> None:
        self._cap.release()


def _open_on_a_thread(*args: Any) -> Any:
    """Opens a capture on a thread of its own and waits for it there.

    A camera's or a stream's open blocks inside OpenCV (a stream that does not
    answer, up to ``STREAM_TIMEOUT_MS``), where no signal handler runs: waiting
    in ``join`` instead lets Ctrl-C and SIGTERM stop the command at once. An
    open left behind that way ends by its own timeout, on a daemon thread.
    """
    result: List[Any] = []

    def open_() -> None:
        try:
            result.append(cv2.VideoCapture(*args))
        except BaseException as exc:  # raised here, in the caller's thread, as before
            result.append(exc)

    thread = threading.Thread(target=open_, name="edgecap-camera-open", daemon=True)
    thread.start()
    thread.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


class CameraSource(FrameSource):
    """A camera read by its own thread, which keeps only the newest frame.

    A slow consumer therefore always gets the most recent image, and frames it
    could not take are counted in ``dropped`` instead of queuing up. The reader
    thread owns the capture and releases it when it ends, so ``close()`` never
    waits longer than ``CLOSE_TIMEOUT_S`` on a read that hangs (an unplugged
    V4L2 camera) and never releases the capture under a read.

    A network stream URL (``is_stream_url``) is read the same way, through
    OpenCV's FFmpeg backend with open and read timeouts (``STREAM_TIMEOUT_MS``);
    its frames are scaled down like a file's, and its password never appears
    in a message (``redact``).
    """

    live = True
    CLOSE_TIMEOUT_S = 2.0

    def __init__(self, device: Union[int, str]):
        super().__init__()
        self.ended = ""  # why the frames ended, once they have (a camera has no end of its own)
        url = isinstance(device, str) and is_stream_url(device)
        self.name = redact(device) if url else f"camera {device}"
        if isinstance(device, int):
            check_camera_index(device)
        elif not url and not os.path.exists(device):
            raise SourceError(f"{self.name}: no such device: check the path (ls /dev/video*) "
                              "and that the camera is plugged in")
        if url:
            # Without the timeouts a host that does not answer blocks the open for minutes.
            self._cap = _open_on_a_thread(device, cv2.CAP_FFMPEG, [
                cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, STREAM_TIMEOUT_MS,
                cv2.CAP_PROP_READ_TIMEOUT_MSEC, STREAM_TIMEOUT_MS])
        else:
            self._cap = _open_on_a_thread(device)
        if not self._cap.isOpened():
            self._cap.release()
            if url:
                raise SourceError(f"{self.name}: cannot open the stream within "
                                  f"{STREAM_TIMEOUT_MS // 1000} s: check the address, the port "
                                  "and that the stream is up (ffprobe URL)")
            # On Linux, V4L2 opens index N (below 100: higher ones name a backend) as /dev/videoN.
            if (isinstance(device, int) and 0 <= device < 100 and sys.platform.startswith("linux")
                    and not os.path.exists(f"/dev/video{device}")):
                raise SourceError(f"{self.name}: no such device (/dev/video{device}): check "
                                  "ls /dev/video* and that the camera is plugged in")
            raise SourceError(f"{self.name}: cannot be opened: check that it is a camera and "
                              "that no other process holds it")
        # A stream's frames can be any size; a camera's are what it was set to.
        self._fit = _fit if url else None
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
                    if not self._stop.is_set():
                        self.ended = (f"the stream ended (no frame within {STREAM_TIMEOUT_MS // 1000} s, or the "
                                      "server closed it)" if self._fit is not None else
                                      "the camera sent no more frames (unplugged?)")
                    break
                now = time.monotonic()
                self._t0 = now if self._t0 is None else self._t0
                with self._cond:
                    if self._latest is not None:
                        self.dropped += 1
                    self._latest = Frame(index, now - self._t0,
                                         image if self._fit is None else self._fit(image))
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


class ReconnectingSource(FrameSource):
    """A camera or stream opened again, with backoff, whenever it ends or fails: it ends only when closed.

    What ``edgecap camera --reconnect`` reads. Each outage is one warning on
    the ``edgecap`` logger (the cause, and when it tries again: after 1 s, 2 s,
    4 s ... up to ``backoff[1]``, from the first after a frame came); frames
    are numbered and timed across reopens, as one source.

    Args:
      device: A camera index, device path or stream URL (``open_source``'s).
      backoff: The first and the longest wait between attempts, in seconds.
      opener: Opens ``device``; raises ``SourceError`` when it cannot.
    """

    live = True

    def __init__(self, device: Union[int, str], backoff: Tuple[float, float] = (1.0, 30.0),
                 opener: Callable[[Union[int, str]], FrameSource] = lambda device: CameraSource(device)) -> None:
        super().__init__()
        self.name = redact(device) if isinstance(device, str) and is_stream_url(device) else f"camera {device}"
        self.ended = ""
        self.reconnects = 0
        self._device, self._backoff, self._opener = device, backoff, opener
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._current: Optional[FrameSource] = None
        self._dropped_before = 0

    @property  # type: ignore[override]
    def dropped(self) -> int:  # noqa: D401 (FrameSource's attribute)
        current = self._current
        return self._dropped_before + (current.dropped if current is not None else 0)

    @dropped.setter
    def dropped(self, value: int) -> None:
        self._dropped_before = value

    def __iter__(self) -> Iterator[Frame]:
        t0, index, delay = time.monotonic(), 0, self._backoff[0]
        while not self._stop.is_set():
            got, why = 0, ""
            try:
                source = self._opener(self._device)
            except SourceError as exc:
                why = str(exc)
            else:
                with self._lock:
                    self._current = source
                try:
                    for frame in source:
                        yield Frame(index, time.monotonic() - t0, frame.image)
                        index, got = index + 1, got + 1
                    why = getattr(source, "ended", "") or "no more frames"
                except SourceError as exc:
                    why = str(exc)
                finally:
                    with self._lock:
                        self._current = None
                        self._dropped_before += source.dropped
                    source.close()
            if self._stop.is_set():
                return
            delay = self._backoff[0] if got else delay
            _log.warning("%s: %s; trying again in %g s", self.name, why.replace(f"{self.name}: ", ""), delay)
            self.reconnects += 1
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, self._backoff[1])

    def close(self) -> None:
        """Ends the iteration: the wait between attempts, or the read of the source open now."""
        self._stop.set()
        with self._lock:
            current = self._current
        if current is not None:
            current.close()


def is_stream_url(text: str) -> bool:
    """True for a network stream URL OpenCV's FFmpeg backend opens (``rtsp://``, ``http://``, ...)."""
    return bool(_URL.match(text))


def redact(url: str) -> str:
    """Returns a URL with its secrets replaced by ``***``, for messages and logs.

    The password of ``scheme://user:secret@host`` (up to the last ``@`` before
    the path, so a password holding ``@`` or ``:`` is hidden whole) and the
    values of query parameters that name a secret (``password``, ``pass``,
    ``pwd``, ``token``, ``key``, ``secret``, ``auth``, ``signature``).

    Args:
      url: Any text; what is not a URL comes back unchanged.
    """
    match = _AUTHORITY.match(url)
    if match is None:
        return url
    scheme, authority, rest = match.groups()
    user, at, host = authority.rpartition("@")
    if at and ":" in user:
        authority = f"{user.split(':', 1)[0]}:***@{host}"
    return scheme + authority + _SECRET_PARAM.sub(r"\1***", rest)


_AUTHORITY = re.compile(r"^([a-z][a-z0-9+.-]*://)([^/?#]*)(.*)$", re.IGNORECASE | re.DOTALL)
_SECRET_PARAM = re.compile(r"([?&;](?:password|passwd|pass|pwd|token|access_token|key|apikey|api_key|secret|auth|"
                           r"signature|sig)=)[^&;#]*", re.IGNORECASE)


def check_camera_index(index: int) -> None:
    """Refuses a camera index OpenCV must not see.

    Raises:
      SourceError: If ``index`` is negative (OpenCV's "any camera", which
        crashes inside OpenCV 5) or past ``limits.MAX_CAMERA_INDEX``.
    """
    if not 0 <= index <= MAX_CAMERA_INDEX:
        raise SourceError(f"camera {index}: not a camera index (0 to {MAX_CAMERA_INDEX}): pass "
                          "the camera's number, e.g. 0 for /dev/video0, or its device path")


def is_camera_path(text: str) -> bool:
    """True for a camera device: a /dev/video path or any character device."""
    if text.startswith("/dev/video"):
        return True
    try:
        return stat.S_ISCHR(os.stat(text).st_mode)
    except OSError:
        return False


def open_source(source: SourceLike, fps: Optional[float] = None,
                decode_threads: Optional[int] = None) -> FrameSource:
    """Opens what a user passes as a video source.

    Args:
      source: A video file path; a camera as a device path (``/dev/video0``) or
        index (``0``, or ``"0"`` when no file of that name exists); a network
        stream URL (``rtsp://``, ``http://`` ...: ``STREAM_SCHEMES``), read as
        a camera; or frames:
        a ``[T,H,W,C]`` array or an iterable of uint8 images (BGR, gray or
        BGRA, any size; see ``preprocess.as_bgr``).
      fps: Rate of in-memory frames (ignored for files and cameras).
      decode_threads: A video file's decoding threads (``VideoFileSource``).

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
        if isinstance(source, str) and is_stream_url(text):  # a Path would fold its "//"
            return CameraSource(text)
        # A video file named like a number ("2024") is that file, not camera 2024.
        if text.lstrip("-").isdigit() and not os.path.isfile(text):
            return CameraSource(int(text))
        if is_camera_path(text):
            return CameraSource(text)
        return VideoFileSource(Path(text), decode_threads)
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


class SampleClock:
    """The ``sample_fps`` clock, kept on source timestamps: which frames a sampled stream keeps.

    A 30 fps file sampled at 8 fps keeps 8 frames a second however the rates
    divide, and a source that stalled owes no burst of samples afterwards.
    """

    def __init__(self, sample_fps: float) -> None:
        self._period = 1.0 / sample_fps
        self._next: Optional[float] = None

    def due(self, t: float) -> bool:
        """Whether the frame at timestamp ``t`` is kept; ask for every frame, in order."""
        # The tolerance absorbs float error when the rates divide exactly.
        if self._next is not None and t + 1e-6 < self._next:
            return False
        self._next = (t if self._next is None else self._next) + self._period
        if t >= self._next:
            self._next = t + self._period
        return True


def sample(frames: Iterable[Frame], sample_fps: float) -> Iterator[Frame]:
    """Yields the frames that fall on a ``sample_fps`` clock (all of them when it is 0); see ``SampleClock``.

    A video file converts only the frames kept (``VideoFileSource.frames``).
    """
    if sample_fps <= 0:
        yield from frames
        return
    clock = SampleClock(sample_fps)
    if isinstance(frames, VideoFileSource):
        yield from frames.frames(clock.due)
        return
    for frame in frames:
        if clock.due(frame.timestamp):
            yield frame
