"""Calibration: the fit recovers known coefficients; a host run feeds `--calibration`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from edgecap_compile.boards import load_board
from edgecap_compile.calibration import Sample, apply_calibration, fit
from edgecap_compile.cli import main
from edgecap_compile.errors import CompileError

DATA = Path(__file__).parent / "data" / "compile"


def _samples(device, rng, count=30, noise=0.0):
    samples = []
    for i in range(count):
        macs, elements, ops = int(rng.integers(1e5, 1e8)), int(rng.integers(1e3, 1e6)), int(
            rng.integers(1, 40))
        link = int(rng.integers(0, 1e6)) if device.is_tpu else 0
        ms = (1e3 * (macs / device.macs_per_s + elements / device.elements_per_s)
              + ops * device.op_overhead_ms + device.invoke_overhead_ms
              + (1e3 * link / device.link_bytes_per_s if device.is_tpu else 0.0))
        ms *= 1.0 + noise * rng.standard_normal()
        samples.append(Sample("m", (0, ops), macs, elements, ops, link, ms))
    return samples


@pytest.mark.parametrize("device", ["cpu", "tpu:0"])
def test_fit_recovers_known_coefficients(device):
    board = load_board("devboard")
    truth = board.cpu if device == "cpu" else board.tpus[0]
    truth = dataclasses.replace(truth, op_overhead_ms=0.01, invoke_overhead_ms=0.3)
    prior = dataclasses.replace(truth, macs_per_s=1e12, elements_per_s=1.0, op_overhead_ms=9.0)
    fitted, error = fit(_samples(truth, np.random.default_rng(0)), prior)
    for name in ("macs_per_s", "elements_per_s", "op_overhead_ms", "invoke_overhead_ms"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    if truth.is_tpu:
        assert fitted.link_bytes_per_s == pytest.approx(truth.link_bytes_per_s, rel=1e-6)
    assert error["all"]["mean_abs_rel"] < 1e-9 and error["holdout"]["mean_abs_rel"] < 1e-9


def test_fit_keeps_coefficients_non_negative_and_reports_noise():
    truth = dataclasses.replace(load_board("devboard").cpu, op_overhead_ms=0.0,
                                invoke_overhead_ms=0.0)
    fitted, error = fit(_samples(truth, np.random.default_rng(1), 60, noise=0.05), truth)
    assert fitted.op_overhead_ms >= 0 and fitted.invoke_overhead_ms >= 0
    assert 0.005 < error["all"]["mean_abs_rel"] < 0.2


def test_too_few_segments_is_an_error():
    cpu = load_board("host").cpu
    with pytest.raises(CompileError, match="at least 8 segments"):
        fit(_samples(cpu, np.random.default_rng(0), 5), cpu)


def test_calibrate_on_this_cpu_then_compile_with_it(tmp_path, capsys):
    out = tmp_path / "host.json"
    assert main(["calibrate", str(DATA / "tiny_mobilenet.tflite"), str(DATA / "tiny_densenet.tflite"),
                 "--board", "host", "--segments", "8", "--repeats", "3", "-o", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["board"] == "host" and saved["device"] == "cpu"
    assert len(saved["samples"]) == 16 and all(s["measured_ms"] > 0 for s in saved["samples"])
    assert saved["error"]["all"]["mean_abs_rel"] >= 0
    assert "fit error over 16 segments" in capsys.readouterr().out
    # The calibrated coefficients are what the compiler predicts with.
    calibrated = apply_calibration(load_board("host"), out).cpu
    assert calibrated.macs_per_s == pytest.approx(saved["coefficients"]["macs_per_s"])
    main(["compile", str(DATA / "tiny_mobilenet.tflite"), "--board", "host",
          "--calibration", str(out), "-o", str(tmp_path / "plan")])
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    whole = next(s for s in saved["samples"] if s["model"] == "tiny_mobilenet"
                 and s["ops"] == [0, plan["model"]["ops"]])
    assert plan["stages"][0]["predicted_ms"] == pytest.approx(whole["predicted_ms"], rel=1e-3)


def test_calibration_for_another_board_is_refused(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"calibration_version": 1, "board": "host", "device": "cpu",
                                "coefficients": {"macs_per_s": 1e9}}))
    with pytest.raises(CompileError, match="for board host, not devboard"):
        apply_calibration(load_board("devboard"), path)
    with pytest.raises(CompileError, match="has no device 'tpu:0'"):
        main(["calibrate", str(DATA / "tiny_mobilenet.tflite"), "--board", "host",
              "--device", "tpu:0", "-o", str(path)])
