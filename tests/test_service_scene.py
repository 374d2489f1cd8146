"""The service says what its model knows (journal, status page, /api/stats) and carries every caption's scene
(/api/captions, MQTT, JSON lines, the journal's lines, the history); an unknown scene opens no event (issue #26)."""

from __future__ import annotations

import io
import json
import sqlite3
import urllib.request
from pathlib import Path

import pytest

from edgecap.bundle import load_bundle
from edgecap.captioner import Caption
from edgecap.service.http import StatusServer
from edgecap.service.service import model_info
from edgecap.service.sinks.stdout import StdoutSink
from edgecap.service.state import ServiceState
from test_mqtt import broker  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "models" / "demo" / "sample.mp4"


def _caption(text: str, scene) -> Caption:
    return Caption(text=text, tokens=[], window=0, start_frame=0, end_frame=15, start_time=0.0, end_time=0.9375,
                   confidence=-0.01, scene=scene)


def _json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _uncalibrated(bundle: Path, everything_unknown: bool = False) -> Path:
    doc = json.loads((bundle / "bundle.json").read_text())
    if everything_unknown:  # every caption's confidence (< 0) is below it
        doc["calibration"] = {"confidence": {"unknown_below": -1e-12}}
    else:
        doc.pop("domain", None)
        doc.pop("calibration", None)
    (bundle / "bundle.json").write_text(json.dumps(doc))
    return bundle


@pytest.mark.fast
def test_model_info_says_what_the_model_knows(bundle_copy: Path):
    info = model_info(load_bundle(REPO / "models" / "shapes_mobilenet_v1" / "bundle"))
    assert info["domain"]["kind"] == "synthetic"
    assert info["calibration"] == {"unknown_below": -0.241876, "feature_unknown_below": 0.623674}
    assert len(info["notices"]) == 1 and "knows only a synthetic world" in info["notices"][0]
    info = model_info(load_bundle(_uncalibrated(bundle_copy)))
    assert info["domain"] == {"kind": "unknown", "about": ""} and info["calibration"] is None
    assert len(info["notices"]) == 1 and "carries no calibration" in info["notices"][0]


@pytest.mark.fast
def test_api_stats_carries_the_model_and_api_captions_each_captions_scene():
    state = ServiceState(["front", "back"])
    state.model(model_info(load_bundle(REPO / "models" / "demo" / "bundle")))
    state.caption("front", _caption("a white star moves down", "unknown"))
    state.caption("back", _caption("a red star grows", "known"))
    with StatusServer(state, None, port=0) as srv:
        stats = _json(srv.url + "api/stats")
        captions = _json(srv.url + "api/captions")
    assert stats["model"]["name"] == "edgecap-demo-shapes" and stats["model"]["domain"]["kind"] == "synthetic"
    assert (captions["front"]["scene"], captions["back"]["scene"]) == ("unknown", "known")
    assert stats["captions"]["front"][0]["scene"] == "unknown"


@pytest.mark.fast
def test_the_journals_caption_lines_mark_unknown_scenes():
    out = io.StringIO()
    sink = StdoutSink(out)
    for scene in ("unknown", "known", None):
        sink.caption("front", _caption("a white star moves down", scene))
    assert out.getvalue().splitlines() == [
        "front [   0.00s -    0.94s] a white star moves down   (unknown scene)",
        "front [   0.00s -    0.94s] a white star moves down",
        "front [   0.00s -    0.94s] a white star moves down"]


def test_the_page_says_what_the_model_knows_and_marks_unknown_scenes(tmp_path: Path):
    from test_status_page import CHROMIUM, browse

    if CHROMIUM is None:
        pytest.skip("no chromium (apt-get install chromium)")
    state = ServiceState(["front"])
    state.set_camera("front", "online")
    state.caption("front", _caption("an older caption", "unknown"))
    state.caption("front", _caption("a white star moves down", "unknown"))
    with StatusServer(state, None, port=0) as srv:
        dom = browse(srv.url, tmp_path / "profile", "--dump-dom")
        assert '<p id="model-notice" class="notice" role="note" hidden=""></p>' in dom  # no model: no notice
        state.model(model_info(load_bundle(REPO / "models" / "demo" / "bundle")))
        dom = browse(srv.url, tmp_path / "profile", "--dump-dom")
    assert ('<figcaption class="caption">a white star moves down <span class="scene">(unknown scene)</span>'
            '</figcaption>') in dom
    assert 'an older caption <span class="scene">(unknown scene)</span>' in dom
    assert '<p id="model-notice" class="notice" role="note">edgecap-demo-shapes knows only a synthetic world' in dom


def test_serve_carries_the_scene_everywhere_and_opens_no_event_in_an_unknown_scene(tmp_path, bundle_copy,
                                                                                 broker):  # noqa: F811
    from test_mqtt import Subscriber, free_port
    from test_serve import NotifySocket, _serve, _stop

    port = free_port()
    history = tmp_path / "history.db"
    config = tmp_path / "edgecap.toml"
    config.write_text("\n".join([
        f'bundle = "{_uncalibrated(bundle_copy, everything_unknown=True)}"', "",
        "[http]", f"port = {port}", "",
        "[sinks.stdout]", "enabled = true", "",
        "[sinks.jsonl]", f'path = "{tmp_path / "captions.jsonl"}"', "events = true", "",
        "[sinks.mqtt]", 'host = "127.0.0.1"', f"port = {broker.port}", 'topic_prefix = "test"', "",
        "[history]", f'path = "{history}"', "captions = true", "",
        "[[cameras]]", 'name = "front"', f'source = "{SAMPLE}"', "loop = true", ""]))
    notify = NotifySocket(tmp_path / "notify.sock")
    sub = Subscriber(broker.port, "test").connect()
    proc = _serve(config, notify, tmp_path)
    try:
        notify.wait_for("READY", timeout=30)
        mqtt = sub.captions(4, timeout=30)
        stats = _json(f"http://127.0.0.1:{port}/api/stats")
        captions = _json(f"http://127.0.0.1:{port}/api/captions")
        assert _stop(proc) < 5.0
        stderr = proc.stderr.read()
    finally:
        proc.kill()
        sub.disconnect()
        notify.close()
    assert proc.returncode == 0, stderr
    assert {c["scene"] for c in mqtt} == {"unknown"} and captions["front"]["scene"] == "unknown"
    assert stats["model"]["domain"]["kind"] == "synthetic" and stats["model"]["notices"]
    assert stats["events"]["front"] == {"current": None, "recent": []}  # no event opened
    assert stderr.count("knows only a synthetic world") == 1, stderr  # the journal, once
    lines = [json.loads(line) for line in (tmp_path / "captions.jsonl").read_text().splitlines()]
    assert lines and all(line.get("scene") == "unknown" for line in lines)  # captions only: no event line
    out = [line for line in (tmp_path / "stdout.txt").read_text().splitlines() if line]
    assert out and all(line.endswith("(unknown scene)") for line in out)
    db = sqlite3.connect(history)
    assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 0
    assert {row[0] for row in db.execute("SELECT scene FROM captions")} == {"unknown"}

