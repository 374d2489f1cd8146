"""CameraSource keeps the newest frame and counts every frame it discards."""

from __future__ import annotations

import threading
from typing import Iterator, List

import numpy as np
import pytest

from edgecap import sources
from edgecap.sources import Frame, open_source


class _GatedCamera:
    """Stands in for cv2.VideoCapture: each read waits for a permit, then returns frame i (all pixels i).

    ``allow(k)`` lets k more frames through; ``wait_idle()`` returns once the
    reader thread is back in ``read`` with no permit, i.e. it has handed every
    frame it read to the source. ``end()`` makes the next read fail (end of stream).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._permits = 0
        self._ended = False
        self._waiting = False
        self.served = 0

    def __call__(self, device):
        self.device = device
        return self

    def isOpened(self) -> bool:
        return True

    def read(self):
        with self._cond:
            self._waiting = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._permits or self._ended)
            self._waiting = False
            if not self._permits:
                return False, None
            self._permits -= 1
            i = self.served
            self.served += 1
        return True, np.full((2, 2, 3), i, np.uint8)

    def release(self) -> None:
        pass

    def allow(self, k: int) -> None:
        with self._cond:
            self._permits += k
            self._cond.notify_all()

    def wait_idle(self, timeout: float = 5.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self._waiting and not self._permits, timeout), "reader stuck"

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()


@pytest.fixture
def camera(monkeypatch) -> Iterator[_GatedCamera]:
    cam = _GatedCamera()
    monkeypatch.setattr(sources.cv2, "VideoCapture", cam)
    yield cam
    cam.end()


def _next(it: Iterator[Frame], timeout: float = 5.0) -> Frame:
    got: List[Frame] = []
    thread = threading.Thread(target=lambda: got.append(next(it)), daemon=True)
    thread.start()
    thread.join(timeout)
    assert got, "no frame"
    return got[0]


def test_a_busy_consumer_gets_the_newest_frame_and_the_rest_count_as_dropped(camera) -> None:
    src = open_source(0)
    assert src.live and camera.device == 0
    it = iter(src)
    camera.allow(5)
    camera.wait_idle()
    newest = _next(it)
    assert newest.index == 4 and int(newest.image[0, 0, 0]) == 4  # not frame 0: no FIFO
    assert src.dropped == 4
    camera.allow(3)
    camera.wait_idle()
    newest = _next(it)
    assert newest.index == 7 and int(newest.image[0, 0, 0]) == 7
    assert src.dropped == 6
    camera.end()  # else close() waits out its timeout on the blocked read
    src.close()


def test_a_consumer_that_keeps_up_gets_every_frame_in_order(camera) -> None:
    src = open_source(0)
    it = iter(src)
    got = []
    for _ in range(6):
        camera.allow(1)
        camera.wait_idle()
        got.append(_next(it).index)
    assert got == list(range(6)) and src.dropped == 0
    camera.allow(1)
    camera.wait_idle()
    camera.end()
    assert [f.index for f in it] == [6]  # the last frame, then the end of the stream
    assert src.dropped == 0
    src.close()


def test_frames_left_unread_at_the_end_are_not_replayed(camera) -> None:
    src = open_source(0)
    camera.allow(4)
    camera.wait_idle()
    camera.end()
    assert [f.index for f in src] == [3]  # only the newest; 0-2 were superseded
    assert src.dropped == 3
    src.close()
