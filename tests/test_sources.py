"""Sources: files, in-memory frames, sampling clock, bad input."""

from __future__ import annotations

import threading
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgecap import sources
from edgecap.errors import SourceError
from edgecap.sources import ArraySource, Frame, open_source, sample


def _write_video(path: Path, n: int, fps: float, size: int = 32) -> None:
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (size, size))
    for i in range(n):
        w.write(np.full((size, size, 3), (i * 7) % 255, np.uint8))
    w.release()


def _frames(n: int, fps: float) -> list:
    return [Frame(i, i / fps, np.zeros((2, 2, 3), np.uint8)) for i in range(n)]


@pytest.mark.parametrize("src_fps,sample_fps,n,expected", [
    (16, 8, 32, list(range(0, 32, 2))),
    (8, 8, 16, list(range(16))),
    (8, 16, 16, list(range(16))),  # cannot sample faster than the source
    (16, 0, 32, list(range(32))),
])
def test_sampling_clock(src_fps: float, sample_fps: float, n: int, expected: list) -> None:
    assert [f.index for f in sample(_frames(n, src_fps), sample_fps)] == expected


def test_sampling_clock_uneven_rates() -> None:
    kept = [f.index for f in sample(_frames(60, 30.0), 8.0)]
    assert len(kept) == 16  # 8 a second over 2 s
    assert set(np.diff(kept)) <= {3, 4}


def test_video_file_frames_and_timestamps(tmp_path: Path) -> None:
    clip = tmp_path / "c.mp4"
    _write_video(clip, 20, 10.0)
    with open_source(str(clip)) as src:
        frames = list(src)
    assert [f.index for f in frames] == list(range(20))
    assert frames[10].timestamp == pytest.approx(1.0)
    assert frames[0].image.shape == (32, 32, 3) and frames[0].image.dtype == np.uint8


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such video file"):
        open_source(str(tmp_path / "missing.mp4"))


def test_not_a_video(tmp_path: Path) -> None:
    bad = tmp_path / "notes.mp4"
    bad.write_text("this is text")
    with pytest.raises(SourceError, match="not a video"):
        open_source(bad)


def test_missing_camera() -> None:
    with pytest.raises(SourceError, match="no such device"):
        open_source("/dev/video97")


def test_array_source_checks_frames() -> None:
    src = ArraySource([np.zeros((4, 4, 3), np.uint8), np.zeros((4, 4, 2), np.uint8)], fps=8)
    with pytest.raises(SourceError, match="frame 1"):
        list(src)


def test_array_shape_checked() -> None:
    with pytest.raises(SourceError, match=r"\[T,H,W,C\]"):
        open_source(np.zeros((4, 4, 3), np.uint8))


class _FakeCamera:
    """Stands in for cv2.VideoCapture: ``frames`` images, then ``fail`` (an exception or a hang)."""

    def __init__(self, frames: int, fail: str) -> None:
        self.frames, self.fail = frames, fail
        self.unblock = threading.Event()
        self.reading = threading.Event()
        self.released = threading.Event()

    def __call__(self, device):
        return self

    def isOpened(self) -> bool:
        return True

    def read(self):
        if self.frames:
            self.frames -= 1
            return True, np.zeros((2, 2, 3), np.uint8)
        if self.fail == "error":
            raise cv2.error("OpenCV(4.x) videoio: VIDIOC_DQBUF: No such device")
        self.reading.set()
        self.unblock.wait()
        return False, None

    def release(self) -> None:
        assert not self.reading.is_set() or self.unblock.is_set(), "released under a blocked read"
        self.released.set()


def _in_thread(fn, timeout: float = 5.0) -> list:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "hung"
    return result


def test_camera_read_error_ends_the_stream_with_a_source_error(monkeypatch) -> None:
    camera = _FakeCamera(3, "error")
    monkeypatch.setattr(sources.cv2, "VideoCapture", camera)
    src = open_source(0)

    def drain():
        with pytest.raises(SourceError, match="camera 0: read failed .*No such device.*plugged in"):
            list(src)
        return True

    assert _in_thread(drain) == [True]
    assert camera.released.wait(1.0)
    src.close()


def test_camera_close_does_not_wait_on_a_hung_read(monkeypatch) -> None:
    camera = _FakeCamera(0, "hang")
    monkeypatch.setattr(sources.cv2, "VideoCapture", camera)
    monkeypatch.setattr(sources.CameraSource, "CLOSE_TIMEOUT_S", 0.1)
    src = open_source(0)
    assert camera.reading.wait(1.0)
    _in_thread(src.close, timeout=2.0)
    assert not camera.released.is_set()
    camera.unblock.set()  # the read returns: the reader thread releases the camera
    assert camera.released.wait(1.0)


def test_a_video_file_named_like_a_number_is_that_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write_video(tmp_path / "clip.mp4", 6, 10.0)
    (tmp_path / "clip.mp4").rename(tmp_path / "2024")
    for source in ("2024", Path("2024")):
        with open_source(source) as src:
            assert not src.live and src.name == "2024"
            assert [f.index for f in src] == list(range(6))


def test_a_number_with_no_such_file_is_a_camera_index(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    opened = []

    class _NoCamera:
        def __init__(self, device):
            opened.append(device)

        def isOpened(self) -> bool:
            return False

        def release(self) -> None:
            pass

    monkeypatch.setattr(sources.cv2, "VideoCapture", _NoCamera)
    with pytest.raises(SourceError, match="camera 2024: cannot be opened"):
        open_source("2024")
    assert opened == [2024]


def test_sampling_restarts_its_clock_after_a_stall() -> None:
    # 1 s at 32 fps, nothing for 2 s (a stalled camera), then 1 s more.
    stamps = [i / 32 for i in range(32)] + [3.0 + i / 32 for i in range(32)]
    frames = [Frame(i, t, np.zeros((2, 2, 3), np.uint8)) for i, t in enumerate(stamps)]
    kept = [f.timestamp for f in sample(frames, 8.0)]
    after = [t for t in kept if t >= 3.0]
    assert after[0] == 3.0  # the first frame after the stall is sampled...
    # ...and the clock restarts there: no burst of the samples the stall "owed".
    assert np.diff(after).min() >= 1 / 8 - 1e-6
    assert len(after) == 8 and len(kept) == 16
