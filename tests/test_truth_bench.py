"""The oracle (the best plan under an emulated board's true costs) and ``edgecap bench --adapt``."""

from __future__ import annotations

import json

import pytest

from edgecap import emulation
from edgecap.plans.compiler import plan_for_board
from edgecap_lab import truth_bench
from edgecap.bundle import load_bundle
from edgecap.devices import parse_device
from tests.pipeline_boards import pipeline_board


@pytest.fixture(scope="module")
def bundle(shipped_bundle):
    return load_bundle(shipped_bundle)


@pytest.fixture(scope="module")
def profiled(bundle):
    return plan_for_board(bundle, pipeline_board("devboard-usb"))


def test_the_oracle_of_the_profile_is_the_planners_plan(bundle, profiled):
    best = truth_bench.oracle(bundle, pipeline_board("devboard-usb"), emulation.Truth(), profiled)
    assert best.fps == profiled.predicted.fps
    assert [(s.device, s.ops) for s in best.plan.stages] == [(s.device, s.ops) for s in profiled.stages]


def test_the_oracle_moves_work_off_a_slowed_tpu(bundle, profiled):
    # The demo's plan runs the encoder's TPU part on pci:0; at half speed the USB accelerator is better.
    slow = profiled.active_stages[0].device
    best = truth_bench.oracle(bundle, pipeline_board("devboard-usb"), emulation.parse("emu-tpu:0=speed:0.5"), profiled)
    assert best.fps < profiled.predicted.fps
    assert best.plan.active_stages[0].device != slow
    assert best.board.tpus[0].macs_per_s == pytest.approx(0.5 * 583e9)
    assert best.board.tpus[0].invoke_overhead_ms == pytest.approx(2 * 1.36)


def test_the_oracle_counts_a_throttling_tpu_at_its_throttled_speed(bundle, profiled):
    throttled = truth_bench.oracle(bundle, pipeline_board("devboard-usb"), emulation.parse("pci:0=throttle:60s"), profiled)
    halved = truth_bench.oracle(bundle, pipeline_board("devboard-usb"), emulation.parse("pci:0=speed:0.5"), profiled)
    assert throttled.fps == halved.fps


def test_a_usb2_link_sets_the_tpus_link_rate_and_keeps_its_name():
    board = truth_bench.true_board(pipeline_board("devboard-usb"), emulation.parse("usb:0=link:usb2"))
    assert board.tpus[1].link_bytes_per_s == 37e6 and board.tpus[1].link == "usb3"


def test_the_oracle_refuses_a_tpu_the_board_lacks(bundle, profiled):
    from edgecap.errors import ConfigError

    with pytest.raises(ConfigError, match=r"usb:3 is no EdgeTPU of board devboard-usb \(its TPUs: pci:0, usb:0\)"):
        truth_bench.oracle(bundle, pipeline_board("devboard-usb"), emulation.parse("usb:3=speed:0.5"), profiled)


@pytest.mark.parametrize("spec", ["pci:0=speed:0.5", "emu-tpu:0=link:usb2;cpu=speed:0.5", "usb:0=speed:0.3"])
def test_pacing_charges_each_stage_what_the_true_board_predicts_for_it(bundle, profiled, tmp_path, spec):
    # The oracle and the emulated devices price one truth alike: the profiled
    # plan's cuts, compiled for the true board, predict each stage's paced time.
    import edgecap_compile

    truth = emulation.resolve(emulation.parse(spec), profiled)
    real = truth_bench.true_board(pipeline_board("devboard-usb"), truth)
    by_name = {name: i for i, name in enumerate(edgecap_compile.plan.plan_devices(real))}
    ranges = [None] * len(profiled.stages)
    for s in profiled.stages:
        ranges[by_name[s.device] if s.spec.kind == "tpu" else len(real.tpus)] = s.ops
    again = edgecap_compile.compile_model(bundle, real, tmp_path, ranges=ranges).plan
    with emulation.emulating(truth):
        for stage in profiled.active_stages:
            if stage.spec.kind != "tpu":
                continue
            paced = emulation.pace(stage, parse_device("emu-tpu:0"), stage.predicted_ms)
            want = next(s for s in again.stages if s.device == stage.device).predicted_ms
            # No pace: the truth leaves the stage as profiled (usb:0's truth, the demo's plan idles usb:0).
            ms = stage.predicted_ms if paced is None else (paced.deadline(100.0) - 100.0) * 1e3
            assert ms == pytest.approx(want, rel=1e-4, abs=2e-6), stage.device


def test_fps_timeline_and_seconds_to_95():
    times = [i * 0.01 for i in range(1, 101)] + [1.0 + i * 0.005 for i in range(1, 401)]  # 100 fps, then 200
    points = truth_bench.timeline(times, 3.0)
    assert points[0] == (1.0, 100.0) and dict(points)[3.0] == 200.0
    assert truth_bench.seconds_to(points, 0.95 * 200) == 2.0  # the first window wholly at 200 fps
    assert truth_bench.seconds_to(points, 250) is None
    assert truth_bench.seconds_to([(1.0, 200.0), (1.25, 100.0), (1.5, 200.0)], 190) == 1.5  # must stay


def test_the_truth_table_has_eight_truths_each_valid(bundle):
    for board in ("devboard-usb", "rpi4-2usb"):
        rows = truth_bench.truth_table(board)
        assert len(rows) >= 8 and rows[0][0] == ""  # the profile itself, then each way it differs
        for spec, what in rows:
            emulation.parse(spec) and what


def test_bench_adapt_writes_the_adapt_keys(shipped_bundle, tmp_path, capsys):
    from edgecap.cli import main

    out = tmp_path / "adapt.json"
    code = main(["bench", "--bundle", str(shipped_bundle), "--adapt", "--truth", "emu-tpu:0=speed:0.5",
                 "--seconds", "2", "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    adapt = doc["adapt"]
    assert {"truth", "oracle_fps", "start_fps", "final_fps", "seconds_to_95", "switches",
            "fps_timeline"} <= set(adapt)
    assert adapt["truth"] == "emu-tpu:0=speed:0.5" and adapt["resolved"] == "pci:0=speed:0.5"
    assert adapt["figures"] == "modelled"
    # The closed loop (edgecap.adapt) may have switched within the 2 s: then to a plan better under the truth.
    assert adapt["switches"] == 0 or adapt["final_plan_fps"] > 1.05 * adapt["start_bound_fps"]
    assert (adapt["final_plan_since_s"] == 0) == (adapt["switches"] == 0) and adapt["final_plan_since_s"] < 2.5
    assert 0 < adapt["oracle_fps"] < adapt["plan_fps"]  # the truth is slower than the profile
    # The start plan (the CNN copied on both TPUs and the CPU) with pci:0 at half speed: its fps
    # can be no more than its price under the truth allows (the host may keep the pace or fall
    # short of it, never beat it).
    assert 0 < adapt["start_fps"] <= 1.02 * adapt["start_bound_fps"]
    assert [t for t, _ in adapt["fps_timeline"]][:2] == [1.0, 1.25]
    assert "| `emu-tpu:0=speed:0.5` |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--truth", "cpu=speed:2"], "--truth and --truth-table are options of --adapt; add --adapt"),
    (["--adapt"], "pass --truth SPEC or --truth-table"),
    (["--adapt", "--truth", "cpu=speed:2", "--truth-table"], "pass --truth SPEC or --truth-table"),
    (["--adapt", "--truth", "cpu=link:usb2"], "--truth: 'cpu=link:usb2' gives the CPU a link"),
    (["--adapt", "--truth", "emu-tpu:5=speed:2"], "--truth: emu-tpu:5 is no EdgeTPU of this run"),
    (["--adapt", "--truth-table", "--board", "host"], "truths.json has no truths for board 'host'"),
    (["--adapt", "--truth", "", "--board", "devboard,devboard-usb"], "--adapt emulates one board"),
    (["--adapt", "--truth", "", "--seconds", "0"], "--seconds"),
])
def test_bench_adapt_refuses_bad_options_in_one_line(shipped_bundle, capsys, argv, message):
    from edgecap.cli import main

    code = main(["bench", "--bundle", str(shipped_bundle), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err


def test_the_start_plans_fps_under_a_truth_is_its_slowest_stage_repriced(profiled):
    assert emulation.steady_fps(profiled, emulation.Truth()) == pytest.approx(profiled.predicted.fps, rel=1e-3)
    tpu = profiled.active_stages[0]
    slowed = emulation.steady_fps(profiled, emulation.parse(f"{tpu.device}=speed:0.5,throttle:9s"))
    c = tpu.cost
    want_ms = (c.compute_ms + c.invoke_ms) / 0.25 + c.link_ms  # half speed, throttled to half again
    assert slowed == pytest.approx(1e3 / want_ms, rel=1e-4)
    cpu = emulation.steady_fps(profiled, emulation.parse("cpu=speed:0.25"))
    assert cpu == pytest.approx(1e3 / (4 * profiled.stages[-1].predicted_ms), rel=1e-4)


def test_an_oversubscribed_bus_caps_the_start_plans_fps(profiled):
    import dataclasses

    from edgecap.plans.plan import Bus

    tpu = profiled.active_stages[0]
    on_bus = dataclasses.replace(tpu, cost=dataclasses.replace(tpu.cost, bus="lane"))
    plan = dataclasses.replace(profiled, buses=(Bus("lane", 1e6),),
                               stages=tuple(on_bus if s is tpu else s for s in profiled.stages))
    assert emulation.steady_fps(plan, emulation.Truth()) == pytest.approx(1e6 / tpu.cost.link_bytes, rel=1e-6)
