"""Each window's RNN state is its own: real clips with different ground truth, one stream.

A window that starts from another window's state (the previous one, or one
still open when it starts) captions something else than the same frames alone,
and, where windows line up with clips, something else than the ground truth.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

from conftest import Story
from edgecap.captioner import EdgeCaptioner


@pytest.fixture(scope="module")
def alone(shipped_bundle: Path, story: Story):
    """Captions one window's frames in a stream of their own, on a fresh captioner each time."""
    n = story.per_window

    def caption(start: int) -> List[int]:
        with EdgeCaptioner(shipped_bundle, pipelined=False, num_threads=1, frames=n, stride=n) as cap:
            (only,) = cap.caption_frames(story.frames[start:start + n])
        return only.tokens

    return caption


@pytest.mark.parametrize("pipelined", [True, False])
def test_back_to_back_windows_caption_their_own_clip(shipped_bundle: Path, story: Story, pipelined: bool):
    with EdgeCaptioner(shipped_bundle, pipelined=pipelined, num_threads=1) as cap:
        assert cap.window.frames == story.per_window and cap.window.stride == story.per_window
        got = [c.text for c in cap.caption_frames(story.frames)]
    assert got == story.truths
    assert len(set(got)) == len(got)  # neighbours differ, so leaked state would show


@pytest.mark.parametrize("stride", [2, 4])
def test_overlapping_windows_caption_as_if_alone(shipped_bundle: Path, story: Story, alone, stride: int):
    n = story.per_window
    with EdgeCaptioner(shipped_bundle, num_threads=1, frames=n, stride=stride) as cap:
        caps = cap.caption_frames(story.frames)
    assert [c.window for c in caps] == list(range((len(story.frames) - n) // stride + 1))
    for c in caps:
        assert c.start_frame == c.window * stride
        assert c.tokens == alone(c.start_frame), f"window {c.window} (frames {c.start_frame}-{c.end_frame})"
    # Windows that line up with a clip say what the clip shows.
    aligned = [c.text for c in caps if c.start_frame % n == 0]
    assert aligned == story.truths
    # Windows straddling two clips are captioned too, and not all like their neighbours.
    assert len({c.text for c in caps}) > len(story.truths)


def test_a_second_stream_starts_from_no_open_window(shipped_bundle: Path, story: Story):
    n = story.per_window
    half = n // 2
    with EdgeCaptioner(shipped_bundle, num_threads=1, frames=n, stride=half) as cap:
        # The first stream ends with windows still open (a trailing half window).
        first = cap.caption_frames(story.frames[: 2 * n + half])
        second = cap.caption_frames(story.frames[n:])
    assert [c.text for c in first if c.start_frame % n == 0] == story.truths[:2]
    assert [c.text for c in second if c.start_frame % n == 0] == story.truths[1:]
    assert second[0].window == 0 and second[0].start_frame == 0
