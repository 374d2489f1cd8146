"""The status page in a real headless browser (Debian's chromium): frames, captions, events, search.

Two drivers: ``browse`` runs chromium once with ``--dump-dom`` (what the page
shows after a few seconds of virtual time); ``browser.Browser`` drives it over
the DevTools protocol (keys, script, every request and console message).
Skips where no chromium is installed; CI installs it (.ci/run). Run as a
script to take the docs' screenshots, of a demo state or of a running service::

    .venv-test/bin/python tests/test_status_page.py docs/service-page.png
    .venv-test/bin/python tests/test_status_page.py docs/service-page-search.png --search star
    .venv-test/bin/python tests/test_status_page.py docs/service-page-phone.png --phone
    .venv-test/bin/python tests/test_status_page.py docs/service-page.png --url http://127.0.0.1:8080/
"""

from __future__ import annotations

import argparse
import collections
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlsplit

import cv2
import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # run as a script from anywhere

from browser import Browser  # noqa: E402
from edgecap.captioner import Caption  # noqa: E402
from edgecap.events import Event  # noqa: E402
from edgecap.service.http import StatusServer  # noqa: E402
from edgecap.service.state import ServiceState  # noqa: E402
from fake_history import FakeHistory, event  # noqa: E402
from models.dataset import random_spec, render_clip  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_TIMEOUT_S = 60  # a hung browser fails the test instead of hanging the suite
TOKEN = "page-test-token-0123456789"

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)")


def browse(url: str, profile: Path, *args: str, run_ms: int = 3000) -> str:
    """Loads ``url`` in headless chromium, lets its script run ``run_ms`` of virtual time; returns stdout."""
    cmd = [CHROMIUM, "--headless=new", "--disable-gpu", "--no-sandbox", "--no-first-run",
           f"--user-data-dir={profile}",  # a private profile: parallel runs do not share a lock
           f"--virtual-time-budget={run_ms}", *args, url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def caption(text: str, window: int, start: int, confidence: float = 0.0) -> Caption:
    return Caption(text=text, tokens=[], window=window, start_frame=start, end_frame=start + 15,
                   start_time=start / 16, end_time=(start + 15) / 16, stage_ms={"cnn": 9.5},
                   latency_ms=180.0, confidence=confidence)


def jpeg(image: np.ndarray, width: int) -> bytes:
    """A frame as JPEG, scaled to ``width`` pixels wide."""
    height = round(image.shape[0] * width / image.shape[1])
    return cv2.imencode(".jpg", cv2.resize(image, (width, height), interpolation=cv2.INTER_NEAREST))[1].tobytes()


class EventsState(ServiceState):
    """A ServiceState whose snapshot carries each camera's event in progress, as the events part does.

    ``snapshot()["events"][camera]`` is ``{"current": Event.to_dict() or None,
    "recent": [...]}`` and ``event_thumbnail(id)`` its JPEG (edgecap/service/state.py
    once events are tracked); set ``current[camera]``.
    """

    def __init__(self, cameras: List[str]) -> None:
        super().__init__(cameras)
        self.current: Dict[str, Event] = {}

    def snapshot(self) -> Dict[str, Any]:
        snap = super().snapshot()
        snap["events"] = {name: {"current": self.current[name].to_dict() if name in self.current else None,
                                 "recent": []} for name in self.cameras}
        return snap

    def event_thumbnail(self, event_id: str) -> Optional[bytes]:
        return next((e.thumbnail for e in self.current.values() if e.id == event_id), None)


def scene(cameras: Tuple[str, ...] = ("front", "garage"), per_camera: int = 8, seed: int = 18
          ) -> Tuple[EventsState, FakeHistory]:
    """A state and a history as a service shows them after a while: real frames of synthetic clips.

    Each camera has ``per_camera`` closed events in the history, a minute or
    more apart, each with a thumbnail of its clip, and one event in progress
    whose clip's last frame is the camera's latest frame and whose text is its
    latest caption.
    """
    rng = np.random.default_rng(seed)
    now = time.time()
    state = EventsState(list(cameras))
    closed = []
    for c, name in enumerate(cameras):
        start = now - 600 * per_camera - 200 + 97 * c  # each takes at most 590 s: all before the current
        for i in range(per_camera + 1):
            spec = random_spec(rng, frames=8)
            frames, text = render_clip(spec, rng)
            seconds = float(rng.integers(4, 90))
            conf = -float(rng.uniform(0.02, 0.7))
            thumb = jpeg(frames[len(frames) // 2], 160)
            if i < per_camera:
                closed.append(event(name, text, start, seconds, thumb, conf))
                start += seconds + float(rng.integers(60, 500))
                continue
            current = event(name, text, now - seconds, seconds, thumb, conf, closed=False)
            state.current[name] = current
            state.set_camera(name, "online")
            state.frame(name, jpeg(frames[-1], 480), now)
            if closed:
                state.caption(name, caption(closed[-1].text, 0, 0, closed[-1].confidence))
            state.caption(name, caption(text, 1, 16, conf))
            state.pipeline(name, {"fps_in": 15.0, "fps_out": 8.0, "dropped": 0, "latency_ms": {"p50": 182.0}})
    state.devices([
        {"device": "cpu", "kind": "cpu", "busy": 0.31, "temperature_c": None, "throttled": False},
        {"device": "tpu:0", "kind": "pci", "busy": 0.62, "temperature_c": 47.8, "throttled": False},
    ])
    return state, FakeHistory(closed)


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    return tmp_path / "chromium-profile"


@needs_chromium
def test_the_page_shows_the_latest_caption_the_frame_and_the_devices(profile: Path) -> None:
    state = ServiceState(["front", "back"])
    state.set_camera("front", "online")
    state.set_camera("back", "offline", "no frame for 20 s")
    img = cv2.imencode(".jpg", cv2.resize(cv2.imread(str(REPO / "results" / "trace-pipelined.png")), (64, 48)))[1]
    state.frame("front", img.tobytes(), 1.0)
    state.caption("front", caption("an older caption about a cat", 0, 0))
    # Markup in a caption must arrive as text: the page never parses captions as HTML.
    state.caption("front", caption("a <b>dog</b> runs across the lawn", 1, 16))
    state.devices([{"device": "tpu:0", "kind": "pci", "busy": 0.25, "temperature_c": 51.5,
                    "predicted_ms": 1.41, "measured_ms": 2.83, "compute_scale": 2.0},
                   {"device": "cpu", "kind": "cpu", "busy": 0.5, "predicted_ms": 1.18, "measured_ms": 1.2}])
    state.sinks({"jsonl": {"sent": 41, "dropped": 0, "errors": 0},
                 "mqtt": {"sent": 7, "dropped": 3, "errors": 1, "waiting": 12, "connected": False}})
    with StatusServer(state, None, port=0) as srv:
        dom = browse(srv.url, profile, "--dump-dom")
    # Each sink's counters (before issue 28 they reached neither the page nor /api/stats).
    assert "<tr><td>jsonl</td><td>41</td><td>–</td><td>0</td><td>0</td></tr>" in dom
    assert ('<tr><td>mqtt (not connected)</td><td>7</td><td class="hot">12</td><td class="hot">3</td>'
            '<td class="hot">1</td></tr>') in dom
    # Each device's predicted and measured time a frame; one off its prediction stands out.
    assert '<td class="hot">1.41 / 2.83 ms (learned ×2.00)</td>' in dom
    assert "<td>1.18 / 1.20 ms</td>" in dom
    assert '<figcaption class="caption">a &lt;b&gt;dog&lt;/b&gt; runs across the lawn</figcaption>' in dom
    assert "an older caption about a cat" in dom  # under "Last captions"
    assert "no event yet" in dom  # no history, no event: the timeline says so
    assert 'src="api/frame/front.jpg?seq=1"' in dom
    assert "offline: no frame for 20 s" in dom
    assert "51.5 °C" in dom and "25%" in dom
    assert 'class="badge online">live<' in dom


@needs_chromium
def test_with_a_token_the_page_sends_the_browser_to_the_login_form(profile: Path) -> None:
    state = ServiceState(["front"])
    state.caption("front", caption("a secret caption", 0, 0))
    with StatusServer(state, None, port=0, token=TOKEN) as srv:
        dom = browse(srv.url, profile, "--dump-dom", run_ms=500)  # a server redirect: little to wait for
    assert 'name="token"' in dom and "a secret caption" not in dom



# What the page shows of each camera, read in the browser.
CARDS_JS = """[...document.querySelectorAll('.camera')].map((card) => {
  const frame = card.querySelector('.frame'), img = frame.querySelector('img'), cap = frame.querySelector('.caption');
  const f = img.getBoundingClientRect(), c = cap.getBoundingClientRect();
  return {name: card.querySelector('h2').textContent, frame_loaded: img.complete && img.naturalWidth > 0,
          caption: cap.textContent,
          over: c.top >= f.top && c.bottom <= f.bottom && c.left >= f.left && c.right <= f.right,
          confidence: card.querySelector('.confidence').textContent,
          events: [...card.querySelectorAll('.timeline .event')].map(eventOf)};
})"""
EVENT_JS = """function eventOf(li) {
  const img = li.querySelector('img');
  return {text: li.querySelector('.event-text').textContent, when: li.querySelector('.when').textContent,
          thumbnail: img ? img.getAttribute('src') : null,
          thumbnail_loaded: !!img && img.complete && img.naturalWidth > 0};
}"""


@pytest.fixture
def shown() -> Iterator[Tuple[StatusServer, EventsState, FakeHistory]]:
    state, history = scene()
    with StatusServer(state, None, port=0, history=history) as srv:
        yield srv, state, history


def only_local(browser: Browser, server: StatusServer) -> None:
    """Asserts that every request the page made went to ``server`` on 127.0.0.1."""
    assert browser.requests, "no request at all"
    for url in browser.requests:
        parts = urlsplit(url)
        assert (parts.scheme, parts.hostname, parts.port) == ("http", "127.0.0.1", server.port), url


def cards(browser: Browser) -> List[Dict[str, Any]]:
    return browser.evaluate(f"(() => {{ {EVENT_JS}; return {CARDS_JS}; }})()")


def percent(confidence: float) -> str:
    return f"{round(100 * math.exp(confidence))}%"


@needs_chromium
def test_frames_carry_their_caption_and_timelines_show_events_with_thumbnails(
        shown: Tuple[StatusServer, EventsState, FakeHistory], profile: Path) -> None:
    srv, state, history = shown
    with Browser(profile) as browser:
        browser.goto(srv.url)
        browser.wait_for("[...document.querySelectorAll('.frame img, .timeline img')]"
                         ".every((i) => i.complete && i.naturalWidth > 0) && "
                         "document.querySelectorAll('.timeline .event').length === 12")
        seen = cards(browser)
        only_local(browser, srv)
        assert browser.problems == []
    assert [c["name"] for c in seen] == ["front", "garage"]
    for card in seen:
        latest = state.captions()[card["name"]]
        assert card["frame_loaded"] and card["caption"] == latest["text"] and card["over"], card
        assert card["confidence"].endswith(percent(latest["confidence"]))
        # The event in progress first, then the history's, newest first, each with its picture.
        current = state.current[card["name"]]
        closed = sorted((e for e in history.events if e.camera == card["name"]), key=lambda e: -e.start_time)
        assert [e["text"] for e in card["events"]] == [current.text] + [e.text for e in closed[:5]]
        assert "so far" in card["events"][0]["when"] and "now" in card["events"][0]["when"]
        assert all(e["thumbnail_loaded"] for e in card["events"])
        assert f"/api/events/{card['name']}%40" in card["events"][1]["thumbnail"]
    assert {s["camera"] for s in history.searches} == {"front", "garage"}  # a timeline asks per camera


@needs_chromium
def test_a_search_typed_with_the_keyboard_lists_the_matching_events(
        shown: Tuple[StatusServer, EventsState, FakeHistory], profile: Path) -> None:
    srv, _, history = shown
    # The colour and shape most events share, as a quoted phrase: e.g. "red star".
    pairs = collections.Counter(" ".join(e.text.split()[1:3]) for e in history.events)
    phrase = pairs.most_common(1)[0][0]
    query = f'"{phrase}"'
    expected = sorted((e for e in history.events if phrase in e.text), key=lambda e: -e.start_time)
    assert len(expected) >= 2
    with Browser(profile) as browser:
        browser.goto(srv.url)
        browser.wait_for("document.querySelectorAll('.camera').length === 2")
        # From the top of the page, the search box is the first stop of the tab order.
        browser.press("Tab")
        focus = browser.evaluate("({id: document.activeElement.id, outline: getComputedStyle("
                                 "document.activeElement).outlineStyle})")
        assert focus == {"id": "q", "outline": "solid"}  # and shows it has the focus
        browser.type(query)
        browser.press("Enter")
        browser.wait_for("document.getElementById('search-status').textContent.includes('for')")
        status = browser.evaluate("document.getElementById('search-status').textContent")
        results = browser.evaluate(f"(() => {{ {EVENT_JS}; return [...document.querySelectorAll("
                                   f"'#results .event')].map(eventOf); }})()")
        browser.wait_for("[...document.querySelectorAll('#results img')]"
                         ".every((i) => i.complete && i.naturalWidth > 0)")
        focused = browser.evaluate("document.activeElement.id")
        only_local(browser, srv)
        assert browser.problems == []
    assert history.searches[-1] == {"q": query, "camera": "", "since": None, "until": None, "limit": 50}
    assert status == f"{len(expected)} events for {query}"
    assert [r["text"] for r in results] == [e.text for e in expected]
    for result, e in zip(results, expected):
        assert result["when"].startswith(e.camera + " · ")
        assert f"· {round(e.end_time - e.start_time)} s" in result["when"] or "min" in result["when"]
        assert result["thumbnail"] and result["thumbnail"].split("?")[0].endswith(
            f"/api/events/{e.id.replace('@', '%40')}/thumbnail.jpg")
    assert focused == "q"  # the focus stays where the user typed


@needs_chromium
def test_the_camera_filter_is_reached_and_chosen_with_the_keyboard(
        shown: Tuple[StatusServer, EventsState, FakeHistory], profile: Path) -> None:
    srv, _, history = shown
    with Browser(profile) as browser:
        browser.goto(srv.url)
        browser.wait_for("document.querySelectorAll('#search-camera option').length === 3")
        for _ in range(2):
            browser.press("Tab")
        assert browser.evaluate("document.activeElement.id") == "search-camera"
        browser.press("ArrowDown")  # "all cameras" -> "front"
        browser.press("Tab")
        assert browser.evaluate("document.activeElement.textContent") == "Search"
        browser.press("Enter")
        browser.wait_for("document.getElementById('search-status').textContent.includes('event')")
        texts = browser.evaluate("[...document.querySelectorAll('#results .event-text')].map((p) => p.textContent)")
    assert history.searches[-1]["camera"] == "front"
    assert texts == [e.text for e in sorted(history.events, key=lambda e: -e.start_time) if e.camera == "front"]


@needs_chromium
def test_on_a_phone_the_page_fits_the_screen(shown: Tuple[StatusServer, EventsState, FakeHistory],
                                             profile: Path) -> None:
    srv = shown[0]
    with Browser(profile, width=390, height=844, mobile=True) as browser:
        browser.goto(srv.url)
        browser.wait_for("document.querySelectorAll('.timeline .event').length === 12")
        fit = browser.evaluate("({page: document.documentElement.scrollWidth, "
                               "search: document.getElementById('q').getBoundingClientRect().width, "
                               "frame: document.querySelector('.frame').getBoundingClientRect().width, "
                               "font: parseFloat(getComputedStyle(document.querySelector('.caption')).fontSize)})")
        assert browser.problems == []
    assert fit["page"] <= 390  # nothing scrolls sideways
    assert fit["search"] >= 200 and fit["frame"] >= 330 and fit["font"] >= 16


@needs_chromium
def test_without_a_history_there_is_no_search_box_and_nothing_fails(profile: Path) -> None:
    state, _ = scene(("front",), per_camera=0)
    with StatusServer(state, None, port=0) as srv, Browser(profile) as browser:
        browser.goto(srv.url)
        # The state's event in progress is still shown; the history's list is empty.
        browser.wait_for("document.querySelector('.timeline .event img') && "
                         "document.querySelector('.timeline .event img').naturalWidth > 0")
        assert browser.evaluate("document.getElementById('q') === null && "
                                "document.querySelectorAll('.timeline .event').length === 1")
        assert not any(url.split("?")[0].endswith("/api/events") for url in browser.requests)  # nothing to ask
        assert browser.problems == []


@needs_chromium
def test_after_a_login_by_keyboard_the_page_reads_events_with_the_session(profile: Path) -> None:
    state, history = scene(("front",), per_camera=3)
    with StatusServer(state, None, port=0, token=TOKEN, history=history) as srv, Browser(profile) as browser:
        browser.goto(srv.url)  # sent to the login form, whose token field has the focus
        assert browser.evaluate("location.pathname") == "/login"
        browser.type(TOKEN)
        browser.press("Enter")
        browser.wait_for("document.querySelectorAll('.timeline .event').length === 4")
        # Log out first, then the search box.
        stops = []
        for _ in range(2):
            browser.press("Tab")
            stops.append(browser.evaluate("document.activeElement.id || document.activeElement.textContent"))
        assert stops == ["Log out", "q"]
        assert browser.problems == []
        assert len(history.searches) >= 1


def screenshot(out: Path, url: Optional[str], size: str, search: Optional[str] = None,
               phone: bool = False) -> None:
    """Takes a docs screenshot of ``url``, or of ``scene()`` when None, after typing ``search`` if given."""
    width, height = (int(x) for x in size.split(","))
    state, history = scene()
    with tempfile.TemporaryDirectory() as tmp, StatusServer(state, None, port=0, history=history) as srv, \
            Browser(Path(tmp), width=390 if phone else width, height=844 if phone else height,
                    mobile=phone) as browser:
        browser.goto(url or srv.url)
        browser.wait_for("document.querySelectorAll('.timeline .event').length")
        if search is not None:
            browser.press("Tab")
            browser.type(search)
            browser.press("Enter")
            browser.wait_for("document.getElementById('search-status').textContent.includes('event')")
        # Every picture decoded and painted before the shot.
        browser.evaluate("Promise.all([...document.images].map((i) => i.decode().catch(() => null)))"
                         ".then(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))))")
        assert browser.problems == [], browser.problems
        browser.screenshot(out)
    # 256 colours: the synthetic frames' noise would make each PNG half a megabyte.
    from PIL import Image  # matplotlib's dependency, in the dev extra

    Image.open(out).convert("RGB").quantize(256, dither=Image.Dither.NONE).save(out, optimize=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Screenshots of the status page for the docs.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--url", help="a running service's page (default: a demo state and history)")
    parser.add_argument("--size", default="1280,1200", help="window WIDTH,HEIGHT")
    parser.add_argument("--search", help="type this into the search box first")
    parser.add_argument("--phone", action="store_true", help="a 390x844 phone screen")
    opts = parser.parse_args()
    if CHROMIUM is None:
        sys.exit("no chromium: apt-get install chromium")
    screenshot(opts.out, opts.url, opts.size, opts.search, opts.phone)
