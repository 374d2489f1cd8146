"""ServiceState: what the service writes is what HTTP reads, health says why, writers never race."""

from __future__ import annotations

import json
import threading
from typing import List

import pytest

from edgecap.captioner import Caption
from edgecap.service.state import ServiceState


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def caption(text: str, window: int = 0) -> Caption:
    return Caption(text=text, tokens=[4, 5], window=window, start_frame=8 * window,
                   end_frame=8 * window + 7, start_time=0.5 * window, end_time=0.5 * window + 0.45,
                   stage_ms={"cnn": 12.5}, latency_ms=140.0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def state(clock: FakeClock) -> ServiceState:
    return ServiceState(["front", "back"], recent=3, clock=clock)


def test_snapshot_is_json_ready_and_holds_what_was_written(state: ServiceState, clock: FakeClock) -> None:
    state.set_camera("front", "online")
    state.frame("front", b"\xff\xd8jpeg", 1.25)
    clock.now += 2.0
    state.caption("front", caption("a man is playing a guitar"))
    state.pipeline("front", {"fps_in": 15.0, "fps_out": 7.5, "dropped": 2, "latency_ms": {"p50": 140.0}})
    state.devices([{"device": "tpu:0", "kind": "pci", "busy": 0.6, "temperature_c": 47.5}])
    clock.now += 1.0

    snap = json.loads(json.dumps(state.snapshot()))

    assert list(snap["cameras"]) == ["front", "back"]
    front = snap["cameras"]["front"]
    assert front["status"] == "online" and front["frame_seq"] == 1 and front["frame_t"] == 1.25
    assert front["frame_age_s"] == pytest.approx(3.0) and front["caption_age_s"] == pytest.approx(1.0)
    assert front["pipeline"]["fps_out"] == 7.5 and front["captions"] == 1
    assert snap["captions"]["front"][0]["text"] == "a man is playing a guitar"
    assert snap["captions"]["front"][0]["camera"] == "front"
    assert snap["captions"]["back"] == []
    back = snap["cameras"]["back"]
    assert back["status"] == "starting" and back["frame_age_s"] is None and back["caption_age_s"] is None
    # Missing device keys read as None: the page and /healthz see one shape.
    assert snap["devices"] == [{"device": "tpu:0", "kind": "pci", "busy": 0.6,
                                "temperature_c": 47.5, "throttled": None, "predicted_ms": None,
                                "measured_ms": None, "compute_scale": None}]
    assert snap["uptime_s"] == pytest.approx(3.0)


def test_recent_keeps_the_last_n_newest_first_and_captions_gives_the_latest(state: ServiceState) -> None:
    for i in range(5):
        state.caption("front", caption(f"caption {i}", window=i))
    assert [c["text"] for c in state.snapshot()["captions"]["front"]] == ["caption 4", "caption 3", "caption 2"]
    assert state.snapshot()["cameras"]["front"]["captions"] == 5
    latest = state.captions()
    assert latest["front"]["text"] == "caption 4" and latest["front"]["window"] == 4
    assert latest["back"] is None


def test_latest_jpeg_is_the_last_frame_and_frame_seq_counts(state: ServiceState) -> None:
    assert state.latest_jpeg("front") is None
    state.frame("front", b"one", 0.0)
    state.frame("front", bytearray(b"two"), 0.1)
    assert state.latest_jpeg("front") == b"two"
    assert state.snapshot()["cameras"]["front"]["frame_seq"] == 2


def test_version_moves_on_every_write_and_not_on_reads(state: ServiceState) -> None:
    v0 = state.version
    state.snapshot(), state.captions(), state.health(60.0), state.latest_jpeg("front")
    assert state.version == v0
    state.frame("back", b"x", 0.0)
    assert state.version == v0 + 1


def test_health_names_cameras_not_online(state: ServiceState) -> None:
    ok, reason = state.health(60.0)
    assert not ok and "camera front starting" in reason and "camera back starting" in reason
    state.set_camera("front", "online")
    state.set_camera("back", "offline", "no frame for 20 s")
    ok, reason = state.health(60.0)
    assert not ok
    assert reason == "camera back offline: no frame for 20 s"


def test_health_turns_bad_when_an_online_camera_stays_silent(state: ServiceState, clock: FakeClock) -> None:
    state.set_camera("front", "online")
    state.set_camera("back", "online")
    assert state.health(60.0) == (True, "ok")  # just came online: it gets time to fill a window
    clock.now += 50
    state.caption("front", caption("a"))
    clock.now += 20  # back: 70 s online without a caption; front: 20 s since its last
    ok, reason = state.health(60.0)
    assert not ok and reason == "camera back: no caption for 70 s (limit 60 s)"
    state.caption("back", caption("b"))
    assert state.health(60.0) == (True, "ok")
    clock.now += 61
    ok, reason = state.health(60.0)
    assert "camera front: no caption" in reason and "camera back: no caption" in reason


def test_a_reconnected_camera_gets_a_fresh_grace_period(state: ServiceState, clock: FakeClock) -> None:
    state.set_camera("front", "online")
    state.set_camera("back", "online")
    state.caption("front", caption("a"))
    state.caption("back", caption("b"))
    state.set_camera("back", "offline", "stalled")
    clock.now += 300
    state.caption("front", caption("a2"))
    state.set_camera("back", "online")
    assert state.health(60.0) == (True, "ok")
    state.set_camera("back", "online")  # a repeated status is not a new transition
    clock.now += 61
    state.caption("front", caption("a3"))
    assert state.health(60.0)[1] == "camera back: no caption for 61 s (limit 60 s)"


def test_bad_calls_fail_loudly() -> None:
    with pytest.raises(ValueError, match="repeat"):
        ServiceState(["a", "a"])
    with pytest.raises(ValueError, match="no camera"):
        ServiceState([])
    state = ServiceState(["a"])
    with pytest.raises(KeyError, match="unknown camera 'b'"):
        state.frame("b", b"", 0.0)
    with pytest.raises(ValueError, match="camera status 'up'"):
        state.set_camera("a", "up")


def test_concurrent_writers_and_readers_lose_nothing() -> None:
    state = ServiceState(["c0", "c1", "c2", "c3"], recent=5)
    n = 500
    errors: List[BaseException] = []
    stop = threading.Event()

    def write(cam: str) -> None:
        for i in range(n):
            state.frame(cam, bytes([i % 256]), i / 15)
            state.caption(cam, caption(f"{cam} {i}", window=i))
            state.pipeline(cam, {"fps_in": float(i)})
            state.devices([{"device": "cpu", "busy": i / n}])

    def read() -> None:
        try:
            while not stop.is_set():
                snap = state.snapshot()
                json.dumps(snap)
                for cam, caps in snap["captions"].items():
                    windows = [c["window"] for c in caps]
                    assert windows == sorted(windows, reverse=True)
                state.health(60.0)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(2)]
    writers = [threading.Thread(target=write, args=(c,)) for c in state.cameras]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not errors
    snap = state.snapshot()
    for cam in state.cameras:
        assert snap["cameras"][cam]["frame_seq"] == n
        assert snap["cameras"][cam]["captions"] == n
        assert snap["captions"][cam][0]["text"] == f"{cam} {n - 1}"
    assert snap["version"] == 4 * 4 * n
