"""``python -m edgecap_lab.compile_benchmark``: usable without TensorFlow up to the point it needs it."""

from __future__ import annotations

import importlib.util

import pytest

from edgecap_lab import compile_benchmark as benchmark
from edgecap.errors import EdgecapError
from edgecap_compile.errors import CompileError


def test_help_needs_no_tensorflow(capsys):
    with pytest.raises(SystemExit) as e:
        benchmark.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--rnn-step" in out and "--window FRAMES STRIDE" in out


def test_missing_models_without_tensorflow_is_one_line(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "keras" else real(name, *a))
    monkeypatch.setenv("EDGECAP_CACHE", str(tmp_path))
    with pytest.raises(CompileError) as e:
        benchmark.main(["--models", "ResNet50", "--out", str(tmp_path / "bench")])
    message = str(e.value)
    assert message.startswith("benchmark models ResNet50 are not in ")
    assert "keras_zoo" in message and "\n" not in message
    assert not (tmp_path / "bench.json").exists()


@pytest.mark.parametrize("argv, match", [
    (["--window", "8", "0"], "argument --window: 0: use a whole number from 1 to 10,000"),
    (["--rnn-step", "no/such/step.tflite"], "no RNN step model"),
    (["--boards", "nano"], "unknown board 'nano'"),
])
def test_bad_options_are_one_line_errors_before_any_work(tmp_path, argv, match):
    with pytest.raises(EdgecapError, match=match) as e:
        benchmark.main([*argv, "--out", str(tmp_path / "bench")])
    assert "\n" not in str(e.value)


def test_sram_sensitivity_compares_both_splits_at_each_budget(monkeypatch):
    from pathlib import Path

    fixture = Path(__file__).parent / "data" / "compile" / "tiny_mobilenet.tflite"
    budgets = (0.01, 0.03, 1.0)  # MiB: the fixture holds about 70 kB of parameters
    rows = benchmark.sram_sensitivity([("tiny", fixture)], ["devboard-usb"], {"devboard-usb": 0.0},
                                      (8, 2), budgets)
    assert [r["sram_usable_mib"] for r in rows] == list(budgets)
    for r in rows:
        ours, equal = r["ours"]["bottleneck_ms"], r["equal_param"]["bottleneck_ms"]
        balanced = r["balanced_tpu"]["bottleneck_ms"]
        # Both baselines are among the partitions ours chooses among.
        assert ours <= equal * (1 + 1e-9) and ours <= balanced * (1 + 1e-9)
        assert r["ours_over_equal"] == pytest.approx(ours / equal, abs=1e-4)
        assert r["ours_over_balanced"] == pytest.approx(ours / balanced, abs=1e-4)
        assert r["balanced_tpu"]["devices"][-1] == "cpu" and r["balanced_tpu"]["cuts"][-2] == \
            r["balanced_tpu"]["cuts"][-1]  # no CNN op on the CPU
    # Less cache streams more: neither split gets faster as the budget shrinks.
    equal = [r["equal_param"]["bottleneck_ms"] for r in rows]
    assert equal == sorted(equal, reverse=True) and equal[0] > equal[-1]


def test_every_row_checks_the_search_against_brute_force_and_the_baselines(monkeypatch,
                                                                            shipped_bundle):
    # The benchmark on a fixture in place of the Keras models (which need
    # TensorFlow), on both boards: every row's search equals brute force over
    # cuts and TPU orders, and no baseline beats it.
    from pathlib import Path

    fixture = Path(__file__).parent / "data" / "compile" / "tiny_inception.tflite"
    monkeypatch.setattr(benchmark, "model_path", lambda name: fixture)
    monkeypatch.setattr(benchmark, "time_cli_compile", lambda model, board: [0.5])
    # One board of each kind: no bus, a bus over 2 TPUs, 4 TPUs (no brute force).
    boards = ["devboard-usb", "rpi4-2usb", "pc-4tpu-pcie"]
    assert set(boards) <= set(benchmark.BOARDS)
    doc = benchmark.benchmark(["tiny"], boards, shipped_bundle / "rnn_encoder_step_int8.tflite",
                              bundles=[shipped_bundle])
    assert [r["board"] for r in doc["rows"]] == boards
    # The demo's own encoder joins the schedules table, on each of those boards it runs.
    assert [(r["model"], r["board"]) for r in doc["bundle_rows"]] == [("demo (bundle)", b) for b in boards]
    for r in doc["rows"]:
        _check_pipeline_row(r)
    for r in [*doc["rows"], *doc["bundle_rows"]]:
        _check_schedules(r)
    text = benchmark.markdown(doc)
    assert "## Schedules" in text and "demo (bundle)" in text and "replicate-slowest" in text
    assert "balanced TPU-only" in text and "ours = optimum on every row brute force ran on" in text
    (goals,) = [line for line in text.splitlines() if line.startswith("Goals: ours = optimum")]
    assert "NOT met" not in goals.split("; ours <=")[0]


def _check_pipeline_row(r: dict) -> None:
    """The pipeline search's row: bit-exact segments, brute force where it ran, no pipeline baseline better."""
    assert r["bit_exact"] and r["tpus"] == r["board_tpus"]
    # Brute force up to 2 TPUs (the 4-TPU card's cut sets would take too long).
    assert (r["ours_is_optimal"] is None) == (r["tpus"] > benchmark.EXHAUSTIVE_TPUS)
    ours = r["ours"]["bottleneck_ms"]
    for baseline in ("ours_profile_order", "equal_param", "balanced_tpu", "one_tpu",
                     "ours_without_bus_under_bus"):
        assert ours <= r[baseline]["bottleneck_ms"] * (1 + 1e-9), baseline
    if r["exhaustive"] is not None:
        assert r["ours_is_optimal"]
        assert sorted(r["ours"]["devices"]) == sorted(r["exhaustive"]["devices"])
    # A board with a shared bus counts it in every bottleneck.
    assert bool(r["buses"]) == (r["board"] != "devboard-usb")
    assert r["ours"]["bottleneck_ms"] >= r["ours"]["bus_ms"]


def _check_schedules(r: dict) -> None:
    """The compiler's schedule (with the CPU's own work a frame) is no slower than the best
    pipeline or any of the four baselines priced the same way."""
    c = r["schedules"]
    ours = c["ours"]["bottleneck_ms"]
    for key in ("pipeline", *benchmark.BASELINES):
        assert c[key] is None or ours <= c[key]["bottleneck_ms"] * (1 + 1e-6), (r["model"], r["board"], key)
    assert c["ours_over_best_baseline"] <= 1 + 1e-6
    assert c["ours_without_cpu_frame"]["bottleneck_ms"] <= ours * (1 + 1e-6)
