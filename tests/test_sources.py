"""Sources: files, in-memory frames, sampling clock, bad input."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

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
    src = ArraySource([np.zeros((4, 4), np.uint8)], fps=8)
    with pytest.raises(SourceError, match="frame 0"):
        list(src)


def test_array_shape_checked() -> None:
    with pytest.raises(SourceError, match=r"\[T,H,W,3\]"):
        open_source(np.zeros((4, 4, 3), np.uint8))
