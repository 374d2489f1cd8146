"""Frames are preprocessed on a pipeline worker of their own, not on the feeder thread that reads them."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from edgecap.bundle import DEMO_DIR
from edgecap.captioner import EdgeCaptioner
from edgecap.errors import SourceError
from edgecap.preprocess import Preprocessor
from edgecap.sources import VideoFileSource

FRAMES = 24  # three windows of the demo bundle
PAUSE_S = 0.02


@pytest.fixture(scope="module")
def frames():
    with VideoFileSource(DEMO_DIR / "sample.mp4") as src:
        return [f.image for f in src][:FRAMES]


def _slow_source(frames):
    # A decoder that takes PAUSE_S a frame, as a camera-size frame does on a board.
    for frame in frames:
        time.sleep(PAUSE_S)
        yield frame


def test_preprocessing_runs_on_its_worker_and_overlaps_reading(frames, monkeypatch):
    with EdgeCaptioner(DEMO_DIR / "bundle", pipelined=True) as cap:
        expected = [(c.start_frame, c.tokens) for c in cap.caption_frames(frames)]

    threads = []
    preprocess = Preprocessor.__call__

    def slow(self, frame):
        threads.append(threading.current_thread().name)
        time.sleep(PAUSE_S)  # as long as reading a frame: overlapped, the two take half the time
        return preprocess(self, frame)

    monkeypatch.setattr(Preprocessor, "__call__", slow)
    with EdgeCaptioner(DEMO_DIR / "bundle", pipelined=True) as cap:
        t0 = time.perf_counter()
        got = [(c.start_frame, c.tokens) for c in cap.stream(_slow_source(frames), fps=0)]
        took = time.perf_counter() - t0
        stages = {s.name: s.worker for s in cap.stats().stages}
    assert got == expected  # in order, identical
    assert set(threads) == {"edgecap-preprocess"} and len(threads) == FRAMES
    assert stages["preprocess"] == "preprocess"
    # One thread doing both would take 2 * FRAMES * PAUSE_S (0.96 s); overlapped, about half.
    # Generous for a loaded machine: a sleep is no CPU work, so load barely delays it.
    assert took < 1.6 * FRAMES * PAUSE_S, took


def test_the_sequential_path_preprocesses_too(frames):
    with EdgeCaptioner(DEMO_DIR / "bundle", pipelined=False) as cap:
        captions = cap.caption_frames(frames)
    assert len(captions) == FRAMES // cap.window.frames
    assert all(c.stage_ms["preprocess"] > 0 for c in captions)


def test_a_frame_preprocessing_refuses_is_still_a_one_line_source_error(frames):
    bad = list(frames[:4]) + [np.zeros((8, 8, 2), np.uint8)] + list(frames[5:])
    with EdgeCaptioner(DEMO_DIR / "bundle", pipelined=True) as cap:
        with pytest.raises(SourceError, match="expected an image") as err:
            cap.caption_frames(bad)
    assert "\n" not in str(err.value)
