"""No plan value keeps a run from ending on SIGINT or SIGTERM (issue #10 item 3).

A stage predicted past ``threading.TIMEOUT_MAX`` (a ``Plan`` built in
Python: its pacing wait used to raise OverflowError; plan.json stops at a
minute, which tests/test_cli_signals.py's 2 s stages stand for) and an emulated
device that hangs in its invoke before its deadline: the CLI still exits
130 / 143 within about two seconds of the signal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgecap.cli import run
from edgecap.command import EXIT_SIGINT, EXIT_SIGTERM
from edgecap.plans.plan import MAX_INVOKE_MS

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                                reason="counts a process's threads in /proc (Linux)")

SIGNALS = [(signal.SIGINT, EXIT_SIGINT), (signal.SIGTERM, EXIT_SIGTERM)]

# Runs the CLI's caption command on a plan whose every predicted time is PREDICTED_MS.
SCRIPT = """
import dataclasses, sys
from edgecap import cli, planner
from edgecap.plans.plan import load_plan
ms = float(sys.argv[2])
plan = load_plan(sys.argv[1])
absurd = dataclasses.replace(plan, rnn_ms=ms,
                             stages=[dataclasses.replace(s, predicted_ms=ms) for s in plan.stages])
planner.load_plan = lambda path: absurd
print("started", flush=True)
sys.exit(cli.main(sys.argv[3:]))
"""


@pytest.fixture(scope="module")
def board_plan(tmp_path_factory, shipped_bundle) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan"
    assert run(["compile", str(shipped_bundle), "--board", "devboard-usb", "-o", str(out)]) == 0
    return out


def _threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return 0


def _running_threads(plan_dir: Path) -> int:
    """Threads of a caption run of the plan: main, the feeder, the watchdog, a worker per device, decode."""
    stages = [s for s in json.loads((plan_dir / "plan.json").read_text())["stages"] if s["ops"][1] > s["ops"][0]]
    devices = {s["device"] for s in stages} | {"cpu"}  # the RNN step runs on the CPU worker
    return 3 + len(devices) + 1


def _signal_after_start(cmd, signum, threads: int, env=None) -> tuple:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 30
        while _threads(proc.pid) < threads and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None and _threads(proc.pid) < threads:
            pytest.fail(f"the run never reached its {threads} threads (has {_threads(proc.pid)})")
        time.sleep(0.5)  # the first frame is now in a stage's wait
        assert proc.poll() is None, proc.communicate()
        sent = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=10)
        return proc.returncode, time.monotonic() - sent, err
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("signum, code", SIGNALS)
@pytest.mark.parametrize("predicted_ms", [1e14])  # past threading.TIMEOUT_MAX
def test_a_signal_ends_a_run_whatever_its_predicted_times(board_plan, shipped_bundle, tmp_path,
                                                          predicted_ms, signum, code):
    script = tmp_path / "absurd.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, str(script), str(board_plan), repr(predicted_ms), "caption",
           str(shipped_bundle.parent / "sample.mp4"), "--bundle", str(shipped_bundle),
           "--plan", str(board_plan), "--emulate"]
    rc, took, err = _signal_after_start(cmd, signum, _running_threads(board_plan))
    assert "Traceback" not in err, err
    assert rc == code and took < 2.0, (rc, took, err)


@pytest.mark.parametrize("signum, code", SIGNALS[:1])
def test_a_signal_ends_a_run_whose_device_hangs(board_plan, shipped_bundle, signum, code):
    # The longest plan.json allows puts the hang's deadline at 20 minutes: the signal comes first.
    doc = json.loads((board_plan / "plan.json").read_text())
    for stage in doc["stages"]:
        stage["predicted_ms"] = MAX_INVOKE_MS
    slow = board_plan.parent / "slow"
    slow.mkdir(exist_ok=True)
    for f in board_plan.iterdir():
        (slow / f.name).write_bytes(f.read_bytes())
    (slow / "plan.json").write_text(json.dumps(doc))
    env = dict(os.environ, EDGECAP_FAULTS="emu-tpu:0=hang@0")
    cmd = [sys.executable, "-m", "edgecap.cli", "caption", str(shipped_bundle.parent / "sample.mp4"),
           "--bundle", str(shipped_bundle), "--plan", str(slow), "--emulate"]
    rc, took, err = _signal_after_start(cmd, signum, _running_threads(slow), env)
    assert "Traceback" not in err, err
    assert rc == code and took < 2.0, (rc, took, err)
