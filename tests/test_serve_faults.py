"""What the journal and the operator see when things go wrong under `edgecap serve` (issue 28).

In-process, on the demo bundle, as tests/test_serve_exit.py builds the service:
SIGHUP reopens the JSON-lines file and the service goes on; every sink's
counters reach /api/stats, /metrics and the page's data.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import urllib.request

import numpy as np
import pytest

from edgecap.captioner import Caption, FrameResult
from edgecap.sources import Frame
from test_serve_exit import front_camera_service



def caption(window: int, text: str = "a red star moves right") -> Caption:
    return Caption(text=text, tokens=[1], window=window, start_frame=window * 8, end_frame=window * 8 + 7,
                   start_time=float(window), end_time=window + 0.9, stage_ms={}, latency_ms=5.0)


@pytest.fixture
def service(tmp_path, shipped_bundle, monkeypatch):
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    svc = front_camera_service(tmp_path, shipped_bundle)
    yield svc
    svc.close()


def _results(*items):
    image = np.zeros((48, 64, 3), np.uint8)
    for i, item in enumerate(items):
        if callable(item):
            item()
            continue
        yield FrameResult("front", Frame(i, i / 8.0, image), [item], {"cpu": 1.0})


def test_sighup_reopens_the_jsonl_file_and_the_service_goes_on(service, tmp_path, caplog):
    # Before: SIGHUP ended `serve` at once (no flush, no STOPPING, no log line), which systemd
    # took for a clean stop: the service stayed down.
    jsonl = tmp_path / "captions.jsonl"
    reopened = threading.Event()
    real = service.reopen

    def reopen():
        real()
        reopened.set()

    service.reopen = reopen

    def rotate():  # what logrotate does: move the file, then signal the service
        jsonl.rename(tmp_path / "captions.jsonl.1")
        os.kill(os.getpid(), signal.SIGHUP)
        assert reopened.wait(5)

    def run_frames(frames, windows=None, live=True):
        yield from _results(caption(0, "before the rotation"), rotate, caption(1, "after the rotation"))
        threading.Timer(0.05, service.stop).start()
        for _ in frames:
            pass

    service.captioner.run_frames = run_frames
    with caplog.at_level(logging.INFO, logger="edgecap"):
        assert service.run() == 0
    assert json.loads((tmp_path / "captions.jsonl.1").read_text())["text"] == "before the rotation"
    assert json.loads(jsonl.read_text())["text"] == "after the rotation"
    said = [r.getMessage() for r in caplog.records if "SIGHUP" in r.getMessage()]
    assert len(said) == 1 and f"reopened {jsonl}" in said[0]
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL  # given back when the service closed


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


def test_every_sinks_counters_reach_the_stats_and_the_metrics(service, tmp_path):
    # Before: SinkSet.counters() had no caller: drops and errors showed nowhere.
    def run_frames(frames, windows=None, live=True):
        yield from _results(caption(0), caption(1), caption(2))
        service._publish_stats()
        threading.Timer(0.05, service.stop).start()
        for _ in frames:
            pass

    service.captioner.run_frames = run_frames
    assert service.run() == 0
    snapshot = service.state.snapshot()
    sinks = snapshot["sinks"]
    assert set(sinks) == {"jsonl", "stdout", "history"}
    assert sinks["jsonl"]["sent"] == 3 and sinks["stdout"]["sent"] == 3
    assert all({"sent", "dropped", "errors"} <= set(c) for c in sinks.values())
    assert "waiting" in sinks["history"]


def test_the_sinks_counters_are_served(service):
    def run_frames(frames, windows=None, live=True):
        yield from _results(caption(0), caption(1))
        service._publish_stats()
        stats = json.loads(_get(f"http://127.0.0.1:{service.http.port}/api/stats"))
        metrics = _get(f"http://127.0.0.1:{service.http.port}/metrics").decode()
        found.update(stats=stats, metrics=metrics)
        threading.Timer(0.05, service.stop).start()
        for _ in frames:
            pass

    found: dict = {}
    service.captioner.run_frames = run_frames
    assert service.run() == 0
    assert found["stats"]["sinks"]["jsonl"]["sent"] == 2
    metrics = found["metrics"]
    assert 'edgecap_sink_sent_total{sink="jsonl"} 2.0' in metrics
    assert 'edgecap_sink_dropped_total{sink="history"} 0.0' in metrics
    assert 'edgecap_sink_errors_total{sink="stdout"} 0.0' in metrics
    assert 'edgecap_sink_waiting{sink="history"}' in metrics
