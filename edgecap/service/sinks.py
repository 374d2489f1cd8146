"""Where captions go: stdout (the journal under systemd), a JSON-lines file, an MQTT broker.

Every sink has the same three calls — ``caption``, ``stats`` and ``close`` —
and ``SinkSet`` fans them out so that one failing sink never stops the others.
A sink that cannot start because of the config (an unwritable file) fails at
``open_sinks``, before the service starts; a broker that is down is never
fatal: the MQTT sink keeps a bounded buffer and reconnects with backoff.

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
import os
import re
import socket
import ssl
import sys
import threading
import time
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Deque, Dict, Iterable, List, NoReturn, Optional, Sequence, Set, TextIO, Tuple

from edgecap import __version__
from edgecap.errors import ConfigError

if TYPE_CHECKING:  # the captioner pulls in the interpreters; sinks only need to_dict()
    from edgecap.captioner import Caption
    from edgecap.events import Change, Event
    from edgecap.service.config import MqttSinkConfig, ServiceConfig

log = logging.getLogger(__name__)

# syslog priorities that journald reads from a "<N>" line prefix (sd-daemon(3)).
PRIORITIES = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


def caption_record(camera: str, caption: "Caption") -> Dict[str, Any]:
    """The JSON object a sink writes for one caption.

    Args:
      camera: The camera's name.
      caption: The caption.

    Returns:
      ``camera``, the caption's fields (``Caption.to_dict()``) and ``time``,
      the wall-clock time it was emitted (Unix seconds).
    """
    record: Dict[str, Any] = {"camera": camera}
    record.update(caption.to_dict())
    record["time"] = round(time.time(), 3)
    return record


def event_record(event: "Event", change: "Change") -> Dict[str, Any]:
    """The JSON object the MQTT sink publishes, and the JSON-lines sink writes, for an event's change.

    Args:
      event: The event.
      change: What happened to it (``opened`` or ``closed``).

    Returns:
      The event's fields (``Event.to_dict()``, no thumbnail bytes) and ``change``.
    """
    record = event.to_dict()
    record["change"] = change
    return record


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


def is_journal(stream: Any) -> bool:
    """True if ``stream`` is connected to the systemd journal.

    systemd sets ``JOURNAL_STREAM=DEV:INODE`` for a service whose stdout or
    stderr is the journal; the stream is the journal only when its file
    matches (a redirect in between makes it a plain file again).

    Args:
      stream: A file object (stdout, stderr).

    Returns:
      Whether lines written to it should carry ``<N>`` priority prefixes.
    """
    expected = os.environ.get("JOURNAL_STREAM", "")
    if not expected:
        return False
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return expected == f"{st.st_dev}:{st.st_ino}"


class JournalFormatter(logging.Formatter):
    """A logging formatter that prefixes each line with its journald priority (``<4>`` for warnings).

    Install it on the service's log handler when ``is_journal(handler.stream)``
    so that ``journalctl -p warning`` finds the service's warnings.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Returns the formatted record, every line prefixed with ``<N>``."""
        prefix = f"<{_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines() or [""])


def _priority(level: int) -> int:
    """The syslog priority of a logging level (levels between take the next more severe)."""
    for threshold in sorted(PRIORITIES, reverse=True):
        if level >= threshold:
            return PRIORITIES[threshold]
    return PRIORITIES[logging.DEBUG]


class Sink:
    """One destination for captions. Each sink owns its resources.

    Attributes:
      name: Short name for logs and counters.
    """

    name = "sink"

    def caption(self, camera: str, caption: "Caption") -> None:
        """Delivers one caption of ``camera``."""

    def event(self, camera: str, event: "Event", change: "Change") -> None:
        """Delivers a change of one of ``camera``'s events (opened, extended, closed)."""

    def stats(self, snapshot: Dict[str, Any]) -> None:
        """Delivers the service's stats (a JSON-ready dict), called every few seconds."""

    def counters(self) -> Dict[str, Any]:
        """Returns what the sink has done (written, dropped, ...), JSON-ready."""
        return {}

    def close(self, timeout: float = 2.0) -> None:
        """Flushes and releases everything within ``timeout`` seconds; never raises."""


class StdoutSink(Sink):
    """One line per caption on stdout; with journald priority ``<6>`` when stdout is the journal."""

    name = "stdout"

    def __init__(self, stream: Optional[TextIO] = None) -> None:
        """Writes to ``stream``.

        Args:
          stream: Where to write (default: ``sys.stdout``).
        """
        self._stream = sys.stdout if stream is None else stream
        self._prefix = f"<{PRIORITIES[logging.INFO]}>" if is_journal(self._stream) else ""
        self._written = 0

    def caption(self, camera: str, caption: "Caption") -> None:
        """Writes ``camera [start - end] text`` and flushes, so the journal has it at once."""
        text = " ".join(caption.text.split())  # one caption, one line
        self._stream.write(f"{self._prefix}{camera} [{caption.start_time:7.2f}s - "
                           f"{caption.end_time:7.2f}s] {text}\n")
        self._stream.flush()
        self._written += 1

    def counters(self) -> Dict[str, Any]:
        """Returns ``{"written": lines}``."""
        return {"written": self._written}

    def close(self, timeout: float = 2.0) -> None:
        """Flushes the stream (it is not ours to close)."""
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass


class JsonlSink(Sink):
    """Captions as JSON lines in a file, rotated by size like logrotate's ``size``.

    ``path`` grows until the next line would pass ``max_bytes``; then ``path.1``
    becomes ``path.2`` and so on (``backups`` kept), ``path`` becomes ``path.1``
    and a new ``path`` starts. Each line is flushed to the OS (not fsynced: a
    power cut may lose the last lines, a crash of the service does not).

    One ``caption_record`` line per caption and, with ``events`` (``[sinks.jsonl]
    events = true``), one ``event_record`` line when an event opens and when it
    closes (not per window: the caption lines are those); an event line is told
    apart by its ``change`` key.
    """

    name = "jsonl"

    def __init__(self, path: "str | os.PathLike[str]", max_bytes: int = 10_000_000, backups: int = 3,
                 events: bool = False) -> None:
        """Opens (or creates, mode 0640) the file for appending.

        Args:
          path: The file.
          max_bytes: Size past which the file is rotated.
          backups: Rotated files kept.
          events: Also write events as they open and close.

        Raises:
          ConfigError: If the file cannot be opened for writing (missing
            directory, permissions, a directory in its place).
        """
        self._path = Path(path)
        self._max_bytes = max_bytes
        self._backups = backups
        self._events = events
        self._written = 0
        self._rotations = 0
        self._closed = False
        try:
            self._file: Optional[TextIO] = self._open()
        except OSError as exc:
            raise ConfigError(f"sinks.jsonl.path: cannot write {self._path} ({exc.strerror or exc}); "
                              f"create its directory, writable by the service's user, "
                              f"or change sinks.jsonl.path") from None
        self._size = self._file.tell()

    def _open(self, truncate: bool = False) -> TextIO:
        # Captions say what the camera saw: not for every user's eyes (0640).
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self._path, flags | (os.O_TRUNC if truncate else 0), 0o640)
        return os.fdopen(fd, "a", encoding="utf-8")

    def caption(self, camera: str, caption: "Caption") -> None:
        """Appends one JSON line, rotating first if it would pass ``max_bytes``.

        Raises:
          OSError: The disk is full or the file went away (``SinkSet`` counts it).
        """
        self._write(caption_record(camera, caption))

    def event(self, camera: str, event: "Event", change: "Change") -> None:
        """Appends the event's line when it opens or closes, if the sink writes events.

        Raises:
          OSError: As ``caption``.
        """
        if self._events and change != "extended":
            self._write(event_record(event, change))

    def _write(self, record: Dict[str, Any]) -> None:
        if self._closed:
            return
        line = json.dumps(record, ensure_ascii=False) + "\n"
        size = len(line.encode("utf-8"))
        # No file: the last rotation failed half-way; try it again.
        if self._file is None or (self._size and self._size + size > self._max_bytes):
            self._rotate()
        assert self._file is not None
        self._file.write(line)
        self._file.flush()
        self._size += size
        self._written += 1

    def _rotate(self) -> None:
        """Shifts path.N-1 -> path.N ... path -> path.1 and starts an empty path."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._backups > 0:
            for n in range(self._backups - 1, 0, -1):
                older = self._path.with_name(f"{self._path.name}.{n}")
                if older.exists():
                    os.replace(older, self._path.with_name(f"{self._path.name}.{n + 1}"))
            if self._path.exists():
                os.replace(self._path, self._path.with_name(f"{self._path.name}.1"))
        self._file = self._open(truncate=True)
        self._size = 0
        self._rotations += 1

    def counters(self) -> Dict[str, Any]:
        """Returns ``{"written": lines, "rotations": n}``."""
        return {"written": self._written, "rotations": self._rotations}

    def close(self, timeout: float = 2.0) -> None:
        """Flushes and closes the file; later captions are ignored."""
        self._closed = True
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError as exc:
                log.warning("closing %s: %s", self._path, exc)


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
            while self._buffer:
                self._publish(*self._buffer.popleft())
            self._connected = True
            self._connects += 1
            self._unreachable_said = False
            self._last_error = ""
        log.info("MQTT connected to %s%s", self._where, " over TLS" if self._tls else "")

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        # No lock: paho may call this while holding its own locks that publish() takes.
        was, self._connected = self._connected, False
        if self._closing:
            return
        if was:
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
        """Returns connected, published, buffered, dropped, errors and connects."""
        with self._lock:
            return {"connected": self._connected, "published": self._published,
                    "buffered": len(self._buffer), "dropped": self._dropped,
                    "errors": self._errors, "connects": self._connects}

    def close(self, timeout: float = 2.0) -> None:
        """Publishes ``offline`` (retained) if connected, disconnects and stops paho's thread."""
        deadline = time.monotonic() + timeout
        try:
            with self._lock:
                self._closing = True
                info = self._publish(self.availability_topic, b"offline", retain=True) \
                    if self._connected else None
                if self._buffer:
                    log.warning("MQTT: %d messages (captions, events) not sent (broker %s away at shutdown)",
                                len(self._buffer), self._where)
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


class SinkSet(Sink):
    """Fans calls out to several sinks; a sink that raises is logged once, counted, and skipped.

    Thread-safe: calls are serialized, so cameras may deliver from their own threads.
    """

    name = "sinks"

    def __init__(self, sinks: List[Sink]) -> None:
        """Takes ownership of ``sinks`` (``close`` closes them)."""
        self.sinks = list(sinks)
        self._failures: Dict[str, int] = {sink.name: 0 for sink in self.sinks}
        self._lock = threading.Lock()

    def caption(self, camera: str, caption: "Caption") -> None:
        """Delivers the caption to every sink."""
        with self._lock:
            for sink in self.sinks:
                try:
                    sink.caption(camera, caption)
                except Exception as exc:
                    self._failed(sink, "caption", exc)

    def event(self, camera: str, event: "Event", change: "Change") -> None:
        """Delivers the event's change to every sink."""
        with self._lock:
            for sink in self.sinks:
                try:
                    sink.event(camera, event, change)
                except Exception as exc:
                    self._failed(sink, "event", exc)

    def stats(self, snapshot: Dict[str, Any]) -> None:
        """Delivers the stats snapshot to every sink."""
        with self._lock:
            for sink in self.sinks:
                try:
                    sink.stats(snapshot)
                except Exception as exc:
                    self._failed(sink, "stats", exc)

    def _failed(self, sink: Sink, what: str, exc: BaseException) -> None:
        self._failures[sink.name] = self._failures.get(sink.name, 0) + 1
        if self._failures[sink.name] == 1:
            log.warning("%s sink failed (%s): %s: %s; the other sinks go on, further failures are counted",
                        sink.name, what, type(exc).__name__, exc)

    def counters(self) -> Dict[str, Any]:
        """Returns each sink's counters plus ``failures`` (calls that raised), by sink name."""
        with self._lock:
            return {sink.name: {**sink.counters(), "failures": self._failures.get(sink.name, 0)}
                    for sink in self.sinks}

    def close(self, timeout: float = 2.0) -> None:
        """Closes every sink within ``timeout`` seconds overall."""
        deadline = time.monotonic() + timeout
        with self._lock:
            sinks, self.sinks = self.sinks, []
        for sink in sinks:
            try:
                sink.close(max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                log.warning("%s sink: close failed: %s", sink.name, exc)


def open_sinks(config: "ServiceConfig", stdout: Optional[TextIO] = None, extra: Sequence[Sink] = ()) -> SinkSet:
    """Opens the sinks the config enables.

    Args:
      config: The service config (its ``sinks`` tables).
      stdout: Stream for the stdout sink (default ``sys.stdout``).
      extra: Sinks the caller opened (the history), put last; closed here if another cannot start.

    Returns:
      The sinks, as one ``SinkSet``.

    Raises:
      ConfigError: If a sink cannot start (an unwritable JSON-lines path, MQTT
        TLS files that do not load); an unreachable broker is not an error.
    """
    sinks: List[Sink] = []
    jsonl = config.sinks.jsonl
    try:
        if jsonl.path:
            sinks.append(JsonlSink(jsonl.path, jsonl.max_bytes, jsonl.backups, jsonl.events))
        if config.sinks.stdout.enabled:
            sinks.append(StdoutSink(stdout))
        if config.sinks.mqtt.host:  # raises, if at all, before its thread starts
            sinks.append(MqttSink(config.sinks.mqtt, cameras=[camera.name for camera in config.cameras]))
    except ConfigError:
        SinkSet(sinks + list(extra)).close()  # the file already opened
        raise
    return SinkSet(sinks + list(extra))
