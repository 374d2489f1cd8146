"""A device fault that would kill the process runs its stage in a worker process on its own.

`edgecap caption` with a pending ``segv`` (or ``abort``) fault on an emulated
EdgeTPU, and no isolation asked for: the stage must run isolated, so the
crash kills only its worker; the command fails over and captions every
window, exit 0. Without that the command itself dies of SIGSEGV (139 in a
shell). Run as a subprocess: a regression must fail this test, not kill pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgecap import isolation
from edgecap.captioner import EdgeCaptioner

# Not in the fast tier (2 s; test_isolation's in-process checks are): the full suite runs it.
pytestmark = pytest.mark.skipif(not isolation.SUPPORTED, reason="process isolation is POSIX only")

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "models" / "demo" / "sample.mp4"


def test_a_pending_segfault_isolates_its_stage_and_the_command_fails_over(shipped_bundle, tmp_path):
    with EdgeCaptioner(shipped_bundle, board="devboard-usb") as cap:
        # The demo's CNN runs as copies on both TPUs: the fault strikes one copy's device.
        assert list(cap.devices.values()) == ["emu-tpu:0", "emu-tpu:1"]
        reference = [(c.window, c.text) for c in cap.stream(str(SAMPLE))]
    assert len(reference) == 3
    env = dict(os.environ, EDGECAP_FAULTS="emu-tpu:0=segv@12")  # mid second window
    run = subprocess.run([sys.executable, "-m", "edgecap.cli", "caption", str(SAMPLE), "--bundle",
                          str(shipped_bundle), "--board", "devboard-usb", "--json"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert run.returncode == 0, (run.returncode, run.stderr)
    assert "emu-tpu:0: crashed: worker process killed by SIGSEGV" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    captions = [json.loads(line) for line in run.stdout.splitlines()]
    assert [(c["window"], c["text"]) for c in captions] == reference
