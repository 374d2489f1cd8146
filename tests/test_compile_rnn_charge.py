"""The RNN encoder step as the compiler charges it: once per open window, timed on one thread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgecap_compile import compiler
from edgecap_compile.boards import load_board


def _with_stride(bundle: Path, stride: int) -> Path:
    doc = json.loads((bundle / "bundle.json").read_text())
    doc["window"]["stride"] = stride
    (bundle / "bundle.json").write_text(json.dumps(doc))
    return bundle


def test_a_bundle_with_overlapping_windows_charges_a_step_per_window(bundle_copy, tmp_path):
    frames = json.loads((bundle_copy / "bundle.json").read_text())["window"]["frames"]
    assert frames == 8
    cpu_ms = {}
    for stride in (8, 2):
        plan = compiler.compile_model(_with_stride(bundle_copy, stride), "devboard",
                                      tmp_path / f"stride{stride}", ranges=[(0, 20), (20, 35)]).plan
        cpu_ms[stride] = plan.stages[-1].predicted_ms
        rnn_ms = plan.rnn_ms  # one step; the same model at either stride
    assert rnn_ms > 0
    # 8-frame windows every 2 frames: each frame feeds 4 windows, 3 steps more than at stride 8.
    assert cpu_ms[2] - cpu_ms[8] == pytest.approx(3 * rnn_ms, rel=1e-4)


def test_the_host_times_the_rnn_step_on_one_thread_as_the_runtime_runs_it(monkeypatch,
                                                                             shipped_bundle):
    seen = {}

    def measure(model, threads=1, **kwargs):
        seen["threads"] = threads
        return 0.25

    monkeypatch.setattr(compiler, "measure_invoke_ms", measure)
    board = load_board("host")
    assert board.cpu.cores and board.cpu.cores > 1
    assert compiler.rnn_step_ms(shipped_bundle / "rnn_encoder_step.tflite", board) == 0.25
    assert seen == {"threads": 1}
