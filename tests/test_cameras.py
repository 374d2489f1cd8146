"""Camera feeds: drop-out and reconnect with backoff, stalls, real-time files, the mux, stopping."""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

import cv2
import numpy as np
import pytest

from edgecap.errors import SourceError
from edgecap.service.cameras import (CameraFeed, CameraMux, CameraSpec, TunedCameraSource,
                                     capture_properties)
from edgecap.sources import Frame, FrameSource

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "models" / "demo" / "sample.mp4"  # 128x128, 16 fps, 48 frames
IMAGE = np.zeros((4, 4, 3), np.uint8)


def _edgecap_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("edgecap-") and t not in _BEFORE]


_BEFORE: List[threading.Thread] = []


@pytest.fixture(autouse=True)
def no_thread_leaks() -> Iterator[None]:
    """Every test ends with no edgecap thread it started still running."""
    _BEFORE[:] = threading.enumerate()  # whatever other modules left is not ours to judge
    yield
    assert [t.name for t in _edgecap_threads()] == []


@contextlib.contextmanager
def deadline(mux: CameraMux, seconds: float = 5.0) -> Iterator[None]:
    """Stops the mux after ``seconds``, so that a broken feed fails the test instead of hanging it."""
    timer = threading.Timer(seconds, mux.stop)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()


class FakeCamera(FrameSource):
    """A live source: ``n`` frames ``period`` apart, then it hangs until closed (``then="stall"``) or ends."""

    live = True

    def __init__(self, n: int, period: float = 0.005, then: str = "stall") -> None:
        super().__init__()
        self.name = "fake camera"
        self._n, self._period, self._then = n, period, then
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[Frame]:
        for i in range(self._n):
            if self.closed.wait(self._period):
                return
            yield Frame(i, i * self._period, IMAGE)
        if self._then == "stall":
            self.closed.wait()

    def close(self) -> None:
        self.closed.set()


class Script:
    """An opener that plays outcomes in order (a source, or an exception to raise) and records call times."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.calls: List[float] = []

    def __call__(self, spec: CameraSpec) -> FrameSource:
        self.calls.append(time.monotonic())
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome() if callable(outcome) else outcome


class Recorder:
    """Collects a feed's callbacks with their times; ``wait_for`` blocks until a predicate holds."""

    def __init__(self) -> None:
        self.states: List[Tuple[float, str, str]] = []
        self.frames = 0
        self.drops = 0
        self.reconnects = 0
        self._cond = threading.Condition()

    def on_state(self, camera: str, status: str, reason: str) -> None:
        with self._cond:
            self.states.append((time.monotonic(), status, reason))
            self._cond.notify_all()

    def on_frame(self, camera: str) -> None:
        with self._cond:
            self.frames += 1
            self._cond.notify_all()

    def on_drop(self, camera: str, n: int) -> None:
        self.drops += n

    def on_reconnect(self, camera: str) -> None:
        self.reconnects += 1

    def feed(self, spec: CameraSpec, opener: Optional[Callable[[CameraSpec], FrameSource]] = None,
             ) -> CameraFeed:
        extra = {} if opener is None else {"opener": opener}
        return CameraFeed(spec, on_state=self.on_state, on_frame=self.on_frame, on_drop=self.on_drop,
                          on_reconnect=self.on_reconnect, **extra)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 3.0) -> None:
        with self._cond:
            assert self._cond.wait_for(predicate, timeout), f"timed out; states: {self.statuses()}"

    def statuses(self) -> List[Tuple[str, str]]:
        return [(status, reason) for _, status, reason in self.states]


def _spec(**kw: Any) -> CameraSpec:
    base = dict(name="cam", source="fake", sample_fps=0.0, stall_seconds=0.2,
                backoff_initial_seconds=0.05, backoff_max_seconds=0.1)
    base.update(kw)
    return CameraSpec(**base)


def test_a_camera_that_drops_out_goes_offline_reconnects_with_backoff_and_resumes() -> None:
    gone = SourceError("camera /dev/video9: no such device: check the path")
    script = Script(lambda: FakeCamera(3), gone, gone, gone, lambda: FakeCamera(4, then="end"),
                    lambda: FakeCamera(2))
    rec = Recorder()
    feed = rec.feed(_spec(), script)
    mux = CameraMux([feed], heartbeat_s=0.05)
    seen: List[Frame] = []
    feed.start()
    try:
        with deadline(mux):
            for camera, frame in mux:
                if frame is not None:
                    seen.append(frame)
                if sum(status == "online" for status, _ in rec.statuses()) == 3 or len(script.calls) > 6:
                    break
        rec.wait_for(lambda: rec.frames == 9)
    finally:
        mux.stop()
        feed.stop()

    assert rec.statuses() == [
        ("starting", "opening fake"),
        ("online", "receiving frames"),
        # Stalled after 3 frames: the first delay, as after any frame.
        ("offline", "no frame for 0.2 s; retrying in 0.05 s"),
        # Three failed reopens: the delay doubles, up to the cap (reported once: the line repeats).
        ("offline", "camera /dev/video9: no such device: check the path; retrying in 0.1 s"),
        ("online", "receiving frames"),
        # It ended after 4 frames: the backoff started over.
        ("offline", "fake camera: stream ended; retrying in 0.05 s"),
        ("online", "receiving frames"),
        ("offline", "stopped"),
    ]
    t = script.calls
    stalled_at = rec.states[2][0]
    assert stalled_at - t[0] >= 0.2  # no frame for stall_seconds, measured from the last frame
    assert t[1] - stalled_at >= 0.05
    assert t[2] - t[1] >= 0.1 and t[3] - t[2] >= 0.1 and t[4] - t[3] >= 0.1
    assert t[5] - rec.states[5][0] >= 0.05
    assert all(gap < 1.0 for gap in np.diff(t))  # none waits far beyond its delay
    assert feed.reconnects == rec.reconnects == 5
    assert feed.captured == rec.frames == 9
    # Frames resumed after each drop-out, numbered across reopens.
    indices = [f.index for f in seen]
    assert indices == sorted(set(indices)) and indices[-1] >= 7
    assert any(i >= 3 for i in indices)
    assert feed.status == "offline"


def test_a_camera_that_never_sends_a_frame_is_offline_after_stall_seconds() -> None:
    rec = Recorder()
    feed = rec.feed(_spec(stall_seconds=0.1), Script(lambda: FakeCamera(0)))
    started = time.monotonic()
    feed.start()
    try:
        rec.wait_for(lambda: any(s == "offline" for _, s, _ in rec.states))
    finally:
        feed.stop()
    offline = next(t for t, s, _ in rec.states if s == "offline")
    assert 0.1 <= offline - started < 1.0
    assert rec.statuses()[1] == ("offline", "no frame for 0.1 s; retrying in 0.05 s")


def test_a_camera_whose_open_hangs_is_tried_again_beside_it(caplog) -> None:
    # Before: the supervisor waited for the hung open to return before the next try, so a
    # camera whose open hung (a wedged driver) stayed offline for good.
    release = threading.Event()

    def hangs() -> FrameSource:
        release.wait()
        return FakeCamera(0)

    rec = Recorder()
    script = Script(hangs, lambda: FakeCamera(50, then="stall"))
    feed = rec.feed(_spec(stall_seconds=0.2), script)
    feed.start()
    try:
        with caplog.at_level("WARNING", logger="edgecap.service.cameras"):
            rec.wait_for(lambda: ("online", "receiving frames") in rec.statuses(), timeout=5.0)
        assert len(script.calls) == 2 and rec.statuses()[1][0] == "offline"
        said = [r.getMessage() for r in caplog.records if "has not returned" in r.getMessage()]
        assert len(said) == 1 and "the open of fake has not returned for 0 s; left behind (1 at once)" in said[0]
    finally:
        release.set()
        feed.stop()


def test_no_more_than_two_hung_opens_are_left_behind() -> None:
    release = threading.Event()

    def hangs() -> FrameSource:
        release.wait()
        return FakeCamera(0)

    rec = Recorder()
    script = Script(hangs)
    feed = rec.feed(_spec(stall_seconds=0.1), script)
    feed.start()
    try:
        time.sleep(1.5)  # many stall periods: still only the opens the cap allows
        assert len(script.calls) == 2
    finally:
        release.set()
        feed.stop()


def test_a_missing_device_is_reported_in_one_line() -> None:
    rec = Recorder()
    feed = rec.feed(_spec(source="/dev/video97"))  # the default opener
    feed.start()
    try:
        rec.wait_for(lambda: len(rec.states) >= 2)
    finally:
        feed.stop()
    status, reason = rec.statuses()[1]
    assert status == "offline"
    assert reason.startswith("camera /dev/video97: no such device") and "\n" not in reason
    assert reason.endswith("; retrying in 0.05 s")


def test_a_file_plays_at_its_own_rate_and_samples_at_sample_fps() -> None:
    rec = Recorder()
    feed = rec.feed(_spec(source=str(SAMPLE), sample_fps=8.0, loop=True))
    mux = CameraMux([feed], heartbeat_s=0.5)
    seen: List[Tuple[float, Frame]] = []
    stopper = threading.Timer(1.5, mux.stop)
    feed.start()
    started = time.monotonic()
    stopper.start()
    try:
        for camera, frame in mux:
            assert camera == "cam" and frame is not None
            seen.append((time.monotonic() - started, frame))
    finally:
        stopper.cancel()
        feed.stop()
    # 16 fps captured, 8 fps sampled, over 1.5 s: a file behaves like a camera.
    assert 21 <= rec.frames <= 26
    assert 10 <= len(seen) <= 13
    stamps = np.array([f.timestamp for _, f in seen])
    assert np.allclose(np.diff(stamps), 1 / 8)  # the schedule, not the wakeups
    assert [f.index for _, f in seen] == list(range(0, 2 * len(seen), 2))
    # Each frame arrives when its timestamp says, not early.
    assert all(arrived >= f.timestamp - 0.01 for arrived, f in seen)
    assert rec.statuses()[:2] == [("starting", f"opening {SAMPLE}"), ("online", "receiving frames")]
    assert feed.reconnects == 0 and rec.drops == 0


def test_a_looping_file_restarts_seamlessly(tmp_path: Path) -> None:
    clip = tmp_path / "short.avi"  # 5 frames at 25 fps: 0.2 s
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"MJPG"), 25.0, (16, 16))
    for i in range(5):
        writer.write(np.full((16, 16, 3), i * 40, np.uint8))
    writer.release()
    rec = Recorder()
    feed = rec.feed(_spec(source=str(clip), loop=True))
    mux = CameraMux([feed], heartbeat_s=0.5)
    seen: List[Frame] = []
    feed.start()
    try:
        with deadline(mux):
            for _, frame in mux:
                assert frame is not None
                seen.append(frame)
                if len(seen) == 17:  # three and a half passes
                    break
    finally:
        mux.stop()
        feed.stop()
    assert [f.index for f in seen] == list(range(17))
    assert np.allclose(np.diff([f.timestamp for f in seen]), 1 / 25)  # no gap or burst at the seams
    assert [round(f.image[0, 0, 0] / 40) for f in seen[:10]] == [0, 1, 2, 3, 4] * 2
    assert rec.statuses() == [("starting", f"opening {clip}"), ("online", "receiving frames"),
                              ("offline", "stopped")]
    assert feed.reconnects == 0


def test_the_mux_interleaves_fairly_and_keeps_only_the_newest_frame() -> None:
    recs = [Recorder(), Recorder()]
    feeds = [rec.feed(_spec(name=name), Script(lambda: FakeCamera(10_000, period=0.002)))
             for rec, name in zip(recs, ("a", "b"))]
    mux = CameraMux(feeds, heartbeat_s=1.0)
    got: List[Tuple[str, Frame]] = []
    for feed in feeds:
        feed.start()
    try:
        with deadline(mux):
            for camera, frame in mux:
                assert frame is not None
                got.append((camera, frame))
                if len(got) == 20:
                    break
                time.sleep(0.02)  # a consumer slower than both cameras
    finally:
        mux.stop()
        for feed in feeds:
            feed.stop()
    names = [camera for camera, _ in got]
    assert abs(names.count("a") - names.count("b")) <= 4  # strict alternation is the test below
    for name, feed, rec in zip(("a", "b"), feeds, recs):
        indices = [f.index for camera, f in got if camera == name]
        assert max(np.diff(indices)) > 1  # frames in between were dropped for newer ones
        assert feed.dropped == rec.drops > 0


class StubFeed:
    """A feed that always has a frame, or only every ``every``-th take."""

    def __init__(self, name: str, every: int = 1) -> None:
        self.name, self.every, self.takes = name, every, 0

    def add_listener(self, wake: Callable[[], None]) -> None:
        pass

    def take(self) -> Optional[Frame]:
        self.takes += 1
        return Frame(self.takes, 0.0, IMAGE) if self.takes % self.every == 0 else None


def test_the_mux_takes_round_robin_among_feeds_that_have_a_frame() -> None:
    mux = CameraMux([StubFeed("a"), StubFeed("b"), StubFeed("c", every=3)])  # type: ignore[list-item]
    names = [camera for camera, _ in itertools.islice(mux, 12)]
    # c has a frame on its 3rd and 6th look, and is served then, in its turn after b.
    assert names == ["a", "b", "a", "b", "a", "b", "c", "a", "b", "a", "b", "a"]


def test_the_mux_beats_while_no_camera_has_a_frame() -> None:
    rec = Recorder()
    feed = rec.feed(_spec(), Script(SourceError("camera x: gone")))
    mux = CameraMux([feed], heartbeat_s=0.05)
    beats: List[float] = []
    feed.start()
    started = time.monotonic()
    try:
        with deadline(mux):
            for item in mux:
                assert item == ("", None)
                beats.append(time.monotonic() - started)
                if len(beats) == 4:
                    break
    finally:
        mux.stop()
        feed.stop()
    assert beats[0] >= 0.05 and all(gap >= 0.045 for gap in np.diff(beats))
    assert beats[-1] < 1.0
    assert rec.statuses()[1] == ("offline", "camera x: gone; retrying in 0.05 s")


def test_stop_from_another_thread_ends_the_iteration_promptly() -> None:
    mux = CameraMux([], heartbeat_s=10.0)
    timer = threading.Timer(0.1, mux.stop)
    started = time.monotonic()
    timer.start()
    items = list(mux)
    timer.join()
    assert items == [] and time.monotonic() - started < 1.0


def test_stop_from_a_signal_handler_ends_the_iteration() -> None:
    mux = CameraMux([], heartbeat_s=10.0)
    previous = signal.signal(signal.SIGALRM, lambda *_: mux.stop())
    started = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        items = list(mux)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert items == [] and time.monotonic() - started < 1.0


def test_stop_returns_within_its_timeout_when_a_read_hangs() -> None:
    release = threading.Event()

    class HungCamera(FakeCamera):
        def __iter__(self) -> Iterator[Frame]:
            yield Frame(0, 0.0, IMAGE)
            release.wait()  # a read that close() cannot interrupt

    rec = Recorder()
    feed = rec.feed(_spec(), Script(lambda: HungCamera(0)))
    feed.start()
    rec.wait_for(lambda: rec.frames == 1)
    started = time.monotonic()
    feed.stop(timeout=0.2)
    assert time.monotonic() - started < 0.5
    assert _edgecap_threads()  # still in the read: the threads outlive the timeout ...
    release.set()
    for thread in _edgecap_threads():
        thread.join(2.0)  # ... and end once it returns
    assert rec.statuses()[-1] == ("offline", "stopped")


def test_stop_before_start_and_twice_is_harmless() -> None:
    feed = CameraFeed(_spec(), opener=Script(lambda: FakeCamera(100)))
    feed.stop()
    feed = CameraFeed(_spec(), opener=Script(lambda: FakeCamera(100)))
    feed.start()
    feed.stop()
    feed.stop()
    assert feed.status == "offline" and feed.reason == "stopped"


def test_a_failing_callback_does_not_stop_the_camera() -> None:
    frames = threading.Semaphore(0)

    def on_frame(camera: str) -> None:
        frames.release()
        raise RuntimeError("listener bug")

    feed = CameraFeed(_spec(), on_frame=on_frame, opener=Script(lambda: FakeCamera(100)))
    feed.start()
    try:
        assert all(frames.acquire(timeout=2.0) for _ in range(5))
    finally:
        feed.stop()
    assert feed.captured >= 5


def test_capture_properties_put_the_pixel_format_first() -> None:
    spec = CameraSpec("c", "/dev/video0", width=640, height=480, fps=15, fourcc="MJPG")
    assert capture_properties(spec) == [
        (cv2.CAP_PROP_FOURCC, float(cv2.VideoWriter_fourcc(*"MJPG"))),
        (cv2.CAP_PROP_FRAME_WIDTH, 640.0), (cv2.CAP_PROP_FRAME_HEIGHT, 480.0), (cv2.CAP_PROP_FPS, 15.0)]
    assert capture_properties(CameraSpec("c", "0")) == []


def test_a_tuned_camera_sets_its_properties_on_its_reader_thread_and_says_what_it_got() -> None:
    # A file read through the camera path stands in for a V4L2 device: it
    # ignores the requested size but reports what the capture has.
    source = TunedCameraSource(str(SAMPLE), [(cv2.CAP_PROP_FRAME_WIDTH, 640.0)])
    try:
        frame = next(iter(source))
    finally:
        source.close()
    assert frame.image.shape == (128, 128, 3)
    assert source.negotiated.startswith("128x128 ") and source.negotiated.endswith(" 16 fps")
