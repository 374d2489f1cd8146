"""The MQTT sink against a real mosquitto broker on 127.0.0.1, started, stopped and restarted by the tests.

`.ci/run` installs mosquitto (and openssl, which makes the throwaway CA and
certificates of the TLS tests); where one is absent its tests skip and say so.
Subscribers that must not miss messages while the broker is down use a
persistent session (clean_session=False, QoS 1) on a broker with persistence,
so that no test depends on who reconnects first.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

paho = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt is in the service extra: pip install -e .[service]")

import msgspec  # noqa: E402

from edgecap.captioner import Caption  # noqa: E402
from edgecap.errors import ConfigError  # noqa: E402
from edgecap.service.config import JsonlSinkConfig, MqttSinkConfig, SinksConfig, load_config  # noqa: E402
from edgecap.events import Event  # noqa: E402
from edgecap.service.sinks import (  # noqa: E402
    JsonlSink, MqttSink, SinkSet, discovery_configs, discovery_id, open_sinks, tls_context, topic_level)

REPO = Path(__file__).resolve().parent.parent
MOSQUITTO = shutil.which("mosquitto") or next(
    (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None)
pytestmark = pytest.mark.skipif(
    MOSQUITTO is None, reason="mosquitto is not installed (apt-get install mosquitto; .ci/run does)")

FAST = (0.1, 0.5)  # reconnect backoff for tests: first and longest wait (s)


def make_caption(window: int = 0) -> Caption:
    return Caption(text=f"caption {window}", tokens=[1, 2], window=window, start_frame=window * 8,
                   end_frame=window * 8 + 7, start_time=float(window), end_time=window + 0.88)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Broker:
    """A mosquitto process on 127.0.0.1:port that a test can stop and start again.

    Args:
      directory: Where its config, log and session store go.
      listener: Lines for the listener (cafile, certfile, ... for TLS).
    """

    def __init__(self, directory: Path, listener: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: Optional[subprocess.Popen] = None
        self.config = directory / "mosquitto.conf"
        lines = [f"listener {self.port} 127.0.0.1", *listener, "allow_anonymous true",
                 "persistence true", f"persistence_location {directory}/", "log_dest stderr",
                 "log_type error", "log_type warning", "log_type notice"]
        if os.geteuid() == 0:
            lines.append("user root")  # else it drops to `mosquitto`, who cannot write tmp_path
        self.config.write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        log = open(self.directory / "mosquitto.log", "ab")
        self.process = subprocess.Popen([MOSQUITTO, "-c", str(self.config)], stdout=log, stderr=log)
        log.close()

        def listening() -> bool:
            assert self.process.poll() is None, (self.directory / "mosquitto.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                return False

        wait_for(listening, 5.0, "mosquitto to listen")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # SIGTERM: closes client connections, saves the session store
            self.process.wait(5)
        self.process = None


@pytest.fixture
def broker(tmp_path):
    if MOSQUITTO is None:  # test_serve uses it too, without this module's skip mark
        pytest.skip("mosquitto is not installed (apt-get install mosquitto; .ci/run does)")
    b = Broker(tmp_path)
    b.start()
    yield b
    b.stop()


@pytest.fixture
def stopped_broker(tmp_path):
    b = Broker(tmp_path)
    yield b
    b.stop()


class Subscriber:
    """A paho client of the test that collects what arrives on `{prefix}/#`."""

    def __init__(self, port: int, prefix: str, client_id: Optional[str] = None, persistent: bool = False,
                 pki: Optional[Path] = None):
        self.port, self.prefix = port, prefix
        self.messages: "queue.Queue[Tuple[str, bytes, bool]]" = queue.Queue()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2,
                                  client_id=client_id or f"test-{uuid.uuid4().hex[:8]}",
                                  clean_session=not persistent)
        if pki is not None:  # over TLS, with the client certificate
            self.client.tls_set(ca_certs=str(pki / "ca.crt"), certfile=str(pki / "client.crt"),
                                keyfile=str(pki / "client.key"))
        self.client.on_message = lambda c, u, m: self.messages.put((m.topic, m.payload, m.retain))
        self.subscribed = queue.Queue()
        self.client.on_subscribe = lambda *args: self.subscribed.put(True)

    def connect(self) -> "Subscriber":
        self.client.connect("127.0.0.1", self.port)
        self.client.loop_start()
        self.client.subscribe(f"{self.prefix}/#", qos=1)
        self.subscribed.get(timeout=5)
        return self

    def disconnect(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def next(self, topic: str, timeout: float = 5.0) -> Tuple[str, bool]:
        """The next payload on `topic` (others are skipped), as text, with its retain flag."""
        payload, retain = self.next_bytes(topic, timeout)
        return payload.decode(), retain

    def next_bytes(self, topic: str, timeout: float = 5.0) -> Tuple[bytes, bool]:
        """The next payload on `topic` (others are skipped), with its retain flag."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                got, payload, retain = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"nothing on {topic} within {timeout}s") from None
            if got == topic:
                return payload, retain

    def captions(self, n: int, timeout: float = 5.0) -> List[dict]:
        return [json.loads(self.next(f"{self.prefix}/front/caption", timeout)[0]) for _ in range(n)]

    def new_windows(self, n: int, seen: set, timeout: float = 5.0) -> List[int]:
        """The next `n` caption windows not in `seen`, in order of arrival.

        QoS 1 is at-least-once: a message whose PUBACK was cut off by a
        disconnect comes again after the reconnect, and that is no loss.
        """
        windows: List[int] = []
        while len(windows) < n:
            window = self.captions(1, timeout)[0]["window"]
            if window not in seen and window not in windows:
                windows.append(window)
        return windows


def sink_config(port: int, prefix: str, **kw) -> MqttSinkConfig:
    return MqttSinkConfig(host="127.0.0.1", port=port, topic_prefix=prefix,
                          client_id=f"edgecap-test-{uuid.uuid4().hex[:8]}", **kw)


def retained(port: int, topic: str) -> str:
    """What a new subscriber is told on `topic` (its retained message)."""
    sub = Subscriber(port, topic.rsplit("/", 1)[0]).connect()
    try:
        return sub.next(topic, 3.0)[0]
    finally:
        sub.disconnect()


def test_captions_and_stats_reach_a_subscriber(broker):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    sub = Subscriber(broker.port, prefix).connect()
    sink = MqttSink(sink_config(broker.port, prefix, stats_interval_seconds=60.0), reconnect_delay=FAST)
    try:
        assert sub.next(f"{prefix}/availability") == ("online", False)
        sink.caption("front", make_caption(0))
        sink.caption("front", make_caption(1))
        got = sub.captions(2)
        assert [c["window"] for c in got] == [0, 1]
        assert got[0]["camera"] == "front" and got[0]["text"] == "caption 0"
        assert {k: v for k, v in got[1].items() if k not in ("camera", "time")} == make_caption(1).to_dict()

        sink.stats({"cameras": {"front": {"fps_out": 7.5}}})
        sink.stats({"cameras": {"front": {"fps_out": 0.0}}})  # within the interval: not sent
        sink.caption("front", make_caption(2))
        assert json.loads(sub.next(f"{prefix}/stats")[0]) == {"cameras": {"front": {"fps_out": 7.5}}}
        assert sub.captions(1)[0]["window"] == 2
        assert sub.messages.empty()
        counters = sink.counters()
        assert counters["connected"] and counters["published"] == 5 and counters["dropped"] == 0
    finally:
        sink.close()
        sub.disconnect()


def test_availability_is_retained_online_then_offline_after_close(broker):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    sink = MqttSink(sink_config(broker.port, prefix), reconnect_delay=FAST)
    wait_for(lambda: sink.connected, 5.0, "the sink to connect")
    assert retained(broker.port, f"{prefix}/availability") == "online"
    started = time.monotonic()
    sink.close(timeout=2.0)
    assert time.monotonic() - started < 2.0
    assert retained(broker.port, f"{prefix}/availability") == "offline"
    sink.caption("front", make_caption())  # after close: ignored, never raises


def test_last_will_says_offline_when_the_process_dies(broker):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    sub = Subscriber(broker.port, prefix).connect()
    script = textwrap.dedent(f"""
        import sys, time
        from edgecap.service.config import MqttSinkConfig
        from edgecap.service.sinks import MqttSink
        sink = MqttSink(MqttSinkConfig(host="127.0.0.1", port={broker.port}, topic_prefix="{prefix}",
                                       client_id="edgecap-victim"))
        while not sink.connected:
            time.sleep(0.01)
        print("up", flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        assert sub.next(f"{prefix}/availability") == ("online", False)
        os.kill(child.pid, signal.SIGKILL)  # no clean disconnect: only the broker's will speaks
        child.wait(5)
        assert sub.next(f"{prefix}/availability") == ("offline", False)
        assert retained(broker.port, f"{prefix}/availability") == "offline"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        sub.disconnect()


def test_broker_down_at_start_buffers_and_delivers_when_it_comes_up(stopped_broker):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    # A persistent subscription the broker keeps while it is down.
    stopped_broker.start()
    sub = Subscriber(stopped_broker.port, prefix, client_id="watcher", persistent=True).connect()
    sub.disconnect()
    stopped_broker.stop()

    sink = MqttSink(sink_config(stopped_broker.port, prefix, buffer=3), reconnect_delay=FAST)
    started = time.monotonic()
    for window in range(5):  # never blocks, never raises; the oldest two are dropped
        sink.caption("front", make_caption(window))
    assert time.monotonic() - started < 0.5
    counters = sink.counters()
    assert (counters["connected"], counters["buffered"], counters["dropped"]) == (False, 3, 2)

    stopped_broker.start()
    wait_for(lambda: sink.connected, 5.0, "the sink to reconnect")
    sub = Subscriber(stopped_broker.port, prefix, client_id="watcher", persistent=True)
    sub.client.connect("127.0.0.1", stopped_broker.port)
    sub.client.loop_start()
    try:
        assert [c["window"] for c in sub.captions(3)] == [2, 3, 4]
        counters = sink.counters()
        assert (counters["buffered"], counters["dropped"], counters["published"]) == (0, 2, 4)  # + online
    finally:
        sink.close()
        sub.disconnect()


def test_broker_restart_mid_run_the_sink_recovers_and_other_sinks_keep_going(broker, tmp_path):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    sub = Subscriber(broker.port, prefix, client_id="watcher2", persistent=True).connect()
    mqtt = MqttSink(sink_config(broker.port, prefix), reconnect_delay=FAST)
    jsonl = JsonlSink(tmp_path / "captions.jsonl")
    sinks = SinkSet([mqtt, jsonl])
    try:
        wait_for(lambda: mqtt.connected, 5.0, "the sink to connect")
        sinks.caption("front", make_caption(0))
        assert sub.captions(1)[0]["window"] == 0
        sub.disconnect()

        broker.stop()
        wait_for(lambda: not mqtt.connected, 5.0, "the sink to notice the broker left")
        started = time.monotonic()
        for window in (1, 2, 3):
            sinks.caption("front", make_caption(window))
        assert time.monotonic() - started < 0.5
        lines = (tmp_path / "captions.jsonl").read_text().splitlines()
        assert [json.loads(x)["window"] for x in lines] == [0, 1, 2, 3]  # the file sink never paused

        broker.start()
        wait_for(lambda: mqtt.connected, 5.0, "the sink to reconnect")
        sub = Subscriber(broker.port, prefix, client_id="watcher2", persistent=True)
        sub.client.connect("127.0.0.1", broker.port)
        sub.client.loop_start()
        assert sub.new_windows(3, seen={0}) == [1, 2, 3]
        sinks.caption("front", make_caption(4))
        assert sub.new_windows(1, seen={0, 1, 2, 3}) == [4]
        assert mqtt.counters()["connects"] == 2
        assert sinks.counters()["mqtt"]["failures"] == 0
    finally:
        sinks.close()
        sub.disconnect()
    assert retained(broker.port, f"{prefix}/availability") == "offline"


# --- events and Home Assistant discovery ----------------------------------------------------

# Not real JPEGs: bytes that are not UTF-8, which the sink must carry untouched.
JPEG_A = b"\xff\xd8\xff\xe0 thumbnail A \x00\x80\xff\xd9"
JPEG_B = b"\xff\xd8\xff\xe0 thumbnail B \x00\x81\xff\xd9"


def make_event(camera: str = "front", start: float = 1000.0, windows: int = 1, text: str = "a red star",
               thumbnail: bytes = JPEG_A, closed: bool = False) -> Event:
    return Event(id=f"{camera}@{int(start * 1000)}", camera=camera, text=text, start_time=start,
                 end_time=start + 0.88 * windows, confidence=-0.4213, windows=windows, thumbnail=thumbnail,
                 closed=closed)


def record(event: Event, change: str) -> dict:
    """What a subscriber must read on the event topic: the event's fields and the change."""
    return {**event.to_dict(), "change": change}


def retained_message(port: int, topic: str, timeout: float = 3.0) -> Tuple[bytes, bool]:
    """What a new subscriber is told on `topic`, with the retain flag it carries."""
    sub = Subscriber(port, topic).connect()  # `topic/#` matches `topic` too
    try:
        return sub.next_bytes(topic, timeout)
    finally:
        sub.disconnect()


def retained_under(port: int, prefix: str, count: int, timeout: float = 5.0) -> Dict[str, Tuple[bytes, bool]]:
    """The retained messages a new subscriber to `prefix/#` is told, waiting for `count` of them."""
    sub = Subscriber(port, prefix).connect()
    got: Dict[str, Tuple[bytes, bool]] = {}
    try:
        deadline = time.monotonic() + timeout
        while len(got) < count:
            try:
                topic, payload, retain = sub.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{len(got)} of {count} retained messages under {prefix}/: {sorted(got)}")
            got[topic] = (payload, retain)
    finally:
        sub.disconnect()
    return got


def test_events_publish_on_change_only_retained_with_their_thumbnail(broker):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    sub = Subscriber(broker.port, prefix).connect()
    sink = MqttSink(sink_config(broker.port, prefix, discovery=False), reconnect_delay=FAST)
    events, thumbnails = f"{prefix}/front/event", f"{prefix}/front/event/thumbnail"
    try:
        assert sub.next(f"{prefix}/availability") == ("online", False)
        opened = make_event()
        sink.event("front", opened, "opened")
        # The thumbnail first, so that whoever reacts to the event finds it.
        assert sub.messages.get(timeout=5) == (thumbnails, JPEG_A, False)
        topic, payload, _ = sub.messages.get(timeout=5)
        assert (topic, json.loads(payload)) == (events, record(opened, "opened"))
        assert json.loads(payload) == {
            "id": "front@1000000", "camera": "front", "text": "a red star", "start_time": 1000.0,
            "end_time": 1000.88, "confidence": -0.4213, "windows": 1, "has_thumbnail": True, "closed": False,
            "change": "opened"}
        published = sink.counters()["published"]

        for windows in (2, 3):  # a window more of the same: nothing
            sink.event("front", make_event(windows=windows), "extended")
        assert sink.counters()["published"] == published
        closed = make_event(windows=4, closed=True)
        sink.event("front", closed, "closed")
        # The very next message is the close: "extended" sent nothing, the same thumbnail is not sent again.
        topic, payload, _ = sub.messages.get(timeout=5)
        assert (topic, json.loads(payload)) == (events, record(closed, "closed"))
        assert sink.counters()["published"] == published + 1

        following = make_event(start=1003.52, text="a blue circle", thumbnail=JPEG_B)
        sink.event("front", following, "opened")
        assert sub.messages.get(timeout=5) == (thumbnails, JPEG_B, False)
        topic, payload, _ = sub.messages.get(timeout=5)
        assert (topic, json.loads(payload)) == (events, record(following, "opened"))

        # Retained: a subscriber that comes later (Home Assistant after a restart) reads the camera's state.
        payload, retain = retained_message(broker.port, events)
        assert (json.loads(payload), retain) == (record(following, "opened"), True)
        assert retained_message(broker.port, thumbnails) == (JPEG_B, True)

        # An event without a thumbnail clears the last one: no other event's picture stands for it.
        bare = make_event(start=1007.04, text="an empty room", thumbnail=b"")
        sink.event("front", bare, "opened")
        assert sub.messages.get(timeout=5) == (thumbnails, b"", False)
        topic, payload, _ = sub.messages.get(timeout=5)
        assert (topic, json.loads(payload)["has_thumbnail"]) == (events, False)
        assert sink.counters()["dropped"] == 0 and sink.counters()["errors"] == 0
    finally:
        sink.close()
        sub.disconnect()


def test_events_wait_for_the_broker_in_order_with_only_the_newest_thumbnail(stopped_broker):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    stopped_broker.start()
    sub = Subscriber(stopped_broker.port, prefix, client_id="event-watcher", persistent=True).connect()
    sub.disconnect()
    stopped_broker.stop()

    sink = MqttSink(sink_config(stopped_broker.port, prefix, discovery=False), reconnect_delay=FAST)
    first = make_event(text="a red star", thumbnail=JPEG_A)
    second = make_event(start=1002.0, text="a blue circle", thumbnail=JPEG_B)
    sink.event("front", first, "opened")
    sink.event("front", make_event(windows=2), "extended")
    sink.event("front", make_event(windows=2, closed=True), "closed")
    sink.event("front", second, "opened")
    # Three changes wait in order; thumbnail A gave way to B, which is no loss.
    counters = sink.counters()
    assert (counters["connected"], counters["buffered"], counters["dropped"]) == (False, 4, 0)

    stopped_broker.start()
    wait_for(lambda: sink.connected, 5.0, "the sink to reconnect")
    sub = Subscriber(stopped_broker.port, prefix, client_id="event-watcher", persistent=True)
    sub.client.connect("127.0.0.1", stopped_broker.port)
    sub.client.loop_start()
    try:
        got: List[Tuple[str, bytes]] = []
        while len(got) < 4:
            topic, payload, _ = sub.messages.get(timeout=5)
            if topic != f"{prefix}/availability":
                got.append((topic, payload))
        events, thumbnails = f"{prefix}/front/event", f"{prefix}/front/event/thumbnail"
        assert [topic for topic, _ in got] == [events, events, thumbnails, events]
        assert [json.loads(p) for t, p in got if t == events] == [
            record(first, "opened"), record(make_event(windows=2, closed=True), "closed"), record(second, "opened")]
        assert got[2][1] == JPEG_B
        assert sink.counters()["buffered"] == 0
        assert retained_message(stopped_broker.port, thumbnails) == (JPEG_B, True)
    finally:
        sink.close()
        sub.disconnect()


# What Home Assistant accepts, from its MQTT integration (homeassistant/components/mqtt):
# discovery.py's TOPIC_MATCHER for the topic; schemas.py, sensor.py and image.py for the keys. Its
# discovery schemas drop unknown keys without a word, so a misspelt key must fail here instead.
HA_DISCOVERY_TOPIC = re.compile(r"(?P<component>\w+)/(?:(?P<node_id>[a-zA-Z0-9_-]+)/)?"
                                r"(?P<object_id>[a-zA-Z0-9_-]+)/config")
HA_ENTITY_KEYS = {"name", "unique_id", "object_id", "icon", "qos", "encoding", "device", "origin",
                  "availability_topic", "availability", "availability_mode", "availability_template",
                  "payload_available", "payload_not_available", "json_attributes_topic",
                  "json_attributes_template", "enabled_by_default", "entity_category", "entity_picture"}
HA_KEYS = {
    "sensor": HA_ENTITY_KEYS | {"state_topic", "value_template", "device_class", "state_class",
                                "unit_of_measurement", "force_update", "expire_after",
                                "last_reset_value_template", "suggested_display_precision", "options"},
    "image": HA_ENTITY_KEYS | {"image_topic", "url_topic", "content_type", "image_encoding", "url_template"},
}
HA_DEVICE_KEYS = {"identifiers", "connections", "manufacturer", "model", "name", "hw_version", "serial_number",
                  "sw_version", "via_device", "suggested_area", "configuration_url"}
HA_MAX_STATE = 255  # homeassistant.const.MAX_LENGTH_STATE_STATE


def ha_topic(topic: str) -> None:
    """Home Assistant's util.valid_topic: UTF-8, no NUL, control characters or non-characters; no wildcards."""
    assert topic and len(topic.encode("utf-8")) <= 65535
    assert not any(c <= "\u001f" or "\u007f" <= c <= "\u009f" or "\ufdd0" <= c <= "\ufdef"
                   or (ord(c) & 0xFFFF) in (0xFFFE, 0xFFFF) for c in topic), topic
    assert "+" not in topic and "#" not in topic, topic


def check_home_assistant_accepts(prefix: str, topic: str, payload: bytes) -> Tuple[str, dict]:
    """Checks one discovery message as Home Assistant reads it; returns its component and config."""
    assert topic.startswith("homeassistant/")
    match = HA_DISCOVERY_TOPIC.fullmatch(topic[len("homeassistant/"):])
    assert match and match["node_id"], f"Home Assistant ignores {topic}"
    component, config = match["component"], json.loads(payload)
    assert component in HA_KEYS
    assert set(config) <= HA_KEYS[component], set(config) - HA_KEYS[component]
    assert isinstance(config["unique_id"], str) and config["unique_id"]
    assert isinstance(config["name"], str) and config["name"]
    assert (config["availability_topic"], config["payload_available"], config["payload_not_available"]) == \
        (f"{prefix}/availability", "online", "offline")
    assert set(config["device"]) <= HA_DEVICE_KEYS and config["device"]["identifiers"]
    assert all(isinstance(i, str) and i for i in config["device"]["identifiers"])
    assert isinstance(config["origin"]["name"], str) and config["origin"]["name"]
    if component == "sensor":
        for key in ("state_topic", "json_attributes_topic"):
            ha_topic(config[key])
    else:
        ha_topic(config["image_topic"])
        assert "url_topic" not in config and config["content_type"] == "image/jpeg"
    return component, config


def render(template: str, payload: bytes) -> str:
    """A value_template rendered as Home Assistant does: Jinja2, sandboxed, `value_json` the parsed payload."""
    jinja2 = pytest.importorskip("jinja2.sandbox", reason="jinja2 is in the dev extra: pip install -e .[dev]")
    return jinja2.ImmutableSandboxedEnvironment().from_string(template).render(
        value=payload.decode(), value_json=json.loads(payload))


CAMERAS = ["front", "back door", "café", "cafe", "门", "窗", "a/b+c#d", ""]


def test_camera_names_become_valid_topic_levels_and_home_assistant_ids():
    assert [topic_level(name) for name in CAMERAS] == [
        "front", "back door", "café", "cafe", "门", "窗", "a_b_c_d", "_"]
    assert topic_level("line\nbreak\x00\x7f\ufdd0\ufffe\ud800") == "line_break_____"
    ids = [discovery_id(name) for name in CAMERAS]
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]+", i) for i in ids), ids
    assert len(set(ids)) == len(CAMERAS)  # café and cafe, 门 and 窗 stay apart
    assert ids[0] == "front" and ids[3] == "cafe"  # a name that is an id already stays itself
    assert re.fullmatch(r"back_door_[0-9a-f]{8}", ids[1]) and re.fullmatch(r"cafe_[0-9a-f]{8}", ids[2])
    assert re.fullmatch(r"[0-9a-f]{8}", ids[4]), ids[4]


def test_discovery_configs_are_what_home_assistant_accepts():
    seen = set()
    for camera in CAMERAS:
        configs = discovery_configs("homeassistant", "house/edgecap", "edgecap-board1", camera)
        assert [component for component, _ in (check_home_assistant_accepts(
            "house/edgecap", topic, json.dumps(config).encode()) for topic, config in configs)] == ["sensor", "image"]
        sensor, image = (config for _, config in configs)
        level = topic_level(camera)
        assert sensor["state_topic"] == sensor["json_attributes_topic"] == f"house/edgecap/{level}/event"
        assert image["image_topic"] == f"house/edgecap/{level}/event/thumbnail"
        assert sensor["device"] == image["device"]  # one device per camera, both entities on it
        seen.update(config["unique_id"] for _, config in configs)
        # The state is the caption, cut to what a state holds; the whole record is in the attributes.
        long = make_event(camera=camera, text="a red star " * 30)
        payload = json.dumps(record(long, "opened"), ensure_ascii=False).encode()
        assert render(sensor["value_template"], payload) == long.text[:HA_MAX_STATE]
        assert render(sensor["value_template"], json.dumps(record(make_event(), "closed")).encode()) == "a red star"
    assert len(seen) == 2 * len(CAMERAS)


def test_discovery_is_retained_on_connect_and_sent_again_when_the_broker_lost_it(broker):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    cameras = ["front", "back door", "门"]
    settings = sink_config(broker.port, prefix)
    node = discovery_id(settings.client_id)
    sink = MqttSink(settings, reconnect_delay=FAST, cameras=cameras)
    expected = {topic: config for camera in cameras
                for topic, config in discovery_configs("homeassistant", prefix, node, camera)}
    try:
        wait_for(lambda: sink.connected, 5.0, "the sink to connect")
        got = retained_under(broker.port, "homeassistant", len(expected))
        assert set(got) == set(expected)
        for topic, (payload, retain) in got.items():
            assert retain and json.loads(payload) == expected[topic]
            check_home_assistant_accepts(prefix, topic, payload)
        assert retained(broker.port, f"{prefix}/availability") == "online"  # so the entities are available

        # The broker restarts without its store (a new broker, a wiped volume): the next connect re-announces.
        broker.stop()
        store = broker.directory / "mosquitto.db"
        assert store.exists()
        store.unlink()
        broker.start()
        wait_for(lambda: sink.counters()["connects"] == 2 and sink.connected, 10.0, "the sink to reconnect")
        got = retained_under(broker.port, "homeassistant", len(expected))
        assert {topic: json.loads(payload) for topic, (payload, _) in got.items()} == expected

        # A camera first met by its event (the Python API) is announced then, before its state.
        sink.event("porch", make_event(camera="porch"), "opened")
        porch = dict(discovery_configs("homeassistant", prefix, node, "porch"))
        got = retained_under(broker.port, "homeassistant", len(expected) + 2)
        assert {t: json.loads(p) for t, (p, _) in got.items() if t in porch} == porch
        # Its sensor's state topic holds what Home Assistant shows: the caption.
        sensor = porch[f"homeassistant/sensor/{node}/porch_caption/config"]
        payload, _ = retained_message(broker.port, sensor["state_topic"])
        assert render(sensor["value_template"], payload) == "a red star"
    finally:
        sink.close()


def test_the_last_event_and_thumbnail_are_retained_again_after_a_broker_forgot_them(broker):
    # Before: a broker restarted without its store lost the retained event and thumbnail, and a
    # camera whose event did not change never sent them again (Home Assistant showed "unknown").
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    sink = MqttSink(sink_config(broker.port, prefix), reconnect_delay=FAST)
    try:
        wait_for(lambda: sink.connected, 5.0, "the sink to connect")
        event = make_event(thumbnail=b"\xff\xd8jpeg\xff\xd9")
        sink.event("front", event, "opened")
        assert retained_message(broker.port, f"{prefix}/front/event")[1]
        broker.stop()
        (broker.directory / "mosquitto.db").unlink()
        broker.start()
        wait_for(lambda: sink.counters()["connects"] == 2 and sink.connected, 10.0, "the sink to reconnect")
        payload, retain = retained_message(broker.port, f"{prefix}/front/event")
        assert retain and json.loads(payload) == record(event, "opened")
        assert retained_message(broker.port, f"{prefix}/front/event/thumbnail") == (b"\xff\xd8jpeg\xff\xd9", True)
    finally:
        sink.close()


def test_a_broker_that_accepts_and_never_answers_is_warned_of(monkeypatch, caplog):
    # Before: a broker that accepts TCP and never sends CONNACK gave no warning at all.
    from edgecap.service.sinks import mqtt as mqtt_module

    monkeypatch.setattr(mqtt_module, "SILENCE_WARN_S", 0.5)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    held = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    sink = MqttSink(sink_config(listener.getsockname()[1], "silent"), reconnect_delay=FAST)
    try:
        with caplog.at_level(logging.WARNING, logger="edgecap.service.sinks.mqtt"):
            line = wait_for(lambda: warnings_of(caplog, "has not accepted the connection"), 5.0, "the warning")
            time.sleep(1.0)
            assert len(warnings_of(caplog, "has not accepted the connection")) == 1
        assert f"127.0.0.1:{listener.getsockname()[1]} has not accepted the connection within 0 s" in line[0]
        assert not sink.connected
    finally:
        sink.close()
        listener.close()
        for conn in held:
            conn.close()


def test_the_service_announces_its_configured_cameras_before_any_event(broker, tmp_path):
    path = tmp_path / "edgecap.toml"
    path.write_text('[[cameras]]\nname = "front"\nsource = "0"\n[[cameras]]\nname = "door"\nsource = "1"\n')
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    settings = sink_config(broker.port, prefix)
    sinks = open_sinks(msgspec.structs.replace(load_config(path), sinks=SinksConfig(mqtt=settings)), stdout=None)
    try:
        node = discovery_id(settings.client_id)
        assert set(retained_under(broker.port, "homeassistant", 4)) == {
            f"homeassistant/{component}/{node}/{camera}_{entity}/config" for camera in ("front", "door")
            for component, entity in (("sensor", "caption"), ("image", "thumbnail"))}
    finally:
        sinks.close()


def test_discovery_can_be_turned_off_or_given_another_prefix(broker):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    off = MqttSink(sink_config(broker.port, prefix, discovery=False), reconnect_delay=FAST, cameras=["front"])
    settings = sink_config(broker.port, prefix + "b", discovery_prefix="ha/")
    on = MqttSink(settings, reconnect_delay=FAST, cameras=["front"])
    try:
        wait_for(lambda: off.connected and on.connected, 5.0, "the sinks to connect")
        off.event("front", make_event(), "opened")
        retained_message(broker.port, f"{prefix}/front/event")  # delivered, so everything before it was
        assert off.counters()["published"] == 3  # online, thumbnail, event: no config
        node = discovery_id(settings.client_id)
        assert set(retained_under(broker.port, "ha", 2)) == {
            f"ha/sensor/{node}/front_caption/config", f"ha/image/{node}/front_thumbnail/config"}
        assert on.counters()["published"] == 3  # online and two configs
    finally:
        off.close()
        on.close()


# --- TLS ------------------------------------------------------------------------------------

OPENSSL = shutil.which("openssl")
needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="openssl is not installed (apt-get install openssl; "
                                                           ".ci/run does)")


def make_pki(directory: Path) -> Path:
    """A throwaway PKI in ``directory``, made with the openssl command.

    ``ca``: the CA the sink trusts; ``server`` (127.0.0.1, localhost) and
    ``client`` are signed by it, and so is ``misnamed`` (a name that is not
    127.0.0.1). ``other-ca`` signs ``rogue`` (127.0.0.1, localhost): a
    certificate with the right name from a CA the sink does not trust.
    ``client-encrypted.key`` is the client's key under a passphrase. Keys are
    P-256 (fast to make) and mode 0600, as openssl writes them.
    """
    def openssl(*args: str) -> None:
        subprocess.run([OPENSSL, *args], cwd=directory, check=True, capture_output=True, timeout=30)

    def key(name: str) -> None:
        openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{name}.key")

    def ca(name: str) -> None:
        key(name)
        openssl("req", "-x509", "-new", "-key", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
                "-subj", f"/CN=edgecap test {name}", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def leaf(name: str, issuer: str, names: str) -> None:
        key(name)
        openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        (directory / f"{name}.ext").write_text(
            f"subjectAltName={names}\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=serverAuth,clientAuth\nsubjectKeyIdentifier=hash\n"
            "authorityKeyIdentifier=keyid,issuer\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{issuer}.crt", "-CAkey", f"{issuer}.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")

    local = "IP:127.0.0.1,DNS:localhost"
    ca("ca")
    ca("other-ca")
    leaf("server", "ca", local)
    leaf("client", "ca", "DNS:edgecap-client")
    leaf("misnamed", "ca", "DNS:broker.elsewhere.example")
    leaf("rogue", "other-ca", local)
    openssl("pkey", "-in", "client.key", "-aes256", "-passout", "pass:x", "-out", "client-encrypted.key")
    for pem in directory.glob("*.key"):
        pem.chmod(0o600)  # as openssl writes them, whatever this openssl's umask habits
    return directory


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    if OPENSSL is None:
        pytest.skip("openssl is not installed (apt-get install openssl; .ci/run does)")
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_listener(pki: Path, server: str = "server", require_certificate: bool = False) -> List[str]:
    """mosquitto listener lines: TLS only, with ``server``'s certificate, trusting ``ca`` for clients."""
    return [f"cafile {pki / 'ca.crt'}", f"certfile {pki / (server + '.crt')}", f"keyfile {pki / (server + '.key')}",
            f"require_certificate {'true' if require_certificate else 'false'}"]


@pytest.fixture
def tls_broker(tmp_path, pki, request):
    """A TLS-only broker; an indirect parametrize of ``tls_broker`` passes tls_listener's options."""
    if MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto; .ci/run does)")
    b = Broker(tmp_path, tls_listener(pki, **getattr(request, "param", {})))
    b.start()
    yield b
    b.stop()


def tls_config(port: int, prefix: str, pki: Path, client_cert: bool = False, **kw) -> MqttSinkConfig:
    files = {"cert_file": str(pki / "client.crt"), "key_file": str(pki / "client.key")} if client_cert else {}
    return sink_config(port, prefix, tls=True, ca_file=str(pki / "ca.crt"), **files, **kw)


def warnings_of(caplog, text: str) -> List[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage() and r.name == "edgecap.service.sinks.mqtt"]


def assert_never_connects(sink: MqttSink, caplog, text: str, seconds: float = 1.0) -> str:
    """Waits for the sink's one-line warning containing ``text``; the sink stays away and buffers."""
    line = wait_for(lambda: warnings_of(caplog, text), 10.0, f"a warning with {text!r}")
    time.sleep(seconds)  # several more attempts (FAST backoff): still one line, never connected
    assert len(warnings_of(caplog, text)) == 1
    sink.caption("front", make_caption(0))
    counters = sink.counters()
    assert (counters["connected"], counters["connects"], counters["buffered"]) == (False, 0, 1)
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in caplog.records), "one line, no traceback"
    return line[0]


def test_captions_arrive_over_tls_with_the_broker_checked(tls_broker, pki, caplog):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    sub = Subscriber(tls_broker.port, prefix, pki=pki).connect()
    with caplog.at_level(logging.INFO, logger="edgecap.service.sinks"):
        sink = MqttSink(tls_config(tls_broker.port, prefix, pki), reconnect_delay=FAST)
        try:
            assert sub.next(f"{prefix}/availability") == ("online", False)
            sink.caption("front", make_caption(0))
            sink.caption("front", make_caption(1))
            assert [c["window"] for c in sub.captions(2)] == [0, 1]
            assert sink.counters()["connects"] == 1
        finally:
            sink.close()
            sub.disconnect()
    assert warnings_of(caplog, f"MQTT connected to 127.0.0.1:{tls_broker.port} over TLS")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("tls_broker", [{"require_certificate": True}], indirect=True)
def test_the_client_certificate_is_presented_when_the_broker_requires_one(tls_broker, pki, caplog):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    sub = Subscriber(tls_broker.port, prefix, pki=pki).connect()
    sink = MqttSink(tls_config(tls_broker.port, prefix, pki, client_cert=True), reconnect_delay=FAST)
    try:
        assert sub.next(f"{prefix}/availability") == ("online", False)
        sink.caption("front", make_caption(7))
        assert sub.captions(1)[0]["window"] == 7
    finally:
        sink.close()
        sub.disconnect()
    # Without it the broker hangs up after the handshake; the line says why and what to set.
    sink = MqttSink(tls_config(tls_broker.port, prefix, pki), reconnect_delay=FAST)
    try:
        line = assert_never_connects(sink, caplog, "closed the connection before accepting it")
    finally:
        sink.close(timeout=1.0)
    assert line.startswith(f"MQTT broker 127.0.0.1:{tls_broker.port} closed the connection before accepting it (")
    assert "certificate required" in line and "set sinks.mqtt.cert_file and key_file" in line


@pytest.mark.parametrize("tls_broker, reason", [
    ({"server": "rogue"}, "unable to get local issuer certificate"),  # signed by another CA
    ({"server": "misnamed"}, "IP address mismatch, certificate is not valid for '127.0.0.1')"),  # our CA, another name
], indirect=["tls_broker"], ids=["another-ca", "another-name"])
def test_a_broker_that_fails_verification_is_refused_in_one_line(tls_broker, reason, pki, caplog, capfd):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    sink = MqttSink(tls_config(tls_broker.port, prefix, pki), reconnect_delay=FAST)
    try:
        line = assert_never_connects(sink, caplog, "TLS certificate failed verification")
    finally:
        sink.close(timeout=1.0)
    assert line.startswith(f"MQTT broker 127.0.0.1:{tls_broker.port} refused: its TLS certificate failed "
                           f"verification ({reason}"), line
    assert "sinks.mqtt.ca_file must hold the CA that signed it" in line
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("tls_broker", [{"server": "rogue"}], indirect=True)
def test_tls_insecure_skips_verification_and_says_so(tls_broker, pki, caplog):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    sink = MqttSink(tls_config(tls_broker.port, prefix, pki, tls_insecure=True), reconnect_delay=FAST)
    try:
        wait_for(lambda: sink.connected, 5.0, "the sink to connect")
    finally:
        sink.close()
    assert warnings_of(caplog, f"sinks.mqtt.tls_insecure is true: the certificate and name of broker "
                               f"127.0.0.1:{tls_broker.port} are not checked")


def test_a_plain_client_against_a_tls_listener_fails_clearly(tls_broker, caplog):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    sink = MqttSink(sink_config(tls_broker.port, prefix), reconnect_delay=FAST)
    try:
        line = assert_never_connects(sink, caplog, "closed the connection before accepting it")
    finally:
        sink.close(timeout=1.0)
    assert line.startswith(f"MQTT broker 127.0.0.1:{tls_broker.port} closed the connection before accepting it")
    assert "if it is a TLS listener (usually port 8883), set sinks.mqtt.tls = true" in line


def test_a_tls_client_against_a_plain_listener_fails_clearly(broker, pki, caplog):
    prefix = "edgecap-" + uuid.uuid4().hex[:6]
    sink = MqttSink(tls_config(broker.port, prefix, pki), reconnect_delay=FAST)
    try:
        line = assert_never_connects(sink, caplog, "the TLS handshake failed")
    finally:
        sink.close(timeout=1.0)
    assert line.startswith(f"MQTT broker 127.0.0.1:{broker.port} refused: the TLS handshake failed (")
    assert "check that the port is the broker's TLS listener" in line


@pytest.mark.parametrize("make, message", [
    (lambda pki: {"ca_file": str(pki / "client.key")},
     "sinks.mqtt.ca_file: cannot load {pki}/client.key (no certificate or crl found); give the PEM file of the CA"),
    (lambda pki: {"cert_file": str(pki / "client.crt"), "key_file": str(pki / "server.key")},
     "sinks.mqtt.cert_file: cannot load the client certificate {pki}/client.crt with the key {pki}/server.key "
     "(key values mismatch); give a PEM certificate and its private key"),
    (lambda pki: {"cert_file": str(pki / "client.crt"), "key_file": str(pki / "client-encrypted.key")},
     "sinks.mqtt.key_file: {pki}/client-encrypted.key holds an encrypted key; store it decrypted"),
], ids=["ca-not-a-certificate", "key-of-another-certificate", "encrypted-key"])
def test_tls_files_that_do_not_load_are_one_line_config_errors(pki, tmp_path, make, message):
    config = MqttSinkConfig(host="127.0.0.1", port=free_port(), tls=True, **make(pki))
    with pytest.raises(ConfigError) as info:
        tls_context(config)  # no terminal prompt for the encrypted key's password, no hang
    assert str(info.value).startswith(message.format(pki=pki)), str(info.value)
    # open_sinks says the same before anything starts, and closes the file sink it had opened.
    service = msgspec.structs.replace(
        load_config(write_config(tmp_path)),
        sinks=SinksConfig(jsonl=JsonlSinkConfig(path=str(tmp_path / "c.jsonl")), mqtt=config))
    threads = threading.active_count()
    with pytest.raises(ConfigError, match="^sinks.mqtt") as raised:  # its traceback keeps the sinks alive
        open_sinks(service)
    assert raised.traceback
    assert threading.active_count() == threads
    open_files = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.islink(f"/proc/self/fd/{fd}")]
    assert str(tmp_path / "c.jsonl") not in open_files


def write_config(directory: Path) -> Path:
    path = directory / "edgecap.toml"
    path.write_text('[[cameras]]\nname = "front"\nsource = "0"\n')
    return path
