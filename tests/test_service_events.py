"""The service's events: one tracker per camera, every change to the sinks and the state, closed on offline and stop."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from typing import List, Tuple


from edgecap.events import Event
from edgecap.service.config import load_config
from edgecap.service.notify import Notifier
from edgecap.service.service import Service
from edgecap.service.sinks import Sink

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "models" / "demo" / "sample.mp4"
TRUTH = [w["caption"] for w in json.loads((REPO / "models" / "demo" / "sample.json").read_text())["windows"]]


class Recorder(Sink):
    """Remembers every call, in order."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: List[Tuple[str, ...]] = []
        self.events: List[Tuple[Event, str]] = []
        self.changed = threading.Condition()

    def event(self, camera, event, change):
        with self.changed:
            self.calls.append(("event", camera, change, event.text))
            self.events.append((event, change))
            self.changed.notify_all()

    def close(self, timeout=2.0):
        self.calls.append(("close",))

    def wait(self, predicate, timeout=30.0) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: predicate(self.events), timeout)


def _run_until(service: Service, recorder: Recorder, predicate, snapshots: list) -> int:
    """Runs the service (on this thread: it sets signal handlers) until ``predicate`` holds for the events."""
    def stop_when_seen() -> None:
        recorder.wait(predicate)
        snapshots.append(service.state.snapshot())
        service.stop()

    threading.Thread(target=stop_when_seen, daemon=True).start()
    return service.run()


def _service(tmp_path: Path, loop: bool) -> Tuple[Service, Recorder]:
    path = tmp_path / "edgecap.toml"
    path.write_text("\n".join([
        f'bundle = "{REPO / "models" / "demo" / "bundle"}"', "", "[http]", "port = 0", "",
        "[sinks.stdout]", "enabled = false", "",
        "[sinks.jsonl]", f'path = "{tmp_path / "out.jsonl"}"', "events = true", "",
        "[[cameras]]", 'name = "front"', f'source = "{SAMPLE}"', f"loop = {str(loop).lower()}",
        "stall_seconds = 5.0", "backoff_max_seconds = 30.0", ""]))
    service = Service(load_config(path), notifier=Notifier({}), stdout=io.StringIO())
    recorder = Recorder()
    service.sinks.sinks.append(recorder)
    return service, recorder


def test_each_caption_change_is_an_event_and_a_camera_going_offline_closes_its_event(tmp_path):
    service, recorder = _service(tmp_path, loop=False)
    before = time.time()
    snapshots: list = []
    # Three clips, three captions, then the file ends: the camera goes offline.
    assert _run_until(service, recorder, lambda ev: sum(c == "closed" for _, c in ev) >= 3, snapshots) == 0
    snapshot = snapshots[0]
    events = [(c[2], c[3]) for c in recorder.calls if c[0] == "event"]
    assert events[:6] == [("opened", TRUTH[0]), ("closed", TRUTH[0]), ("opened", TRUTH[1]),
                          ("closed", TRUTH[1]), ("opened", TRUTH[2]), ("closed", TRUTH[2])]
    closed = [e for e, c in recorder.events if c == "closed"][:3]
    # Unix times: each event spans its window, and the next starts after it.
    assert all(before - 1 < e.start_time < e.end_time < time.time() + 1 for e in closed)
    assert all(0.7 < e.end_time - e.start_time < 1.0 for e in closed)
    assert closed[0].end_time <= closed[1].start_time and all(e.windows == 1 and e.thumbnail for e in closed)
    assert closed[1].id == f"front@{round(closed[1].start_time * 1000)}"
    state = snapshot["events"]["front"]
    assert state["current"] is None
    assert [e["text"] for e in state["recent"]] == TRUTH[::-1]  # newest first
    assert service.state.event_thumbnail(state["recent"][0]["id"]).startswith(b"\xff\xd8")
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(r["change"], r["text"]) for r in lines if "change" in r][:6] == events[:6]
    assert sum("change" not in r for r in lines) >= 3  # the captions, as before


def test_a_stop_closes_the_event_in_progress_before_the_sinks_close(tmp_path):
    service, recorder = _service(tmp_path, loop=True)
    assert _run_until(service, recorder, lambda ev: any(c == "opened" for _, c in ev), []) == 0
    assert recorder.calls[-1] == ("close",)
    last_event = recorder.calls[-2]
    assert last_event[:3] == ("event", "front", "closed"), recorder.calls
    opened = [e.id for e, c in recorder.events if c == "opened"]
    closed = [e.id for e, c in recorder.events if c == "closed"]
    assert opened == closed  # every event that opened was closed, once
    assert service.state.snapshot()["events"]["front"]["current"] is None
