"""How `edgecap serve` runs and ends: what systemd hears from its loop, the exit code, the drain.

In-process, on the demo bundle: the service is built as `edgecap serve`
builds it, and its captioner's run is replaced by one that yields frames and
heartbeats, fails, or hangs until the captioner is closed (a stage stuck in a
driver call).
"""

from __future__ import annotations

import io
import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgecap.captioner import FrameResult
from edgecap.errors import DeviceFailed, RunCancelled
from edgecap.service import service as service_module
from edgecap.service.config import load_config
from edgecap.service.notify import Notifier
from edgecap.service.service import Service
from edgecap.sources import Frame

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "models" / "demo" / "sample.mp4"


def front_camera_service(tmp_path: Path, bundle: Path) -> Service:
    """A service of one looping file camera on ``bundle``, with a JSON-lines sink and the page on port 0."""
    config = tmp_path / "edgecap.toml"
    config.write_text("\n".join([
        f'bundle = "{bundle}"', "",
        "[http]", 'address = "127.0.0.1"', "port = 0", "",
        "[sinks.jsonl]", f'path = "{tmp_path / "captions.jsonl"}"', "",
        "[[cameras]]", 'name = "front"', f'source = "{SAMPLE}"', "loop = true", "stall_seconds = 5.0", ""]))
    return Service(load_config(config), notifier=Notifier({}), stdout=io.StringIO())


@pytest.fixture
def service(tmp_path, shipped_bundle):
    svc = front_camera_service(tmp_path, shipped_bundle)
    yield svc
    svc.close()


def test_a_run_time_failure_exits_1_for_systemd_to_restart(service, monkeypatch, caplog):
    def failing(frames, windows=None, live=True):
        yield from ()
        raise DeviceFailed("cpu", "error", "RuntimeError: the CNN's interpreter failed")

    monkeypatch.setattr(service.captioner, "run_frames", failing)
    with caplog.at_level(logging.ERROR, logger="edgecap"):
        assert service.run() == 1
    assert any("cpu: error" in r.getMessage() and "restart" in r.getMessage() for r in caplog.records)


def test_a_stop_exits_0(service, monkeypatch):
    def ends_at_stop(frames, windows=None, live=True):
        threading.Timer(0.05, service.stop).start()
        for _ in frames:  # the cameras' frames end when the service stops
            pass
        yield from ()

    monkeypatch.setattr(service.captioner, "run_frames", ends_at_stop)
    assert service.run() == 0


def test_a_hung_pipeline_is_cancelled_by_the_drain_timer(service, monkeypatch, caplog):
    budget, guard_s = 0.4, 8.0
    monkeypatch.setattr(service_module, "STOP_BUDGET_S", budget)
    closed = threading.Event()
    real_close = service.captioner.close

    def close():
        closed.set()
        real_close()

    gave_up = []

    def hung(frames, windows=None, live=True):
        # A stage stuck in its device: nothing comes out until the captioner is closed.
        threading.Timer(0.05, service.stop).start()  # SIGTERM arrives meanwhile
        if not closed.wait(guard_s):
            gave_up.append(True)
            return
        raise RunCancelled("the pipeline was closed")
        yield

    monkeypatch.setattr(service.captioner, "close", close)
    monkeypatch.setattr(service.captioner, "run_frames", hung)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        code = service.run()
    took = time.monotonic() - t0
    assert not gave_up, "the drain timer never closed the hung pipeline"
    assert code == 0 and took < guard_s / 2, took
    assert any("did not drain" in r.getMessage() for r in caplog.records)


class RecordingNotifier(Notifier):
    """systemd's side: records what the service says, with a watchdog period of 50 ms."""

    def __init__(self) -> None:
        super().__init__({})
        self.sent: list = []

    def notify(self, *fields: str) -> bool:
        self.sent.append((time.monotonic(), fields))
        return True

    def watchdog_interval(self) -> float:
        return 0.05

    def times(self, field: str) -> list:
        return [t for t, fields in self.sent if field in fields]


def test_the_loop_tells_systemd_ready_pings_the_watchdog_and_says_stopping(tmp_path, shipped_bundle):
    config = tmp_path / "edgecap.toml"
    config.write_text("\n".join([
        f'bundle = "{shipped_bundle}"', "", "[http]", 'address = "127.0.0.1"', "port = 0", "",
        "[[cameras]]", 'name = "front"', f'source = "{SAMPLE}"', "stall_seconds = 30.0", ""]))
    notifier = RecordingNotifier()
    svc = Service(load_config(config), notifier=notifier, stdout=io.StringIO())
    image = np.zeros((48, 64, 3), np.uint8)
    first_frame = []

    def run_frames(frames, windows=None, live=True):
        for i in range(40):  # heartbeats, then frames, every 10 ms
            if i == 20:
                first_frame.append(time.monotonic())
            frame = Frame(i, i / 8.0, image) if i >= 20 else None
            yield FrameResult("front", frame, [], {"cpu": 1.0} if frame is not None else {})
            time.sleep(0.01)

    try:
        svc.captioner.run_frames = run_frames
        t0 = time.monotonic()
        assert svc.run() == 0
        end = time.monotonic()
    finally:
        svc.close()
    (ready,) = notifier.times("READY=1")
    assert ready >= first_frame[0]  # not before a frame went through (the camera's stall is 30 s)
    pings = notifier.times("WATCHDOG=1")
    assert len(pings) >= 3 and pings[0] - t0 < 0.5, pings
    # At its period, not per result (every 10 ms): the loop times a ping by the result before it and
    # the notifier by the call, so on a loaded host one gap may come in a little under 50 ms.
    assert all(b - a >= 0.03 for a, b in zip(pings, pings[1:])), np.diff(pings)
    assert len(pings) <= (end - t0) / 0.05 + 1
    status = [fields for _, fields in notifier.sent if any(f.startswith("STATUS=") for f in fields)]
    assert status and "front" in " ".join(status[0])
    (stopping,) = notifier.times("STOPPING=1")
    assert stopping >= pings[-1]


def test_a_cpu_step_that_raises_ends_the_service_with_one_line_and_exit_1(tmp_path, shipped_bundle,
                                                                         monkeypatch, caplog):
    # The real captioner, whose RNN step raises mid-run: every camera's run fails, so the service
    # exits 1 through its drain (STOPPING=1, the captioner closed) for systemd to restart it.
    from edgecap.rnn import RnnEncoder

    calls = []
    real = RnnEncoder.step

    def step(self, feature, state):
        calls.append(1)
        if len(calls) == 9:  # mid-run: the first window's steps went through
            raise RuntimeError("tensor arena exhausted")
        return real(self, feature, state)

    config = tmp_path / "edgecap.toml"
    config.write_text("\n".join([
        f'bundle = "{shipped_bundle}"', "", "[http]", 'address = "127.0.0.1"', "port = 0", "",
        "[[cameras]]", 'name = "front"', f'source = "{SAMPLE}"', "loop = true", "stall_seconds = 5.0", ""]))
    notifier = RecordingNotifier()
    svc = Service(load_config(config), notifier=notifier, stdout=io.StringIO())
    # After the start: the host rule times the RNN step as the captioner starts.
    monkeypatch.setattr(RnnEncoder, "step", step)
    try:
        with caplog.at_level(logging.INFO, logger="edgecap"):
            assert svc.run() == 1
    finally:
        svc.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and not errors[0].exc_info, errors
    message = errors[0].getMessage()
    assert "rnn_step on cpu failed at run time: RuntimeError: tensor arena exhausted" in message
    assert "\n" not in message and "restart" in message
    assert notifier.times("STOPPING=1")
