"""Which camera sources stop `edgecap serve` at start and which it waits for.

A file camera that is missing or not a video is a config error: one line naming
the file, the line and the key, exit 2 (which the unit does not restart). A
device camera (/dev/videoN, a udev link under /dev, an index) may be unplugged
at start and plugged in later: the service starts and retries it
(tests/test_serve.py::test_a_missing_camera_keeps_the_service_up_and_unhealthy).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from edgecap.errors import ConfigError
from edgecap.service.cameras import is_device_source
from edgecap.service.config import load_config

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "models" / "demo" / "sample.mp4"


def config_with(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "edgecap.toml"
    path.write_text(f'log_level = "info"\n\n[[cameras]]\nname = "front"\nsource = "{source}"\n')
    return path


def refusal(tmp_path: Path, source: str) -> str:
    path = config_with(tmp_path, source)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:5: cameras[0].source: "), message
    return message


def test_a_missing_file_is_a_config_error(tmp_path):
    message = refusal(tmp_path, "clip.mp4")
    assert f"{tmp_path / 'clip.mp4'}: no such video file" in message


def test_a_file_that_is_not_a_video_is_a_config_error(tmp_path):
    (tmp_path / "notes.mp4").write_text("not a video\n")
    assert "not a video OpenCV can decode" in refusal(tmp_path, "notes.mp4")


def test_a_directory_is_a_config_error(tmp_path):
    (tmp_path / "clips").mkdir()
    assert "not a file" in refusal(tmp_path, "clips")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_opening_it(tmp_path):
    os.mkfifo(tmp_path / "pipe.mp4")
    started = time.monotonic()
    assert "not a file" in refusal(tmp_path, "pipe.mp4")
    assert time.monotonic() - started < 10  # opening it would block until a writer came


def test_a_video_file_is_accepted(tmp_path):
    shutil.copy(SAMPLE, tmp_path / "clip.mp4")
    config = load_config(config_with(tmp_path, "clip.mp4"))
    assert config.cameras[0].source == str(tmp_path / "clip.mp4")


@pytest.mark.parametrize("source", ["/dev/video97", "/dev/v4l/by-id/usb-cam-video-index0", "7"])
def test_an_absent_device_camera_is_accepted(tmp_path, source):
    # Plugged in later (udev, hotplug): the service starts and waits for it.
    assert not os.path.exists(source)
    assert load_config(config_with(tmp_path, source)).cameras[0].source == source


def test_what_counts_as_a_device(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_device_source("/dev/video0") and is_device_source("0")
    assert is_device_source("/dev/v4l/by-path/platform-xhci-usb-0:1:1.0-video-index0")
    assert not is_device_source("clip.mp4") and not is_device_source(str(tmp_path))
    # A network stream may be down when the service starts, as a camera may be unplugged.
    assert is_device_source("rtsp://cam.local/live") and is_device_source("http://10.0.0.2/video.mjpg")
    (tmp_path / "2024").write_bytes(b"")
    assert not is_device_source("2024")  # a file named like an index is that file
