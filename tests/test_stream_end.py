"""A camera or stream that stops: `edgecap camera` says so and exits 1, or reconnects; no password shown (issue 28)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, List

import cv2
import numpy as np
import pytest

from edgecap import sources
from edgecap.cli import main
from edgecap.errors import SourceError
from edgecap.sources import Frame, FrameSource, ReconnectingSource, open_source, redact

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "models" / "demo" / "sample.mp4"


class Mjpeg:
    """An MJPEG stream over HTTP (the sample clip) that plays ``play_s`` seconds, then stalls, connection open."""

    def __init__(self, play_s: float) -> None:
        cap = cv2.VideoCapture(str(SAMPLE))
        jpegs: List[bytes] = []
        while True:
            ok, image = cap.read()
            if not ok:
                break
            jpegs.append(cv2.imencode(".jpg", image)[1].tobytes())
        cap.release()
        self.stop = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(handler) -> None:
                handler.send_response(200)
                handler.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
                handler.end_headers()
                t0, i = time.monotonic(), 0
                with contextlib.suppress(OSError):
                    while time.monotonic() - t0 < play_s:
                        jpeg = jpegs[i % len(jpegs)]
                        i += 1
                        handler.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n"
                                            % len(jpeg) + jpeg + b"\r\n")
                        time.sleep(1 / 16)
                    self.stop.wait(30)  # stalls: no byte more

            def log_message(handler, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/live.mjpg"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stalling() -> Iterator[Mjpeg]:
    stream = Mjpeg(play_s=3.0)
    yield stream
    stream.close()


def test_the_camera_command_says_why_a_stream_ended_and_exits_1(stalling, monkeypatch, capfd) -> None:
    # Before: `edgecap camera URL` ended with exit 0 and no word when the stream stalled or died.
    monkeypatch.setattr(sources, "STREAM_TIMEOUT_MS", 2000)
    assert main(["camera", stalling.url]) == 1
    err = [line for line in capfd.readouterr().err.splitlines() if not line.startswith("BUNDLE")]
    assert len(err) == 1, err
    assert err[0] == (f"edgecap: error: {stalling.url}: the stream ended (no frame within 2 s, or the server "
                      "closed it); start it again, or pass --reconnect to wait for it")


class Scripted(FrameSource):
    live = True

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.ended = ""
        self.closed = False

    def __iter__(self) -> Iterator[Frame]:
        for i in range(self.n):
            yield Frame(i, i * 0.1, np.zeros((2, 2, 3), np.uint8))
        self.ended = "the stream ended"

    def close(self) -> None:
        self.closed = True


def test_a_reconnecting_source_opens_again_with_backoff_and_numbers_frames_across(caplog) -> None:
    outcomes: List = [Scripted(3), SourceError("http://cam/x: cannot open the stream"), Scripted(2), Scripted(0)]
    opened: List[float] = []

    def opener(device):
        opened.append(time.monotonic())
        outcome = outcomes.pop(0) if outcomes else Scripted(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    src = ReconnectingSource("http://cam/x", backoff=(0.05, 0.2), opener=opener)
    frames = []
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        for frame in src:
            frames.append(frame)
            if len(frames) == 5:
                src.close()
    assert [f.index for f in frames] == [0, 1, 2, 3, 4]
    assert all(b.timestamp >= a.timestamp for a, b in zip(frames, frames[1:]))
    said = [r.getMessage() for r in caplog.records]
    assert said[:2] == ["http://cam/x: the stream ended; trying again in 0.05 s",
                        "http://cam/x: cannot open the stream; trying again in 0.1 s"]
    assert opened[2] - opened[1] >= 0.09  # the second failure in a row waits twice as long
    assert src.reconnects == 2


def test_a_reconnecting_source_ends_when_closed_during_its_wait() -> None:
    src = ReconnectingSource("http://cam/x", backoff=(10.0, 10.0),
                             opener=lambda device: (_ for _ in ()).throw(SourceError("down")))
    threading.Timer(0.2, src.close).start()
    t0 = time.monotonic()
    assert list(src) == []
    assert time.monotonic() - t0 < 2.0


def test_the_camera_command_reconnects_when_asked(stalling, monkeypatch, caplog) -> None:
    monkeypatch.setattr(sources, "STREAM_TIMEOUT_MS", 1500)
    opened = []
    real = sources.CameraSource

    def counting(device):
        opened.append(device)
        if len(opened) == 2:  # the second connection: stop the command (as Ctrl-C would) once it opened
            threading.Timer(1.0, lambda: __import__("_thread").interrupt_main()).start()
        return real(device)

    monkeypatch.setattr(sources, "CameraSource", counting)
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        assert main(["camera", "--reconnect", stalling.url]) == 130
    assert len(opened) == 2
    said = [r.getMessage() for r in caplog.records]
    assert any("the stream ended" in m and "trying again in 1 s" in m for m in said), said


@pytest.mark.parametrize("url, shown", [
    ("rtsp://viewer:hunter2@cam.lan/live", "rtsp://viewer:***@cam.lan/live"),
    ("rtsp://viewer:p@ss:w@rd@cam.lan:554/live", "rtsp://viewer:***@cam.lan:554/live"),
    ("http://cam.lan/snap.mjpg?user=a&password=hunter2&x=1", "http://cam.lan/snap.mjpg?user=a&password=***&x=1"),
    ("https://cam.lan/live?token=hunter2", "https://cam.lan/live?token=***"),
    ("rtsp://cam.lan/live", "rtsp://cam.lan/live"),
    ("/dev/video0", "/dev/video0"),
])
def test_redact_hides_every_secret_of_a_url(url, shown) -> None:
    # Before: a password holding "@" showed its tail, and query secrets showed whole.
    assert redact(url) == shown


def test_a_config_error_for_a_stream_url_hides_its_password(tmp_path) -> None:
    # Before: "cameras[0].source: 'rtsp://viewer:hunter2@...' is a network stream ..." showed it.
    from edgecap.errors import ConfigError
    from edgecap.service.config import load_config

    path = tmp_path / "edgecap.toml"
    path.write_text('[[cameras]]\nname = "front"\nsource = "rtsp://viewer:hunter2@cam.lan/live"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "hunter2" not in str(info.value) and "rtsp://viewer:***@cam.lan/live" in str(info.value)


def test_a_camera_feed_says_opening_without_the_password() -> None:
    from edgecap.service.cameras import CameraFeed, CameraSpec

    states = []
    release = threading.Event()

    def hangs(spec):
        release.wait(5)
        raise SourceError("gone")

    feed = CameraFeed(CameraSpec(name="front", source="rtsp://viewer:hunter2@cam.lan/live", stall_seconds=0.2),
                      on_state=lambda camera, status, reason: states.append(reason), opener=hangs)
    feed.start()
    time.sleep(0.1)
    release.set()
    feed.stop()
    assert states[0] == "opening rtsp://viewer:***@cam.lan/live"
    assert not any("hunter2" in s for s in states)


def test_an_open_stream_source_is_a_live_camera_source(stalling, monkeypatch) -> None:
    monkeypatch.setattr(sources, "STREAM_TIMEOUT_MS", 2000)
    src = open_source(stalling.url)
    try:
        assert src.live and src.ended == ""
        assert sum(1 for _ in src) > 0
        assert src.ended.startswith("the stream ended")
    finally:
        src.close()
