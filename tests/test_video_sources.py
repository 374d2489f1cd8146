"""Videos as they come from phones, the web and cut-off recorders; cameras by index and by URL.

The fixtures in tests/data/video were made from the demo's sample clip by
tools/make_video_fixtures.py (ffmpeg 5.1); each is what its name says.
"""

from __future__ import annotations

import functools
import http.server
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Iterator, List

import cv2
import numpy as np
import pytest

from edgecap import sources
from edgecap.cli import main
from edgecap.containers import damage
from edgecap.errors import SourceError
from edgecap.sources import MAX_FRAME_SIDE, VideoFileSource, open_source, sample

VIDEO = Path(__file__).parent / "data" / "video"


def _frames(name: str) -> List[sources.Frame]:
    with VideoFileSource(VIDEO / name) as src:
        return list(src)


def test_a_variable_rate_clip_is_timed_by_each_frames_own_timestamp(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        frames = _frames("vfr.mp4")
    times = [f.timestamp for f in frames]
    assert len(frames) == 48
    # 24 frames at 8 fps, then 24 at 32 fps from 3.0 s: not 48 frames at one nominal rate.
    assert times[:24] == pytest.approx([i / 8 for i in range(24)], abs=2e-3)
    assert times[24:] == pytest.approx([3 + i / 32 for i in range(24)], abs=2e-3)
    warned = [r.getMessage() for r in caplog.records if "variable frame rate" in r.getMessage()]
    assert len(warned) == 1 and "vfr.mp4" in warned[0]


def test_a_variable_rate_clip_is_sampled_evenly_in_time() -> None:
    kept = [f.timestamp for f in sample(iter(_frames("vfr.mp4")), 8.0)]
    steps = np.diff(kept)
    assert steps == pytest.approx(np.full(len(steps), 0.125), abs=0.02)


def test_a_steady_clip_warns_of_nothing(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        frames = _frames("moov_at_end.mp4")
    assert [f.timestamp for f in frames] == pytest.approx([i / 16 for i in range(48)], abs=1e-6)
    assert not caplog.records


def test_a_high_speed_clip_keeps_its_rate() -> None:
    with VideoFileSource(VIDEO / "fast1200.mp4") as src:
        assert src.fps == pytest.approx(1200)
        frames = list(src)
    assert frames[-1].timestamp == pytest.approx(47 / 1200, abs=1e-3)


@pytest.mark.parametrize("name, where", [
    ("cut.avi", "its RIFF chunk runs to byte"),
    ("piped_cut.avi", "inside a 00dc chunk"),
])
def test_a_cut_off_avi_gives_its_frames_then_one_line(name: str, where: str) -> None:
    got = 0
    with VideoFileSource(VIDEO / name) as src, pytest.raises(SourceError) as caught:
        for _ in src:
            got += 1
    message = str(caught.value)
    assert 20 < got < 48
    assert name in message and where in message and "the recording ends at frame" in message
    assert "\n" not in message


def test_an_avi_written_to_a_pipe_is_whole_and_not_called_truncated(caplog) -> None:
    # Its header says 2**30 frames and it has no index: the old check called it truncated.
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        frames = _frames("piped.avi")
    assert len(frames) == 48
    assert any("has no index" in r.getMessage() for r in caplog.records)


def test_an_mp4_that_lost_its_index_is_one_line_at_open() -> None:
    with pytest.raises(SourceError, match=r"moov_lost\.mp4: cut off at byte \d+ inside its mdat box"):
        VideoFileSource(VIDEO / "moov_lost.mp4")


@pytest.mark.parametrize("name", ["moov_at_end.mp4", "whole.avi", "vfr.mp4", "hd720.mp4"])
def test_whole_files_have_no_damage(name: str) -> None:
    assert damage(VIDEO / name) is None


def test_rotation_metadata_turns_the_frames_upright() -> None:
    frames = _frames("rotated.mp4")
    assert frames[0].image.shape == (160, 96, 3)  # stored 160x96, shown portrait


@pytest.mark.parametrize("name, shape", [("hd720.mp4", (720, 1280, 3)), ("hd1080.mp4", (1080, 1920, 3))])
def test_hd_frames_pass_at_their_size(name: str, shape) -> None:
    assert {f.image.shape for f in _frames(name)} == {shape}


def test_frames_past_the_largest_side_are_scaled_down_as_read(tmp_path: Path) -> None:
    path = tmp_path / "big.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 8, (2560, 1440))
    for i in range(3):
        writer.write(np.full((1440, 2560, 3), 40 * i, np.uint8))
    writer.release()
    frames = _frames(str(path))
    assert {f.image.shape for f in frames} == {(1080, MAX_FRAME_SIDE, 3)}
    assert [int(f.image.mean()) for f in frames] == pytest.approx([0, 40, 80], abs=2)


@pytest.mark.parametrize("index", [-1, -2, 10_000, 2**40])
def test_camera_indices_opencv_must_not_see_are_refused_first(index: int, monkeypatch) -> None:
    def no_opencv(*args, **kwargs):
        raise AssertionError("OpenCV was asked to open the camera")

    monkeypatch.setattr(sources.cv2, "VideoCapture", no_opencv)
    with pytest.raises(SourceError, match=r"not a camera index \(0 to 9999\)"):
        open_source(index)
    with pytest.raises(SourceError, match="not a camera index"):
        open_source(str(index))


def test_the_camera_command_refuses_minus_one_in_one_line(capfd) -> None:
    assert main(["camera", "-1"]) == 2
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("edgecap: error: camera -1: not a camera index")


def test_a_stream_url_is_opened_as_a_url_and_its_password_never_shown() -> None:
    # Port 9 (discard) refuses at once: the URL reaches FFmpeg whole, not folded as a path.
    with pytest.raises(SourceError) as caught:
        open_source("rtsp://viewer:hunter2@127.0.0.1:9/live")
    message = str(caught.value)
    assert message.startswith("rtsp://viewer:***@127.0.0.1:9/live: cannot open the stream")
    assert "hunter2" not in message


@pytest.fixture
def http_clip() -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(VIDEO))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/moov_at_end.mp4"
    server.shutdown()
    server.server_close()


def test_an_http_stream_is_read_as_a_live_source(http_clip: str) -> None:
    src = open_source(http_clip)
    try:
        assert src.live and src.name == http_clip
        first = next(iter(src))
        assert first.image.shape == (128, 128, 3)
    finally:
        src.close()


class _Interrupted(Exception):
    pass


def test_a_signal_stops_a_stream_open_that_blocks_inside_opencv(monkeypatch) -> None:
    # A stream that accepts the connection and never answers holds OpenCV's open for
    # its whole timeout; no Python signal handler runs inside it, so edgecap waits elsewhere.
    release = threading.Event()

    def blocking_open(*args, **kwargs):
        # Blocks as OpenCV's C code does: no signal reaches the thread it blocks.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            release.wait(3.0)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
        raise AssertionError("the open was not abandoned")

    def on_alarm(signum, frame):
        raise _Interrupted()

    monkeypatch.setattr(sources.cv2, "VideoCapture", blocking_open)
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    t0 = time.monotonic()
    try:
        with pytest.raises(_Interrupted):
            open_source("rtsp://127.0.0.1:9/live")
        assert time.monotonic() - t0 < 2.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        release.set()
