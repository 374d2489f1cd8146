"""The status page in a real headless browser (Debian's chromium): captions reach the DOM.

Skips where no chromium is installed; CI installs it (.ci/run). Run as a script
to take the docs' screenshot, of a demo state or of a running service::

    .venv-test/bin/python tests/test_status_page.py docs/service-page.png
    .venv-test/bin/python tests/test_status_page.py docs/service-page.png --url http://127.0.0.1:8080/
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

import cv2
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from edgecap.captioner import Caption  # noqa: E402
from edgecap.service.http import StatusServer  # noqa: E402
from edgecap.service.state import ServiceState  # noqa: E402

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


def caption(text: str, window: int, start: int) -> Caption:
    return Caption(text=text, tokens=[], window=window, start_frame=start, end_frame=start + 15,
                   start_time=start / 16, end_time=(start + 15) / 16, stage_ms={"cnn": 9.5},
                   latency_ms=180.0)


def demo_state() -> ServiceState:
    """Two cameras fed frames of the demo video and its reference captions, two devices."""
    sample = json.loads((REPO / "models" / "demo" / "sample.json").read_text())
    video = cv2.VideoCapture(str(REPO / "models" / "demo" / sample["video"]))
    frames = []
    while True:
        ok, img = video.read()
        if not ok:
            break
        frames.append(img)
    video.release()
    state = ServiceState(["front", "garage"], recent=10)
    for name, windows in (("front", sample["windows"]), ("garage", sample["windows"][:1])):
        for i, w in enumerate(windows):
            state.caption(name, caption(w["caption"], i, w["start_frame"]))
        img = cv2.resize(frames[windows[-1]["end_frame"] - 4], (480, 480), interpolation=cv2.INTER_NEAREST)
        state.frame(name, cv2.imencode(".jpg", img)[1].tobytes(), windows[-1]["end_frame"] / sample["fps"])
    state.set_camera("front", "online")
    state.set_camera("garage", "offline", "no frame for 20 s; reopening")
    state.pipeline("front", {"fps_in": 15.0, "fps_out": 8.0, "dropped": 0, "latency_ms": {"p50": 182.0}})
    state.pipeline("garage", {"fps_in": 0.0, "fps_out": 0.0, "dropped": 3, "latency_ms": {"p50": 190.0}})
    state.devices([
        {"device": "cpu", "kind": "cpu", "busy": 0.31, "temperature_c": None, "throttled": False},
        {"device": "tpu:0", "kind": "pci", "busy": 0.62, "temperature_c": 47.8, "throttled": False},
    ])
    return state


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    return tmp_path / "chromium-profile"


@needs_chromium
def test_the_page_shows_the_latest_caption_the_frame_and_the_devices(profile: Path) -> None:
    state = ServiceState(["front", "back"])
    state.set_camera("front", "online")
    state.set_camera("back", "offline", "no frame for 20 s")
    img = cv2.imencode(".jpg", cv2.resize(cv2.imread(str(REPO / "docs" / "trace-pipelined.png")), (64, 48)))[1]
    state.frame("front", img.tobytes(), 1.0)
    state.caption("front", caption("an older caption about a cat", 0, 0))
    # Markup in a caption must arrive as text: the page never parses captions as HTML.
    state.caption("front", caption("a <b>dog</b> runs across the lawn", 1, 16))
    state.devices([{"device": "tpu:0", "kind": "pci", "busy": 0.25, "temperature_c": 51.5}])
    with StatusServer(state, None, port=0) as srv:
        dom = browse(srv.url, profile, "--dump-dom")
    assert '<p class="caption">a &lt;b&gt;dog&lt;/b&gt; runs across the lawn</p>' in dom
    assert "an older caption about a cat" in dom
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


def screenshot(out: Path, url: Optional[str], size: str) -> List[str]:
    """Takes the docs' screenshot of ``url``, or of a demo state when None; returns the command."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [f"--screenshot={out.resolve()}", f"--window-size={size}", "--hide-scrollbars"]
        if url is not None:
            browse(url, Path(tmp), *args)
        else:
            with StatusServer(demo_state(), None, port=0) as srv:
                browse(srv.url, Path(tmp), *args)
    return [CHROMIUM or "chromium", *args]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Screenshot of the status page for the docs.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--url", help="a running service's page (default: a demo state)")
    parser.add_argument("--size", default="1280,900", help="window WIDTH,HEIGHT")
    opts = parser.parse_args()
    if CHROMIUM is None:
        sys.exit("no chromium: apt-get install chromium")
    print(" ".join(screenshot(opts.out, opts.url, opts.size)))
