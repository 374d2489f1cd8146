"""Calibration: the fit recovers known coefficients; a host run feeds `--calibration`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from edgecap.devices import parse_device
from edgecap_compile import calibration
from edgecap_compile.boards import load_board
from edgecap_compile.calibration import Sample, apply_calibration, fit
from edgecap.cli import run as main
from edgecap_compile.edgetpu import EdgeTpuReport
from edgecap_compile.errors import CompileError
from edgecap_compile.graph import read_graph

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


def test_a_rate_the_timings_cannot_determine_keeps_the_profile_value():
    # Timings that fall as element work grows (noise on a real host can do
    # this) would need a negative cost per element; the rate stays the prior's.
    prior = load_board("host").cpu
    truth = dataclasses.replace(prior, elements_per_s=-prior.elements_per_s)
    samples = [dataclasses.replace(s, measured_ms=max(s.measured_ms, 1e-3))
               for s in _samples(truth, np.random.default_rng(2), 20)]
    fitted, error = fit(samples, prior)
    assert error["kept_from_profile"] == ["elements_per_s"]
    assert fitted.elements_per_s == prior.elements_per_s
    assert fitted.macs_per_s > 0 and fitted.op_overhead_ms >= 0
    assert fitted.invoke_overhead_ms >= 0


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
    # The reported fit error is the samples' mean relative error of prediction.
    relative = [abs(s["predicted_ms"] - s["measured_ms"]) / s["measured_ms"]
                for s in saved["samples"]]
    assert saved["error"]["all"]["mean_abs_rel"] == pytest.approx(np.mean(relative), rel=1e-9)
    assert saved["error"]["all"]["max_abs_rel"] == pytest.approx(max(relative), rel=1e-9)
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


@pytest.mark.parametrize("flag, value", [("--threads", -1), ("--threads", 0),
                                         ("--segments", 0), ("--repeats", -3)])
def test_counts_below_one_are_one_line_errors(flag, value):
    # The command line refuses these before any work (test_bad_input_cli); the API, here.
    graph = read_graph(DATA / "tiny_mobilenet.tflite")
    with pytest.raises(CompileError) as e:
        calibration.calibrate([graph], load_board("host"), **{flag[2:]: value})
    assert f"{flag} must be >= 1, got {value}" in str(e.value) and "\n" not in str(e.value)


def test_a_tpu_without_its_runtime_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setattr(calibration, "find_compiler", lambda: "/usr/bin/edgetpu_compiler")
    with pytest.raises(CompileError) as e:
        main(["calibrate", str(DATA / "tiny_mobilenet.tflite"), "--board", "devboard",
              "--device", "tpu:0", "-o", str(tmp_path / "cal.json")])
    assert "cannot calibrate tpu:0" in str(e.value) and "libedgetpu" in str(e.value)
    assert "\n" not in str(e.value)


class _Timed(Exception):
    pass


def test_tpu_segments_are_timed_on_the_named_tpu_with_the_repeats(tmp_path, monkeypatch):
    delegate, seen = object(), {}

    def compile_segment(compiler, path):
        compiled = path.with_name("segment_edgetpu.tflite")
        compiled.write_bytes(path.read_bytes())
        return EdgeTpuReport(compiled=True, compiled_segment=compiled.name)

    def load_edgetpu_delegate(spec):
        seen["spec"] = spec
        return delegate

    def make_delegate_interpreter(path, delegates):
        seen["delegates"] = delegates
        return object()

    def time_invokes(interp, repeats):
        seen["repeats"] = repeats
        raise _Timed

    monkeypatch.setattr(calibration, "find_compiler", lambda: "/usr/bin/edgetpu_compiler")
    for fake in (load_edgetpu_delegate, compile_segment, make_delegate_interpreter, time_invokes):
        monkeypatch.setattr(calibration, fake.__name__, fake)
    with pytest.raises(_Timed):
        calibration.calibrate([read_graph(DATA / "tiny_mobilenet.tflite")],
                              load_board("rpi4-2usb"), device="tpu:1", repeats=4)
    assert seen == {"spec": parse_device("tpu:1"), "delegates": [delegate], "repeats": 4}


def _fake_tpu(monkeypatch, compiled=True, opens=True):
    def compile_segment(compiler, path):
        if not compiled:
            return EdgeTpuReport(compiled=False, reason="Model not quantized")
        compiled_path = path.with_name("segment_edgetpu.tflite")
        compiled_path.write_bytes(path.read_bytes())
        return EdgeTpuReport(compiled=True, compiled_segment=compiled_path.name)

    def make_delegate_interpreter(path, delegates):
        if not opens:
            raise RuntimeError("Failed to prepare for TPU")
        return object()

    monkeypatch.setattr(calibration, "find_compiler", lambda: "/usr/bin/edgetpu_compiler")
    monkeypatch.setattr(calibration, "load_edgetpu_delegate", lambda spec: object())
    monkeypatch.setattr(calibration, "compile_segment", compile_segment)
    monkeypatch.setattr(calibration, "make_delegate_interpreter", make_delegate_interpreter)


@pytest.mark.parametrize("setup, message", [
    (lambda mp: mp.setattr(calibration, "find_compiler", lambda: None),
     "calibrating a TPU needs edgetpu_compiler on PATH"),
    (lambda mp: _fake_tpu(mp, compiled=False),
     "edgetpu_compiler failed on a calibration segment: Model not quantized"),
    (lambda mp: _fake_tpu(mp, opens=False),
     "tpu:1 cannot run a calibration segment (Failed to prepare for TPU)"),
])
def test_tpu_calibration_failures_are_one_line_errors(monkeypatch, setup, message):
    setup(monkeypatch)
    with pytest.raises(CompileError) as e:
        calibration.calibrate([read_graph(DATA / "tiny_mobilenet.tflite")],
                              load_board("rpi4-2usb"), device="tpu:1", segments=2, repeats=1)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_cpu_memory_bandwidth_stays_the_profiles_and_the_rest_is_fitted_around_it():
    # Timings that include memory traffic at the profile's bandwidth: the fit
    # recovers the other coefficients and keeps the bandwidth (it is not fitted).
    truth = dataclasses.replace(load_board("devboard").cpu, op_overhead_ms=0.01,
                                invoke_overhead_ms=0.3)
    rng = np.random.default_rng(3)
    samples = []
    for s in _samples(truth, rng):
        memory = int(rng.integers(1e4, 1e7))
        samples.append(dataclasses.replace(
            s, memory_bytes=memory, measured_ms=s.measured_ms + 1e3 * memory / truth.memory_bytes_per_s))
    prior = dataclasses.replace(truth, macs_per_s=1e12, op_overhead_ms=9.0)
    fitted, error = fit(samples, prior)
    assert fitted.memory_bytes_per_s == truth.memory_bytes_per_s
    for name in ("macs_per_s", "elements_per_s", "op_overhead_ms", "invoke_overhead_ms"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert error["all"]["mean_abs_rel"] < 1e-9 and error["holdout"]["mean_abs_rel"] < 1e-9
