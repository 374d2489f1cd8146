"""``--trace`` is written only by a run that succeeds: not by one that fails, nor after Ctrl-C of a file's run
(issue 19); a camera, which ends only by an interrupt, writes its trace then."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import pytest

from conftest import write_noise_clip
from edgecap.captioner import EdgeCaptioner
from edgecap.cli import main, run
from edgecap.command import EXIT_SIGINT
from edgecap.sources import Frame, FrameSource
from test_bad_media import write_damaged_clip

STAGE_MS = 2000.0  # each emulated stage invoke sleeps this long: the run is mid-way when signalled
OLD = '{"traceEvents": []}\n'  # a trace of an earlier run, which a failed run must leave alone


@pytest.fixture(scope="module")
def slow_plan(tmp_path_factory, shipped_bundle) -> Path:
    out = tmp_path_factory.mktemp("slow") / "plan"
    assert run(["compile", str(shipped_bundle), "--board", "devboard-usb", "-o", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    for stage in plan["stages"]:
        stage["predicted_ms"] = STAGE_MS
    (out / "plan.json").write_text(json.dumps(plan))
    return out


@pytest.mark.parametrize("earlier", [False, True], ids=["no earlier trace", "an earlier trace"])
def test_a_run_that_fails_writes_no_trace(tmp_path: Path, shipped_bundle: Path, capsys, earlier: bool) -> None:
    damaged = write_damaged_clip(tmp_path / "damaged.mp4")
    trace = tmp_path / "out" / "trace.json"
    trace.parent.mkdir()
    if earlier:
        trace.write_text(OLD)
    code = main(["caption", str(damaged), "--bundle", str(shipped_bundle), "--trace", str(trace)])
    assert code == 2 and "damaged at frame" in capsys.readouterr().err
    assert os.listdir(trace.parent) == (["trace.json"] if earlier else [])  # no temporary file either
    if earlier:
        assert trace.read_text() == OLD


def test_a_run_that_succeeds_writes_its_trace(tmp_path: Path, shipped_bundle: Path, capsys) -> None:
    clip = write_noise_clip(tmp_path / "clip.mp4", 16, 64)
    trace = tmp_path / "trace.json"
    trace.write_text(OLD)
    assert main(["caption", str(clip), "--bundle", str(shipped_bundle), "--trace", str(trace)]) == 0
    assert any(e["ph"] == "X" for e in json.loads(trace.read_text())["traceEvents"])


def test_ctrl_c_writes_no_trace(tmp_path: Path, slow_plan: Path, shipped_bundle: Path) -> None:
    clip = write_noise_clip(tmp_path / "clip.mp4", 40, 64)
    trace = tmp_path / "out" / "trace.json"
    trace.parent.mkdir()
    # A real SIGINT to a child (a shell's background job would ignore it).
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgecap.cli", "caption", str(clip), "--bundle", str(shipped_bundle),
         "--plan", str(slow_plan), "--emulate", "--trace", str(trace)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Running once its workers are up (main, feeder, one per device and decode): the
        # first frame is then in an emulated stage's multi-second sleep.
        deadline = time.monotonic() + 60
        while (proc.poll() is None and time.monotonic() < deadline
               and len(os.listdir(f"/proc/{proc.pid}/task")) < 6):
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == EXIT_SIGINT and "Traceback" not in err, err
    assert os.listdir(trace.parent) == []


class _Camera(FrameSource):
    """A live source that never ends by itself; raises ``stop`` after ``frames`` frames if given."""

    live = True

    def __init__(self, frames: int, stop: Optional[BaseException] = None):
        super().__init__()
        self.frames, self.stop = frames, stop

    def __iter__(self) -> Iterator[Frame]:
        rng = np.random.default_rng(0)
        for i in itertools.count():
            if self.stop is not None and i == self.frames:
                raise self.stop
            yield Frame(i, i / 30.0, rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))


def test_a_camera_run_ended_by_ctrl_c_writes_its_trace(tmp_path: Path, shipped_bundle: Path) -> None:
    # A camera ends only by an interrupt; were that treated as a failure, `camera --trace` could never write.
    trace = tmp_path / "trace.json"
    with EdgeCaptioner(shipped_bundle, trace=trace) as cap:
        with pytest.raises(KeyboardInterrupt):
            for _ in cap.stream(_Camera(40, KeyboardInterrupt())):
                pass
    assert any(e["ph"] == "X" for e in json.loads(trace.read_text())["traceEvents"])


def test_a_camera_run_its_caller_stops_reading_writes_its_trace(tmp_path: Path, shipped_bundle: Path) -> None:
    trace = tmp_path / "trace.json"
    with EdgeCaptioner(shipped_bundle, trace=trace) as cap:
        captions = cap.stream(_Camera(10**9))
        next(captions)
        captions.close()
    assert any(e["ph"] == "X" for e in json.loads(trace.read_text())["traceEvents"])


def test_a_file_run_its_caller_stops_reading_writes_no_trace(tmp_path: Path, shipped_bundle: Path) -> None:
    clip = write_noise_clip(tmp_path / "clip.mp4", 40, 64)
    trace = tmp_path / "trace.json"
    with EdgeCaptioner(shipped_bundle, trace=trace) as cap:
        captions = cap.stream(clip)
        next(captions)
        captions.close()
    assert not trace.exists()
