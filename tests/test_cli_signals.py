"""SIGINT and SIGTERM end a CLI command within about a second: exit 130 / 143, no traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import write_noise_clip
from edgecap.cli import run
from edgecap.command import EXIT_SIGINT, EXIT_SIGTERM

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                                reason="counts a process's threads in /proc (Linux)")

STAGE_MS = 2000.0  # each emulated stage invoke sleeps this long


@pytest.fixture(scope="module")
def slow_plan(tmp_path_factory, shipped_bundle) -> Path:
    # The board's plan with every stage predicted to take seconds: an emulated
    # run then spends its time in the pacer's sleeps, where a signal must still end it.
    out = tmp_path_factory.mktemp("slow") / "plan"
    assert run(["compile", str(shipped_bundle), "--board", "devboard-usb", "-o", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    for stage in plan["stages"]:
        stage["predicted_ms"] = STAGE_MS
    plan["rnn_ms"] = STAGE_MS / 2
    (out / "plan.json").write_text(json.dumps(plan))
    return out


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return write_noise_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", 40, 64)


def _threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, EXIT_SIGINT),
                                          (signal.SIGTERM, EXIT_SIGTERM)])
def test_a_signal_ends_an_emulated_caption_run_within_a_second(
        slow_plan, clip, shipped_bundle, signum, code):
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgecap.cli", "caption", str(clip), "--bundle",
         str(shipped_bundle), "--plan", str(slow_plan), "--emulate"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Running: main thread, one worker per device (2 TPUs, cpu, decode), the feeder.
        deadline = time.monotonic() + 30
        while _threads(proc.pid) < 6 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the first frame is now in an emulated stage's sleep
        assert proc.poll() is None, proc.communicate()
        sent = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=3 * STAGE_MS / 1000)
        took = time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()
    assert "Traceback" not in err, err
    assert proc.returncode == code
    # The bound is 1 s; 0.5 s more is for starting the interpreter's exit on a loaded host.
    assert took < 1.5, f"took {took:.2f} s to stop"


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, EXIT_SIGINT),
                                          (signal.SIGTERM, EXIT_SIGTERM)])
def test_a_signal_ends_a_command_between_stages(tmp_path, signum, code):
    # `edgecap devices` cannot be slow, so the signal is raised in the process
    # itself, where a command runs: main() maps it to its exit code, no traceback.
    script = (
        "import os, signal, sys\n"
        "from edgecap import cli\n"
        "def slow(args):\n"
        f"    os.kill(os.getpid(), {int(signum)})\n"
        "    signal.pause()\n"
        "cli._cmd_devices = slow\n"
        "sys.exit(cli.main(['devices']))\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == code and "Traceback" not in r.stderr, r.stderr
