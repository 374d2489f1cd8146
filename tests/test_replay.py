"""The replay window: after a failover in file mode, every window not yet captioned runs again, whole.

A file source loses nothing on a failover: the new pipeline starts again at
the first frame of the earliest window that has not come out, and opens that
window and the ones after it. An off-by-one there either loses a window or
feeds one a frame short, and every later caption changes. Here: the resume
point against a brute-force count of what came out, then failovers struck at
every frame of a window on the sequential schedule (where the frames that
came out before the failure are exactly the fault's invoke number).
"""

from __future__ import annotations

from typing import List, Tuple

import pytest

from edgecap import faults
from edgecap.bundle import WindowSpec
from edgecap.captioner import EdgeCaptioner
# The one import of the private resume point.
from edgecap.supervisor import _resume_point
from tests.pipeline_boards import pipeline_board


def _expected(consumed: int, frames: int, stride: int, live: bool) -> Tuple[int, int, int]:
    """The resume point by counting windows: ``(next sample, first window to open, windows lost)``."""
    captioned = 0  # window n is captioned once its last sample, n * stride + frames - 1, came out
    while captioned * stride + frames - 1 < consumed:
        captioned += 1
    earliest = captioned  # windows are captioned in order: the first one still open
    if not live:
        # Replay from the first sample of that window (or the next sample, if it starts later).
        return min(earliest * stride, consumed), earliest, 0
    first = 0  # live: go on with the next sample; only windows that start there or later are whole
    while first * stride < consumed:
        first += 1
    return consumed, first, first - earliest


@pytest.mark.parametrize("frames, stride", [(8, 8), (8, 4), (8, 3), (5, 1), (4, 6), (1, 1)])
@pytest.mark.parametrize("live", [False, True])
def test_the_resume_point_is_the_earliest_window_not_yet_captioned(frames, stride, live):
    spec = WindowSpec(frames=frames, stride=stride, sample_fps=8.0)
    for consumed in range(0, 4 * (frames + stride) + 1):
        assert tuple(_resume_point(consumed, spec, live)) == _expected(consumed, frames, stride, live), consumed


def _captions(shipped_bundle, clip, fault: str = "", **window) -> Tuple[List[Tuple[int, str]], list]:
    with EdgeCaptioner(shipped_bundle, board=pipeline_board("devboard-usb"), num_threads=1, pipelined=False, **window) as cap:
        assert "emu-tpu:0" in cap.devices.values()
        faults.inject(fault)
        try:
            captions = [(c.window, c.text) for c in cap.caption_frames(clip)]
        finally:
            faults.inject("")
        return captions, list(cap.stats().failovers)


@pytest.fixture(scope="module")
def reference(shipped_bundle, story):
    captions, failovers = _captions(shipped_bundle, story.frames)
    assert failovers == [] and [n for n, _ in captions] == list(range(len(story.truths)))
    return captions


@pytest.mark.parametrize("at", range(8, 16))  # every frame of the demo's second window (8 frames a window)
def test_a_failover_at_any_frame_of_a_window_keeps_every_caption(shipped_bundle, story, reference, at):
    captions, failovers = _captions(shipped_bundle, story.frames, f"emu-tpu:0=fail@{at}")
    (record,) = failovers
    assert (record.device, record.kind) == ("emu-tpu:0", "error")
    # The frames of the window that was open are run again: at - 8 of them came out already.
    assert record.replayed == at - 8 + 1
    assert captions == reference


@pytest.mark.parametrize("at", [12])
def test_overlapping_windows_survive_a_failover_too(shipped_bundle, story, at):
    window = {"frames": 8, "stride": 4}
    reference, _ = _captions(shipped_bundle, story.frames, **window)
    assert [n for n, _ in reference] == list(range(len(story.frames) // 4 - 1))
    captions, failovers = _captions(shipped_bundle, story.frames, f"emu-tpu:0=fail@{at}", **window)
    assert len(failovers) == 1
    assert captions == reference

