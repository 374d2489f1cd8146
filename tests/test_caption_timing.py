"""A caption's stage milliseconds add up over its window's frames; its latency is real.

Stages are made slow on purpose by known amounts (an emulated TPU stage paced
to 5 ms, the RNN step paced to 2 ms, preprocessing slowed by 3 ms a frame), so
each figure has a floor worked out by hand: frames in the window times the
per-frame cost. Pacing guarantees the floor; noise can only add to it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from edgecap.captioner import EdgeCaptioner
from edgecap.preprocess import Preprocessor
from runtime_plans import write_plan

CNN_MS = 5.0
RNN_MS = 2.0
PRE_MS = 3.0
FRAMES = 4
# A floor misses by the clock's rounding at most; captions round to 1 us.
SLACK = 0.98


@pytest.fixture(scope="module")
def paced_plan(shipped_bundle: Path, tmp_path_factory) -> Path:
    path = write_plan(shipped_bundle / "encoder.tflite", [], ["tpu:0"], tmp_path_factory.mktemp("paced"),
                      [CNN_MS])
    doc = json.loads(path.read_text())
    doc["rnn_ms"] = RNN_MS
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def slow_preprocess(monkeypatch):
    real = Preprocessor.__call__

    def slow(self, frame):
        deadline = time.perf_counter() + PRE_MS / 1000.0
        out = real(self, frame)
        while time.perf_counter() < deadline:
            time.sleep(max(0.0, deadline - time.perf_counter()))
        return out

    monkeypatch.setattr(Preprocessor, "__call__", slow)


@pytest.mark.parametrize("pipelined", [True, False])
def test_stage_ms_add_up_over_the_window(shipped_bundle, paced_plan, story, slow_preprocess, pipelined):
    with EdgeCaptioner(shipped_bundle, plan=paced_plan, num_threads=1, frames=FRAMES, stride=FRAMES,
                       pipelined=pipelined) as cap:
        assert cap.devices == {"tpu:0": "emu-tpu:0"}
        caps = cap.caption_frames(story.frames[: 3 * FRAMES])
    assert len(caps) == 3
    for c in caps:
        assert c.stage_ms["preprocess"] >= SLACK * FRAMES * PRE_MS, c.stage_ms
        assert c.stage_ms["cnn"] >= SLACK * FRAMES * CNN_MS, c.stage_ms
        assert c.stage_ms["rnn_step"] >= SLACK * FRAMES * RNN_MS, c.stage_ms
        assert c.stage_ms["decode"] > 0.0
        # From the last frame leaving the source to the caption: at least that
        # frame's preprocess, CNN and RNN step, and the decode.
        floor = PRE_MS + CNN_MS + RNN_MS
        assert c.latency_ms >= SLACK * floor + c.stage_ms["decode"] - 0.01, (c.latency_ms, c.stage_ms)


def test_overlapping_windows_each_count_all_their_frames(shipped_bundle, paced_plan, story, slow_preprocess):
    # Each frame belongs to two windows; each window counts the CNN and
    # preprocessing of all four of its frames, not only the ones it opened with.
    with EdgeCaptioner(shipped_bundle, plan=paced_plan, num_threads=1, frames=FRAMES,
                       stride=FRAMES // 2) as cap:
        caps = cap.caption_frames(story.frames[: 3 * FRAMES])
    assert [c.window for c in caps] == [0, 1, 2, 3, 4]
    for c in caps:
        assert c.stage_ms["cnn"] >= SLACK * FRAMES * CNN_MS, (c.window, c.stage_ms)
        assert c.stage_ms["preprocess"] >= SLACK * FRAMES * PRE_MS, (c.window, c.stage_ms)
        assert c.latency_ms >= SLACK * (PRE_MS + CNN_MS), (c.window, c.latency_ms)
