"""Events: the tracker's rule (merge, near-same, confidence hysteresis, thumbnails) and ``EdgeCaptioner.events``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import List

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgecap.captioner import Caption, EdgeCaptioner
from edgecap.events import Event, EventRule, EventTracker, thumbnail

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
SURE, UNSURE = 0.0, math.log(0.5)  # mean token log-probabilities either side of the rule's threshold


def _caption(text: str, n: int, confidence: float = SURE) -> Caption:
    """Window ``n`` of a one-second-window stream."""
    return Caption(text=text, tokens=[], window=n, start_frame=16 * n, end_frame=16 * n + 14,
                   start_time=float(n), end_time=n + 0.875, confidence=confidence)


def _feed(tracker: EventTracker, windows: List[tuple]) -> List[list]:
    """Feeds ``(text, confidence)`` windows; returns each update's ``[(change, text, windows)]``."""
    out = []
    for n, (text, confidence) in enumerate(windows):
        out.append([(change, e.text, e.windows) for e, change in tracker.update(_caption(text, n, confidence))])
    return out


def test_windows_with_the_same_caption_are_one_event_from_its_first_window_to_its_last():
    tracker = EventTracker("front")
    assert _feed(tracker, [("a red star grows", SURE)] * 3) == [
        [("opened", "a red star grows", 1)], [("extended", "a red star grows", 2)],
        [("extended", "a red star grows", 3)]]
    [(event, change)] = tracker.close()
    assert change == "closed" and event.closed
    assert (event.id, event.camera, event.start_time, event.end_time, event.windows) == ("front@0", "front", 0.0, 2.875, 3)
    assert tracker.close() == [] and tracker.current is None


def test_a_new_caption_closes_the_event_and_opens_the_next_one_where_it_starts():
    tracker = EventTracker("front")
    changes = [tracker.update(_caption(t, n)) for n, t in enumerate(["a red star grows"] * 2 + ["a blue circle moves up"])]
    closed, opened = changes[2]
    assert closed[1] == "closed" and (closed[0].text, closed[0].end_time, closed[0].windows) == ("a red star grows", 1.875, 2)
    assert opened[1] == "opened" and (opened[0].text, opened[0].start_time, opened[0].id) == (
        "a blue circle moves up", 2.0, "front@2000")
    assert not opened[0].closed


@pytest.mark.parametrize("a, b, same", [
    ("a man is riding a horse", "A man riding the horse.", True),  # filler words and case
    ("a red star moves left", "a red star moves right", False),    # one content word is a different event
    ("a red star grows", "a red star", False),
    ("a dog's ball", "the dog's  ball", True),
])
def test_near_same_captions_share_their_content_words_in_order(a, b, same):
    assert (EventRule().key(a) == EventRule().key(b)) is same
    tracker = EventTracker("c")
    _feed(tracker, [(a, SURE), (b, SURE)])
    assert (tracker.current.windows == 2) is same


def test_a_one_window_flicker_of_low_confidence_stays_inside_the_event():
    tracker = EventTracker("c")
    x, y = "a red star grows", "a red star shrinks"
    assert _feed(tracker, [(x, SURE), (x, SURE), (y, UNSURE), (x, SURE)]) == [
        [("opened", x, 1)], [("extended", x, 2)], [], [("extended", x, 4)]]
    [(event, _)] = tracker.close()
    assert (event.text, event.windows, event.end_time) == (x, 4, 3.875)


def test_a_low_confidence_change_is_confirmed_by_the_next_window_agreeing():
    tracker = EventTracker("c")
    x, y = "a red star grows", "a red star shrinks"
    assert _feed(tracker, [(x, SURE), (x, SURE), (y, UNSURE), (y, UNSURE)])[2:] == [
        [], [("closed", x, 2), ("opened", y, 2)]]
    assert (tracker.current.start_time, tracker.current.id) == (2.0, "c@2000")


def test_a_confident_change_is_at_once_and_the_threshold_is_the_rules():
    x, y = "a red star grows", "a red star shrinks"
    assert _feed(EventTracker("c"), [(x, SURE), (y, -0.05)])[1] == [("closed", x, 1), ("opened", y, 1)]
    # Every change waits for confirmation when nothing counts as confident.
    strict = EventRule(confident=1.0)
    assert _feed(EventTracker("c", strict), [(x, SURE), (y, SURE)])[1] == []
    # And none does with confirm_windows = 1.
    assert _feed(EventTracker("c", EventRule(confirm_windows=1)), [(x, SURE), (y, UNSURE)])[1] == [
        ("closed", x, 1), ("opened", y, 1)]


def test_unconfirmed_windows_of_another_caption_join_the_event_they_interrupted():
    tracker = EventTracker("c")
    x, y, z = "a red star grows", "a blue square moves up", "a white circle shrinks"
    out = _feed(tracker, [(x, SURE), (y, UNSURE), (z, UNSURE), (z, UNSURE)])
    assert out[1:] == [[], [], [("closed", x, 2), ("opened", z, 2)]]


def test_closing_with_a_change_pending_keeps_every_window_in_the_event():
    tracker = EventTracker("c")
    _feed(tracker, [("a red star grows", SURE), ("a blue square moves up", UNSURE)])
    [(event, change)] = tracker.close()
    assert (change, event.windows, event.end_time) == ("closed", 2, 1.875)


def _solid(bgr, width=640, height=480) -> np.ndarray:
    return np.full((height, width, 3), bgr, np.uint8)


def test_the_most_confident_window_names_the_event_and_gives_its_thumbnail():
    tracker = EventTracker("c")
    tracker.update(_caption("a man is riding a horse", 0, -0.6), _solid((0, 0, 255)))
    tracker.update(_caption("a man riding the horse", 1, -0.1), _solid((255, 0, 0)))
    tracker.update(_caption("a man is riding the horse", 2, -0.1), _solid((0, 255, 0)))  # not surer: not chosen
    event = tracker.current
    assert (event.text, event.confidence, event.windows) == ("a man riding the horse", -0.1, 3)
    image = cv2.imdecode(np.frombuffer(event.thumbnail, np.uint8), cv2.IMREAD_COLOR)
    assert image.shape == (120, 160, 3)  # scaled to 160 px wide, aspect kept
    assert np.abs(image.mean(axis=(0, 1)) - (255, 0, 0)).max() < 10  # the blue frame of window 1
    assert event.to_dict()["has_thumbnail"] and "thumbnail" not in event.to_dict()


def test_a_thumbnail_keeps_a_narrow_frame_and_an_unencodable_one_gives_none():
    jpeg = thumbnail(_solid((9, 9, 9), 128, 128))
    assert cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR).shape == (128, 128, 3)
    assert thumbnail(np.zeros((0, 0, 3), np.uint8)) == b""


def test_the_events_handed_out_are_copies():
    tracker = EventTracker("c")
    [(opened, _)] = tracker.update(_caption("a red star grows", 0))
    opened.windows = 99
    assert tracker.current.windows == 1


def test_a_rule_that_could_never_confirm_is_refused():
    with pytest.raises(ValueError, match="confirm_windows"):
        EventRule(confirm_windows=0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a red star grows", "a red star  grows.", "a blue square moves up",
                                           "a white circle shrinks"]),
                          st.sampled_from([SURE, -0.2, UNSURE, -3.0])), min_size=1, max_size=30),
       st.integers(1, 4))
def test_every_window_belongs_to_exactly_one_event_and_events_follow_each_other(windows, confirm):
    tracker = EventTracker("c", EventRule(confirm_windows=confirm))
    closed: List[Event] = []
    for n, (text, confidence) in enumerate(windows):
        for event, change in tracker.update(_caption(text, n, confidence)):
            if change == "closed":
                closed.append(event)
    closed += [e for e, _ in tracker.close()]
    assert sum(e.windows for e in closed) == len(windows)
    assert closed[0].start_time == 0.0 and closed[-1].end_time == len(windows) - 1 + 0.875
    for before, after in zip(closed, closed[1:]):
        assert after.start_time == before.end_time + 0.125  # the next window, nothing skipped or shared
        assert EventRule().key(after.text) != EventRule().key(before.text)
    assert len({e.id for e in closed}) == len(closed)


def _clip_frames() -> List[np.ndarray]:
    from models.dataset import read_video

    video, _ = read_video(REPO / "models" / "demo" / "sample.mp4")
    return [video[i * 16:(i + 1) * 16] for i in range(3)]


def test_the_api_yields_events_with_source_times_and_thumbnails():
    truth = [w["caption"] for w in json.loads((REPO / "models" / "demo" / "sample.json").read_text())["windows"]]
    clips = _clip_frames()
    frames = np.concatenate([clips[0], clips[0], clips[1], clips[2], clips[2], clips[2]])
    with EdgeCaptioner(REPO / "models" / "demo" / "bundle") as cap:
        events = list(cap.events(frames, fps=16.0, camera="demo"))
    assert [(e.text, e.windows) for e in events] == [(truth[0], 2), (truth[1], 1), (truth[2], 3)]
    assert [(e.start_time, e.end_time) for e in events] == [(0.0, 1.875), (2.0, 2.875), (3.0, 5.875)]
    assert all(e.closed and e.thumbnail.startswith(b"\xff\xd8") and e.camera == "demo" for e in events)
    assert events[1].id == "demo@2000"


def test_a_caller_that_stops_reading_events_stops_the_run():
    clips = _clip_frames()
    frames = np.concatenate([clips[0], clips[1], clips[2]] * 3)
    with EdgeCaptioner(REPO / "models" / "demo" / "bundle") as cap:
        events = cap.events(frames, fps=16.0)
        first = next(events)
        events.close()
        assert first.windows == 1 and first.id == "@0"
        assert [c.window for c in cap.stream(frames[:32], fps=16.0)] == [0, 1]  # ready for the next run


def _event(n: int, closed: bool = False, thumb: bytes = b"jpeg") -> Event:
    return Event(id=f"front@{n * 1000}", camera="front", text=f"event {n}", start_time=float(n),
                 end_time=n + 0.9, confidence=0.0, windows=1, thumbnail=thumb, closed=closed)


def test_the_state_keeps_each_cameras_current_event_and_its_last_closed_ones():
    from edgecap.service.state import ServiceState

    state = ServiceState(["front", "back"], recent_events=2)
    state.event("front", _event(0, thumb=b"jpeg0"), "opened")
    snap = state.snapshot()["events"]
    assert snap["front"]["current"]["id"] == "front@0" and snap["back"] == {"current": None, "recent": []}
    for n in range(1, 4):
        state.event("front", _event(n - 1, closed=True, thumb=b"jpeg%d" % (n - 1)), "closed")
        state.event("front", _event(n, thumb=b"jpeg%d" % n), "opened")
    snap = state.snapshot()["events"]["front"]
    assert snap["current"]["id"] == "front@3000"
    assert [e["id"] for e in snap["recent"]] == ["front@2000", "front@1000"]  # newest first, two kept
    assert state.event_thumbnail("front@3000") == b"jpeg3" and state.event_thumbnail("front@2000") == b"jpeg2"
    assert state.event_thumbnail("front@0") is None  # dropped with its event: memory stays bounded
    json.dumps(state.snapshot())


def test_the_jsonl_sink_writes_events_as_they_open_and_close_only_when_asked(tmp_path):
    from edgecap.service.sinks import JsonlSink

    for events in (True, False):
        path = tmp_path / f"{events}.jsonl"
        sink = JsonlSink(path, events=events)
        for change in ("opened", "extended", "closed"):
            sink.event("front", _event(0, closed=change == "closed"), change)
        sink.close()
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        if events:
            assert [(r["change"], r["id"], r["closed"]) for r in lines] == [
                ("opened", "front@0", False), ("closed", "front@0", True)]
            assert lines[1]["text"] == "event 0" and "thumbnail" not in lines[1]
        else:
            assert lines == []


def test_the_jsonl_events_key_is_typed_config(tmp_path):
    from edgecap.errors import ConfigError
    from edgecap.service.config import load_config

    def config(value: str) -> Path:
        path = tmp_path / "c.toml"
        path.write_text(f'[sinks.jsonl]\npath = "x.jsonl"\nevents = {value}\n\n'
                        f'[[cameras]]\nname = "a"\nsource = "/dev/video0"\n')
        return path

    assert load_config(config("true")).sinks.jsonl.events is True
    with pytest.raises(ConfigError, match="sinks.jsonl.events"):
        load_config(config('"yes"'))
