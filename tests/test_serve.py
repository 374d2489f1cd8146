"""`edgecap serve` end to end: a looping file camera, a real sd_notify socket, HTTP, MQTT and SIGTERM.

The service runs as a subprocess, as systemd runs it. The test is systemd: it
binds the notify socket and waits for READY=1; it is the user: it reads the
health, the metrics and the captions over HTTP; it is the house: it subscribes
to the MQTT broker; then it sends SIGTERM and times the exit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from test_mqtt import Subscriber, broker, free_port  # noqa: F401 (broker is a fixture)

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "models" / "demo" / "sample.mp4"
TRUTH = [w["caption"] for w in json.loads((REPO / "models" / "demo" / "sample.json").read_text())["windows"]]


class NotifySocket:
    """The systemd side of sd_notify: a datagram socket that collects what the service says."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: List[Dict[str, str]] = []

    def wait_for(self, key: str, timeout: float) -> Dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.messages:
                if key in m:
                    return m
            try:
                data = self.sock.recv(4096).decode()
            except socket.timeout:
                continue
            self.messages.append(dict(line.split("=", 1) for line in data.splitlines() if "=" in line))
        raise AssertionError(f"no {key} within {timeout} s; got {self.messages}")

    def close(self) -> None:
        self.sock.close()


def _get(url: str, token: Optional[str] = None) -> tuple:
    req = urllib.request.Request(url)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _config(tmp_path: Path, port: int, broker_port: Optional[int], cameras: List[tuple]) -> Path:
    lines = [f'bundle = "{REPO / "models" / "demo" / "bundle"}"', "",
             "[http]", f"port = {port}", "",
             "[sinks.stdout]", "enabled = true", "",
             "[sinks.jsonl]", f'path = "{tmp_path / "captions.jsonl"}"', ""]
    if broker_port:
        lines += ["[sinks.mqtt]", 'host = "127.0.0.1"', f"port = {broker_port}",
                  'topic_prefix = "test"', "stats_interval_seconds = 1.0", ""]
    for name, source, stall in cameras:
        lines += ["[[cameras]]", f'name = "{name}"', f'source = "{source}"', "loop = true",
                  f"stall_seconds = {stall}", "backoff_max_seconds = 1.0", ""]
    path = tmp_path / "edgecap.toml"
    path.write_text("\n".join(lines))
    return path


def _serve(config: Path, notify: NotifySocket, tmp_path: Path) -> subprocess.Popen:
    env = dict(os.environ, NOTIFY_SOCKET=str(notify.path), WATCHDOG_USEC="2000000",
               WATCHDOG_PID="", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "edgecap.cli", "serve", "--config", str(config)],
                            stdout=open(tmp_path / "stdout.txt", "w"), stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path)


def _stop(proc: subprocess.Popen) -> float:
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    finally:
        proc.kill()
    return time.monotonic() - sent


def test_serve_captions_a_camera_end_to_end(tmp_path, broker):  # noqa: F811
    port = free_port()
    notify = NotifySocket(tmp_path / "notify.sock")
    sub = Subscriber(broker.port, "test").connect()
    proc = _serve(_config(tmp_path, port, broker.port, [("front", SAMPLE, 20.0)]), notify, tmp_path)
    try:
        started = time.monotonic()
        ready = notify.wait_for("READY", timeout=30)
        assert ready["READY"] == "1" and "front online" in ready.get("STATUS", "")
        ready_s = time.monotonic() - started
        notify.wait_for("WATCHDOG", timeout=5)
        caption = sub.captions(1, timeout=20)[0]  # over MQTT, from the real broker
        assert caption["camera"] == "front" and caption["text"] in TRUTH
        status, body = _get(f"http://127.0.0.1:{port}/healthz")
        health = json.loads(body)
        assert status == 200 and health["ok"], health
        status, metrics = _get(f"http://127.0.0.1:{port}/metrics")
        text = metrics.decode()
        assert status == 200 and 'edgecap_frames_processed_total{camera="front"}' in text
        assert "edgecap_caption_latency_seconds_bucket" in text
        # Each step's measured time a frame (the host plan predicts none).
        assert re.search(r'^edgecap_stage_measured_seconds\{device="cpu",stage="rnn_step"\} [0-9.e-]+$', text, re.M)
        _, body = _get(f"http://127.0.0.1:{port}/api/stats")
        (cpu,) = [d for d in json.loads(body)["devices"] if d["device"] == "cpu"]
        assert cpu["measured_ms"] > 0 and cpu["predicted_ms"] is None  # the status page's row
        status, body = _get(f"http://127.0.0.1:{port}/api/captions")
        assert json.loads(body)["front"]["text"] in TRUTH
        took = _stop(proc)
        stderr = proc.stderr.read()
        assert proc.returncode == 0, stderr
        assert "Traceback" not in stderr, stderr
        assert took < 5.0, f"SIGTERM to exit took {took:.2f} s"
        notify.wait_for("STOPPING", timeout=1)
        lines = (tmp_path / "captions.jsonl").read_text().splitlines()
        assert lines and all(json.loads(line)["text"] in TRUTH for line in lines)
        assert all(line.startswith("front") or "front" in line
                   for line in (tmp_path / "stdout.txt").read_text().splitlines() if line)
        print(f"\nstart to READY {ready_s:.2f} s; SIGTERM to exit {took:.2f} s")
    finally:
        proc.kill()
        sub.disconnect()
        notify.close()


def test_two_cameras_share_the_devices_and_each_caption_reads_its_own_frames(tmp_path):
    port = free_port()
    notify = NotifySocket(tmp_path / "notify.sock")
    proc = _serve(_config(tmp_path, port, None, [("left", SAMPLE, 20.0), ("right", SAMPLE, 20.0)]),
                  notify, tmp_path)
    try:
        notify.wait_for("READY", timeout=30)
        deadline = time.monotonic() + 30
        seen: Dict[str, List[str]] = {"left": [], "right": []}
        while time.monotonic() < deadline and min(len(v) for v in seen.values()) < 2:
            time.sleep(0.5)
            path = tmp_path / "captions.jsonl"
            if path.is_file():
                seen = {"left": [], "right": []}
                for line in path.read_text().splitlines():
                    rec = json.loads(line)
                    seen[rec["camera"]].append(rec["text"])
        assert min(len(v) for v in seen.values()) >= 2, seen
        # Interleaved frames of two cameras never mix in a window: every caption is right.
        assert all(text in TRUTH for texts in seen.values() for text in texts), seen
        _stop(proc)
        assert proc.returncode == 0, proc.stderr.read()
    finally:
        proc.kill()
        notify.close()


def test_a_missing_camera_keeps_the_service_up_and_unhealthy(tmp_path):
    port = free_port()
    notify = NotifySocket(tmp_path / "notify.sock")
    proc = _serve(_config(tmp_path, port, None, [("gone", "/dev/video99", 1.0)]), notify, tmp_path)
    try:
        ready = notify.wait_for("READY", timeout=30)  # up, after the camera's stall time
        assert "gone offline" in ready.get("STATUS", "")
        status, body = _get(f"http://127.0.0.1:{port}/healthz")
        assert status == 503 and "gone" in json.loads(body)["reason"]
        _, metrics = _get(f"http://127.0.0.1:{port}/metrics")
        assert 'edgecap_camera_up{camera="gone"} 0.0' in metrics.decode()
        notify.wait_for("WATCHDOG", timeout=5)  # heartbeats keep the watchdog fed
        _stop(proc)
        assert proc.returncode == 0
    finally:
        proc.kill()
        notify.close()


def test_a_bad_config_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "edgecap.toml"
    bad.write_text('[[cameras]]\nname = "front"\nsource = "/dev/video0"\nfps = -1\n')
    run = subprocess.run([sys.executable, "-m", "edgecap.cli", "serve", "--config", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "edgecap.toml:4" in lines[0] and "fps" in lines[0], lines


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        run = subprocess.run([sys.executable, "-m", "edgecap.cli", "serve", "--config",
                              str(_config(tmp_path, port, None, [("front", SAMPLE, 20.0)]))],
                             capture_output=True, text=True, timeout=60)
    finally:
        holder.close()
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "already in use" in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_a_network_stream_is_refused_in_one_line(tmp_path):
    from edgecap.errors import ConfigError
    from edgecap.service.config import load_config

    path = tmp_path / "edgecap.toml"
    path.write_text('[[cameras]]\nname = "door"\nsource = "rtsp://10.0.0.5/stream"\n')
    with pytest.raises(ConfigError, match=r"edgecap.toml:3: .*network stream.*/dev/videoN") as err:
        load_config(path)
    assert "\n" not in str(err.value)
