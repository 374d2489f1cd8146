"""The MQTT sink: captions, events, availability and stats on a broker, through paho-mqtt.

A broker that is down is never fatal: the sink keeps a bounded buffer and
reconnects with backoff.

MQTT topics, under ``topic_prefix``:

- ``{prefix}/{camera}/caption``: one JSON object per caption (``caption_record``).
- ``{prefix}/{camera}/event``: retained, one JSON object (``event_record``) each
  time an event opens or closes; never per window.
- ``{prefix}/{camera}/event/thumbnail``: retained, the event's JPEG, when it
  differs from the last one sent (empty: the event has none).
- ``{prefix}/availability``: retained ``online`` on connect; ``offline`` on a
  clean close and, by the broker's last will, when the connection dies.
- ``{prefix}/stats``: the service's stats snapshot as JSON, at most every
  ``stats_interval_seconds``.

With ``discovery = true``, every connect also publishes retained Home Assistant
MQTT discovery configs (``discovery_configs``): a caption sensor and an image
per camera, available while ``{prefix}/availability`` says ``online``. A
camera's name goes into topics as one level (``topic_level``) and into Home
Assistant's ids as ``[A-Za-z0-9_-]+`` (``discovery_id``).

With ``tls = true`` the sink checks the broker's certificate against
``ca_file`` (or the system's CAs) and its host name, and may present a client
certificate; a broker that fails the check is logged in one line naming it and
the cause, and retried like a broker that is down.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import re
import socket
import ssl
import sys
import threading
import time
import unicodedata
from typing import TYPE_CHECKING, Any, Deque, Dict, Iterable, List, NoReturn, Optional, Set, Tuple

from edgecap import __version__
from edgecap.errors import ConfigError
from edgecap.service.sinks.base import Sink, caption_record, event_record

if TYPE_CHECKING:
    from edgecap.captioner import Caption
    from edgecap.events import Change, Event
    from edgecap.service.config import MqttSinkConfig

log = logging.getLogger(__name__)

SILENCE_WARN_S = 8.0  # a broker that has not answered a connection this long is warned of (10 s from the start)


def topic_level(name: str) -> str:
    """A camera's name as one MQTT topic level.

    Spaces and any language's letters are fine in a topic; what is not
    becomes ``_``: ``+`` and ``#`` (wildcards a publisher may not use), ``/``
    (it would add levels), and what MQTT forbids or advises against and Home
    Assistant refuses to subscribe to (NUL, control characters,
    non-characters, halves of surrogate pairs). The service's names
    (``[A-Za-z0-9_-]+``) pass unchanged.

    Args:
      name: The camera's name (any text: the Python API takes any).

    Returns:
      A non-empty topic level (``_`` for an empty name).
    """
    return "".join("_" if _unfit_in_topic(char) else char for char in name) or "_"


def _unfit_in_topic(char: str) -> bool:
    code = ord(char)
    return (char in "/+#" or code <= 0x1F or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xDFFF
            or 0xFDD0 <= code <= 0xFDEF or code & 0xFFFF >= 0xFFFE)


def discovery_id(name: str) -> str:
    """A name as a Home Assistant discovery node or object id, ``[A-Za-z0-9_-]+``.

    Home Assistant ignores a discovery topic with any other character. A name
    that is not such an id already is transliterated to ASCII where it can be,
    the rest replaced by ``_``, and a hash of the name appended, so that two
    names never share an id (``café`` and ``cafe``, ``门`` and ``窗``).

    Args:
      name: A camera's name or the MQTT client id.

    Returns:
      The id: ``name`` itself when it is one.
    """
    if re.fullmatch(r"[A-Za-z0-9_-]+", name):
        return name
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", ascii_name).strip("_")
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{slug}_{digest}" if slug else digest


def discovery_configs(discovery_prefix: str, topic_prefix: str, node: str,
                      camera: str) -> List[Tuple[str, Dict[str, Any]]]:
    """Home Assistant's MQTT discovery configs for one camera: a caption sensor and a thumbnail image.

    The sensor's state is the text of the camera's latest event (cut to the 255
    characters a state may hold), its attributes the event's record; both come
    from the retained event topic. The image shows the retained thumbnail.
    Both are unavailable while ``{topic_prefix}/availability`` says
    ``offline`` (a clean stop or the broker's last will).

    Args:
      discovery_prefix: Home Assistant's discovery prefix (``homeassistant``).
      topic_prefix: The sink's topic prefix, without a trailing ``/``.
      node: The node id of this board (``discovery_id`` of its MQTT client id).
      camera: The camera's name.

    Returns:
      ``(topic, config)`` pairs, to be published retained.
    """
    level, object_id = topic_level(camera), discovery_id(camera)
    event_topic = f"{topic_prefix}/{level}/event"
    common = {
        "availability_topic": f"{topic_prefix}/availability",
        "payload_available": "online",
        "payload_not_available": "offline",
        "qos": 1,
        # One device per camera, so that its entities sit together; the ids
        # carry the node so that two boards' cameras named alike stay apart.
        "device": {"identifiers": [f"edgecap_{node}_{object_id}"], "name": camera or "edgecap",
                   "manufacturer": "edgecap", "model": "edgecap camera", "sw_version": __version__},
        "origin": {"name": "edgecap", "sw_version": __version__},
    }
    sensor = {"name": "Caption", "unique_id": f"edgecap_{node}_{object_id}_caption", "icon": "mdi:text-box-outline",
              "state_topic": event_topic, "value_template": "{{ value_json.text[:255] }}",
              "json_attributes_topic": event_topic, **common}
    image = {"name": "Event thumbnail", "unique_id": f"edgecap_{node}_{object_id}_thumbnail",
             "image_topic": f"{event_topic}/thumbnail", "content_type": "image/jpeg", **common}
    return [(f"{discovery_prefix}/sensor/{node}/{object_id}_caption/config", sensor),
            (f"{discovery_prefix}/image/{node}/{object_id}_thumbnail/config", image)]


def tls_context(config: "MqttSinkConfig") -> ssl.SSLContext:
    """The TLS context of the MQTT sink: the broker's certificate and host name checked unless ``tls_insecure``.

    Args:
      config: The ``[sinks.mqtt]`` table (its files already checked by ``load_config``).

    Returns:
      A client context trusting ``ca_file`` (or the system's CAs) and holding
      the client certificate, if any.

    Raises:
      ConfigError: If ``ca_file`` holds no CA certificate, or the client
        certificate and key cannot be loaded (not PEM, not a pair, encrypted).
    """
    try:
        # A ca_file replaces the system's CAs: only the CA named is trusted.
        context = ssl.create_default_context(cafile=config.ca_file or None)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"sinks.mqtt.ca_file: cannot load {config.ca_file or 'the system CAs'} "
                          f"({_ssl_reason(exc)}); give the PEM file of the CA that signed the "
                          "broker's certificate") from None
    if config.cert_file:
        key, key_name = (config.key_file, "key_file") if config.key_file else (config.cert_file, "cert_file")

        def no_password() -> NoReturn:
            # Without this OpenSSL would prompt on the terminal, which a service has not.
            raise ConfigError(f"sinks.mqtt.{key_name}: {key} holds an encrypted key; store it decrypted "
                              f"(`openssl pkey -in {key} -out NEW`) and `chmod o-r` it")

        try:
            context.load_cert_chain(config.cert_file, config.key_file or None, password=no_password)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"sinks.mqtt.cert_file: cannot load the client certificate {config.cert_file} "
                              f"with the key {key} ({_ssl_reason(exc)}); give a PEM certificate and "
                              "its private key") from None
    if config.tls_insecure:
        context.check_hostname = False  # before verify_mode: ssl refuses CERT_NONE while it is on
        context.verify_mode = ssl.CERT_NONE
    return context


def _ssl_reason(exc: BaseException) -> str:
    """OpenSSL's reason without its ``[LIB: CODE]`` tag and ``(_ssl.c:N)`` place."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return exc.verify_message.rstrip(".")
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return re.sub(r"^\[[^\]]*\]\s*|\s*\(_ssl\.c:\d+\)$", "", text)


class MqttSink(Sink):
    """Captions, events, availability and stats on an MQTT broker (paho-mqtt 2.x, its own network thread).

    Never blocks the caller and never raises: while the broker is away,
    captions and events wait in a buffer of ``buffer`` messages (the oldest
    are dropped beyond it, and counted; of a camera's thumbnails only the
    newest waits); paho's thread reconnects with exponential backoff and the
    buffer is sent, in order, once it is back, after the discovery configs.
    """

    name = "mqtt"

    def __init__(self, config: "MqttSinkConfig", reconnect_delay: Tuple[float, float] = (1.0, 30.0),
                 keepalive: int = 30, cameras: Iterable[str] = ()) -> None:
        """Starts connecting in the background; returns at once.

        Args:
          config: The ``[sinks.mqtt]`` table (``host`` must be set).
          reconnect_delay: First and longest wait between connection attempts (s).
          keepalive: Seconds between pings; a broker silent for 1.5x this is gone.
          cameras: Cameras to announce to Home Assistant from the first connect;
            a camera whose first event comes later is announced then.

        Raises:
          ConfigError: If TLS is on and its files cannot be loaded (``tls_context``).
        """
        import paho.mqtt.client as mqtt  # the service extra; only this sink needs it

        prefix = config.topic_prefix.rstrip("/")
        self._prefix = prefix
        self._caption_topic = prefix + "/{camera}/caption"
        self.availability_topic = f"{prefix}/availability"
        self.stats_topic = f"{prefix}/stats"
        self._stats_interval = config.stats_interval_seconds
        self._last_stats = float("-inf")
        self._where = f"{config.host}:{config.port}"
        self._tls = config.tls
        self._last_error = ""  # paho's last error-level log line: why a connection closed
        self._lock = threading.Lock()
        self._buffer: Deque[Tuple[str, bytes, bool]] = collections.deque()  # topic, payload, retain
        self._capacity = config.buffer
        self._connected = False
        self._closing = False
        self._published = 0
        self._dropped = 0
        self._errors = 0
        self._connects = 0
        self._unreachable_said = False
        self._cameras: Set[str] = set(cameras)
        self._thumbnails: Dict[str, bytes] = {}  # by camera: the last one sent or buffered (b"": none)
        self._events: Dict[str, bytes] = {}  # by camera: the last event record sent or buffered
        self._silence: Optional[threading.Timer] = None  # warns of a connection the broker does not answer
        self._discovery_prefix = config.discovery_prefix.rstrip("/") if config.discovery else ""

        client_id = config.client_id or f"edgecap-{socket.gethostname()}"
        self._node = discovery_id(client_id)  # the broker already requires it unique
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
        if config.username:
            client.username_pw_set(config.username, config.password or None)
        if config.tls:
            client.tls_set_context(tls_context(config))  # paho takes check_hostname from it
            if config.tls_insecure:
                log.warning("MQTT: sinks.mqtt.tls_insecure is true: the certificate and name of broker %s are "
                            "not checked, so anyone on the path can pose as it and read the password and "
                            "captions", self._where)
        client.will_set(self.availability_topic, b"offline", qos=1, retain=True)
        client.reconnect_delay_set(*reconnect_delay)
        # paho's own queue holds what is in flight (awaiting PUBACK), the flush of
        # our buffer on reconnect, and what is sent while a dead connection is not
        # yet noticed (up to 1.5x keepalive), and the discovery configs of each
        # connect (two for each of up to 64 cameras): room for all that, yet bounded.
        client.max_queued_messages_set(2 * config.buffer + 64 + 2 * 64)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_connect_fail = self._on_connect_fail
        client.on_log = self._on_log
        self._client = client
        self._mqtt = mqtt
        client.connect_async(config.host, config.port, keepalive=keepalive)
        self._watch_silence()
        client.loop_start()

    @property
    def connected(self) -> bool:
        """True while the broker has accepted the connection."""
        return self._connected

    def caption(self, camera: str, caption: "Caption") -> None:
        """Publishes the caption (QoS 1) on ``{prefix}/{camera}/caption``, or buffers it."""
        try:
            payload = json.dumps(caption_record(camera, caption), ensure_ascii=False).encode("utf-8")
            self._send(self._caption_topic.format(camera=topic_level(camera)), payload, buffer=True)
        except Exception as exc:  # never into the caption loop
            self._error("caption", exc)

    def event(self, camera: str, event: "Event", change: "Change") -> None:
        """Publishes an event that opened or closed on ``{prefix}/{camera}/event``, retained; or buffers it.

        "extended" (one window more of the same) publishes nothing: the topic
        says what the camera sees, and that has not changed. A thumbnail that
        differs from the camera's last goes first, retained, on
        ``{prefix}/{camera}/event/thumbnail``, so that whoever reacts to the
        event finds its picture there; an event without one clears it (an
        empty retained message), so that no other event's picture stands for it.
        """
        if change not in ("opened", "closed"):
            return
        try:
            topic = f"{self._prefix}/{topic_level(camera)}/event"
            payload = json.dumps(event_record(event, change), ensure_ascii=False).encode("utf-8")
            with self._lock:
                if self._closing:
                    return
                if camera not in self._cameras:
                    self._cameras.add(camera)
                    if self._connected:
                        self._announce(camera)
                if self._thumbnails.get(camera, b"") != event.thumbnail:
                    self._thumbnails[camera] = event.thumbnail
                    self._deliver(f"{topic}/thumbnail", event.thumbnail, buffer=True, retain=True, latest_only=True)
                self._events[camera] = payload
                self._deliver(topic, payload, buffer=True, retain=True)
        except Exception as exc:
            self._error("event", exc)

    def stats(self, snapshot: Dict[str, Any]) -> None:
        """Publishes the snapshot on ``{prefix}/stats`` if ``stats_interval_seconds`` have passed.

        Stats are not buffered: the next snapshot after a reconnect is newer.
        """
        now = time.monotonic()
        if now - self._last_stats < self._stats_interval:
            return
        self._last_stats = now
        try:
            self._send(self.stats_topic, json.dumps(snapshot, default=str).encode("utf-8"), buffer=False)
        except Exception as exc:
            self._error("stats", exc)

    def _send(self, topic: str, payload: bytes, buffer: bool) -> None:
        with self._lock:
            if self._closing:
                return
            self._deliver(topic, payload, buffer)

    def _deliver(self, topic: str, payload: bytes, buffer: bool, retain: bool = False,
                 latest_only: bool = False) -> None:
        """Publishes a message if connected, else buffers it if asked (lock held); see ``_keep``."""
        if self._connected:
            self._publish(topic, payload, retain)
        elif buffer:
            self._keep(topic, payload, retain, latest_only)

    def _keep(self, topic: str, payload: bytes, retain: bool = False, latest_only: bool = False) -> None:
        """Buffers a message while disconnected, dropping the oldest beyond capacity (lock held).

        Args:
          topic: Its topic.
          payload: Its bytes.
          retain: Publish it retained.
          latest_only: It replaces a message of its topic still in the buffer
            (a retained picture: only the newest is worth its bytes, and a
            superseded one is no loss, so it is not counted as dropped).
        """
        if self._capacity <= 0:
            self._dropped += 1
            return
        if latest_only:
            for message in [m for m in self._buffer if m[0] == topic]:
                self._buffer.remove(message)
        if len(self._buffer) >= self._capacity:
            self._buffer.popleft()
            self._dropped += 1
        self._buffer.append((topic, payload, retain))

    def _announce(self, camera: str) -> None:
        """Publishes the camera's Home Assistant discovery configs, retained, if discovery is on (lock held)."""
        if not self._discovery_prefix:
            return
        for topic, config in discovery_configs(self._discovery_prefix, self._prefix, self._node, camera):
            # ASCII with \u escapes: encodes whatever the name holds (this runs in paho's thread).
            self._publish(topic, json.dumps(config).encode("ascii"), retain=True)

    def _publish(self, topic: str, payload: bytes, retain: bool = False) -> Any:
        """Hands a message to paho (lock held); counts what paho refuses."""
        info = self._client.publish(topic, payload, qos=1, retain=retain)
        if info.rc == self._mqtt.MQTT_ERR_QUEUE_SIZE:
            self._dropped += 1
        else:
            # NO_CONN: the connection dropped just now; paho keeps QoS 1 messages
            # queued and sends them after it reconnects.
            self._published += 1
        return info

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self._unreachable_said = True  # said here; the disconnect that follows adds nothing
            log.warning("MQTT broker %s refused the connection: %s", self._where, reason)
            return
        with self._lock:
            self._publish(self.availability_topic, b"online", retain=True)
            # On every connect: a broker that lost its retained messages gets them back.
            for camera in sorted(self._cameras):
                self._announce(camera)
            flushed = {message[0] for message in self._buffer}
            while self._buffer:
                self._publish(*self._buffer.popleft())
            self._republish(flushed)
            self._connected = True
            self._connects += 1
            self._unreachable_said = False
            self._last_error = ""
        log.info("MQTT connected to %s%s", self._where, " over TLS" if self._tls else "")

    def _republish(self, flushed: Set[str]) -> None:
        """Publishes each camera's last event and thumbnail again, retained, unless just flushed (lock held).

        A broker restarted without persistence has forgotten them, and a camera
        whose event does not change would otherwise leave Home Assistant "unknown".
        """
        for camera, payload in sorted(self._events.items()):
            topic = f"{self._prefix}/{topic_level(camera)}/event"
            if f"{topic}/thumbnail" not in flushed and camera in self._thumbnails:
                self._publish(f"{topic}/thumbnail", self._thumbnails[camera], retain=True)
            if topic not in flushed:
                self._publish(topic, payload, retain=True)

    def _watch_silence(self) -> None:
        """Warns if the broker has not accepted the connection within ``SILENCE_WARN_S`` (once per outage)."""
        if self._closing:
            return
        timer = threading.Timer(SILENCE_WARN_S, self._silent)
        timer.daemon = True
        old, self._silence = self._silence, timer
        if old is not None:
            old.cancel()
        timer.start()

    def _silent(self) -> None:
        if self._connected or self._closing or self._unreachable_said:
            return
        self._unreachable_said = True
        log.warning("MQTT broker %s has not accepted the connection within %.0f s (%s); retrying with backoff, "
                    "buffering up to %d messages", self._where, SILENCE_WARN_S,
                    self._last_error or "no answer: check the host and port, and that it is the broker",
                    self._capacity)

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        # No lock: paho may call this while holding its own locks that publish() takes.
        was, self._connected = self._connected, False
        if self._closing:
            return
        if was:
            self._watch_silence()  # a new outage: a broker that comes back silent is warned of too
            self._unreachable_said = True  # one line per outage
            log.warning("MQTT connection to %s lost (%s); buffering up to %d messages and reconnecting",
                        self._where, reason, self._capacity)
        elif not self._unreachable_said:
            # Closed before the broker's CONNACK: what a TLS listener does to a
            # client without TLS, or without the client certificate it requires.
            self._unreachable_said = True
            hint = _NEEDS_CERT if self._tls else _NEEDS_TLS
            log.warning("MQTT broker %s closed the connection before accepting it (%s); %s; retrying with "
                        "backoff, buffering up to %d messages", self._where, self._last_error or reason, hint,
                        self._capacity)

    def _on_connect_fail(self, client: Any, userdata: Any) -> None:
        # paho calls this inside its `except OSError:`, so the exception in hand is the cause.
        cause = sys.exc_info()[1]
        # Once per outage: the broker being away is worth a line, not a line a second.
        if not self._unreachable_said and not self._closing:
            self._unreachable_said = True
            log.warning("MQTT broker %s %s; retrying with backoff, buffering up to %d messages",
                        self._where, _connect_failure(cause, self._tls), self._capacity)

    def _on_log(self, client: Any, userdata: Any, level: int, message: str) -> None:
        if level == self._mqtt.MQTT_LOG_ERR:  # e.g. "failed to receive on socket: [SSL: ...] ..."
            self._last_error = message

    def _error(self, what: str, exc: BaseException) -> None:
        with self._lock:
            self._errors += 1
            first = self._errors == 1
        if first:
            log.warning("MQTT %s not sent: %s: %s", what, type(exc).__name__, exc)

    def counters(self) -> Dict[str, Any]:
        """Returns sent (published), dropped, errors, waiting (buffered), connected, connects."""
        with self._lock:
            return {"sent": self._published, "dropped": self._dropped, "errors": self._errors,
                    "waiting": len(self._buffer), "connected": self._connected, "published": self._published,
                    "buffered": len(self._buffer), "connects": self._connects}

    def close(self, timeout: float = 2.0) -> None:
        """Publishes ``offline`` (retained) if connected, disconnects and stops paho's thread."""
        deadline = time.monotonic() + timeout
        try:
            with self._lock:
                self._closing = True
                info = self._publish(self.availability_topic, b"offline", retain=True) \
                    if self._connected else None
                if self._silence is not None:
                    self._silence.cancel()
                if self._buffer:
                    log.warning("MQTT: %d messages (captions, events) not sent (broker %s away at shutdown)",
                                len(self._buffer), self._where)
                    self._dropped += len(self._buffer)
                    self._buffer.clear()
            if info is not None:
                info.wait_for_publish(max(0.0, deadline - time.monotonic()))
        except Exception as exc:
            log.warning("MQTT: offline not published on close: %s", exc)
        # After disconnect() paho's loop ends within its 1 s select timeout, unless
        # it is inside a TCP connect or a DNS lookup: wait for it only as long as
        # the timeout allows (its thread is a daemon and dies with the process).
        stopper = threading.Thread(target=self._stop_network, name="mqtt-close", daemon=True)
        stopper.start()
        stopper.join(max(0.0, deadline - time.monotonic()))
        if stopper.is_alive():
            log.warning("MQTT: the connection to %s did not close within %.1f s; leaving it",
                        self._where, timeout)

    def _stop_network(self) -> None:
        try:
            self._client.disconnect()
            self._client.loop_stop()
        except Exception as exc:
            log.warning("MQTT: closing the connection to %s: %s", self._where, exc)


# The fix for a broker that hangs up before its CONNACK.
_NEEDS_TLS = "if it is a TLS listener (usually port 8883), set sinks.mqtt.tls = true"
_NEEDS_CERT = "if it requires a client certificate, set sinks.mqtt.cert_file and key_file"


def _connect_failure(cause: Optional[BaseException], tls: bool) -> str:
    """Why a connection attempt failed, in words for the log, with the fix where there is one.

    Args:
      cause: The exception of the attempt, if paho let us see it.
      tls: Whether the sink speaks TLS.

    Returns:
      What to log after ``MQTT broker HOST:PORT``.
    """
    if isinstance(cause, ssl.SSLCertVerificationError):
        return (f"refused: its TLS certificate failed verification ({_ssl_reason(cause)}); sinks.mqtt.ca_file "
                "must hold the CA that signed it and sinks.mqtt.host a name it was issued for")
    # A reset comes after the TCP connect: in the TLS handshake (a plain
    # listener hangs up on a ClientHello), or as the CONNECT is sent (a TLS
    # listener hangs up on plain MQTT).
    hung_up = isinstance(cause, (ConnectionResetError, BrokenPipeError))
    if isinstance(cause, ssl.SSLError) or (tls and hung_up):
        return (f"refused: the TLS handshake failed ({_ssl_reason(cause)}); check that the port is the "
                "broker's TLS listener (usually 8883)")
    if hung_up:
        return f"closed the connection before accepting it ({_ssl_reason(cause)}); {_NEEDS_TLS}"
    if isinstance(cause, OSError):
        return f"not reachable ({_ssl_reason(cause)})"
    return "not reachable"
