"""The service's TOML config file, read into typed records through edgecap.schema.

One file names the cameras, the bundle, the plan or board, the HTTP address and
the sinks (see deploy/edgecap.toml for a commented example). Every failure is
one ``ConfigError`` line naming the file, the line and the key::

    edgecap.toml:12: cameras[0].fps: must be float > 0.0; frames per second the camera delivers

Paths in the file (``bundle``, ``plan``, ``http.token_file``,
``sinks.jsonl.path``, the ``sinks.mqtt`` TLS files and file camera sources) are
relative to the file's own directory; paths given as overrides (command-line
flags) are taken as they are.

Secrets follow one rule wherever they are written: a file that holds one (a
token file, an MQTT client's private key, or the config itself when it has an
inline ``http.token`` or ``sinks.mqtt.password``) must not be readable by every
user. Group read is allowed: install.sh makes the config ``root:edgecap 0640``
so that the service's user reads it through its group.
"""

from __future__ import annotations

import collections
import ipaddress
import math
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import msgspec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.9/3.10 only
    import tomli as tomllib

from edgecap import files, schema
from edgecap.errors import ConfigError, SourceError
from edgecap.limits import DEFAULT_BEAM, MAX_BEAM

try:  # Annotated is in typing from 3.9 on
    from typing import Annotated, Literal
except ImportError:  # pragma: no cover
    from typing_extensions import Annotated, Literal  # type: ignore[assignment]

NAME_PATTERN = r"^[A-Za-z0-9_-]+$"

CameraName = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, max_length=64)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
Side = Annotated[int, msgspec.Meta(ge=1, le=16384)]
CameraFps = Annotated[float, msgspec.Meta(gt=0.0, le=1000.0)]
Seconds = Annotated[float, msgspec.Meta(gt=0.0, le=86_400.0)]
WindowFrames = Annotated[int, msgspec.Meta(ge=1, le=10_000)]
SampleFps = Annotated[float, msgspec.Meta(ge=0.0, le=10_000.0)]
Beam = Annotated[int, msgspec.Meta(ge=1, le=MAX_BEAM)]
# A system CA bundle is about 200 kB; OpenSSL reads a TLS file whole.
MAX_TLS_FILE_BYTES = 4 * 1024 * 1024
# MQTT wildcards and NUL have no place in a topic someone publishes to.
TopicPrefix = Annotated[str, msgspec.Meta(pattern=r"^[^#+\x00]+$", max_length=256)]

_FIX = "see deploy/edgecap.toml for every key and its default"

MIN_TOKEN_CHARS = 16
# Bits by the token's own character mix (length x Shannon entropy per character): a
# random 22-character token_urlsafe scores ~85-120, "aaaaaaaaaaaaaaaa" 0, "abcdefghijklmnop" 64.
MIN_TOKEN_BITS = 72.0
TOKEN_FIX = "make one with `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`"
_VISIBLE_ASCII = re.compile(r"^[\x21-\x7e]+$")  # fits a header and a form unchanged

# What to do about a bad value, by key: appended to the message.
_HINTS: Dict[str, str] = {
    "bundle": "give the bundle's directory",
    "plan": "give a plan.json or a directory holding one, or leave it empty to plan for `board`",
    "board": "use auto or a board profile name (`edgecap devices` lists them)",
    "on_missing_tpu": 'use "cpu" (run on the CPU) or "fail"',
    "beam": f"use the decoder's beam width, a whole number from 1 (greedy) to {MAX_BEAM} "
            f"(default {DEFAULT_BEAM})",
    "log_level": "use debug, info, warning or error",
    "http": "[http] takes address, port, token and token_file",
    "address": "give an IP address to bind, e.g. 127.0.0.1",
    "port": "use a port number from 0 to 65535",
    "token": "give the access token as a string",
    "token_file": "give the path of a file holding the token",
    "cameras": "add at least one [[cameras]] table with a name and a source",
    "name": "use letters, digits, '_' and '-' only: the name goes into MQTT topics and metric labels",
    "source": "give a device path (/dev/video0), a camera index or a video file",
    "width": "use the capture width in pixels",
    "height": "use the capture height in pixels",
    "fps": "use the frames per second the camera delivers",
    "fourcc": "use MJPG or YUYV",
    "loop": "use true or false",
    "frames": "use a whole number of sampled frames per window, 1 to 10000",
    "stride": "use a whole number of sampled frames between windows, 1 to 10000",
    "sample_fps": "use the sampling rate in frames per second (0 keeps every frame)",
    "stall_seconds": "use the seconds without a frame before the camera is reopened",
    "backoff_max_seconds": "use the longest wait between reopen attempts, in seconds",
    "sinks": "[sinks] takes the tables stdout, jsonl and mqtt",
    "stdout": "[sinks.stdout] takes enabled = true | false",
    "enabled": "use true or false",
    "jsonl": "[sinks.jsonl] takes path, max_bytes and backups",
    "path": 'give the JSON-lines file to write, or "" to disable it',
    "max_bytes": "use the size in bytes at which the file is rotated",
    "backups": "use how many rotated files to keep",
    "mqtt": "[sinks.mqtt] takes host, port, topic_prefix, client_id, username, password, "
            "stats_interval_seconds, buffer, tls, ca_file, cert_file, key_file, tls_insecure, discovery "
            "and discovery_prefix",
    "host": 'give the broker\'s host name or address, or "" to disable MQTT',
    "topic_prefix": "use a topic prefix without the wildcards + and #",
    "client_id": "give a client id, or leave it empty for edgecap-<hostname>",
    "stats_interval_seconds": "use the seconds between stats messages",
    "buffer": "use how many messages to keep while the broker is away",
    "tls": "use true (TLS to the broker, usually port 8883) or false",
    "ca_file": "give the PEM file of the CA that signed the broker's certificate, or \"\" for the system's CAs",
    "cert_file": "give the PEM file of the client certificate, or \"\" for none",
    "key_file": "give the PEM file of the client certificate's private key",
    "tls_insecure": "use false (check the broker's certificate and name) or true (do not: insecure)",
    "discovery": "use true (announce each camera's caption sensor to Home Assistant) or false",
    "discovery_prefix": "use Home Assistant's MQTT discovery prefix (homeassistant unless changed there), "
                        "without the wildcards + and #",
    "history": "[history] takes path, max_age_days, max_bytes and captions",
    "history.path": 'give the history database file (relative: in the state directory), or "" to keep no history',
    "history.max_age_days": "use the days events are kept, more than 0",
    "history.max_bytes": "use the disk budget of the history in bytes (thumbnails included), at least 1000000",
    "history.captions": "use true (keep every caption too) or false (events only)",
}


class _Record(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A table of the config file: unknown keys are errors, values are immutable."""


class CameraConfig(_Record):
    """One ``[[cameras]]`` table.

    Attributes:
      name: Unique, ``[A-Za-z0-9_-]+``; names MQTT topics and metric labels.
      source: Device path, camera index (as text) or video file.
      width: Capture width requested from the camera.
      height: Capture height requested from the camera.
      fps: Capture rate requested from the camera.
      fourcc: Pixel format requested from the camera.
      loop: Restart a file source at its end (testing, demos).
      frames: Sampled frames per window (default: the bundle's).
      stride: Sampled frames between window starts (default: the bundle's).
      sample_fps: Sampling rate (default: the bundle's; 0 keeps every frame).
      stall_seconds: No frame for this long reopens the camera.
      backoff_max_seconds: Longest wait between reopen attempts.
    """

    name: CameraName
    source: schema.Name
    width: Side = 640
    height: Side = 480
    fps: CameraFps = 15.0
    fourcc: Literal["MJPG", "YUYV"] = "MJPG"
    loop: bool = False
    frames: Optional[WindowFrames] = None
    stride: Optional[WindowFrames] = None
    sample_fps: Optional[SampleFps] = None
    stall_seconds: Seconds = 20.0
    backoff_max_seconds: Seconds = 30.0


class HttpConfig(_Record):
    """The ``[http]`` table.

    Attributes:
      address: Address to bind; any but loopback requires a token.
      port: Port to bind (0: any free port).
      token: Access token (bearer or login cookie); filled from ``token_file``.
      token_file: File holding the token; must not be world-readable.
    """

    address: schema.Name = "127.0.0.1"
    port: Port = 8080
    token: str = ""
    token_file: str = ""


class StdoutSinkConfig(_Record):
    """``[sinks.stdout]``: one line per caption on stdout (the journal under systemd)."""

    enabled: bool = True


class JsonlSinkConfig(_Record):
    """``[sinks.jsonl]``: captions as JSON lines, rotated by size.

    Attributes:
      path: The file; empty disables the sink.
      max_bytes: Size at which the file is rotated.
      backups: Rotated files kept (``file.1`` is the newest).
      events: Also write a line when an event opens and when it closes
        (``edgecap.service.sinks.event_record``); off by default, so the file
        holds only captions.
    """

    path: str = ""
    max_bytes: Annotated[int, msgspec.Meta(ge=1024, le=schema.MAX_BYTES)] = 10_000_000
    backups: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 3
    events: bool = False


class MqttSinkConfig(_Record):
    """``[sinks.mqtt]``: captions, availability and stats on an MQTT broker.

    Attributes:
      host: Broker host; empty disables the sink.
      port: Broker port.
      topic_prefix: Topics are ``{prefix}/{camera}/caption``, ``{prefix}/{camera}/event``
        (and ``/event/thumbnail``), ``{prefix}/availability`` and ``{prefix}/stats``.
      client_id: MQTT client id; empty means ``edgecap-<hostname>``.
      username: Broker user (empty: anonymous).
      password: Broker password.
      stats_interval_seconds: Seconds between stats messages.
      buffer: Messages kept while the broker is away; the oldest go beyond it.
      tls: Connect with TLS, checking the broker's certificate and host name.
      ca_file: PEM file of the CAs trusted for the broker (empty: the system's).
      cert_file: PEM file of the client certificate (empty: none); may hold the key.
      key_file: PEM file of the client certificate's private key (empty: in
        ``cert_file``); must not be readable by every user.
      tls_insecure: Skip the check of the broker's certificate and host name
        (the link is encrypted but the broker not authenticated); logs a warning.
      discovery: Announce a caption sensor and a thumbnail image per camera to
        Home Assistant (MQTT discovery, retained, on every connect).
      discovery_prefix: Home Assistant's discovery prefix.
    """

    host: str = ""
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 1883
    topic_prefix: TopicPrefix = "edgecap"
    client_id: Annotated[str, msgspec.Meta(max_length=256)] = ""
    username: str = ""
    password: str = ""
    stats_interval_seconds: Seconds = 10.0
    buffer: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 1000
    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    tls_insecure: bool = False
    discovery: bool = True
    discovery_prefix: TopicPrefix = "homeassistant"


class SinksConfig(_Record):
    """The ``[sinks]`` tables."""

    stdout: StdoutSinkConfig = msgspec.field(default_factory=StdoutSinkConfig)
    jsonl: JsonlSinkConfig = msgspec.field(default_factory=JsonlSinkConfig)
    mqtt: MqttSinkConfig = msgspec.field(default_factory=MqttSinkConfig)


class HistoryConfig(_Record):
    """``[history]``: events (and optionally every caption) in an SQLite file, searchable.

    Attributes:
      path: The database file; relative to the state directory
        (``state_directory()``); empty keeps no history.
      max_age_days: Events older than this are deleted.
      max_bytes: Disk budget, thumbnails included; the oldest events go beyond it.
      captions: Keep every caption too, not only events.
    """

    path: str = "history.db"
    max_age_days: Annotated[float, msgspec.Meta(gt=0.0, le=36_500.0)] = 30.0
    max_bytes: Annotated[int, msgspec.Meta(ge=1_000_000, le=schema.MAX_BYTES)] = 500_000_000
    captions: bool = False


class ServiceConfig(_Record):
    """The whole config file of ``edgecap serve``.

    Attributes:
      cameras: One or more cameras; names are unique.
      bundle: Model bundle directory (empty: ``$EDGECAP_BUNDLE``, else the demo).
      plan: A plan.json or directory (empty: plan for ``board``).
      board: ``auto`` or a board profile name.
      on_missing_tpu: ``cpu`` runs on what is there; ``fail`` refuses to start.
      beam: The decoder's beam width (``CaptionerOptions.beam``).
      log_level: debug, info, warning or error.
      http: The status page and API.
      sinks: Where captions go.
      history: The event history.
    """

    cameras: Annotated[List[CameraConfig], msgspec.Meta(min_length=1, max_length=64)]
    bundle: str = ""
    plan: str = ""
    board: schema.Name = "auto"
    on_missing_tpu: Literal["cpu", "fail"] = "cpu"
    beam: Beam = DEFAULT_BEAM
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    sinks: SinksConfig = msgspec.field(default_factory=SinksConfig)
    history: HistoryConfig = msgspec.field(default_factory=HistoryConfig)


def state_directory() -> Path:
    """Where the service keeps its state (the history): ``$STATE_DIRECTORY``, else ``$XDG_STATE_HOME/edgecap``.

    systemd sets ``$STATE_DIRECTORY`` from the unit's ``StateDirectory=``
    (/var/lib/edgecap; systemd 240 and later, so Mendel's 241 too); outside
    systemd the default is ``~/.local/state/edgecap``.
    """
    given = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "edgecap"


Key = Tuple[Union[str, int], ...]


def load_config(path: "str | os.PathLike[str]", overrides: Mapping[str, Any] = {}) -> ServiceConfig:
    """Reads and checks the service's config file.

    Args:
      path: The TOML file.
      overrides: Values that replace the file's, by dotted key (``"http.port"``,
        ``"cameras[0].fps"``, ``"board"``), e.g. from command-line flags; a
        value of None (a flag not given) leaves the file's value.

    Returns:
      The typed config, with the token read from ``http.token_file`` when set and
      the file's relative paths made relative to its directory.

    Raises:
      ConfigError: One line naming the file, the line and the key, for an
        unreadable file, malformed TOML, an unknown key, a wrong type, a value
        out of range, duplicate or malformed camera names, a file camera that is
        missing or not a video (a device camera may be absent), an off-loopback
        address without a token, a token file or MQTT private key that is
        unreadable or readable by everyone, MQTT TLS files without ``tls``, or
        an inline token or MQTT password in a file readable by everyone.
    """
    path = Path(path)
    data = files.read_bytes(path, what="config file", error=ConfigError, kind="toml",
                            fix="give the path of a readable TOML file")
    text = _text(path, data)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(_toml_message(path, text, exc)) from None
    except RecursionError:  # tomllib recurses once per nesting level
        raise ConfigError(f"{path}: malformed TOML ({schema.TOO_DEEP.replace('objects', 'tables')}); "
                          "fix the TOML syntax") from None
    _check_inline_secrets(path, text, raw)
    _resolve_paths(raw, path.absolute().parent)
    applied = _apply_overrides(raw, overrides, path)
    try:
        config = msgspec.convert(raw, ServiceConfig, strict=True)
    except msgspec.ValidationError as exc:
        problem, key = _problem(exc)
        raise ConfigError(_message(path, text, key, problem, applied)) from None
    except RecursionError:  # an override nested deeper than msgspec recurses
        raise ConfigError(f"{path}: an override has {schema.TOO_DEEP}; pass a plain value") from None
    except UnicodeError:  # msgspec cannot quote a lone surrogate; TOML text never holds one
        bad = [k for k, v in overrides.items() if schema.unrepresentable(v) == schema.NOT_UNICODE]
        raise ConfigError(f"{path}: override {bad[0] if bad else '?'}: {schema.NOT_UNICODE} (bytes that are "
                          "not UTF-8?); pass UTF-8 text") from None
    _check_names(path, text, config, applied)
    _check_mqtt(path, text, config.sinks.mqtt, applied)
    if config.history.path:
        config = msgspec.structs.replace(config, history=msgspec.structs.replace(
            config.history, path=str(state_directory() / config.history.path)))
    _check_history_path(path, text, config, applied)
    _check_sources(path, text, config, applied)
    return _check_http(path, text, config, applied)


def locate(text: str, key: Sequence[Union[str, int]]) -> Optional[int]:
    """Finds the line of a TOML document that sets ``key`` (or its closest enclosing table).

    tomlkit reads the document keeping its layout and renders it back byte for
    byte; the item at ``key`` is found in its tree and its line read off that
    rendering with a mark put before the item. Asked only where a document that
    tomllib read went wrong.

    Args:
      text: The TOML document.
      key: Path of the key, e.g. ``("cameras", 1, "fps")``.

    Returns:
      The 1-based line that sets the key, else the line of its nearest
      enclosing table or key, else None.
    """
    try:
        import tomlkit  # here, not at the top: only a bad file pays for it

        doc = tomlkit.parse(text)
    except Exception:  # no tomlkit, or one that reads the file otherwise than tomllib: no line, same message
        return None
    for item in reversed(_items(doc, tuple(key))):
        line = _line_of(doc, item)
        if line is not None:
            return line
    return None


_MARK = "\x00"  # in no TOML document: tomllib refuses control characters


def _items(node: Any, key: Key) -> List[Any]:
    """tomlkit's items along ``key``, as deep as the document goes (a table written in parts: each part)."""
    if not key:
        return []
    best: List[Any] = []
    for child in _children(node, key[0]):
        path = [child] + _items(child, key[1:])
        if len(path) > len(best):
            best = path
    return best


def _children(node: Any, part: Union[str, int]) -> List[Any]:
    """The items of ``node`` at ``part``: an index of an array (of tables), else every entry of that name."""
    from tomlkit.container import Container
    from tomlkit.items import AoT, Array

    if isinstance(part, int):
        return [node[part]] if isinstance(node, (AoT, Array)) and 0 <= part < len(node) else []
    body = node if isinstance(node, Container) else getattr(node, "value", None)
    if not isinstance(body, Container):
        return []
    return [item for name, item in body.body if name is not None and name.key == part]


def _line_of(doc: Any, item: Any) -> Optional[int]:
    """The line where ``item`` starts in ``doc``; for a table without a header, where its first key does."""
    from tomlkit.items import AoT, Table

    trivia = getattr(item, "trivia", None)
    if trivia is not None:
        indent = trivia.indent
        trivia.indent = indent + _MARK
        try:
            rendered = doc.as_string()
        finally:
            trivia.indent = indent
        at = rendered.find(_MARK)
        if at >= 0:
            return rendered.count("\n", 0, at) + 1
    if isinstance(item, AoT):
        children = list(item.body)
    elif isinstance(item, Table):
        children = [child for name, child in item.value.body if name is not None]
    else:
        return None  # a value inside an array or an inline table: the caller takes the key that holds it
    for child in children:
        line = _line_of(doc, child)
        if line is not None:
            return line
    return None


# --- reading -------------------------------------------------------------------------

_AT_LINE = re.compile(r"\s*\(at line (?P<line>\d+), column (?P<col>\d+)\)\s*$")
_AT_END = re.compile(r"\s*\(at end of document\)\s*$")
_INDEX = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
_OVERRIDE_PART = re.compile(r"([A-Za-z0-9_-]+)|\[(\d+)\]")


def _text(path: Path, data: bytes) -> str:
    """The file as text; a file that is not UTF-8 gets one line naming where."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text; save the config file as UTF-8") from None


def _toml_message(path: Path, text: str, exc: Exception) -> str:
    """tomllib's error as ``FILE:LINE: malformed TOML (problem, column N); fix``."""
    msg = str(exc)
    at = _AT_LINE.search(msg)
    if at:
        line, problem = at.group("line"), f"{msg[:at.start()]}, column {at.group('col')}"
    else:
        line, problem = str(max(1, len(text.splitlines()))), f"{_AT_END.sub('', msg)}, at the end of the file"
    return (f"{path}:{line}: malformed TOML ({problem[:1].lower()}{problem[1:]}); "
            f"fix the TOML syntax there")


def _resolve_paths(raw: Dict[str, Any], base: Path) -> None:
    """Makes the file's relative paths relative to its directory, in place."""

    def fix(table: Any, key: str) -> None:
        if isinstance(table, dict) and isinstance(table.get(key), str) and table[key]:
            value = Path(table[key]).expanduser()
            if not value.is_absolute():
                table[key] = str(base / value)

    fix(raw, "bundle")
    fix(raw, "plan")
    fix(raw.get("http"), "token_file")
    sinks = raw.get("sinks")
    fix(sinks.get("jsonl") if isinstance(sinks, dict) else None, "path")
    mqtt = sinks.get("mqtt") if isinstance(sinks, dict) else None
    for key in ("ca_file", "cert_file", "key_file"):
        fix(mqtt, key)
    cameras = raw.get("cameras")
    for camera in cameras if isinstance(cameras, list) else ():
        if not isinstance(camera, dict):
            continue
        source = camera.get("source")
        # A camera index may be written as a number; the pipeline takes text.
        if isinstance(source, int) and not isinstance(source, bool):
            camera["source"] = str(source)
        elif isinstance(source, str) and source and not source.isdigit() and "://" not in source:
            fix(camera, "source")


def _override_key(key: str) -> Key:
    """``"cameras[0].fps"`` or ``"cameras.0.fps"`` -> ``("cameras", 0, "fps")``."""
    parts: List[Union[str, int]] = []
    for piece in key.split("."):
        matched = _OVERRIDE_PART.findall(piece)
        if not piece or "".join(f"{n}" if n else f"[{i}]" for n, i in matched) != piece:
            raise ConfigError(f"override {key!r}: not a key; write keys as in the file, "
                              f"e.g. http.port or cameras[0].fps")
        for name, index in matched:
            parts.append(int(name) if name.isdigit() else name if name else int(index))
    return tuple(parts)


def _apply_overrides(raw: Dict[str, Any], overrides: Mapping[str, Any], path: Path) -> List[Key]:
    """Sets each override in the parsed document; returns their keys."""
    applied = []
    for dotted, value in overrides.items():
        if value is None:
            continue
        key = _override_key(dotted)
        node: Any = raw
        for i, part in enumerate(key[:-1]):
            nxt = key[i + 1]
            if isinstance(part, int):
                if not isinstance(node, list) or part >= len(node):
                    raise ConfigError(f"{path}: override {dotted}: there is no {_name(key[:i + 1])}; "
                                      f"the file has {len(node) if isinstance(node, list) else 0}")
                node = node[part]
            else:
                if not isinstance(node, dict):
                    raise ConfigError(f"{path}: override {dotted}: {_name(key[:i])} is not a table")
                node = node.setdefault(part, [] if isinstance(nxt, int) else {})
        last = key[-1]
        if isinstance(last, int):
            if not isinstance(node, list) or last >= len(node):
                raise ConfigError(f"{path}: override {dotted}: there is no {_name(key)}")
        elif not isinstance(node, dict):
            raise ConfigError(f"{path}: override {dotted}: {_name(key[:-1])} is not a table")
        node[last] = value
        applied.append(key)
    return applied


# --- messages --------------------------------------------------------------------------

def _name(key: Sequence[Union[str, int]]) -> str:
    """``("cameras", 0, "fps")`` -> ``cameras[0].fps``."""
    out = ""
    for part in key:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _problem(exc: msgspec.ValidationError) -> Tuple[str, Key]:
    """msgspec's message as (problem in edgecap's words, key it is about)."""
    where, msg = schema.problem(exc)
    key: Key = tuple(int(i) if i else n for n, i in _INDEX.findall("." + where if where else ""))
    if msg == "is unknown":
        return "unknown key", key
    if "matching regex" in msg:
        if NAME_PATTERN in msg:
            return "must be letters, digits, '_' and '-' only", key
        return "must be text without the MQTT wildcards + and #", key
    if msg.startswith("invalid enum value"):
        return f"invalid value {msg[len('invalid enum value '):]}", key
    return msg.replace("array of length", "a list of length"), key


def _hint(key: Key) -> str:
    """The fix for a bad value at ``key``."""
    names = [part for part in key if isinstance(part, str)]
    return _HINTS.get(".".join(names), _HINTS.get(names[-1], _FIX)) if names else _FIX


def _message(path: Path, text: str, key: Key, problem: str, applied: Sequence[Key],
             hint: Optional[str] = None) -> str:
    """``FILE:LINE: key: problem; fix`` (or ``FILE: key (override): ...`` for a flag's value)."""
    hint = hint or _hint(key)
    # An override's own key, a key inside it, or the unknown key it created.
    if any(key[:len(o)] == o or o[:len(key)] == key for o in applied):
        return f"{path}: {_name(key)} (from an override): {problem}; {hint}"
    line = locate(text, key) if key else None
    where = f"{path}:{line}" if line else str(path)
    return f"{where}: {_name(key) or 'the file'}: {problem}; {hint}"


# --- checks across keys -------------------------------------------------------------------

def _check_names(path: Path, text: str, config: ServiceConfig, applied: Sequence[Key]) -> None:
    """Refuses two cameras of the same name (the name keys topics, labels and pages) and network streams."""
    seen: Dict[str, int] = {}
    for i, camera in enumerate(config.cameras):
        if camera.name in seen:
            raise ConfigError(_message(
                path, text, ("cameras", i, "name"),
                f"{camera.name!r} is also the name of cameras[{seen[camera.name]}]", applied,
                "give each camera its own name"))
        seen[camera.name] = i
        if "://" in camera.source:
            from edgecap.sources import redact  # here: it loads OpenCV

            raise ConfigError(_message(
                path, text, ("cameras", i, "source"),
                f"{redact(camera.source)!r} is a network stream, which edgecap does not read yet", applied,
                "use a V4L2 device (/dev/videoN), a camera index or a video file"))


# Inline secrets, by key, and where else the secret can live.
_INLINE_SECRETS: Dict[Key, str] = {
    ("http", "token"): ", or move the token into a file named by http.token_file",
    ("sinks", "mqtt", "password"): "",
}


def _check_inline_secrets(path: Path, text: str, raw: Mapping[str, Any]) -> None:
    """Refuses a config file readable by every user that holds a token or password (as a token file is)."""
    held = next((key for key in _INLINE_SECRETS if _is_set(raw, key)), None)
    if held is None:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigError(f"{path}: cannot stat ({exc.strerror or exc}); "
                          "give the path of a readable TOML file") from None
    if mode & stat.S_IROTH:
        raise ConfigError(_message(path, text, held, f"{path} holds this secret and is readable by every user",
                                   (), f"run `chmod o-r {path}`{_INLINE_SECRETS[held]}"))


def _is_set(raw: Mapping[str, Any], key: Key) -> bool:
    """True if the parsed document sets ``key`` to non-empty text."""
    value: Any = raw
    for part in key:
        value = value.get(part) if isinstance(value, dict) else None
    return isinstance(value, str) and bool(value)


def _check_mqtt(path: Path, text: str, mqtt: MqttSinkConfig, applied: Sequence[Key]) -> None:
    """Refuses TLS keys without ``tls``, and TLS files that are missing, special or (keys) readable by everyone."""
    if not mqtt.tls:
        # Else a config that names a CA would talk to the broker in clear without a word.
        for name in ("ca_file", "cert_file", "key_file", "tls_insecure"):
            if getattr(mqtt, name):
                raise ConfigError(_message(path, text, ("sinks", "mqtt", name), "set while sinks.mqtt.tls is false",
                                           applied, "set tls = true to connect with TLS, or remove the key"))
        return
    if mqtt.key_file and not mqtt.cert_file:
        raise ConfigError(_message(path, text, ("sinks", "mqtt", "key_file"), "set without sinks.mqtt.cert_file",
                                   applied, "give the client certificate in cert_file too, or remove key_file"))
    # The private key is in key_file, else in cert_file (one PEM holding both).
    private = "key_file" if mqtt.key_file else "cert_file"
    for name in ("ca_file", "cert_file", "key_file"):
        if getattr(mqtt, name):
            _check_tls_file(path, text, name, Path(getattr(mqtt, name)), name == private, applied)


def _check_tls_file(path: Path, text: str, name: str, file: Path, private: bool, applied: Sequence[Key]) -> None:
    """Refuses a TLS file that is missing, not a regular file, unreadable, or a private key readable by everyone."""
    key = ("sinks", "mqtt", name)
    try:
        # stat, not open: opening a FIFO would block.
        st = os.stat(file)
    except OSError as exc:
        raise ConfigError(_message(path, text, key, f"cannot read {file} ({exc.strerror or exc})", applied,
                                   "give an existing PEM file, readable by the service's user")) from None
    except ValueError:  # a NUL in the name, which no system call takes
        raise ConfigError(_message(path, text, key, f"{str(file)!r} is not a usable file name "
                                   "(it contains a NUL byte)", applied, "give the PEM file's path")) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(_message(path, text, key, f"{file} is not a regular file", applied,
                                   "give a PEM file"))
    if st.st_size > MAX_TLS_FILE_BYTES:  # OpenSSL reads it whole
        raise ConfigError(_message(path, text, key, f"{file} is {st.st_size} bytes, more than a PEM file of "
                                   f"certificates ({MAX_TLS_FILE_BYTES} at most)", applied, "give a PEM file"))
    if private and st.st_mode & stat.S_IROTH:
        raise ConfigError(_message(path, text, key, f"{file} holds the client's private key and is readable "
                                   "by every user", applied, f"run `chmod o-r {file}`"))
    if not os.access(file, os.R_OK):
        raise ConfigError(_message(path, text, key, f"cannot read {file} (permission denied)", applied,
                                   "make it readable by the service's user (its group may read it)"))


def _check_history_path(path: Path, text: str, config: ServiceConfig, applied: Sequence[Key]) -> None:
    """Refuses a history that would be the JSON-lines file or the config: two writers of one file."""
    history = config.history.path
    if not history:
        return
    for key, other in ((("sinks", "jsonl", "path"), config.sinks.jsonl.path), ((), str(path))):
        if other and os.path.abspath(history) == os.path.abspath(other):
            what = "the JSON-lines file (sinks.jsonl.path)" if key else "this config file"
            raise ConfigError(_message(path, text, ("history", "path"), f"{history} is {what}", applied,
                                       "give the history a file of its own"))


def _check_sources(path: Path, text: str, config: ServiceConfig, applied: Sequence[Key]) -> None:
    """Refuses a file camera that is missing or not a video; a device camera may come later.

    A file cannot appear by itself, so a wrong one is a config error at start
    (exit 2, which the unit does not restart); a device (/dev/videoN, an index)
    may be plugged in after the service starts, and the service waits for it.
    """
    # Imported here, not at the top: the cameras module loads OpenCV.
    from edgecap.service.cameras import check_file_source, is_device_source

    for i, camera in enumerate(config.cameras):
        if is_device_source(camera.source):
            continue
        try:
            check_file_source(camera.source)
        except SourceError as exc:
            raise ConfigError(_message(
                path, text, ("cameras", i, "source"), str(exc), applied,
                "only a device camera (/dev/videoN, an index) may be absent at start")) from None


def is_loopback(address: str) -> bool:
    """Says whether an address reaches only this machine: the config's ``http.address`` and a request's Host.

    Args:
      address: An IP address, bracketed or not (``::1``, ``[::1]``), or a
        host name; ``localhost`` in any case (host names are not case-sensitive).

    Returns:
      True for 127.0.0.0/8, ::1 and localhost; False for anything else, a host
      name or "" included (it may resolve anywhere, so it counts as exposed).
    """
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_http(path: Path, text: str, config: ServiceConfig, applied: Sequence[Key]) -> ServiceConfig:
    """Reads the token file and refuses an address off loopback without a token."""
    http = config.http
    if http.token and http.token_file:
        raise ConfigError(_message(path, text, ("http", "token_file"), "set together with http.token",
                                   applied, "keep one of token and token_file"))
    if http.token_file:
        token = _read_token(path, text, Path(http.token_file), applied)
        http = msgspec.structs.replace(http, token=token)
    weakness = token_weakness(http.token) if http.token else None
    if weakness is not None:
        key = ("http", "token_file") if http.token_file else ("http", "token")
        raise ConfigError(_message(path, text, key, f"the token {weakness}", applied, TOKEN_FIX))
    if not http.token and not is_loopback(http.address):
        raise ConfigError(_message(
            path, text, ("http", "address"),
            f"{http.address} is not a loopback address and no access token is set", applied,
            "set http.token or http.token_file (the page serves camera frames), "
            "or bind 127.0.0.1"))
    return msgspec.structs.replace(config, http=http)


def _read_token(path: Path, text: str, token_file: Path, applied: Sequence[Key]) -> str:
    """The token in ``token_file``, which must be readable by us and not by everyone."""
    key = ("http", "token_file")
    unreadable = "create the file, readable by the service's user"
    try:
        # stat first: opening a FIFO or device would block or read forever.
        if not stat.S_ISREG(os.stat(token_file).st_mode):
            raise ConfigError(_message(path, text, key, f"{token_file} is not a regular file", applied,
                                       "give a file holding the token"))
        data, st = files.read_regular(token_file, "token")
        mode = st.st_mode
    except OSError as exc:
        raise ConfigError(_message(path, text, key, f"cannot read {token_file} "
                                   f"({exc.strerror or exc})", applied, unreadable)) from None
    except ValueError:  # a NUL in the name, which no system call takes
        raise ConfigError(_message(path, text, key, f"{str(token_file)!r} is not a usable file name "
                                   "(it contains a NUL byte)", applied, "give the token file's path")) from None
    if mode & stat.S_IROTH:
        raise ConfigError(_message(path, text, key, f"{token_file} is readable by every user", applied,
                                   f"run `chmod 600 {token_file}`"))
    token = data.decode("utf-8", "replace").strip()
    if not token:
        raise ConfigError(_message(path, text, key, f"{token_file} is empty", applied,
                                   "write the access token into it"))
    return token


def token_weakness(token: str) -> Optional[str]:
    """Says what makes an access token easy to guess, or None for a good one.

    Args:
      token: The token as configured.

    Returns:
      None, or the problem as words that follow "the token", e.g. "is too easy to
      guess (16 characters, 1 different: ...)"; ``TOKEN_FIX`` says how to make one.
    """
    if not _VISIBLE_ASCII.match(token):
        return "must be visible ASCII characters without spaces"
    if len(token) < MIN_TOKEN_CHARS:
        return f"has {len(token)} characters; at least {MIN_TOKEN_CHARS} are needed"
    counts = collections.Counter(token).values()
    bits = sum(n * math.log2(len(token) / n) for n in counts)
    if bits < MIN_TOKEN_BITS:
        return (f"is too easy to guess ({len(token)} characters, {len(counts)} different: about "
                f"{bits:.0f} bits where {MIN_TOKEN_BITS:.0f} are needed)")
    return None
