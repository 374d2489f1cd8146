"""Frames of the Python API in other forms: converted as documented, or one SourceError."""

from __future__ import annotations


import cv2
import numpy as np
import pytest

from conftest import Story
from edgecap.captioner import EdgeCaptioner
from edgecap.errors import SourceError
from edgecap.sources import Frame


def _texts(cap: EdgeCaptioner, frames) -> list:
    return [c.text for c in cap.caption_frames(frames)]


def test_bgra_frames_lose_their_alpha(captioner: EdgeCaptioner, story: Story) -> None:
    alpha = np.full(story.frames.shape[:3] + (1,), 7, np.uint8)
    assert _texts(captioner, np.concatenate([story.frames, alpha], axis=3)) == story.truths


@pytest.mark.parametrize("layout", ["HxW", "HxWx1"])
def test_gray_frames_are_taken_as_gray_bgr(captioner: EdgeCaptioner, story: Story,
                                           layout: str) -> None:
    gray = [cv2.cvtColor(f, cv2.COLOR_BGR2GRAY) for f in story.frames]
    as_bgr = [cv2.cvtColor(g, cv2.COLOR_GRAY2BGR) for g in gray]
    given = gray if layout == "HxW" else [g[..., None] for g in gray]
    assert _texts(captioner, given) == _texts(captioner, as_bgr)


def test_any_size_is_resized_to_the_model_input(captioner: EdgeCaptioner, story: Story) -> None:
    # The sample's shapes drawn on a 3x canvas: the captions do not depend on the frame size.
    big = [cv2.resize(f, None, fx=3, fy=3, interpolation=cv2.INTER_NEAREST) for f in story.frames]
    assert _texts(captioner, big) == story.truths


@pytest.mark.parametrize("frame, says", [
    (np.zeros((48, 64, 3), np.float32), "uint8 pixels .* got float32: .*np.clip"),
    (np.zeros((48, 64, 3), np.uint16), "uint8 pixels .* got uint16: .*>> 8"),
    (np.zeros((48, 64, 2), np.uint8), r"got shape \(48, 64, 2\)"),
    (np.zeros((0, 64, 3), np.uint8), r"got shape \(0, 64, 3\)"),
    (None, r"got shape \(\)"),
], ids=["float32", "uint16", "2 channels", "empty", "None"])
def test_other_frames_are_one_source_error_naming_the_frame(captioner: EdgeCaptioner,
                                                            story: Story, frame, says: str) -> None:
    n = captioner.window.frames
    frames = list(story.frames[:n]) + [frame]
    stream = captioner.stream(frames, fps=0)
    assert next(stream).text == story.truths[0]  # the window before the bad frame stands
    with pytest.raises(SourceError, match=f"^frame {n}: expected .*{says}"):
        next(stream)


def test_a_bad_frames_array_is_refused_before_the_run(captioner: EdgeCaptioner,
                                                      story: Story) -> None:
    with pytest.raises(SourceError, match=r"frames array: .*got float64"):
        captioner.stream(story.frames.astype(np.float64), fps=0).__next__()
    with pytest.raises(SourceError, match=r"\[T,H,W,C\].*one frame\? pass \[frame\]"):
        captioner.caption_frames(story.frames[0])
    assert _texts(captioner, story.frames) == story.truths


def test_run_frames_refuses_a_bad_frame_with_a_source_error(captioner: EdgeCaptioner,
                                                           story: Story) -> None:
    good = [("cam", Frame(i, i / 8, f)) for i, f in enumerate(story.frames[:3])]
    bad = ("cam", Frame(3, 3 / 8, story.frames[3].astype(np.float32)))
    with pytest.raises(SourceError, match="frame: expected uint8 pixels"):
        list(captioner.run_frames(good + [bad], live=False))
