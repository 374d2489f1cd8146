"""`edgecap serve` goes on when an emulated EdgeTPU fails: it fails over and counts it, no restart."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

from test_mqtt import free_port
from test_serve import SAMPLE, TRUTH, NotifySocket, _config, _get, _stop


def test_the_service_fails_over_instead_of_exiting(tmp_path):
    port = free_port()
    notify = NotifySocket(tmp_path / "notify.sock")
    config = _config(tmp_path, port, None, [("front", SAMPLE, 20.0)])
    # The refit devboard-usb runs the demo on one EdgeTPU (emu-tpu:0): the fault strikes it.
    config.write_text('board = "devboard-usb"\n' + config.read_text())
    env = dict(os.environ, NOTIFY_SOCKET=str(notify.path), PYTHONUNBUFFERED="1",
               EDGECAP_FAULTS="emu-tpu:0=fail@20")
    proc = subprocess.Popen([sys.executable, "-m", "edgecap.cli", "serve", "--config", str(config)],
                            stdout=open(tmp_path / "stdout.txt", "w"), stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path)
    try:
        notify.wait_for("READY", timeout=30)
        deadline = time.monotonic() + 30
        metric, texts = None, []
        while time.monotonic() < deadline:
            time.sleep(0.5)
            _, body = _get(f"http://127.0.0.1:{port}/metrics")
            metric = re.search(r'^edgecap_failovers_total\{device="emu-tpu:0",how="(\w+)",kind="error"\} (\S+)',
                               body.decode(), re.M)
            path = tmp_path / "captions.jsonl"
            texts = [json.loads(line)["text"] for line in path.read_text().splitlines()] if path.is_file() else []
            if metric and len(texts) >= 6:  # windows captioned after the failover too
                break
        assert metric is not None and float(metric.group(2)) == 1.0, body.decode()
        assert metric.group(1) == "compiler"  # no TPU left: re-partitioned for the CPU alone
        assert proc.poll() is None, proc.stderr.read()
        assert len(texts) >= 6 and all(t in TRUTH for t in texts), texts
        _stop(proc)
        assert proc.returncode == 0
        assert "emu-tpu:0: error: injected fail" in proc.stderr.read()
    finally:
        proc.kill()
        notify.close()
