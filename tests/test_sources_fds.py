"""A video file that cannot be opened for want of file descriptors says so, not "not a video"."""

from __future__ import annotations

import os
import resource

import pytest

from edgecap.bundle import DEMO_DIR
from edgecap.errors import SourceError
from edgecap.sources import VideoFileSource

pytestmark = pytest.mark.fast


def test_out_of_descriptors_is_reported_as_such() -> None:
    clip = DEMO_DIR / "sample.mp4"
    VideoFileSource(clip).close()  # it opens when descriptors are free
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
        with pytest.raises(OSError):
            while True:  # what a crowd of clients did to the service before its connection cap
                held.append(os.open(os.devnull, os.O_RDONLY))
        with pytest.raises(SourceError) as e:
            VideoFileSource(clip)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    message = str(e.value)
    assert message.startswith(f"{clip}: cannot open: Too many open files (EMFILE); ")
    assert "LimitNOFILE" in message and "decode" not in message and "\n" not in message
