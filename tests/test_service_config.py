"""The service's TOML config: typed values, defaults, overrides, and one-line errors with file:line: key."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from edgecap.errors import ConfigError
from edgecap.service.config import (
    CameraConfig, ServiceConfig, is_loopback, load_config, locate,
)

FULL = """\
bundle = "/var/lib/edgecap/bundle"
plan = ""
board = "devboard"
on_missing_tpu = "fail"
log_level = "debug"

[http]
address = "127.0.0.1"
port = 9090

[[cameras]]
name = "front"
source = "/dev/video0"
width = 320
height = 240
fps = 30
fourcc = "YUYV"
frames = 8
stride = 4
sample_fps = 8.0
stall_seconds = 5.0
backoff_max_seconds = 10.0

[[cameras]]
name = "back-2"
source = 1
loop = true

[sinks.stdout]
enabled = false

[sinks.jsonl]
path = "/var/lib/edgecap/captions.jsonl"
max_bytes = 1_000_000
backups = 5

[sinks.mqtt]
host = "broker.lan"
port = 1884
topic_prefix = "house/edgecap"
client_id = "board-1"
username = "u"
password = "p"
stats_interval_seconds = 2.5
buffer = 50
"""

MINIMAL = """\
[[cameras]]
name = "cam"
source = "/dev/video0"
"""


def write(tmp_path: Path, text: str, name: str = "edgecap.toml", mode: int = 0o640) -> Path:
    """The config file, mode 0640 as install.sh makes it (one readable by every user may hold no secret)."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    path.chmod(mode)
    return path


def error_of(path: Path, overrides=None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides or {})
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_full_file_is_read_into_typed_records(tmp_path):
    config = load_config(write(tmp_path, FULL))
    assert isinstance(config, ServiceConfig)
    assert (config.board, config.on_missing_tpu, config.log_level) == ("devboard", "fail", "debug")
    assert (config.http.address, config.http.port) == ("127.0.0.1", 9090)
    front, back = config.cameras
    assert isinstance(front, CameraConfig)
    assert (front.name, front.width, front.height, front.fps, front.fourcc) == ("front", 320, 240, 30.0, "YUYV")
    assert (front.frames, front.stride, front.sample_fps) == (8, 4, 8.0)
    assert (front.stall_seconds, front.backoff_max_seconds) == (5.0, 10.0)
    assert isinstance(front.fps, float)
    # A camera index written as a number reaches the pipeline as text.
    assert (back.name, back.source, back.loop) == ("back-2", "1", True)
    assert config.sinks.stdout.enabled is False
    assert (config.sinks.jsonl.max_bytes, config.sinks.jsonl.backups) == (1_000_000, 5)
    mqtt = config.sinks.mqtt
    assert (mqtt.host, mqtt.port, mqtt.topic_prefix, mqtt.client_id) == ("broker.lan", 1884, "house/edgecap", "board-1")
    assert (mqtt.stats_interval_seconds, mqtt.buffer) == (2.5, 50)


def test_absent_keys_take_the_documented_defaults(tmp_path):
    config = load_config(write(tmp_path, MINIMAL))
    assert (config.bundle, config.plan, config.board, config.on_missing_tpu, config.log_level) == \
        ("", "", "auto", "cpu", "info")
    assert (config.http.address, config.http.port, config.http.token) == ("127.0.0.1", 8080, "")
    camera = config.cameras[0]
    assert (camera.width, camera.height, camera.fps, camera.fourcc, camera.loop) == (640, 480, 15.0, "MJPG", False)
    assert (camera.frames, camera.stride, camera.sample_fps) == (None, None, None)
    assert (camera.stall_seconds, camera.backoff_max_seconds) == (20.0, 30.0)
    assert config.sinks.stdout.enabled is True
    assert (config.sinks.jsonl.path, config.sinks.jsonl.max_bytes, config.sinks.jsonl.backups) == ("", 10_000_000, 3)
    mqtt = config.sinks.mqtt
    assert (mqtt.host, mqtt.port, mqtt.topic_prefix, mqtt.buffer, mqtt.stats_interval_seconds) == \
        ("", 1883, "edgecap", 1000, 10.0)


def test_relative_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    etc = tmp_path / "etc"
    etc.mkdir()
    # A real video: a file camera that is not one is refused (tests/test_camera_config.py).
    (etc / "clip.mp4").write_bytes((Path(__file__).parent.parent / "models/demo/sample.mp4").read_bytes())
    write(etc, """\
        bundle = "bundle"
        plan = "plans/devboard"
        [[cameras]]
        name = "a"
        source = "clip.mp4"
        [[cameras]]
        name = "b"
        source = "/dev/video3"
        [sinks.jsonl]
        path = "out/captions.jsonl"
        """)
    monkeypatch.chdir(tmp_path)  # somewhere else than the file's directory
    config = load_config(Path("etc") / "edgecap.toml", {"plan": "mine.json"})
    assert config.bundle == str(etc / "bundle")
    assert config.cameras[0].source == str(etc / "clip.mp4")
    assert config.cameras[1].source == "/dev/video3"
    assert config.sinks.jsonl.path == str(etc / "out" / "captions.jsonl")
    # A flag's path is the user's, relative to where they are.
    assert config.plan == "mine.json"


def test_overrides_replace_keys_by_dotted_and_indexed_name(tmp_path):
    path = write(tmp_path, FULL)
    config = load_config(path, {"http.port": 9000, "board": "auto", "cameras[1].fps": 5.0,
                                "cameras.0.width": 64, "sinks.mqtt.host": "", "plan": None})
    assert (config.http.port, config.board) == (9000, "auto")
    assert (config.cameras[1].fps, config.cameras[0].width) == (5.0, 64)
    assert config.sinks.mqtt.host == ""
    assert config.plan == ""  # None: the flag was not given
    # A table absent from the file is created by an override.
    config = load_config(write(tmp_path, MINIMAL, "min.toml"), {"sinks.jsonl.path": "/x.jsonl"})
    assert config.sinks.jsonl.path == "/x.jsonl"


@pytest.mark.parametrize("overrides, expected", [
    ({"http.port": "x"}, r"edgecap\.toml: http\.port \(from an override\): must be int, got str"),
    ({"http.bogus": 1}, r"http\.bogus \(from an override\): unknown key"),
    ({"cameras[3].fps": 1.0}, r"there is no cameras\[3\]"),
    ({"http..port": 1}, r"override 'http\.\.port': not a key"),
    ({"board.x": 1}, r"board is not a table"),
])
def test_a_bad_override_is_named_as_one(tmp_path, overrides, expected):
    assert re.search(expected, error_of(write(tmp_path, FULL), overrides))


def test_malformed_toml_names_the_line(tmp_path):
    path = write(tmp_path, """\
        board = "auto"

        [http]
        port = 80 80
        """)
    message = error_of(path)
    assert message.startswith(f"{path}:4: malformed TOML (")
    assert "column" in message


def test_a_key_set_twice_is_malformed_toml_at_its_second_line(tmp_path):
    path = write(tmp_path, MINIMAL + 'fps = 1\nfps = 2\n')
    assert error_of(path).startswith(f"{path}:5: malformed TOML")


def test_unterminated_document_names_the_end(tmp_path):
    path = write(tmp_path, 'board = "auto"\n[http\n')
    assert re.match(rf"{re.escape(str(path))}:\d+: malformed TOML", error_of(path))


def test_a_file_that_is_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "edgecap.toml"
    path.write_bytes(b'board = "auto"\nplan = "\xff"\n')
    assert error_of(path) == f"{path}:2: not UTF-8 text; save the config file as UTF-8"


def test_missing_file_and_directory_are_one_line(tmp_path):
    assert "no such config file" in error_of(tmp_path / "absent.toml")
    assert "is a directory" in error_of(tmp_path)


@pytest.mark.parametrize("text, line, key, problem", [
    # unknown keys: at the top, in a table, in the second camera
    ('bord = "auto"\n' + MINIMAL, 1, "bord", "unknown key"),
    ('[http]\nport = 1\nadress = "x"\n' + MINIMAL, 3, "http.adress", "unknown key"),
    (MINIMAL + '[[cameras]]\nname = "b"\nsource = "x"\nfsp = 3\n', 7, "cameras[1].fsp", "unknown key"),
    ('[sinks.mqtt]\nhost = "h"\nqos = 1\n' + MINIMAL, 3, "sinks.mqtt.qos", "unknown key"),
    ('[sinks]\nfile = {path = "x"}\n' + MINIMAL, 2, "sinks.file", "unknown key"),
    # wrong types
    ('[http]\nport = "8080"\n' + MINIMAL, 2, "http.port", "must be int, got str"),
    (MINIMAL + 'fps = "fast"\n', 4, "cameras[0].fps", "must be float, got str"),
    (MINIMAL + 'loop = 1\n', 4, "cameras[0].loop", "must be bool, got int"),
    ('http = 3\n' + MINIMAL, 1, "http", "must be object, got int"),
    ('cameras = "front"\n', 1, "cameras", "must be array, got str"),
    # out of range
    (MINIMAL + 'fps = 0\n', 4, "cameras[0].fps", "must be float > 0.0"),
    (MINIMAL + 'width = -1\n', 4, "cameras[0].width", "must be int >= 1"),
    ('[http]\nport = 70000\n' + MINIMAL, 2, "http.port", "must be int <= 65535"),
    ('[sinks.jsonl]\npath = "x"\nbackups = -1\n' + MINIMAL, 3, "sinks.jsonl.backups", "must be int >= 0"),
    ('[sinks.mqtt]\nstats_interval_seconds = 0.0\n' + MINIMAL, 2, "sinks.mqtt.stats_interval_seconds",
     "must be float > 0.0"),
    (MINIMAL + 'sample_fps = nan\n', 4, "cameras[0].sample_fps", "must be float >= 0.0"),
    # values outside their set
    (MINIMAL + 'fourcc = "H264"\n', 4, "cameras[0].fourcc", "invalid value 'H264'"),
    ('on_missing_tpu = "crash"\n' + MINIMAL, 1, "on_missing_tpu", "invalid value 'crash'"),
    ('[sinks.mqtt]\ntopic_prefix = "a/#"\n' + MINIMAL, 2, "sinks.mqtt.topic_prefix",
     "must be text without the MQTT wildcards + and #"),
    # names
    ('[[cameras]]\nname = "front door"\nsource = "0"\n', 2, "cameras[0].name",
     "must be letters, digits, '_' and '-' only"),
    ('[[cameras]]\nname = "a"\nsource = "0"\n[[cameras]]\nsource = "1"\nname = "a"\n', 6, "cameras[1].name",
     "'a' is also the name of cameras[0]"),
    # missing: the enclosing table's line
    (MINIMAL + '[[cameras]]\nname = "b"\n', 4, "cameras[1].source", "is missing"),
    ('cameras = []\n', 1, "cameras", "must be a list of length >= 1"),
])
def test_schema_errors_name_file_line_and_key(tmp_path, text, line, key, problem):
    path = write(tmp_path, text)
    message = error_of(path)
    assert message.startswith(f"{path}:{line}: {key}: {problem}"), message
    assert "; " in message  # and a fix


def test_no_cameras_at_all_is_named_without_a_line(tmp_path):
    path = write(tmp_path, 'board = "auto"\n')
    assert error_of(path).startswith(f"{path}: cameras: is missing; add at least one [[cameras]]")


def test_the_fix_is_specific_to_the_key(tmp_path):
    assert error_of(write(tmp_path, MINIMAL + 'fourcc = "H264"\n')).endswith("; use MJPG or YUYV")
    assert error_of(write(tmp_path, '[[cameras]]\nname = "a b"\nsource = "0"\n')).endswith(
        "the name goes into MQTT topics and metric labels")


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.53", "::1", "localhost"])
def test_loopback_needs_no_token(tmp_path, address):
    config = load_config(write(tmp_path, f'[http]\naddress = "{address}"\n' + MINIMAL))
    assert config.http.token == ""
    assert is_loopback(address)


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "192.168.1.5", "board.lan"])
def test_off_loopback_without_a_token_is_refused(tmp_path, address):
    path = write(tmp_path, f'log_level = "info"\n[http]\naddress = "{address}"\n' + MINIMAL)
    message = error_of(path)
    assert message.startswith(f"{path}:3: http.address: {address} is not a loopback address "
                              "and no access token is set; set http.token or http.token_file")
    assert not is_loopback(address)


STRONG = "Vq3x-8Lm_Tz2RkP0wYbN5c"  # secrets.token_urlsafe(16)


def test_off_loopback_with_a_token_starts(tmp_path):
    config = load_config(write(tmp_path, f'[http]\naddress = "0.0.0.0"\ntoken = "{STRONG}"\n' + MINIMAL))
    assert config.http.token == STRONG
    # ... and a flag that moves the address off loopback is held to the same rule.
    message = error_of(write(tmp_path, MINIMAL, "b.toml"), {"http.address": "0.0.0.0"})
    assert "http.address (from an override): 0.0.0.0 is not a loopback address" in message


def test_token_file_is_read_when_private(tmp_path):
    secret = tmp_path / "token"
    secret.write_text(f"  {STRONG}\n")
    secret.chmod(0o600)
    config = load_config(write(tmp_path, '[http]\naddress = "0.0.0.0"\ntoken_file = "token"\n' + MINIMAL))
    assert config.http.token == STRONG
    assert config.http.token_file == str(secret)


def test_world_readable_token_file_is_refused_with_chmod(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("abc123\n")
    secret.chmod(0o644)
    path = write(tmp_path, '[http]\naddress = "0.0.0.0"\n\ntoken_file = "token"\n' + MINIMAL)
    message = error_of(path)
    assert message == (f"{path}:4: http.token_file: {secret} is readable by every user; "
                       f"run `chmod 600 {secret}`")


@pytest.mark.parametrize("make, problem", [
    (lambda p: None, "cannot read"),
    (lambda p: p.mkdir(), "not a regular file"),
    (lambda p: (p.write_text("\n"), p.chmod(0o600)), "is empty"),
])
def test_unusable_token_file_is_refused(tmp_path, make, problem):
    make(tmp_path / "token")
    path = write(tmp_path, '[http]\ntoken_file = "token"\n' + MINIMAL)
    message = error_of(path)
    assert message.startswith(f"{path}:2: http.token_file: ") and problem in message, message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_token_file_is_refused(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("abc\n")
    secret.chmod(0o000)
    assert "http.token_file: cannot read" in error_of(write(tmp_path, '[http]\ntoken_file = "token"\n' + MINIMAL))


def test_token_and_token_file_together_are_refused(tmp_path):
    path = write(tmp_path, '[http]\ntoken = "a"\ntoken_file = "t"\n' + MINIMAL)
    assert error_of(path).startswith(f"{path}:3: http.token_file: set together with http.token")


@pytest.mark.parametrize("secret, line, key, fix", [
    ('[http]\naddress = "0.0.0.0"\ntoken = "Xq7vR2mK9pLw4tZb8nC3"\n', 3, "http.token",
     ", or move the token into a file named by http.token_file"),
    ('[sinks.mqtt]\nhost = "broker.lan"\nusername = "u"\npassword = "p"\n', 4, "sinks.mqtt.password", ""),
], ids=["http-token", "mqtt-password"])
def test_an_inline_secret_in_a_world_readable_config_is_refused(tmp_path, secret, line, key, fix):
    path = write(tmp_path, secret + MINIMAL, mode=0o644)
    assert error_of(path) == (f"{path}:{line}: {key}: {path} holds this secret and is readable by every user; "
                              f"run `chmod o-r {path}`{fix}")
    # Group read is how the service's user reads install.sh's root:edgecap 0640 file.
    for private in (0o640, 0o600):
        path.chmod(private)
        load_config(path)
    # No secret in the file, no rule: a world-readable example config is fine.
    load_config(write(tmp_path, MINIMAL, "plain.toml", mode=0o644))


def test_a_token_file_beside_a_world_readable_config_is_accepted(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("Xq7vR2mK9pLw4tZb8nC3\n")
    secret.chmod(0o640)
    path = write(tmp_path, '[http]\naddress = "0.0.0.0"\ntoken_file = "token"\n' + MINIMAL, mode=0o644)
    assert load_config(path).http.token == "Xq7vR2mK9pLw4tZb8nC3"


def test_mqtt_tls_keys_are_read_with_paths_relative_to_the_file(tmp_path):
    for name in ("ca.crt", "client.crt", "client.key"):
        (tmp_path / name).write_text("PEM\n")
        (tmp_path / name).chmod(0o640)
    path = write(tmp_path, '[sinks.mqtt]\nhost = "broker.lan"\nport = 8883\ntls = true\nca_file = "ca.crt"\n'
                           'cert_file = "client.crt"\nkey_file = "client.key"\n' + MINIMAL)
    mqtt = load_config(path).sinks.mqtt
    assert (mqtt.tls, mqtt.tls_insecure, mqtt.port) == (True, False, 8883)
    assert (mqtt.ca_file, mqtt.cert_file, mqtt.key_file) == tuple(
        str(tmp_path / n) for n in ("ca.crt", "client.crt", "client.key"))
    defaults = load_config(write(tmp_path, MINIMAL, "b.toml")).sinks.mqtt
    assert (defaults.tls, defaults.ca_file, defaults.cert_file, defaults.key_file, defaults.tls_insecure) == \
        (False, "", "", "", False)


def test_home_assistant_discovery_keys_are_read_and_default_to_on(tmp_path):
    defaults = load_config(write(tmp_path, MINIMAL)).sinks.mqtt
    assert (defaults.discovery, defaults.discovery_prefix) == (True, "homeassistant")
    mqtt = load_config(write(tmp_path, '[sinks.mqtt]\nhost = "b"\ndiscovery = false\ndiscovery_prefix = "ha"\n'
                                       + MINIMAL, "b.toml")).sinks.mqtt
    assert (mqtt.discovery, mqtt.discovery_prefix) == (False, "ha")


@pytest.mark.parametrize("table, line, problem", [
    ('discovery = "yes"\n', 3, "sinks.mqtt.discovery: must be bool, got str; use true (announce each camera's "
                               "caption sensor to Home Assistant) or false"),
    ('discovery_prefix = "ha/#"\n', 3, "sinks.mqtt.discovery_prefix: must be text without the MQTT wildcards + "
                                       "and #; use Home Assistant's MQTT discovery prefix (homeassistant unless "
                                       "changed there), without the wildcards + and #"),
    ('discovery_prefix = ""\n', 3, "sinks.mqtt.discovery_prefix: must be text without the MQTT wildcards"),
    ('discovery_prefx = "ha"\n', 3, "sinks.mqtt.discovery_prefx: unknown key; see deploy/edgecap.toml"),
], ids=["discovery-not-bool", "prefix-wildcard", "prefix-empty", "misspelt"])
def test_bad_discovery_keys_are_one_line(tmp_path, table, line, problem):
    path = write(tmp_path, '[sinks.mqtt]\nhost = "broker.lan"\n' + table + MINIMAL)
    message = error_of(path)
    assert message.startswith(f"{path}:{line}: {problem}"), message


@pytest.mark.parametrize("table, line, problem", [
    ('ca_file = "ca.crt"\n', 3, "sinks.mqtt.ca_file: set while sinks.mqtt.tls is false; set tls = true to "
                                "connect with TLS, or remove the key"),
    ('tls_insecure = true\n', 3, "sinks.mqtt.tls_insecure: set while sinks.mqtt.tls is false"),
    ('tls = true\nkey_file = "client.key"\n', 4, "sinks.mqtt.key_file: set without sinks.mqtt.cert_file"),
    ('tls = true\nca_file = "nowhere.crt"\n', 4, "sinks.mqtt.ca_file: cannot read {d}/nowhere.crt (No such file"),
    ('tls = true\nca_file = "."\n', 4, "sinks.mqtt.ca_file: {d} is not a regular file; give a PEM file"),
    ('tls = true\nca_file = "fifo"\n', 4, "sinks.mqtt.ca_file: {d}/fifo is not a regular file"),
    ('tls = true\nca_file = "huge.crt"\n', 4, "sinks.mqtt.ca_file: {d}/huge.crt is 4194305 bytes, more than a "
                                               "PEM file of certificates (4194304 at most); give a PEM file"),
    ('tls = true\ncert_file = "client.crt"\nkey_file = "open.key"\n', 5,
     "sinks.mqtt.key_file: {d}/open.key holds the client's private key and is readable by every user; "
     "run `chmod o-r {d}/open.key`"),
    # One PEM with certificate and key: the certificate file is the private one.
    ('tls = true\ncert_file = "open.key"\n', 4,
     "sinks.mqtt.cert_file: {d}/open.key holds the client's private key and is readable by every user"),
], ids=["ca-without-tls", "insecure-without-tls", "key-without-cert", "missing", "directory", "fifo", "huge",
        "world-readable-key", "world-readable-cert-with-key"])
def test_bad_mqtt_tls_keys_are_one_line(tmp_path, table, line, problem):
    for name, mode in (("client.crt", 0o644), ("client.key", 0o600), ("open.key", 0o644)):
        (tmp_path / name).write_text("PEM\n")
        (tmp_path / name).chmod(mode)
    os.mkfifo(tmp_path / "fifo")  # opened, it would block: checked by stat alone
    with open(tmp_path / "huge.crt", "wb") as f:
        f.truncate(4 * 1024 * 1024 + 1)  # sparse: no disk
    path = write(tmp_path, '[sinks.mqtt]\nhost = "broker.lan"\n' + table + MINIMAL)
    message = error_of(path)
    assert message.startswith(f"{path}:{line}: " + problem.format(d=tmp_path)), message


LOCATOR_DOC = """\
# comment = 1
top = 1
dotted.key = 2
"quoted.key" = 3

[table]
a = 1
  b = 2   # indented

[[arr]]
x = 1
text = '''
y = "not a key"
[not.a.header]
'''
y = 2

[[arr]]
x = 3
[arr.sub]
z = 4

[ "spaced" . 'part' ]
w = 5
"""


@pytest.mark.parametrize("key, line", [
    (("top",), 2),
    (("dotted", "key"), 3),
    (("dotted",), 3),
    (("quoted.key",), 4),
    (("table",), 6),
    (("table", "a"), 7),
    (("table", "b"), 8),
    (("table", "missing"), 6),
    (("arr", 0, "x"), 11),
    (("arr", 0, "y"), 16),
    (("arr", 1), 18),
    (("arr", 1, "x"), 19),
    (("arr", 1, "sub", "z"), 21),
    (("arr", 1, "sub"), 20),
    (("spaced", "part", "w"), 24),
    (("nowhere",), None),
    (("not", "a", "header"), None),
])
def test_locate_finds_the_line_of_a_key(key, line):
    assert locate(LOCATOR_DOC, key) == line


SPLIT_DOC = """\
[a]
x = 1
[b]
y = 2
[a.c]
z = 3
cams = [ {name = "f", fps = 0},
  {name = "g", fps = 1} ]
"""


@pytest.mark.parametrize("key, line", [
    (("a", "x"), 2),  # a table written in two parts: the key is in the first ...
    (("a", "c", "z"), 6),  # ... or in the second
    (("a", "c"), 5),
    (("b", "missing"), 3),
    (("a", "c", "cams", 0, "fps"), 7),  # a value in an inline table in an array: its own line
    (("a", "c", "cams", 1, "fps"), 8),
])
def test_locate_reads_tables_written_in_parts_and_arrays(key, line):
    # The hand-made line finder this replaced put every item of an array on the array's first line.
    assert locate(SPLIT_DOC, key) == line


def test_a_bad_value_in_a_table_written_in_parts_names_its_line(tmp_path):
    path = write(tmp_path, MINIMAL + '[http]\nport = 80\n[sinks.stdout]\nenabled = true\n[http.x]\ny = 1\n')
    assert error_of(path).startswith(f"{path}:8: http.x: unknown key; ")


@pytest.mark.parametrize("token, problem", [
    ("aaaaaaaaaaaaaaaa", "is too easy to guess (16 characters, 1 different: about 0 bits where 72 are needed)"),
    ("abcdefghijklmnop", "is too easy to guess (16 characters, 16 different: about 64 bits where 72 are needed)"),
    ("s3cret", "has 6 characters; at least 16 are needed"),
    ("correct horse battery staple", "must be visible ASCII characters without spaces"),
])
@pytest.mark.parametrize("inline", [True, False])
def test_a_weak_token_is_refused_with_how_to_make_a_good_one(tmp_path, token, problem, inline):
    if inline:
        path = write(tmp_path, f'[http]\naddress = "0.0.0.0"\ntoken = "{token}"\n' + MINIMAL)
    else:
        (tmp_path / "token").write_text(token + "\n")
        (tmp_path / "token").chmod(0o600)
        path = write(tmp_path, '[http]\naddress = "0.0.0.0"\ntoken_file = "token"\n' + MINIMAL)
    key = "http.token" if inline else "http.token_file"
    assert error_of(path) == (f"{path}:3: {key}: the token {problem}; make one with "
                              "`python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`")


def test_random_tokens_of_the_suggested_kinds_pass():
    import secrets
    from edgecap.service.config import token_weakness
    for _ in range(200):
        assert token_weakness(secrets.token_urlsafe(32)) is None
        assert token_weakness(secrets.token_urlsafe(16)) is None
        assert token_weakness(secrets.token_hex(16)) is None
