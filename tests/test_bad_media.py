"""Videos that decode partway: the stop is reported (frame, time, frames decoded), OpenCV stays quiet."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import write_noise_clip
from edgecap.errors import SourceError
from edgecap.sources import VideoFileSource

FRAMES = 96


def damage(path: Path, at: float = 0.4, length: int = 4000) -> Path:
    """Zeroes ``length`` bytes ``at`` a fraction into the file: the middle of the stream is lost."""
    data = bytearray(path.read_bytes())
    start = int(len(data) * at)
    data[start:start + length] = bytes(length)
    path.write_bytes(bytes(data))
    return path


def write_damaged_clip(path: Path) -> Path:
    """An mp4 of ``FRAMES`` noise frames whose bytes are zeroed 40% of the way in."""
    return damage(write_noise_clip(path, FRAMES, 64))


def _drain(src: VideoFileSource) -> "tuple[int, str]":
    frames = 0
    with pytest.raises(SourceError) as caught:
        for _ in src:
            frames += 1
    return frames, str(caught.value)


def test_a_clip_damaged_in_the_middle_says_where_it_stopped(tmp_path: Path) -> None:
    src = VideoFileSource(write_damaged_clip(tmp_path / "clip.mp4"))
    frames, message = _drain(src)
    assert 0 < frames < FRAMES
    assert f"damaged at frame {frames} ({frames / src.fps:.2f} s)" in message
    assert f"after {frames} frames of {FRAMES}" in message and "clip.mp4" in message


def test_a_clip_that_ends_before_the_frames_it_lists(tmp_path: Path) -> None:
    # Motion-JPEG in AVI: the demuxer skips the damaged frame and the stream ends one short.
    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 8, (64, 48))
    rng = np.random.default_rng(0)
    for _ in range(48):
        writer.write(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    writer.release()
    src = VideoFileSource(damage(path, at=1 / 3))
    frames, message = _drain(src)
    assert frames < 48 and f"ended at frame {frames}" in message and "lists 48 frames" in message


def test_an_intact_clip_ends_without_an_error(tmp_path: Path) -> None:
    src = VideoFileSource(write_noise_clip(tmp_path / "clip.mp4", FRAMES, 64))
    assert sum(1 for _ in src) == FRAMES == src.frame_count


def _cli(args: list, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENCV_")}
    return subprocess.run([sys.executable, "-m", "edgecap.cli", *args], capture_output=True,
                          text=True, env={**clean, **env}, timeout=120)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_damaged_clip(tmp_path_factory.mktemp("media") / "damaged.mp4")


def test_cli_keeps_the_captions_before_the_damage_and_prints_one_line(damaged: Path,
                                                                      shipped_bundle: Path) -> None:
    # A fresh process: FFmpeg's log level is fixed when OpenCV first opens a video.
    run = _cli(["caption", str(damaged), "--bundle", str(shipped_bundle)])
    assert run.returncode == 2
    assert re.fullmatch(r"edgecap: error: \S+damaged\.mp4: damaged at frame \d+ \([\d.]+ s\)"
                        r"[^\n]*\n", run.stderr), run.stderr
    assert re.search(r"^\[ *0\.00s - ", run.stdout, re.M), run.stdout  # the first window stands
    assert "FFMPEG" not in run.stdout and " @ 0x" not in run.stdout


def test_ffmpegs_own_lines_come_through_when_asked_for(damaged: Path, shipped_bundle: Path) -> None:
    run = _cli(["caption", str(damaged), "--bundle", str(shipped_bundle)],
               OPENCV_FFMPEG_LOGLEVEL="16")  # AV_LOG_ERROR
    assert run.returncode == 2 and run.stderr.startswith("edgecap: error: ")
    # OpenCV prints FFmpeg's messages on stdout once the level is set.
    assert "[OPENCV:FFMPEG:16] " in run.stdout
