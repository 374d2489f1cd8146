"""Camera feeds for the service: each camera read by its own thread and reopened when it drops out.

A ``CameraFeed`` keeps only the newest sampled frame of its camera; a
``CameraMux`` interleaves the feeds' newest frames, round-robin, into the one
captioning pipeline that all cameras share, and sends a heartbeat while no
camera has a frame so that the service's watchdog keeps pinging.

Threads: a feed's supervisor thread (``edgecap-feed-NAME``) keeps time (stall
detection, backoff) and reports states; each open of the source is read by
one reader thread (``edgecap-feed-NAME-read``) that opens, reads and closes
that source, so no other thread releases a capture under a read. The one
exception is a live source's ``close()``, which the supervisor calls to end a
reader waiting on a camera that stalled: ``CameraSource.close()`` is made for
that (it only signals its own reader thread and waits a bounded time).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

import cv2

from edgecap.errors import EdgecapError, RunFailure
from edgecap.sources import (CameraSource, Frame, FrameSource, is_camera_path, is_stream_url, open_source, redact,
                             sample)

STARTING, ONLINE, OFFLINE = "starting", "online", "offline"

# A file that falls this far behind its real-time schedule (a slow disk, a
# paused process) skips ahead as a camera would, instead of delivering a burst.
_MAX_LAG_S = 0.5
# Opens that hung and were left behind, at most, before the feed waits for one to return.
MAX_HUNG_OPENS = 2

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CameraSpec:
    """What the service config says of one camera.

    Attributes:
      name: Unique name, used in topics, metric labels and messages.
      source: ``"/dev/video0"``, a camera index such as ``"0"``, or a video file path.
      width: Requested frame width (0 = the camera's default).
      height: Requested frame height (0 = the camera's default).
      fps: Requested capture rate (0 = the camera's default).
      fourcc: Requested pixel format, ``"MJPG"`` or ``"YUYV"`` ("" = default).
      loop: A file source restarts at its end (testing and demos).
      sample_fps: The window's sampling rate for this camera (0 = every frame).
      stall_seconds: No frame for this long means the camera is gone: reopen it.
      backoff_max_seconds: Cap of the delay between reopen attempts.
      backoff_initial_seconds: First delay between reopen attempts; it doubles
        on each failure up to the cap, and starts over after a frame arrives.
    """

    name: str
    source: str
    width: int = 0
    height: int = 0
    fps: float = 0.0
    fourcc: str = ""
    loop: bool = False
    sample_fps: float = 8.0
    stall_seconds: float = 20.0
    backoff_max_seconds: float = 30.0
    backoff_initial_seconds: float = 1.0


def capture_properties(spec: CameraSpec) -> List[Tuple[int, float]]:
    """The OpenCV capture properties a spec asks for, in the order V4L2 needs them.

    The pixel format goes first: a camera offers different sizes and rates in
    MJPG and YUYV, so size and rate are negotiated within the format.

    Args:
      spec: The camera.

    Returns:
      ``(cv2.CAP_PROP_*, value)`` pairs; those left at their default are omitted.
    """
    props: List[Tuple[int, float]] = []
    if spec.fourcc:
        props.append((cv2.CAP_PROP_FOURCC, float(cv2.VideoWriter_fourcc(*spec.fourcc))))
    if spec.width:
        props.append((cv2.CAP_PROP_FRAME_WIDTH, float(spec.width)))
    if spec.height:
        props.append((cv2.CAP_PROP_FRAME_HEIGHT, float(spec.height)))
    if spec.fps:
        props.append((cv2.CAP_PROP_FPS, float(spec.fps)))
    return props


class TunedCameraSource(CameraSource):
    """A ``CameraSource`` that sets capture properties (format, size, rate) before its first read.

    Attributes:
      negotiated: What the camera agreed to, e.g. ``"640x480 MJPG 15 fps"``;
        filled by the reader thread before the first frame.
    """

    def __init__(self, device: Union[int, str], properties: Sequence[Tuple[int, float]] = ()):
        # Set before CameraSource.__init__ starts the reader thread that reads them.
        self._properties = tuple(properties)
        self.negotiated = ""
        super().__init__(device)

    def _read(self) -> None:
        # The reader thread owns the capture, so setting properties here cannot race a read.
        try:
            for prop, value in self._properties:
                self._cap.set(prop, value)
            self.negotiated = _describe(self._cap)
        except cv2.error as exc:
            _log.warning("%s: could not set capture properties: %s", self.name,
                         " ".join(str(exc).split()))
        super()._read()


def _describe(cap: Any) -> str:
    width, height = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
    code = int(cap.get(cv2.CAP_PROP_FOURCC))
    fourcc = "".join(chr((code >> (8 * i)) & 0xFF) for i in range(4)).strip("\0 ")
    fps = cap.get(cv2.CAP_PROP_FPS)
    parts = [f"{width}x{height}", fourcc if fourcc.isprintable() else "", f"{fps:g} fps" if fps > 0 else ""]
    return " ".join(p for p in parts if p)


def is_device_source(text: str) -> bool:
    """True if a camera source names a device rather than a video file.

    A device (``/dev/video0``, a udev link under ``/dev/v4l/``, an index) may
    be unplugged when the service starts and plugged in later, and a network
    stream (``rtsp://...``) may be down: the feed waits for it. A file has no such excuse, so ``check_file_source`` checks it at
    start.

    Args:
      text: The configured source.

    Returns:
      True for an index (unless a file of that name exists), any path under
      ``/dev/``, and any character device.
    """
    # A video file named like a number ("2024") is that file, not camera 2024.
    if text.isdigit():
        return not os.path.isfile(text)
    return text.startswith("/dev/") or is_camera_path(text) or is_stream_url(text)


def check_file_source(text: str) -> None:
    """Opens a file camera's video, reads its first frame and closes it.

    Args:
      text: A source for which ``is_device_source`` is False.

    Raises:
      SourceError: One line, if the file is missing, not a regular file (a
        directory or a FIFO, which is never opened), unreadable, or not a video
        OpenCV decodes.
    """
    open_source(text).close()


def open_camera(spec: CameraSpec) -> FrameSource:
    """Opens a spec's source: a camera with its requested properties, else what ``open_source`` opens.

    Args:
      spec: The camera.

    Returns:
      A ``FrameSource``; the caller closes it.

    Raises:
      SourceError: If the camera or file cannot be opened.
    """
    text = spec.source
    if not is_device_source(text) or is_stream_url(text):
        return open_source(text)
    return TunedCameraSource(int(text) if text.isdigit() else text, capture_properties(spec))


def _ignore(*args: Any) -> None:
    pass


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if isinstance(exc, (EdgecapError, RunFailure)) and text else f"{type(exc).__name__}: {text}"


class _Connection:
    """One open of a feed's source and the reader thread that owns it (guarded by the feed's lock)."""

    def __init__(self, opened_at: float) -> None:
        self.source: Optional[FrameSource] = None
        self.stop = False
        self.ended = False
        self.why = ""  # why it ended
        self.frames = 0
        self.last_t = opened_at  # clock of the open, then of the last frame
        self.thread: Optional[threading.Thread] = None


class CameraFeed:
    """One camera, read by its own thread, reopened with exponential backoff when it drops out.

    Opens the camera (applying size, rate and format), samples at
    ``sample_fps``, keeps only the newest sampled frame, paces a file source to
    its own timestamps (real time, like a camera) and restarts it at its end
    when ``loop``. When no frame arrives for ``stall_seconds``, or the source
    fails or ends, it closes the source and reopens it after 1 s, 2 s, 4 s ...
    up to ``backoff_max_seconds`` (starting over after a frame), until ``stop()``.

    Frames carry ``index``: frames captured since the feed started (before
    sampling, across reopens), and ``timestamp``: seconds since the feed
    started on ``clock`` (for a file, its real-time schedule).

    Callbacks run on the feed's threads and must not block: ``on_state`` on the
    supervisor thread, ``on_frame`` and ``on_drop`` on the reader thread. An
    exception in one is logged and ignored.

    Attributes:
      spec: The camera.
      status: ``"starting"``, ``"online"`` or ``"offline"``.
      reason: One line on why, e.g. ``"no frame for 20.0 s; retrying in 1 s"``.
      reconnects: Reopen attempts after the first open.
      captured: Frames read from the camera.
      dropped: Sampled frames replaced by a newer one before anyone took them.
    """

    def __init__(self, spec: CameraSpec,
                 on_state: Callable[[str, str, str], None] = _ignore,
                 on_frame: Callable[[str], None] = _ignore,
                 on_drop: Callable[[str, int], None] = _ignore,
                 on_reconnect: Callable[[str], None] = _ignore,
                 clock: Callable[[], float] = time.monotonic,
                 opener: Callable[[CameraSpec], FrameSource] = open_camera):
        """Prepares the feed; ``start()`` opens the camera.

        Args:
          spec: The camera.
          on_state: Called with ``(camera, status, reason)`` on each change of status or reason.
          on_frame: Called with the camera's name for each frame captured.
          on_drop: Called with ``(camera, n)`` when sampled frames are dropped for newer ones.
          on_reconnect: Called with the camera's name on each reopen attempt.
          clock: Monotonic seconds, for timestamps, pacing and stall detection.
          opener: Opens the spec's source (``open_camera``); raises ``SourceError``
            when it cannot. A live source's ``close()`` must end a read that
            waits on another thread (``CameraSource.close()`` does).
        """
        self.spec = spec
        self.status = STARTING
        self.reason = ""
        self.reconnects = 0
        self.captured = 0
        self.dropped = 0
        self._on_state, self._on_frame = on_state, on_frame
        self._on_drop, self._on_reconnect = on_drop, on_reconnect
        self._clock = clock
        self._opener = opener
        self._cond = threading.Condition()
        self._latest: Optional[Frame] = None
        self._listeners: List[Callable[[], None]] = []
        self._stopping = False
        self._hung: List[_Connection] = []  # readers left inside an open that did not return
        self._t0 = 0.0
        self._thread = threading.Thread(target=self._run, name=f"edgecap-feed-{spec.name}",
                                        daemon=True)

    @property
    def name(self) -> str:
        """The camera's name."""
        return self.spec.name

    def start(self) -> None:
        """Starts the feed's thread, which opens the camera."""
        self._t0 = self._clock()
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stops the feed and waits for its threads, readers left inside a hung open included; idempotent.

        Args:
          timeout: Returns after this many seconds in all even if a read or an
            open hangs (the threads are daemons and end when it returns).
        """
        self.request_stop()
        if self._thread.ident is None or self._thread is threading.current_thread():
            return
        end = time.monotonic() + timeout
        self._thread.join(timeout)
        with self._cond:
            hung = [c.thread for c in self._hung if c.thread is not None]
        for thread in hung:  # readers left inside an open: they end once it returns
            thread.join(max(0.0, end - time.monotonic()))

    def request_stop(self) -> None:
        """Tells the feed to stop, without waiting (so many feeds stop at once)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def take(self) -> Optional[Frame]:
        """Returns the newest sampled frame not taken yet, or None."""
        with self._cond:
            frame, self._latest = self._latest, None
            return frame

    def add_listener(self, wake: Callable[[], None]) -> None:
        """Calls ``wake()`` (on the reader thread; it must not block) whenever a sampled frame arrives."""
        with self._cond:
            self._listeners = self._listeners + [wake]

    # Supervisor thread.

    def _run(self) -> None:
        try:
            self._supervise()
        except Exception as exc:  # a bug: say so where the service looks, instead of a stale "online"
            _log.exception("camera %s: feed failed", self.name)
            self._report(OFFLINE, f"feed failed: {_one_line(exc)}")

    def _supervise(self) -> None:
        spec = self.spec
        self._report(STARTING, f"opening {redact(spec.source)}")
        failures = 0
        conn: Optional[_Connection] = None
        while True:
            if conn is not None:
                self.reconnects += 1
                self._call(self._on_reconnect, self.name)
            conn = _Connection(self._clock())
            with self._cond:
                if self._stopping:
                    break
            conn.thread = threading.Thread(target=self._read, args=(conn,),
                                           name=f"edgecap-feed-{self.name}-read", daemon=True)
            conn.thread.start()
            why = self._watch(conn)
            self._hang_up(conn)
            if why is None:
                break
            if conn.frames:
                failures = 0
            delay = min(spec.backoff_initial_seconds * 2 ** min(failures, 30), spec.backoff_max_seconds)
            failures += 1
            self._report(OFFLINE, f"{why}; retrying in {delay:g} s")
            if self._wait(self._clock() + delay) or self._let_go(conn):
                break
        if conn is not None and conn.thread is not None:
            # Bounded: an open that hangs (a wedged V4L2 driver) must not keep this thread.
            conn.thread.join(self.spec.stall_seconds)
            if conn.thread.is_alive():
                _log.warning("camera %s: %s still in an open or read; left to end on its own",
                             self.name, conn.thread.name)
        self._report(OFFLINE, "stopped")

    def _watch(self, conn: _Connection) -> Optional[str]:
        """Waits until the connection ends or stalls; returns why, or None when the feed stops."""
        stall = self.spec.stall_seconds
        announced = False
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return None
                    if conn.frames and not announced:
                        negotiated = getattr(conn.source, "negotiated", "")
                        break
                    if conn.ended:
                        return conn.why
                    idle = self._clock() - conn.last_t
                    if idle >= stall:
                        return f"no frame for {stall:.1f} s"
                    self._cond.wait(stall - idle)
            announced = True
            self._report(ONLINE, f"receiving frames ({negotiated})" if negotiated else "receiving frames")

    def _hang_up(self, conn: _Connection) -> None:
        with self._cond:
            conn.stop = True
            source = conn.source
            self._cond.notify_all()
        if source is not None and source.live:
            # Ends a reader that waits on a camera that stalled.
            source.close()

    def _wait(self, deadline: float) -> bool:
        """Waits until ``deadline`` on the clock; True when the feed stops first."""
        with self._cond:
            while not self._stopping:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def _let_go(self, conn: _Connection) -> bool:
        """Waits for the last reader to let go of the source; True when the feed stops first.

        The next open should find the device free; but a reader still inside
        its open ``stall_seconds`` later (a wedged V4L2 driver, a host that
        never answers) is left behind, with one warning, and the camera tried
        again beside it, up to ``MAX_HUNG_OPENS`` such readers at once: then the
        feed waits for one of them to return.
        """
        with self._cond:
            self._cond.wait_for(lambda: conn.ended or self._stopping, self.spec.stall_seconds)
            if self._stopping or conn.ended:
                return self._stopping
            self._hung = [c for c in self._hung if not c.ended] + [conn]
            hung = len(self._hung)
        _log.warning("camera %s: the open of %s has not returned for %.0f s; left behind (%d at once), "
                     "trying again", self.name, redact(self.spec.source), self.spec.stall_seconds, hung)
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or sum(not c.ended for c in self._hung) < MAX_HUNG_OPENS)
            return self._stopping

    def _report(self, status: str, reason: str) -> None:
        if (status, reason) != (self.status, self.reason):
            self.status, self.reason = status, reason
            self._call(self._on_state, self.name, status, reason)

    def _call(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:  # the camera must keep running whatever a listener does
            _log.exception("camera %s: callback %r failed", self.name, callback)

    # Reader thread.

    def _read(self, conn: _Connection) -> None:
        why = ""
        try:
            source = self._open(conn)
            if source is not None:
                for frame in sample(self._capture(conn, source), self.spec.sample_fps):
                    self._publish(frame)
                source = conn.source
                why = f"{source.name if source is not None else self.spec.source}: stream ended"
        except Exception as exc:  # the supervisor reports it and reopens
            why = _one_line(exc)
        finally:
            with self._cond:
                source, conn.source = conn.source, None
            if source is not None:
                source.close()
            with self._cond:
                conn.ended, conn.why = True, why
                self._cond.notify_all()

    def _open(self, conn: _Connection) -> Optional[FrameSource]:
        source = self._opener(self.spec)
        with self._cond:
            if not (conn.stop or self._stopping):
                conn.source = source
                return source
        source.close()
        return None

    def _capture(self, conn: _Connection, source: FrameSource) -> Iterator[Frame]:
        """Frames of one connection on the feed's timeline; a file paced to real time and looped if asked."""
        start: Optional[float] = None  # feed time of the file's time 0 in this pass
        while True:
            last: Optional[Frame] = None
            for frame in source:
                if conn.stop or self._stopping:
                    return
                if source.live:
                    t = self._clock() - self._t0
                else:
                    if start is None:
                        start = self._clock() - self._t0 - frame.timestamp
                    lag = self._pace(conn, start + frame.timestamp)
                    if lag is None:
                        return
                    if lag > _MAX_LAG_S:
                        start += lag
                    t = start + frame.timestamp
                last = frame
                yield self._captured(conn, frame.image, t)
            if source.live or not self.spec.loop or last is None or start is None:
                return
            # The next pass starts one frame period after this one's last frame.
            fps = getattr(source, "fps", 0.0) or 30.0
            start += last.timestamp + 1.0 / fps
            with self._cond:
                conn.source = None
            source.close()
            reopened = self._open(conn)
            if reopened is None:
                return
            source = reopened

    def _pace(self, conn: _Connection, t: float) -> Optional[float]:
        """Waits until feed time ``t``; returns how late it is then, or None when stopped."""
        deadline = self._t0 + t
        with self._cond:
            while not (conn.stop or self._stopping):
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return -remaining
                self._cond.wait(remaining)
        return None

    def _captured(self, conn: _Connection, image: Any, t: float) -> Frame:
        with self._cond:
            frame = Frame(self.captured, t, image)
            self.captured += 1
            conn.frames += 1
            conn.last_t = self._clock()
            if conn.frames == 1:
                self._cond.notify_all()
        self._call(self._on_frame, self.name)
        return frame

    def _publish(self, frame: Frame) -> None:
        with self._cond:
            replaced = self._latest is not None
            if replaced:
                self.dropped += 1
            self._latest = frame
            listeners = self._listeners
        for wake in listeners:
            wake()
        if replaced:
            self._call(self._on_drop, self.name, 1)


class CameraMux:
    """Interleaves the newest sampled frame of each feed, fairly (round-robin among feeds that have one).

    Iterating yields ``(camera, frame)``; when no feed has produced a frame for
    ``heartbeat_s`` it yields ``("", None)``, so the consumer's watchdog keeps
    pinging while every camera is offline. The iteration ends after ``stop()``.
    One consumer iterates; the feeds are started and stopped by the caller.
    """

    def __init__(self, feeds: Sequence[CameraFeed], heartbeat_s: float = 1.0):
        """Attaches to the feeds.

        Args:
          feeds: The cameras to interleave.
          heartbeat_s: Longest wait without yielding anything.
        """
        self._feeds = list(feeds)
        self._heartbeat_s = heartbeat_s
        # Reentrant, so a stop() from a signal handler that interrupted the
        # consumer while it holds the lock cannot deadlock.
        self._cond = threading.Condition(threading.RLock())
        self._stopped = False
        self._next = 0
        for feed in self._feeds:
            feed.add_listener(self._wake)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def stop(self) -> None:
        """Ends the iteration; thread-safe and safe in a signal handler (sets a flag and notifies)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def __iter__(self) -> Iterator[Tuple[str, Optional[Frame]]]:
        deadline = time.monotonic() + self._heartbeat_s
        while True:
            with self._cond:
                while True:
                    if self._stopped:
                        return
                    item = self._take()
                    if item is not None:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        item = ("", None)
                        break
                    self._cond.wait(remaining)
            deadline = time.monotonic() + self._heartbeat_s
            yield item

    def _take(self) -> Optional[Tuple[str, Optional[Frame]]]:
        count = len(self._feeds)
        for k in range(count):
            i = (self._next + k) % count
            frame = self._feeds[i].take()
            if frame is not None:
                self._next = i + 1
                return self._feeds[i].name, frame
        return None
