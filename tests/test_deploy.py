"""deploy/: the systemd unit, the udev rules, the example config and install/uninstall.

The unit is checked by systemd itself (`systemd-analyze verify`, and `security
--offline` for what the hardening leaves reachable); the udev rules by a parser of
udev(7)'s key/operator/value syntax (plus `udevadm verify` where the installed
systemd has it, 254 and later); install.sh and uninstall.sh run for real into a
temporary root, twice each, and the trees are compared.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import typing
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
UNIT = DEPLOY / "edgecap.service"
APEX_DROPIN = DEPLOY / "edgecap-apex.conf"
RULES = DEPLOY / "70-edgecap-coral.rules"
CONFIG = DEPLOY / "edgecap.toml"
INSTALL = DEPLOY / "install.sh"
UNINSTALL = DEPLOY / "uninstall.sh"

needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze not installed (apt-get install systemd; .ci/run does)",
)


# --- the unit -------------------------------------------------------------------


def unit_entries(text: str) -> Dict[str, List[Tuple[str, str]]]:
    """Returns a unit file's (key, value) pairs per section, repeats kept in order.

    Args:
      text: the unit file.

    Returns:
      {"Unit": [("Description", "..."), ...], "Service": [...], ...}.
    """
    sections: Dict[str, List[Tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"key outside a section: {line}"
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def values(entries: List[Tuple[str, str]], key: str) -> List[str]:
    return [v for k, v in entries if k == key]


def unit_for_verify(tmp_path: Path, text: str) -> Path:
    """Writes the unit to tmp_path with @VENV@ pointing at a stub edgecap executable."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin" / "edgecap"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    unit = tmp_path / "edgecap.service"
    unit.write_text(text.replace("@VENV@", str(venv)))
    return unit


def verify(unit: Path) -> Tuple[int, List[str]]:
    """Runs `systemd-analyze verify` on unit; returns its status and the lines about it.

    systemd-analyze exits 0 on unknown keys and unparsable values (it logs them and
    ignores them), so the lines that name the unit are the real verdict.
    SYSTEMD_LOG_LEVEL=notice keeps debug chatter (e.g. syscall names newer than the
    host's libseccomp) out.
    """
    env = dict(os.environ, SYSTEMD_LOG_LEVEL="notice", SYSTEMD_PAGER="", LC_ALL="C")
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True, text=True, env=env, timeout=60,
    )
    out = (proc.stdout + proc.stderr).splitlines()
    return proc.returncode, [line for line in out if unit.name in line]


@needs_analyze
def test_unit_passes_systemd_analyze_verify(tmp_path):
    code, lines = verify(unit_for_verify(tmp_path, UNIT.read_text()))
    assert code == 0 and lines == [], "\n".join(lines)


@needs_analyze
@pytest.mark.parametrize(
    "bad, expect",
    [
        ("Bogus=1", "Unknown key"),
        ("DeviceAllow=char-apex rwz", "Invalid device rights"),
        ("RestrictAddressFamilies=AF_BOGUS", "address family"),
    ],
)
def test_verify_reports_what_systemd_ignores(tmp_path, bad, expect):
    # The check above can fail: a unit systemd would half-ignore is caught.
    text = UNIT.read_text().replace("UMask=0077", f"UMask=0077\n{bad}")
    code, lines = verify(unit_for_verify(tmp_path, text))
    assert any(expect in line for line in lines), lines


@needs_analyze
def test_verify_fails_on_a_missing_executable(tmp_path):
    unit = tmp_path / "edgecap.service"
    unit.write_text(UNIT.read_text().replace("@VENV@", str(tmp_path / "nowhere")))
    code, _ = verify(unit)
    assert code != 0


def test_unit_is_a_watched_notify_service_that_does_not_crash_loop():
    entries = unit_entries(UNIT.read_text())
    unit, service = entries["Unit"], entries["Service"]
    assert values(service, "Type") == ["notify"]
    assert values(service, "NotifyAccess") == ["main"]
    assert values(service, "ExecStart") == [
        "@VENV@/bin/edgecap serve --config /etc/edgecap/edgecap.toml"
    ]
    assert values(service, "Restart") == ["on-failure"]
    # Bad input exits 2: restarting cannot fix a config error.
    assert "2" in values(service, "RestartPreventExitStatus")[0].split()
    # Start limits live in [Unit] since systemd 230; in [Service] they are ignored.
    assert values(unit, "StartLimitBurst") and values(unit, "StartLimitIntervalSec")
    assert not values(service, "StartLimitBurst")

    def seconds(v: str) -> float:
        m = re.fullmatch(r"(\d+)(s|min)?", v)
        assert m, v
        return int(m.group(1)) * (60 if m.group(2) == "min" else 1)

    watchdog = seconds(values(service, "WatchdogSec")[0])
    assert 10 <= watchdog <= 120
    # The service drains within 5 s; SIGKILL must not come before that.
    assert seconds(values(service, "TimeoutStopSec")[0]) > 5
    burst = int(values(unit, "StartLimitBurst")[0])
    interval = seconds(values(unit, "StartLimitIntervalSec")[0])
    restart = seconds(values(service, "RestartSec")[0])
    # Within the interval the burst runs out: at most `burst` starts, not a loop.
    assert burst * restart < interval


def test_unit_runs_unprivileged_with_the_device_groups_and_directories():
    service = unit_entries(UNIT.read_text())["Service"]
    assert values(service, "User") == ["edgecap"]
    assert set(" ".join(values(service, "SupplementaryGroups")).split()) >= {"video", "plugdev", "apex"}
    for key in ("StateDirectory", "CacheDirectory", "ConfigurationDirectory"):
        assert values(service, key) == ["edgecap"], key
    # edgecap keeps plans under $XDG_CACHE_HOME/edgecap; %C is /var/cache.
    assert "XDG_CACHE_HOME=%C" in values(service, "Environment")
    assert values(service, "UMask") == ["0077"]
    # PrivateDevices= would replace /dev and hide the TPU and the camera.
    assert values(service, "PrivateDevices") in ([], ["no"])


@needs_analyze
def test_hardening_leaves_the_tpu_usb_and_camera_reachable(tmp_path):
    """systemd's own reading of the unit: exposure, and the device allow list."""
    import json

    unit = unit_for_verify(tmp_path, UNIT.read_text())
    env = dict(os.environ, SYSTEMD_LOG_LEVEL="err", LC_ALL="C")
    rows = json.loads(subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--json=short", "--no-pager", str(unit)],
        capture_output=True, text=True, env=env, timeout=60, check=True,
    ).stdout)
    by_field = {row["json_field"]: row for row in rows}
    allowed = by_field["DeviceAllow"]["description"]
    for group in ("char-apex:rw", "char-usb_device:rw", "char-video4linux:rw"):
        assert group in allowed, allowed
    assert not by_field["PrivateDevices"]["set"]
    for field in ("ProtectSystem", "ProtectHome", "PrivateTmp", "NoNewPrivileges",
                  "RestrictAddressFamilies_AF_PACKET", "UserOrDynamicUser"):
        assert by_field[field]["set"], field
    text = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True, text=True, env=env, timeout=60,
    ).stdout
    level = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", text).group(1))
    # systemd calls < 2.0 "OK"; this unit is at 1.5 (systemd 252) after giving up
    # PrivateDevices=, PrivateNetwork= and MemoryDenyWriteExecute= for good reasons.
    assert level <= 2.0, text


# --- ordering after the PCIe TPU (systemd 241 has no modprobe@.service) ------------


def test_the_apex_drop_in_orders_the_service_after_the_tpu_device():
    unit = unit_entries(APEX_DROPIN.read_text())["Unit"]
    assert values(unit, "After") == ["dev-apex_0.device"]
    # Wants, not Requires: a TPU whose driver fails still lets the service start on the CPU.
    assert values(unit, "Wants") == ["dev-apex_0.device"] and not values(unit, "Requires")
    # The unit name is systemd's for the node the apex driver creates.
    if shutil.which("systemd-escape"):
        name = subprocess.run(["systemd-escape", "--path", "--suffix=device", "/dev/apex_0"],
                              capture_output=True, text=True, check=True).stdout.strip()
        assert name == "dev-apex_0.device"
    # That device unit exists only for nodes udev tags for systemd.
    apex = [tokens for tokens in parse_udev_rules(RULES.read_text())
            if ("SUBSYSTEM", "", "==", "apex") in tokens]
    assert apex and ("TAG", "", "+=", "systemd") in apex[0]
    # ... on every event of the device, not only "add" (tags were per event before 247).
    assert not any(key == "ACTION" for key, *_ in apex[0])


def test_the_unit_names_no_unit_that_systemd_241_lacks():
    entries = unit_entries(UNIT.read_text())["Unit"]
    for key in ("Wants", "Requires", "After", "Before", "BindsTo"):
        assert not any("modprobe@" in v for v in values(entries, key)), key


@needs_analyze
def test_unit_with_the_apex_drop_in_passes_verify(tmp_path):
    text = UNIT.read_text() + "\n" + APEX_DROPIN.read_text()
    code, lines = verify(unit_for_verify(tmp_path, text))
    assert code == 0 and lines == [], "\n".join(lines)


# --- limits ---------------------------------------------------------------------


def size_bytes(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)", text)
    assert m, text
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]


def test_the_unit_bounds_files_tasks_and_memory():
    service = unit_entries(UNIT.read_text())["Service"]
    nofile = int(values(service, "LimitNOFILE")[0])  # one number: soft and hard alike
    tasks = int(values(service, "TasksMax")[0])
    memory = size_bytes(values(service, "MemoryMax")[0])
    # Each camera has a feed thread and a reader thread: the most cameras the config
    # accepts must fit, with the pipeline's, the page's and the sinks' threads.
    config = pytest.importorskip("edgecap.service.config")
    cameras = typing.get_type_hints(config.ServiceConfig, include_extras=True)["cameras"]
    most = next(m.max_length for m in cameras.__metadata__ if getattr(m, "max_length", None))
    assert 2 * most + 64 <= tasks <= 1024
    # The page's connection cap plus the descriptors it keeps for cameras and files
    # (edgecap/service/http/server.py, where it has them) fit under the limit.
    http = pytest.importorskip("edgecap.service.http.server")
    need = getattr(http, "MAX_CONNECTIONS", 0) + getattr(http, "FD_RESERVE", 0)
    assert max(need, 256) <= nofile <= 65536
    # Above the ~200-230 MB a paper-sized model takes per process (docs/headline.md),
    # below the Dev Board's 1 GB.
    assert 512 * 2**20 <= memory < 2**30


# --- stopping before READY=1 -----------------------------------------------------


def catches_sigterm(pid: int) -> bool:
    """True once the process has a SIGTERM handler (SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux /proc")
@pytest.mark.parametrize("delay", [0.0, 0.1])
def test_sigterm_before_ready_is_a_clean_stop(tmp_path, delay):
    """systemd may stop the unit while it starts (a TimeoutStartSec=, a `systemctl stop`
    during boot): the main process must exit 0, not 143, or systemd logs a failure."""
    config = tmp_path / "edgecap.toml"
    # A device camera that is not there: the service starts and waits for it, so
    # READY=1 would come only after stall_seconds (60 s), long after the signal.
    config.write_text(f'bundle = "{REPO / "models/demo/bundle"}"\n[http]\nport = 0\n'
                      '[[cameras]]\nname = "gone"\nsource = "/dev/video99"\nstall_seconds = 60.0\n')
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.setblocking(False)
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify.sock"), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "edgecap.cli", "serve", "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        # The handler goes in as the command starts, before the service's imports and
        # its bundle load: a signal now lands in the start, the window systemd hits.
        while not catches_sigterm(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.005)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    said = []
    while True:
        try:
            said.append(notify.recv(4096).decode())
        except BlockingIOError:
            break
    notify.close()
    assert not any("READY=1" in m for m in said), said
    assert proc.returncode == 0, (proc.returncode, stderr)
    assert "Traceback" not in stderr, stderr


def test_the_unit_counts_143_as_a_clean_stop():
    # serve exits 0 on a stop (above); 143 is what every other edgecap command exits
    # on SIGTERM (edgecap.command), kept clean here should a stop ever end that way.
    service = unit_entries(UNIT.read_text())["Service"]
    assert "143" in " ".join(values(service, "SuccessExitStatus")).split()


# --- exit 2 at start: what the unit does not restart ---------------------------------


def test_a_bad_camera_file_stops_serve_at_start_with_one_line_and_exit_2(tmp_path):
    # RestartPreventExitStatus=2: a file camera that is not there cannot come back by
    # itself (tests/test_camera_config.py has the cases; a device camera is waited for).
    path = tmp_path / "edgecap.toml"
    path.write_text('[[cameras]]\nname = "front"\nsource = "gone.mp4"\n')
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "edgecap.cli", "serve", "--config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "2" in values(unit_entries(UNIT.read_text())["Service"], "RestartPreventExitStatus")[0].split()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "cameras[0].source" in lines[0] and "no such video file" in lines[0]
    # At start, not after the camera's stall time and retries (stall_seconds is 20 s).
    assert time.monotonic() - started < 20


# --- no wait for network-online.target ------------------------------------------


def test_the_unit_does_not_wait_for_the_network():
    # network-online.target holds every boot without a network until
    # systemd-networkd-wait-online (or NetworkManager-wait-online) gives up; the
    # service needs no network to caption, and the MQTT sink retries (below).
    unit = unit_entries(UNIT.read_text())["Unit"]
    for key in ("Wants", "After", "Requires"):
        assert not any("network-online.target" in v for v in values(unit, key)), key


@pytest.fixture
def mqtt():
    """tests/test_mqtt.py (its broker, subscriber and helpers), or a skip without paho-mqtt."""
    return pytest.importorskip("test_mqtt")


def test_mqtt_with_no_network_at_start_connects_when_it_comes(mqtt, tmp_path, monkeypatch):
    """The boot without network-online.target: the broker's name does not resolve
    yet (no DNS, no route); the sink keeps trying and delivers once it does."""
    if mqtt.MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto; .ci/run does)")
    from edgecap.service.config import MqttSinkConfig
    from edgecap.service.sinks import MqttSink

    real = socket.getaddrinfo
    network = {"up": False}

    def getaddrinfo(host, *args, **kwargs):
        if host == "broker.example":
            if not network["up"]:
                raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    broker = mqtt.Broker(tmp_path)
    broker.start()
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    sub = mqtt.Subscriber(broker.port, "boot").connect()
    sink = MqttSink(MqttSinkConfig(host="broker.example", port=broker.port, topic_prefix="boot",
                                   client_id="edgecap-boot-test"), reconnect_delay=(0.1, 0.5))
    try:
        sink.caption("front", mqtt.make_caption(0))  # buffered: never blocks, never raises
        time.sleep(0.5)  # several failed attempts
        assert not sink.connected
        network["up"] = True
        mqtt.wait_for(lambda: sink.connected, 10.0, "the sink to connect once the network is up")
        assert sub.captions(1)[0]["window"] == 0
    finally:
        sink.close()
        sub.disconnect()
        broker.stop()


# --- systemd 241 (Mendel on the Coral Dev Board) -----------------------------------

# Keys the unit uses that systemd 241 does not know, with the release that added
# each (systemd's NEWS: "CHANGES WITH 242" ProtectHostname= and RestrictSUIDSGID=,
# 244 ProtectKernelLogs=, 245 ProtectClock=, 247 ProtectProc=). 241 logs one
# "Unknown lvalue" warning for each and ignores it. docs/deploy.md has the table.
NEWER_THAN_241 = {"ProtectHostname": 242, "RestrictSUIDSGID": 242, "ProtectKernelLogs": 244,
                  "ProtectClock": 245, "ProtectProc": 247}


def test_each_key_newer_than_241_is_marked_where_it_is_set():
    lines = UNIT.read_text().splitlines()
    for i, line in enumerate(lines):
        key = line.partition("=")[0]
        if key in NEWER_THAN_241:
            # The comment right above says from which release, and what holds on 241.
            assert re.match(rf"# \({NEWER_THAN_241[key]}\+[,)]", lines[i - 1]), (key, lines[i - 1])
    marked = {int(m) for m in re.findall(r"^# \((\d+)\+", UNIT.read_text(), re.M)}
    assert marked == set(NEWER_THAN_241.values())


def as_241_applies_it(text: str) -> str:
    """The unit without the lines systemd 241 ignores."""
    return "\n".join(line for line in text.splitlines()
                     if line.partition("=")[0] not in NEWER_THAN_241)


@needs_analyze
def test_the_unit_as_241_applies_it_verifies_and_stays_hardened(tmp_path):
    """Modelled with this machine's systemd-analyze: 241's own is not available here."""
    unit = unit_for_verify(tmp_path, as_241_applies_it(UNIT.read_text()))
    code, lines = verify(unit)
    assert code == 0 and lines == [], "\n".join(lines)
    env = dict(os.environ, SYSTEMD_LOG_LEVEL="err", LC_ALL="C")
    text = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
                          capture_output=True, text=True, env=env, timeout=60).stdout
    level = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", text).group(1))
    # 2.2 on systemd 252 (1.5 with every line); "MEDIUM" starts at 5.0.
    assert level <= 2.5, text


# --- udev -----------------------------------------------------------------------

# udev(7): match keys compare (==, !=); assignment keys assign (=, +=, -=, :=).
_MATCH_KEYS = {"ACTION", "DEVPATH", "KERNEL", "KERNELS", "NAME", "SYMLINK", "SUBSYSTEM",
               "SUBSYSTEMS", "DRIVER", "DRIVERS", "TAG", "TAGS", "TEST", "PROGRAM",
               "RESULT", "ATTR", "ATTRS", "SYSCTL", "ENV", "CONST"}
_ASSIGN_KEYS = {"NAME", "SYMLINK", "OWNER", "GROUP", "MODE", "SECLABEL", "ATTR", "SYSCTL",
                "ENV", "TAG", "RUN", "LABEL", "GOTO", "IMPORT", "OPTIONS"}
_TOKEN = re.compile(r'\s*([A-Z_]+)(?:\{([^}]*)\})?\s*(==|!=|\+=|-=|:=|=)\s*"([^"]*)"\s*(,|$)')


def parse_udev_rules(text: str) -> List[List[Tuple[str, str, str, str]]]:
    """Parses udev rules into rules of (key, attribute, operator, value) tokens.

    Args:
      text: a .rules file.

    Returns:
      One list of tokens per rule line.

    Raises:
      ValueError: a line that is not a comma-separated list of KEY[{attr}]OP"value",
        an unknown key, or an operator the key does not take.
    """
    rules = []
    for number, line in enumerate(text.replace("\\\n", "").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        tokens, pos = [], 0
        while pos < len(line):
            m = _TOKEN.match(line, pos)
            if not m:
                raise ValueError(f"line {number}: cannot parse at column {pos + 1}: {line[pos:]!r}")
            key, attr, op, value, _ = m.groups()
            is_match = op in ("==", "!=")
            if key not in (_MATCH_KEYS if is_match else _ASSIGN_KEYS):
                raise ValueError(f"line {number}: {key} does not take {op}")
            if key in ("ATTR", "ATTRS", "ENV") and not attr:
                raise ValueError(f"line {number}: {key} needs {{attribute}}")
            tokens.append((key, attr or "", op, value))
            pos = m.end()
        if not any(op in ("==", "!=") for _, _, op, _ in tokens):
            raise ValueError(f"line {number}: a rule without a match applies to every device")
        rules.append(tokens)
    return rules


@pytest.mark.parametrize(
    "line",
    [
        'SUBSYSTEM="apex", MODE="0660"',  # a match key given an assignment: no match at all
        'SUBSYSTEM=="apex" MODE="0660"',  # missing comma
        'SUBSYSTEM=="apex", MODE=0660',  # unquoted value
        'SUBSYSTEM=="apex", MOOD="0660"',  # unknown key
        'ATTRS=="1a6e", GROUP="plugdev"',  # ATTRS without {attribute}
    ],
)
def test_udev_parser_rejects_malformed_rules(line):
    with pytest.raises(ValueError):
        parse_udev_rules(line + "\n")


def test_udev_rules_give_the_groups_the_pcie_tpu_and_both_usb_ids():
    rules = parse_udev_rules(RULES.read_text())

    def rule_for(**matches: str) -> Dict[str, str]:
        for tokens in rules:
            found = {(k, a): v for k, a, op, v in tokens if op == "=="}
            if all(found.get(tuple(key.split("_", 1)) if "_" in key else (key, "")) == v
                   for key, v in matches.items()):
                return {k: v for k, _, op, v in tokens if op in ("=", "+=", ":=")}
        raise AssertionError(f"no rule matches {matches}")

    apex = rule_for(SUBSYSTEM="apex")
    assert apex["GROUP"] == "apex" and apex["MODE"] == "0660"
    for vendor, product in (("1a6e", "089a"), ("18d1", "9302")):
        usb = rule_for(SUBSYSTEM="usb", ATTR_idVendor=vendor, ATTR_idProduct=product)
        assert usb["GROUP"] == "plugdev" and usb["MODE"] == "0660"
        assert usb.get("TAG") == "uaccess"
    # Not world-writable anywhere.
    for tokens in rules:
        for key, _, _, value in tokens:
            if key == "MODE":
                assert int(value, 8) & 0o007 == 0, value
    # 73-seat-late.rules acts on TAG+="uaccess": a file sorting after it is too late.
    assert RULES.name < "73-seat-late.rules"


def test_udevadm_verify_where_available():
    udevadm = shutil.which("udevadm")
    if udevadm is None:
        pytest.skip("udevadm not installed")
    probe = subprocess.run([udevadm, "verify", "--help"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("udevadm verify needs systemd 254 or newer")
    proc = subprocess.run([udevadm, "verify", "--resolve-names=never", str(RULES)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the example config ---------------------------------------------------------


def load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.9 and 3.10
        tomllib = pytest.importorskip("tomli")
    with open(path, "rb") as f:
        return tomllib.load(f)


def test_example_config_is_safe_by_default():
    doc = load_toml(CONFIG)
    # Loopback and no token: the page serves camera frames.
    assert doc["http"]["address"] == "127.0.0.1"
    assert doc["http"]["token"] == "" and doc["http"]["token_file"] == ""
    assert doc["on_missing_tpu"] == "cpu"
    names = [camera["name"] for camera in doc["cameras"]]
    assert names and all(re.fullmatch(r"[A-Za-z0-9_-]+", n) for n in names)
    # Secrets and sinks are off until the owner sets them.
    assert doc["sinks"]["mqtt"]["host"] == "" and doc["sinks"]["mqtt"]["password"] == ""
    # The unit's ExecStart reads exactly this path.
    assert "--config /etc/edgecap/edgecap.toml" in UNIT.read_text()


def test_example_config_loads_with_the_service_config_reader():
    config = pytest.importorskip("edgecap.service.config", reason="edgecap.service.config not merged yet")
    loaded = config.load_config(CONFIG)
    assert [c.name for c in loaded.cameras] == ["front"]


# --- install.sh / uninstall.sh --------------------------------------------------


def tree(root: Path) -> Dict[str, tuple]:
    """Everything under root: path -> (kind, mode, size, sha256, mtime_ns, link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_size, digest, st.st_mtime_ns)
    return out


def run_script(script: Path, *args: str, env=None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(script), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def index_reachable() -> bool:
    probe = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "setuptools",
                            "--disable-pip-version-check"], capture_output=True, text=True, timeout=120)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """install.sh --wheel into a temporary root (no deps: pip is not under test).

    The wheel is built once here with the command install.sh uses for a checkout
    (building fetches setuptools from the package index); test_install_from_source
    (slow) runs that path inside install.sh. The tests using this fixture run in
    file order: install, install again, uninstall.
    """
    if not index_reachable():
        pytest.skip("package index unreachable: the wheel cannot be built")
    wheels = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--disable-pip-version-check", "--wheel-dir", str(wheels), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(wheels.glob("edgecap-*.whl"))
    root = tmp_path_factory.mktemp("root")
    args = ("--root", str(root), "--python", sys.executable, "--wheel", str(wheel),
            "--pip-option=--no-deps")
    first = run_script(INSTALL, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    return root, args, first


@pytest.mark.slow  # builds a wheel and a venv: 30 s of a ~1 min suite
@pytest.mark.network
def test_install_stages_the_unit_rules_config_venv_and_bundle(staged, tmp_path):
    root, _, first = staged
    unit = (root / "etc/systemd/system/edgecap.service").read_text()
    assert "@VENV@" not in unit
    assert "ExecStart=/opt/edgecap/bin/edgecap serve --config /etc/edgecap/edgecap.toml" in unit
    assert (root / "opt/edgecap/bin/edgecap").is_file()
    assert (root / "etc/udev/rules.d/70-edgecap-coral.rules").read_text() == RULES.read_text()
    config = root / "etc/edgecap/edgecap.toml"
    assert config.read_text() == CONFIG.read_text()
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    assert stat.S_IMODE((root / "etc/edgecap").stat().st_mode) == 0o750
    assert (root / "var/lib/edgecap/bundle").is_dir()
    # What the installed model knows: the demo, a synthetic world (issue #26).
    assert "edgecap-demo-shapes knows only a synthetic world" in first.stdout
    # A staging root without a PCIe TPU under its /sys: no wait for /dev/apex_0.
    assert not (root / "etc/systemd/system/edgecap.service.d").exists()
    if shutil.which("systemctl"):
        wants = root / "etc/systemd/system/multi-user.target.wants/edgecap.service"
        assert os.readlink(wants) == "/etc/systemd/system/edgecap.service"
    # Accounts and systemctl calls are skipped with a message, not silently.
    assert "groups video, plugdev, apex and user edgecap are not created" in first.stdout
    assert "skipped systemctl daemon-reload and udevadm" in first.stdout
    if shutil.which("systemd-analyze"):
        # The installed unit, pointed at the staged venv, verifies too.
        staged_unit = tmp_path / "edgecap.service"
        staged_unit.write_text(unit.replace("/opt/edgecap/", f"{root}/opt/edgecap/"))
        code, lines = verify(staged_unit)
        assert code == 0 and lines == [], lines


@pytest.mark.slow  # builds a wheel and a venv: 30 s of a ~1 min suite
@pytest.mark.network
def test_install_twice_changes_nothing_and_keeps_the_config(staged):
    root, args, _ = staged
    config = root / "etc/edgecap/edgecap.toml"
    config.write_text('board = "devboard"\n')  # the owner's edit
    config.chmod(0o640)
    before = tree(root)
    second = run_script(INSTALL, *args)
    assert second.returncode == 0, second.stdout + second.stderr
    after = tree(root)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert changed == [], changed
    assert config.read_text() == 'board = "devboard"\n'
    assert "kept existing" in second.stdout
    assert not [line for line in second.stdout.splitlines()
                if line.startswith("edgecap-install: installed ")]


@pytest.mark.slow  # builds a wheel and a venv: 30 s of a ~1 min suite
@pytest.mark.network
def test_uninstall_keeps_config_and_state_then_purge_removes_them(staged):
    root, _, _ = staged
    out = run_script(UNINSTALL, "--root", str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    for gone in ("etc/systemd/system/edgecap.service", "etc/udev/rules.d/70-edgecap-coral.rules",
                 "opt/edgecap", "etc/edgecap/edgecap.toml.example",
                 "etc/systemd/system/multi-user.target.wants/edgecap.service"):
        assert not os.path.lexists(root / gone), gone
    assert (root / "etc/edgecap/edgecap.toml").is_file()
    assert (root / "var/lib/edgecap/bundle").is_dir()
    before = tree(root)
    again = run_script(UNINSTALL, "--root", str(root))
    assert again.returncode == 0 and tree(root) == before
    purge = run_script(UNINSTALL, "--root", str(root), "--purge")
    assert purge.returncode == 0, purge.stdout + purge.stderr
    files = [k for k, v in tree(root).items() if v[0] != "dir"]
    assert files == []


@pytest.mark.slow  # a venv and pip, like the tests above
@pytest.mark.network
def test_install_adds_the_apex_drop_in_only_with_a_pcie_tpu(staged, tmp_path):
    _, args, _ = staged
    root = tmp_path / "root"
    args = ("--root", str(root)) + args[2:]
    dropin = root / "etc/systemd/system/edgecap.service.d/edgecap-apex.conf"
    pci = root / "sys/bus/pci/devices/0000:01:00.0"
    pci.mkdir(parents=True)
    (pci / "vendor").write_text("0x1ac1\n")  # Global Unichip Corp.: the Coral Edge TPU
    (pci / "device").write_text("0x089a\n")
    first = run_script(INSTALL, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    assert dropin.read_text() == APEX_DROPIN.read_text()
    before = tree(root)
    again = run_script(INSTALL, *args)
    assert again.returncode == 0 and tree(root) == before
    # Another PCI device only: the drop-in goes, and says so.
    (pci / "vendor").write_text("0x8086\n")
    gone = run_script(INSTALL, *args)
    assert gone.returncode == 0 and not dropin.exists() and "no PCIe Edge TPU" in gone.stdout
    # Or when asked, hardware or not (an image for a Dev Board built elsewhere).
    asked = run_script(INSTALL, *args, "--pcie-tpu", "yes")
    assert asked.returncode == 0 and dropin.is_file()
    bad = run_script(INSTALL, *args, "--pcie-tpu", "maybe")
    assert bad.returncode == 2 and "use auto, yes or no" in bad.stderr


@pytest.mark.slow
@pytest.mark.network
def test_install_from_source_twice(tmp_path):
    """The walkthrough's path: install.sh builds the wheel from the checkout itself."""
    if not index_reachable():
        pytest.skip("package index unreachable: the wheel cannot be built")
    args = ("--root", str(tmp_path), "--python", sys.executable, "--source", str(REPO),
            "--pip-option=--no-deps")
    first = run_script(INSTALL, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (tmp_path / "opt/edgecap/bin/edgecap").is_file()
    before = tree(tmp_path)
    second = run_script(INSTALL, *args)
    assert second.returncode == 0, second.stdout + second.stderr
    assert tree(tmp_path) == before


def test_install_and_uninstall_leave_a_prefix_that_is_not_a_venv_alone(tmp_path):
    prefix = tmp_path / "root" / "usr"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "tool").write_text("keep me")
    args = ("--root", str(tmp_path / "root"), "--prefix", "/usr")
    out = run_script(INSTALL, *args, "--python", sys.executable, "--wheel", str(UNIT))
    assert out.returncode == 2 and "is not a virtual environment" in out.stderr
    out = run_script(UNINSTALL, *args)
    assert out.returncode == 0 and "left" in out.stdout
    assert (prefix / "bin" / "tool").read_text() == "keep me"


def python_outside_home() -> str:
    """A Python >= 3.9 with venv outside /root and /home (the service's view), or ""."""
    for name in ("python3", "python3.13", "python3.12", "python3.11", "python3.10", "python3.9"):
        for d in ("/usr/bin", "/usr/local/bin", "/opt/python/bin"):
            exe = Path(d) / name
            if not exe.is_file():
                continue
            ok = subprocess.run([str(exe), "-I", "-c",
                                 "import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 9))"],
                                capture_output=True)
            if ok.returncode == 0:
                return str(exe)
    return ""


@pytest.mark.slow
@pytest.mark.network
def test_install_as_root_creates_accounts_and_ownership_in_a_private_namespace(tmp_path):
    """The real-system path (accounts, chown, record, purge) with /etc, /opt and /var
    bind-mounted from copies in a private mount namespace: the host is not touched."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1)")
    if subprocess.run(["unshare", "--mount", "--propagation", "private", "true"]).returncode != 0:
        pytest.skip("no permission to create a mount namespace here")
    python = python_outside_home()
    if not python:
        pytest.skip("no Python >= 3.9 with venv outside /root and /home")
    if not index_reachable():
        pytest.skip("package index unreachable: the wheel cannot be built")
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
                    str(wheels), str(REPO)], check=True, capture_output=True, timeout=300)
    wheel = next(wheels.glob("edgecap-*.whl"))
    for d in ("opt", "var"):
        (tmp_path / d).mkdir()
    subprocess.run(["cp", "-a", "/etc", str(tmp_path / "etc")], check=True)
    install = f"sh {INSTALL} --python {python} --wheel {wheel} --pip-option=--no-deps"
    script = f"""set -e
for d in etc opt var; do mount --bind {tmp_path}/$d /$d; done
{install}
{install} > {tmp_path}/second.txt
echo "passwd: $(getent passwd edgecap)"
echo "groups: $(id -nG edgecap)"
echo "modes: $(stat -c '%a %U:%G' /etc/edgecap /etc/edgecap/edgecap.toml /var/lib/edgecap | tr '\\n' ' ')"
su -s /bin/sh edgecap -c 'cat /etc/edgecap/edgecap.toml > /dev/null' && echo "service user reads config"
su -s /bin/sh nobody -c 'cat /etc/edgecap/edgecap.toml > /dev/null' 2>/dev/null || echo "others do not"
sh {UNINSTALL} --purge
getent passwd edgecap || echo "user removed"
"""
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "passwd: edgecap:x:" in text and ":/var/lib/edgecap:" in text
    assert "modes: 750 root:edgecap 640 root:edgecap 750 edgecap:edgecap" in text
    assert "service user reads config" in text and "others do not" in text
    assert "user removed" in text
    second = (tmp_path / "second.txt").read_text()
    assert "created" not in second and "edgecap-install: installed " not in second


# --- the Python version check ---------------------------------------------------


def stub_python(directory: Path, version: str, name: str = "python3") -> Path:
    """A `python3` that answers every question with `version`, like Mendel's 3.7 would."""
    directory.mkdir(parents=True, exist_ok=True)
    stub = directory / name
    stub.write_text(f"#!/bin/sh\necho {version}\n")
    stub.chmod(0o755)
    return stub


def test_install_refuses_python_37_and_says_what_to_do(tmp_path):
    bin_dir = tmp_path / "bin"
    stub_python(bin_dir, "3.7")
    # The stub and a few basic tools on PATH, nothing else: no newer python3.X to find.
    for tool in ("cat", "dirname", "id", "mkdir"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    root = tmp_path / "root"
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    out = subprocess.run(["/bin/sh", str(INSTALL), "--root", str(root)], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 1
    assert "needs Python 3.9 or newer" in out.stderr and "is 3.7" in out.stderr
    assert "uv python install" in out.stderr and "pyenv" in out.stderr
    assert not root.exists()  # nothing written before the check


def test_install_refuses_an_explicit_old_python(tmp_path):
    stub = stub_python(tmp_path / "bin", "3.8")
    out = run_script(INSTALL, "--root", str(tmp_path / "root"), "--python", str(stub))
    assert out.returncode == 1 and "is 3.8" in out.stderr
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("version", ["3.9", "3.10", "3.13", "4.0"])
def test_install_accepts_newer_pythons(tmp_path, version):
    # 3.10 is the one a string comparison gets wrong. The run stops at the next
    # check (a missing wheel), after the Python check passed.
    stub = stub_python(tmp_path / "bin", version)
    out = run_script(INSTALL, "--root", str(tmp_path / "root"), "--python", str(stub),
                     "--wheel", str(tmp_path / "missing.whl"))
    assert "needs Python" not in out.stderr
    assert out.returncode == 2 and "no such file" in out.stderr


# --- install.sh picks the combination for the installed libedgetpu ----------------


def _stub_tool(directory: Path, name: str, output: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(f"#!/bin/sh\necho '{output}'\n")
    (directory / name).chmod(0o755)


def _install_with(tmp_path, *args, dpkg: str = "", bits: str = "64", pythons=("3.11",)):
    """install.sh with stubbed dpkg-query, getconf and Pythons on PATH (plus the real python3 to read
    the matrix), stopping at a missing wheel once its checks pass."""
    bin_dir = tmp_path / "bin"
    if dpkg:
        _stub_tool(bin_dir, "dpkg-query", dpkg)
    _stub_tool(bin_dir, "getconf", bits)
    for version in pythons:
        stub_python(bin_dir, version, name=f"python{version}")
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    for tool in ("cat", "dirname", "id", "mkdir", "awk", "uname"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    out = subprocess.run(["/bin/sh", str(INSTALL), "--root", str(tmp_path / "root"),
                          "--wheel", str(tmp_path / "missing.whl"), *args],
                         capture_output=True, text=True, env=env, timeout=60)
    return out


def test_corals_libedgetpu_gets_python_39_and_tflite_runtime_211(tmp_path):
    out = _install_with(tmp_path, dpkg="libedgetpu1-std 16.0 installed", pythons=("3.11", "3.9"))
    assert "Python: " in out.stdout and "(3.9)" in out.stdout
    assert "the coral-16.0 combination (tflite-runtime==2.11.0 numpy<2 opencv-python-headless<4.12)" in out.stdout
    assert out.returncode == 2 and "missing.whl: no such file" in out.stderr  # every check before passed


def test_corals_libedgetpu_without_a_python_39_is_refused_in_one_line(tmp_path):
    out = _install_with(tmp_path, dpkg="libedgetpu1-max 16.0 installed", pythons=("3.11",))
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1
    assert "needs tflite-runtime==2.11.0, which has wheels for Python 3.9 only" in out.stderr
    assert "uv python install 3.9" in out.stderr and "feranick" in out.stderr
    assert not (tmp_path / "root").exists()
    explicit = _install_with(tmp_path / "b", "--python", str(tmp_path / "b" / "bin" / "python3.11"),
                             dpkg="libedgetpu1-std 16.0 installed")
    assert explicit.returncode == 1 and "is 3.11" in explicit.stderr


def test_a_rebuilt_libedgetpu_gets_its_interpreter_on_the_systems_python(tmp_path):
    out = _install_with(tmp_path, "--libedgetpu", "16.0tf2.17.0-1.bookworm", pythons=("3.11",))
    assert "(3.11)" in out.stdout and "the rebuilt-tf2.16 combination (ai-edge-litert numpy" in out.stdout
    assert out.returncode == 2
    older = _install_with(tmp_path / "b", "--libedgetpu", "16.0tf2.13.1-1", pythons=("3.11",))
    assert "the rebuilt-tf2.13 combination (tflite-runtime>=2.13,<2.15 numpy<2" in older.stdout


def test_no_libedgetpu_installs_the_default_interpreter(tmp_path):
    out = _install_with(tmp_path, pythons=("3.11",))
    assert "combination" not in out.stdout and out.returncode == 2


def test_a_32_bit_userland_is_refused_before_anything_in_one_line(tmp_path):
    out = _install_with(tmp_path, bits="32", dpkg="libedgetpu1-std 16.0 installed")
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1
    assert "32-bit userland" in out.stderr and "64-bit OS" in out.stderr
    assert not (tmp_path / "root").exists()


def test_install_reads_the_matrix_it_ships():
    from edgecap import configurations

    text = INSTALL.read_text()
    assert "edgecap/data/configurations.json" in text
    assert {s.build for s in configurations.load().stacks} == {"coral-tf2.5", "rebuilt"}
