"""`edgecap bench` and planning on the fly for a named board."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_noise_clip
from edgecap_lab.bench import _bound_fps, bench_overhead, run_bench
from edgecap.bundle import WindowSpec, load_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.cli import main
from edgecap.errors import ConfigError
from edgecap.plans.compiler import plan_for_board


@pytest.fixture(autouse=True)
def plan_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg"))


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return write_noise_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", 24, 80)


def test_bench_prints_the_table_and_writes_json_and_plots(clip, shipped_bundle, tmp_path, capsys):
    out = tmp_path / "bench.json"
    png = tmp_path / "bench.png"
    code = main(["bench", "--bundle", str(shipped_bundle), "--clips", str(clip), "--frames", "48",
                 "--host-seconds", "1", "--json", str(out), "--plot", str(png)])
    assert code == 0
    table = capsys.readouterr().out
    assert "== devboard-usb (emulated)" in table and "== host (measured)" in table
    assert "scheduler overhead" in table and "sequential vs pipelined" in table
    assert "paper" in table and "54.9x" in table and "goals, devboard-usb" in table
    result = json.loads(out.read_text())
    assert [x["invokes"] for x in result["host_scaling"]] == [1, 4, 16]
    assert [p["fps"] for p in result["published"]] == [59.0]
    rows = {(r["profile"], r["schedule"]): r for r in result["rows"]}
    assert all(r["same_captions"] for r in result["rows"] if "timing-only" not in r["schedule"])
    _check_board_rows(rows, "devboard-usb (emulated)")
    _check_host_rows(rows, result)
    for path in (png, tmp_path / "bench-timeline.png"):
        assert path.stat().st_size > 1000


def _check_board_rows(rows, board):
    """The emulated board's rows: every schedule, the CPU path's features, placements and the modelled bound."""
    assert {s for p, s in rows if p == board} == {"a", "b", "e", "c", "d", "d timing-only"}
    assert rows[(board, "a")]["speedup"] == 1.0
    ours = [r for (p, _), r in rows.items() if p == board]
    # Every board row's segments were chained on the CPU and gave its features bit for bit.
    assert all(r["same_features"] for r in ours)
    # The equal-parameter split leaves the CPU only the RNN: its CNN is all on the TPUs.
    assert set(rows[(board, "e")]["placement"]) == {"pci:0", "usb:0"}
    placement = rows[(board, "d")]["placement"]
    # The devboard-usb plan names its TPUs by bus (pci:0 on PCIe, usb:0 on USB), one emulated
    # TPU each (the demo's CNN runs as copies on both).
    assert placement["pci:0"] == "emu-tpu:0" and placement.get("usb:0", "emu-tpu:1") == "emu-tpu:1"
    # Emulation paces to the board's predictions: never faster than the bound, which is the
    # pricing function's for the plan that runs (copies included).
    for r in ours:
        assert 0 < r["fps"] <= r["bound_fps"] * 1.01
        assert 0 < r["of_bound"] <= 1.01
    # The pipeline on the emulated board beats the sequential CPU by a wide margin.
    assert rows[(board, "d")]["speedup"] > 2


def _check_host_rows(rows, result):
    """The host: edgecap caption against plain loops written without its scheduler, on the host's plan."""
    assert {s for p, s in rows if p == "host"} == {"plain 1 thread", "plain all cores", "plain 2 threads",
                                                   "edgecap caption"}
    assert result["host_bench"]["choice"]["kind"] == result["host_choice"]["kind"] == "overlap"
    # edgecap caption on a host runs the CPU plan (no TPU), not the board's.
    assert rows[("host", "edgecap caption")]["plan_board"] == "host"


@pytest.mark.parametrize("stride, sequential_ms, pipelined_ms", [
    # pci:0 2.0 ms, cpu 1.0 ms and the RNN step 0.5 ms; 8-frame windows:
    # the runtime steps the RNN 8 / stride times a frame, and the plan made for that window charges it so.
    (8, 2.0 + 1.5, 2.0),
    (4, 2.0 + 1.0 + 2 * 0.5, 2.0),
    (2, 2.0 + 1.0 + 4 * 0.5, 1.0 + 4 * 0.5),
    (16, 2.0 + 1.0 + 0.5 * 0.5, 2.0),
])
def test_bound_charges_the_rnn_step_once_per_open_window(shipped_bundle, stride, sequential_ms,
                                                         pipelined_ms):
    window = WindowSpec(frames=8, stride=stride, sample_fps=0)
    plan = plan_for_board(load_bundle(shipped_bundle), "devboard-usb", tpus=1, window=window, replicas=False)
    assert [s.device for s in plan.stages] == ["pci:0", "cpu"]
    assert plan.rnn_steps_per_frame == 8 / stride
    # The bound is the pricing function's: times as the stages predict them, no CPU work besides.
    times = {"pci:0": 2.0, "cpu": 1.0 + 0.5 * plan.rnn_steps_per_frame}
    plan = dataclasses.replace(plan, rnn_ms=0.5, cpu_frame=None, stages=tuple(
        dataclasses.replace(s, predicted_ms=times[s.device], cost=None) for s in plan.stages))
    assert _bound_fps(plan, False) == pytest.approx(1000 / sequential_ms)
    assert _bound_fps(plan, True) == pytest.approx(1000 / pipelined_ms)


def test_rows_that_ran_fewer_frames_compare_the_windows_both_captioned():
    from edgecap_lab.bench import _same_windows

    # A row whose bound is slow runs fewer frames (row_seconds): its windows are the others' first ones.
    assert _same_windows([[1, 2], [3]], [[1, 2], [3], [4]]) and _same_windows([[1, 2], [3], [4]], [[1, 2], [3]])
    assert not _same_windows([[1, 2], [5]], [[1, 2], [3], [4]])
    assert not _same_windows([], [[1]])


def test_the_bound_under_an_emulated_truth_is_where_the_plan_settles(shipped_bundle, monkeypatch):
    from edgecap import emulation

    plan = plan_for_board(load_bundle(shipped_bundle), "devboard-usb")
    assert any(s.replicas for s in plan.active_stages)  # the demo's CNN as copies
    as_profiled = _bound_fps(plan, True)
    monkeypatch.setenv(emulation.ENV, "pci:0=speed:0.2;usb:0=speed:0.2;cpu=speed:0.2")
    assert _bound_fps(plan, True) == pytest.approx(emulation.steady_fps(plan, emulation.current()))
    assert _bound_fps(plan, True) == pytest.approx(as_profiled * 0.2)  # every device 5x slower


@pytest.mark.slow
def test_fraction_of_the_bound_holds_at_every_stride(shipped_bundle):
    # Measured, so slow (timings on a shared host are noisy): each schedule's
    # fraction of its bound at strides 4 and 2 stays within 10% of stride 8's,
    # ratios from one run. The bound that charged the RNN step once a frame put
    # the CPU-only schedule at 0.85x and the one-TPU schedule at 0.65x of that.
    result = run_bench(shipped_bundle, frames=240, profiles=["board"], timing_only=True,
                       strides=[8, 4, 2])
    fractions = {(r.stride, r.schedule): r.of_bound for r in result.rows}
    assert set(fractions) == {(s, x) for s in (8, 4, 2) for x in "abcde"}
    for (stride, schedule), fraction in fractions.items():
        assert fraction <= 1.02, (stride, schedule, fraction)
        assert fraction >= 0.9 * fractions[(8, schedule)], (stride, schedule, fraction)


def test_null_stage_overhead_is_measured():
    o = bench_overhead(stages=2, frames=500)
    assert 0 < o.wall_ms_per_frame_stage < 5 and 0 < o.inline_wall_ms_per_frame_stage < 5
    assert o.cpu_ms_per_frame_stage > 0


def test_board_name_plans_on_the_fly_with_emulated_tpus(shipped_bundle):
    with EdgeCaptioner(shipped_bundle, board="devboard-usb") as cap:
        assert cap.plan.board == "devboard-usb"
        # The demo runs copies of its CNN: on both TPUs, and the CPU takes whole frames on a worker of its own.
        assert set(cap.devices.values()) <= {"emu-tpu:0", "emu-tpu:1", "cpu", "cpu:1"}
        assert "emu-tpu:0" in cap.devices.values()


def test_unknown_board_is_a_one_line_error(shipped_bundle, capsys):
    code = main(["bench", "--bundle", str(shipped_bundle), "--board", "nosuchboard", "--profiles", "board"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "nosuchboard" in err[0]


@pytest.mark.parametrize("option,value", [("--threads", "-1"), ("--threads", "0"), ("--frames", "0")])
def test_out_of_range_counts_are_one_line_errors(shipped_bundle, capsys, option, value):
    code = main(["bench", "--bundle", str(shipped_bundle), option, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"argument {option}: {value}: use a whole number from 1 to" in err[0]
    # The library checks them too, for callers other than the command line.
    counts = {"frames": 480, "threads": 1, option[2:]: int(value)}
    with pytest.raises(ConfigError, match=f"{option} {value}: use 1 or more"):
        run_bench(shipped_bundle, None, counts["frames"], "devboard-usb", ["board"], False,
                  counts["threads"], 8, None, None)


def test_the_runtime_never_imports_the_compiler(shipped_bundle):
    code = (
        "import sys, numpy as np\n"
        "from edgecap.captioner import EdgeCaptioner\n"
        "import edgecap.scheduler, edgecap.devices, edgecap.plans.plan, edgecap.trace\n"
        f"with EdgeCaptioner({str(shipped_bundle)!r}) as cap:\n"
        "    cap.caption_frames(np.zeros((8, 32, 32, 3), np.uint8))\n"
        "assert 'edgecap_compile' not in sys.modules, 'compiler imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
