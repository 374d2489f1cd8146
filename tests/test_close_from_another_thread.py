"""EdgeCaptioner.close() from another thread ends a stream() at once, whatever its source does (issue 28)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from edgecap.captioner import EdgeCaptioner
from edgecap.errors import RunCancelled
from edgecap.options import CaptionerOptions


@pytest.mark.parametrize("pipelined", [False, True], ids=["sequential", "pipelined"])
def test_close_ends_a_stream_whose_generator_blocks(shipped_bundle, pipelined) -> None:
    # Before: the sequential schedule read the caller's generator on the consumer's own thread,
    # so the stream waited for it (30 s here); the pipelined one raised "ValueError: generator
    # already executing" as it closed the generator the feeder thread was inside.
    release = threading.Event()
    seen = []

    def frames():
        for _ in range(20):
            yield np.zeros((48, 64, 3), np.uint8)
        release.wait(30)  # the caller's source blocks
        seen.append("resumed")
        yield np.zeros((48, 64, 3), np.uint8)

    cap = EdgeCaptioner(shipped_bundle, CaptionerOptions(pipelined=pipelined))
    timer = threading.Timer(0.5, cap.close)
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(RunCancelled, match="stopped by close"):
            for _ in cap.stream(frames(), fps=8):
                pass
        assert time.monotonic() - t0 < 3.0
    finally:
        release.set()
        timer.join()
    deadline = time.monotonic() + 5
    while any(t.name == "edgecap-frames" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "edgecap-frames" for t in threading.enumerate())  # it went when the read returned


def test_a_generator_that_raises_still_raises_in_the_callers_thread(shipped_bundle) -> None:
    def frames():
        yield np.zeros((48, 64, 3), np.uint8)
        raise OSError("the caller's camera broke")

    with EdgeCaptioner(shipped_bundle) as cap:
        with pytest.raises(OSError, match="the caller's camera broke"):
            list(cap.stream(frames(), fps=8))


def test_a_generator_is_read_to_its_end_and_closed(shipped_bundle) -> None:
    closed = []

    def frames():
        try:
            for _ in range(24):
                yield np.zeros((48, 64, 3), np.uint8)
        finally:
            closed.append(True)

    with EdgeCaptioner(shipped_bundle) as cap:
        captions = list(cap.stream(frames(), fps=8))
        expected = list(cap.stream(np.zeros((24, 48, 64, 3), np.uint8), fps=8))
    assert [c.text for c in captions] == [c.text for c in expected] and captions
    assert closed == [True]
