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
from typing import List, Optional, Sequence, Tuple

import pytest

paho = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt is in the service extra: pip install -e .[service]")

import msgspec  # noqa: E402

from edgecap.captioner import Caption  # noqa: E402
from edgecap.errors import ConfigError  # noqa: E402
from edgecap.service.config import JsonlSinkConfig, MqttSinkConfig, SinksConfig, load_config  # noqa: E402
from edgecap.service.sinks import JsonlSink, MqttSink, SinkSet, open_sinks, tls_context  # noqa: E402

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
        self.messages: "queue.Queue[Tuple[str, str, bool]]" = queue.Queue()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2,
                                  client_id=client_id or f"test-{uuid.uuid4().hex[:8]}",
                                  clean_session=not persistent)
        if pki is not None:  # over TLS, with the client certificate
            self.client.tls_set(ca_certs=str(pki / "ca.crt"), certfile=str(pki / "client.crt"),
                                keyfile=str(pki / "client.key"))
        self.client.on_message = lambda c, u, m: self.messages.put((m.topic, m.payload.decode(), m.retain))
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
    return [r.getMessage() for r in caplog.records if text in r.getMessage() and r.name == "edgecap.service.sinks"]


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
