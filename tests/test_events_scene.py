"""Events and unknown scenes: an unknown scene opens no event and, confirmed, closes the one in progress (issue #26)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgecap.captioner import Caption, EdgeCaptioner
from edgecap.events import Event, EventRule, EventTracker

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
SURE = 0.0
X, Y = "a red star grows", "a blue square moves up"
K, U = "known", "unknown"


def _caption(text: str, n: int, scene: Optional[str], confidence: float = SURE) -> Caption:
    return Caption(text=text, tokens=[], window=n, start_frame=16 * n, end_frame=16 * n + 14,
                   start_time=float(n), end_time=n + 0.875, confidence=confidence, scene=scene)


def _feed(tracker: EventTracker, windows: List[tuple]) -> List[list]:
    """Feeds ``(text, scene)`` windows; returns each update's ``[(change, text, windows)]``."""
    return [[(change, e.text, e.windows) for e, change in tracker.update(_caption(text, n, scene))]
            for n, (text, scene) in enumerate(windows)]


def test_an_unknown_scene_opens_no_event():
    tracker = EventTracker("c")
    assert _feed(tracker, [(X, U)] * 4) == [[]] * 4
    assert tracker.current is None and tracker.close() == []


def test_one_unknown_window_is_a_flicker_inside_the_event_and_never_names_it():
    tracker = EventTracker("c")
    out = _feed(tracker, [(X, K), (X, U), (X, K)])
    assert out == [[("opened", X, 1)], [], [("extended", X, 3)]]
    # The same words in an unknown scene are not the event's caption: they never name it or give its picture.
    tracker = EventTracker("c")
    tracker.update(_caption(X, 0, K, -0.5))
    tracker.update(_caption(X, 1, U, 0.0))
    [(event, _)] = tracker.close()
    assert (event.windows, event.confidence, event.end_time) == (2, -0.5, 1.875)


def test_confirmed_unknown_windows_close_the_event_where_its_last_known_window_ended():
    tracker = EventTracker("c")
    out = _feed(tracker, [(X, K), (X, K), (X, U), (Y, U), (Y, U)])
    assert out[2:] == [[], [("closed", X, 2)], []]
    assert tracker.current is None
    # confirm_windows decides how many: three here.
    out = _feed(EventTracker("c", EventRule(confirm_windows=3)), [(X, K), (X, U), (X, U), (X, U)])
    assert out[1:] == [[], [], [("closed", X, 1)]]


def test_an_unknown_window_is_never_confident_enough_to_close_the_event_at_once():
    tracker = EventTracker("c", EventRule(confident=-1.0))
    assert _feed(tracker, [(X, K), (Y, U)]) == [[("opened", X, 1)], []]


def test_after_unknown_scenes_a_caption_opens_an_event_only_once_confirmed_even_a_confident_one():
    tracker = EventTracker("c")
    out = _feed(tracker, [(X, K), (X, U), (X, U), (Y, K), (X, U), (Y, K), (Y, K)])
    assert out == [[("opened", X, 1)], [], [("closed", X, 1)], [], [], [], [("opened", Y, 2)]]
    assert (tracker.current.start_time, tracker.current.id) == (5.0, "c@5000")  # the first confirming window


def test_windows_awaiting_confirmation_after_unknown_scenes_are_dropped_at_the_close():
    tracker = EventTracker("c")
    _feed(tracker, [(X, U), (X, U), (Y, K)])
    assert tracker.close() == []
    # The tracker starts again as at the first window: a camera back online opens at once.
    assert _feed(tracker, [(Y, K)]) == [[("opened", Y, 1)]]


def test_a_scene_not_judged_counts_as_known():
    tracker = EventTracker("c")
    assert _feed(tracker, [(X, None), (X, None)]) == [[("opened", X, 1)], [("extended", X, 2)]]


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([X, Y]), st.sampled_from([K, K, U, None])), min_size=1, max_size=40),
       st.integers(1, 3))
def test_every_known_window_is_in_at_most_one_event_and_no_event_holds_a_confirmed_unknown_run(windows, confirm):
    tracker = EventTracker("c", EventRule(confirm_windows=confirm))
    closed: List[Event] = []
    for n, (text, scene) in enumerate(windows):
        closed += [e for e, change in tracker.update(_caption(text, n, scene)) if change == "closed"]
    closed += [e for e, _ in tracker.close()]
    spans = [(round(e.start_time), round(e.end_time - 0.875)) for e in closed]
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start > end  # events follow each other, sharing no window
    for event, (start, end) in zip(closed, spans):
        inside = windows[start:end + 1]
        assert event.windows == len(inside)
        assert inside[0][1] != U  # an event opens on a known window; an unknown flicker may end it, as any flicker
        assert event.text in {t for t, s in inside if s != U}
        run = 0
        for _, scene in inside:
            run = run + 1 if scene == U else 0
            assert run < confirm  # a confirmed run of unknown windows is in no event
    covered = {n for start, end in spans for n in range(start, end + 1)}
    assert all(n in covered for n, (_, s) in enumerate(windows) if s != U and confirm == 1)


def _sample_frames() -> np.ndarray:
    from models.dataset import read_video

    video, _ = read_video(REPO / "models" / "demo" / "sample.mp4")
    return video[:48]


def _calibrated(bundle: Path, unknown_below: float) -> Path:
    doc = json.loads((bundle / "bundle.json").read_text())
    doc["calibration"] = {"confidence": {"unknown_below": unknown_below}}
    (bundle / "bundle.json").write_text(json.dumps(doc))
    return bundle


def test_the_api_makes_no_event_of_a_stream_the_bundle_calls_unknown(bundle_copy: Path):
    # A threshold above every caption's confidence (< 0) makes every window unknown.
    with EdgeCaptioner(_calibrated(bundle_copy, -1e-12)) as cap:
        frames = _sample_frames()
        assert {c.scene for c in cap.stream(frames, fps=16.0)} == {"unknown"}
        assert list(cap.events(frames, fps=16.0)) == []
