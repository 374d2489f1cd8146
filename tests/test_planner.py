"""The planner: board="auto" picks the bundle's plan that fits the attached EdgeTPUs (fake device trees), the window filter, deadlines and the host rule."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import List

import numpy as np
import pytest

from edgecap import devices, faults, planner
from edgecap.failover import load_recovery
from edgecap.options import FIRST_INVOKE_GRACE, CaptionerOptions
from edgecap.plans.plan import ParamBytes
from edgecap.planner import choose, tpus_used
from edgecap.bundle import load_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.errors import EdgecapError
from edgecap_compile.compiler import compile_model

from test_devices import _fake_tree

PHANBELL = "Freescale i.MX8MQ Phanbell"
PI4 = "Raspberry Pi 4 Model B Rev 1.4"
CORAL_USB = ("18d1", "9302")


def choose_plan(bundle, hardware, on_missing_tpu="cpu"):
    """The planner's start-up choice for ``board="auto"`` on the given hardware."""
    return choose(bundle, CaptionerOptions(on_missing_tpu=on_missing_tpu), hardware)


def _compiled_plan(bundle: Path, board: str, tpus: int, compiled: bool = True) -> None:
    """Compiles the bundle's encoder into plans/<board> with ``tpus`` TPU stages.

    With ``compiled``, each TPU stage is marked as edgetpu_compiler's output
    (the segment itself stands in for the compiled file: there is no compiler here).
    """
    out = bundle / "plans" / board
    n = load_bundle(bundle).encoder_model.ops
    cuts = [round(n * (k + 1) / (tpus + 1)) for k in range(tpus)]
    ranges = list(zip([0, *cuts], [*cuts, n]))
    compile_model(bundle, board, out, tpus=tpus, ranges=ranges)
    if compiled:
        doc = json.loads((out / "plan.json").read_text())
        for stage in doc["stages"][:tpus]:
            stage["edgetpu"] = {"compiled": True, "compiled_segment": stage["segment"]}
        (out / "plan.json").write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def bundle_with_plans(shipped_bundle: Path, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("plans") / "bundle"
    shutil.copytree(shipped_bundle, root)
    _compiled_plan(root, "devboard-usb", 2)
    _compiled_plan(root, "devboard", 1)
    return root


def _hardware(tmp_path: Path, model, pci: int = 0, usb: int = 0) -> devices.Hardware:
    tree = _fake_tree(tmp_path / "root", {f"1-{i}": CORAL_USB for i in range(usb)},
                      {n: 40000 for n in range(pci)}, model)
    return devices.detect_hardware(tree)


@pytest.mark.parametrize("model,pci,usb,profile", [
    (PHANBELL, 1, 0, "devboard"),
    (PHANBELL, 1, 1, "devboard-usb"),
    ("Google i.MX8MQ Phanbell", 1, 1, "devboard-usb"),
    (PI4, 0, 2, "rpi4-2usb"),
    (PI4, 0, 0, None),
    (None, 0, 1, None),
])
def test_the_board_is_recognised_from_its_device_tree(tmp_path, model, pci, usb, profile):
    hw = _hardware(tmp_path, model, pci, usb)
    assert hw.profile == profile
    assert [t.kind for t in hw.tpus] == ["pci"] * pci + ["usb"] * usb


def test_the_plan_for_the_board_is_taken_when_its_tpus_are_there(bundle_with_plans, tmp_path):
    bundle = load_bundle(bundle_with_plans)
    assert sorted(bundle.plans) == ["devboard", "devboard-usb"]
    choice = choose_plan(bundle, _hardware(tmp_path, PHANBELL, pci=1, usb=1))
    assert (choice.board, choice.fallback, tpus_used(choice.plan)) == ("devboard-usb", None, 2)
    one = choose_plan(bundle, _hardware(tmp_path / "b", PHANBELL, pci=1))
    assert (one.board, one.fallback, tpus_used(one.plan)) == ("devboard", None, 1)


def test_fewer_tpus_than_planned_falls_back_to_the_best_plan_for_what_is_there(bundle_with_plans,
                                                                               tmp_path):
    bundle = load_bundle(bundle_with_plans)
    # A Dev Board whose USB Accelerator is unplugged: devboard-usb needs 2; devboard's plan fits.
    choice = choose_plan(bundle, _hardware(tmp_path, "Some i.MX8 board", pci=1))
    assert (choice.board, choice.fallback) == ("devboard", "fewer-tpus")
    assert "needs 2 EdgeTPU(s), 1 attached" in choice.reason and "\n" not in choice.reason
    # A Raspberry Pi with one USB Accelerator: devboard's plan names pci:0, which is not there.
    pi = choose_plan(bundle, _hardware(tmp_path / "pi", PI4, usb=1))
    assert (pi.board, pi.fallback, tpus_used(pi.plan)) == (None, "fewer-tpus", 0)
    assert "plan devboard: needs 1 PCIe EdgeTPU(s), 0 attached" in pi.reason


def test_no_tpu_runs_the_cpu_plan_or_fails_when_asked(bundle_with_plans, tmp_path):
    bundle = load_bundle(bundle_with_plans)
    hw = _hardware(tmp_path, PHANBELL)
    choice = choose_plan(bundle, hw)
    assert (choice.board, choice.fallback, tpus_used(choice.plan)) == (None, "no-tpu", 0)
    with pytest.raises(EdgecapError, match="set on_missing_tpu = \"cpu\"") as err:
        choose_plan(bundle, hw, on_missing_tpu="fail")
    assert "\n" not in str(err.value)


def test_uncompiled_and_foreign_plans_are_skipped_with_a_reason(bundle_copy, tmp_path):
    _compiled_plan(bundle_copy, "devboard", 1, compiled=False)
    choice = choose_plan(load_bundle(bundle_copy), _hardware(tmp_path, PHANBELL, pci=1))
    assert (choice.board, choice.fallback) == (None, "uncompiled")
    assert choice.skipped == (("devboard", "stage(s) 0 not compiled by edgetpu_compiler"),)
    doc = json.loads((bundle_copy / "plans" / "devboard" / "plan.json").read_text())
    doc["model"]["sha256"] = "0" * 64
    (bundle_copy / "plans" / "devboard" / "plan.json").write_text(json.dumps(doc))
    choice = choose_plan(load_bundle(bundle_copy), _hardware(tmp_path / "b", PHANBELL, pci=1))
    assert choice.skipped == (("devboard", "compiled from another encoder"),)


def test_a_bundle_without_plans_on_a_host_runs_on_the_cpu_quietly(shipped_bundle, tmp_path):
    choice = choose_plan(load_bundle(shipped_bundle), _hardware(tmp_path, None))
    assert (choice.board, choice.fallback, tpus_used(choice.plan)) == (None, None, 0)


def test_auto_on_this_host_warns_once_and_captions_on_the_cpu(bundle_with_plans, caplog):
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        with EdgeCaptioner(bundle_with_plans, num_threads=1) as cap:
            assert cap.choice.fallback == "no-tpu"
            assert [s.device for s in cap.plan.active_stages] == ["cpu"]
    assert len([r for r in caplog.records if "no EdgeTPU" in r.getMessage()]) == 1


def auto_on_a_dev_board_captions_on_the_cpu(bundle: Path, tmp_path: Path, monkeypatch, caplog) -> List[str]:
    """Runs auto on a fake Dev Board whose TPU will not open; asserts it captions on the CPU.

    Returns:
      The warning lines logged.
    """
    hw = _hardware(tmp_path, PHANBELL, pci=1)
    monkeypatch.setattr(devices, "detect_hardware", lambda root="/": hw)
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        with EdgeCaptioner(bundle, num_threads=1) as cap:
            assert cap.choice.fallback == "tpu-open-failed"
            assert [s.device for s in cap.plan.active_stages] == ["cpu"]
            assert len(cap.caption_frames(np.zeros((8, 64, 64, 3), np.uint8))) == 1
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_tpu_that_will_not_open_falls_back_to_the_cpu(bundle_with_plans, tmp_path, monkeypatch, caplog):
    # auto found a Dev Board's TPU, but libedgetpu is not installed: captions, on the CPU.
    warnings = auto_on_a_dev_board_captions_on_the_cpu(bundle_with_plans, tmp_path, monkeypatch, caplog)
    assert any("libedgetpu" in w for w in warnings)
    with pytest.raises(EdgecapError, match="libedgetpu"):
        EdgeCaptioner(bundle_with_plans, num_threads=1, on_missing_tpu="fail")


def test_a_bundled_plan_made_for_another_window_is_skipped_with_one_warning(bundle_with_plans, tmp_path,
                                                                          caplog):
    # The bundle's plans charge their CPU stage 8/8 = 1 RNN step a frame; stride 4 takes 2.
    bundle = load_bundle(bundle_with_plans)
    hw = _hardware(tmp_path, PHANBELL, pci=1, usb=1)
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        choice = choose(bundle, CaptionerOptions(stride=4, num_threads=1), hw)
    assert (choice.board, choice.fallback, tpus_used(choice.plan)) == (None, "other-window", 0)
    assert {b for b, why in choice.skipped if "RNN steps a frame" in why} == {"devboard", "devboard-usb"}
    assert len([r for r in caplog.records if "RNN steps a frame" in r.getMessage()]) == 1
    same = choose(bundle, CaptionerOptions(num_threads=1), hw)  # the window it was made for
    assert (same.board, same.fallback) == ("devboard-usb", None)


def test_after_a_failure_only_plans_for_the_running_window_are_candidates(bundle_with_plans):
    bundle = load_bundle(bundle_with_plans)
    ours = planner.bundle_plans(bundle, bundle.window, "devboard-usb")
    assert [b for b, _ in ours.usable] == ["devboard-usb"]
    other = planner.bundle_plans(bundle, dataclasses.replace(bundle.window, stride=2), "devboard-usb")
    assert other.usable == () and "RNN steps a frame" in other.skipped[0][1]


@pytest.mark.parametrize("predicted_ms, floor, factor, deadline", [
    (0.3, 0.5, 20.0, 0.5),        # the floor: what a loaded host may add
    (100.0, 0.5, 20.0, 2.0),      # 20 x 100 ms
    (100.0, 0.5, 3.0, 0.5),
    (None, 0.5, 20.0, planner.UNPREDICTED_DEADLINE_S),
])
def test_one_deadline_policy_for_every_tpu_stage(predicted_ms, floor, factor, deadline):
    stage = type("S", (), {"predicted_ms": predicted_ms, "param_bytes": ParamBytes(on_chip=2**20)})()
    options = CaptionerOptions(deadline_floor_s=floor, deadline_factor=factor)
    got = planner.deadlines(stage, devices.parse_device("emu-tpu:0"), options)
    # The first invoke: plus its predicted load (test_deadlines), or the grace where nothing is predicted.
    first = deadline * FIRST_INVOKE_GRACE if predicted_ms is None else (
        deadline + load_recovery().first_invoke.load_s(2**20))
    assert got == pytest.approx((deadline, first))
    assert planner.deadlines(stage, devices.parse_device("cpu:1"), options) == (None, None)


def test_the_captioners_stages_carry_the_planners_deadlines_and_isolation(shipped_bundle, two_tpu_board):
    with EdgeCaptioner(shipped_bundle, board=two_tpu_board, num_threads=1,
                       deadline_factor=4.0, deadline_floor_s=0.01) as cap:
        runs = {str(r.worker): r for r in cap.choice.stages}
        watched = {s.worker: (s.deadline_s, s.first_deadline_s) for s in cap._supervisor.pipeline._steps
                   if s.deadline_s is not None}
    tpu = runs["emu-tpu:0"]
    assert tpu.deadline_s == pytest.approx(max(0.01, 4.0 * tpu.stage.predicted_ms / 1e3))
    assert watched["emu-tpu:0"] == (tpu.deadline_s, tpu.first_deadline_s)
    assert runs["cpu"].deadline_s is None and "cpu" not in watched
    assert not any(r.isolate for r in runs.values())  # emulated TPUs run in-process by default


def test_a_pending_crash_fault_isolates_that_device_only(shipped_bundle, two_tpu_board):
    faults.inject("emu-tpu:1=segv@3")
    try:
        choice = choose(load_bundle(shipped_bundle), CaptionerOptions(board=two_tpu_board, num_threads=1))
    finally:
        faults.inject("")
    assert {str(r.worker): r.isolate for r in choice.stages} == {"emu-tpu:0": False, "emu-tpu:1": True,
                                                                 "cpu": False}


@pytest.mark.parametrize("cnn_ms, rnn_ms, cores, kind, threads, worker, pipelined, batch", [
    (200.0, 5.0, 2, "threads", 2, "cpu", True, 1),      # a big CNN: every core to it
    (2.0, 1.5, 2, "pipeline", 1, "cpu:1", True, 1),     # RNN 1.5 > t / (C - 1) = 1: overlap them
    (2.0, 0.9, 2, "threads", 2, "cpu", True, 1),        # r < t / (C - 1)
    (12.0, 1.1, 4, "pipeline", 3, "cpu:1", True, 1),    # r > t / (C - 1) = 1.0
    (12.0, 0.9, 4, "threads", 4, "cpu", True, 1),
    (0.6, 0.15, 2, "overlap", 1, "cpu", True, 2),       # sub-millisecond CNN: one kernel thread,
    (0.09, 0.01, 2, "overlap", 1, "cpu", True, 10),     # decoding beside it, 1 ms of work a hand-off
    (0.01, 0.0, 2, "overlap", 1, "cpu", True, 16),      # at most HOST_BATCH_MAX frames
    (5.0, 5.0, 1, "sequential", 1, "cpu", False, 1),    # one core: nothing to overlap onto
    (0.2, 0.02, 1, "sequential", 1, "cpu", False, 1),
])
def test_the_host_rule(cnn_ms, rnn_ms, cores, kind, threads, worker, pipelined, batch):
    got = planner.host_schedule(cnn_ms, rnn_ms, cores)
    assert ((got.kind, got.num_threads, str(got.cnn_worker), got.pipelined, got.batch)
            == (kind, threads, worker, pipelined, batch))
    assert got.reason and got.cores == cores


@pytest.mark.parametrize("taken, threads, expected", [
    (0.0, 2, 2), (0.5, 2, 2),      # a core half taken: within the margin, it keeps its threads
    (0.67, 2, 1),                  # another process's thread beside two kernel threads: down to one
    (1.0, 1, 1), (1.8, 1, 1),      # never below one
    (0.5, 1, 1), (0.3, 1, 2),      # the second core free again: back to both
])
def test_the_host_rule_re_checks_a_cnn_on_every_core_against_the_cores_others_take(taken, threads, expected):
    schedule = planner.host_schedule(100.0, 2.0, 2)
    assert planner.host_threads(schedule, taken, threads) == expected
    # The other kinds keep their threads whatever the load.
    for kind in (planner.host_schedule(0.1, 0.01, 2), planner.host_schedule(2.0, 1.5, 2)):
        assert planner.host_threads(kind, taken, kind.num_threads) == kind.num_threads


def test_a_cpu_only_captioner_runs_the_host_rule_unless_told_otherwise(shipped_bundle, monkeypatch):
    monkeypatch.setattr(devices, "cpu_cores", lambda: 2)
    monkeypatch.setattr(planner, "measure_host", lambda bundle, plan, window, float_rnn: (2.0, 1.5))
    with EdgeCaptioner(shipped_bundle) as cap:  # auto on this host: the CPU plan
        assert (cap.choice.host.kind, cap.devices, cap.choice.pipelined) == ("pipeline", {"cpu": "cpu:1"}, True)
        assert cap.choice.stages[0].threads == 1 and cap.choice.preprocess_worker == "feeder"
        assert len(cap.caption_frames(np.zeros((8, 64, 64, 3), np.uint8))) == 1
    monkeypatch.setattr(planner, "measure_host", lambda bundle, plan, window, float_rnn: (0.2, 0.02))
    with EdgeCaptioner(shipped_bundle) as cap:
        assert (cap.choice.host.kind, cap.devices, cap.choice.pipelined) == ("overlap", {"cpu": "cpu"}, True)
        assert (cap.choice.preprocess_worker, cap.choice.batch, cap.choice.decode_threads) == ("feeder", 5, 1)
        assert len(cap.caption_frames(np.zeros((8, 64, 64, 3), np.uint8))) == 1
    monkeypatch.setattr(devices, "cpu_cores", lambda: 1)
    with EdgeCaptioner(shipped_bundle) as cap:  # one core: everything in one thread, nothing read ahead
        assert (cap.choice.host.kind, cap.choice.pipelined, cap.choice.preprocess_worker) == (
            "sequential", False, planner.PREPROCESS_WORKER)
        assert len(cap.caption_frames(np.zeros((8, 64, 64, 3), np.uint8))) == 1
    with EdgeCaptioner(shipped_bundle, num_threads=2) as cap:  # the caller decided
        assert cap.choice.host is None and cap.devices == {"cpu": "cpu"} and cap.choice.pipelined
        assert cap.choice.preprocess_worker == planner.PREPROCESS_WORKER and cap.choice.batch == 1


def test_the_board_filter_keeps_each_boards_plans_whatever_their_order(bundle_with_plans):
    bundle = load_bundle(bundle_with_plans)
    for board in bundle.plans:
        found = planner.bundle_plans(bundle, bundle.window, board)
        assert [b for b, _ in found.usable] == [board]


def test_among_plans_with_as_many_tpus_the_fastest_bottleneck_wins(bundle_with_plans, tmp_path):
    bundle = load_bundle(bundle_with_plans)
    (_, plan), = planner.bundle_plans(bundle, bundle.window, "devboard").usable
    slow = dataclasses.replace(plan, predicted=dataclasses.replace(plan.predicted,
                                                                  bottleneck_ms=plan.predicted.bottleneck_ms * 3))
    assert planner._rank(plan) > planner._rank(slow)
    assert max([slow, plan, slow], key=planner._rank) is plan


def test_a_plan_with_more_tpu_stages_than_attached_tpus_is_emulated(shipped_bundle, two_tpu_board, monkeypatch):
    from edgecap.devices import DeviceInfo

    one = [DeviceInfo("cpu", "cpu", "", ""), DeviceInfo("tpu:0", "pci", "/dev/apex_0", "")]
    monkeypatch.setattr(devices, "list_devices", lambda root="/": one)
    choice = choose(load_bundle(shipped_bundle), CaptionerOptions(board=two_tpu_board, num_threads=1))
    assert choice.emulated and [str(d) for d in choice.tpus] == ["emu-tpu:0", "emu-tpu:1"]


def test_after_a_failure_the_compiler_replans_for_the_tpus_left(shipped_bundle, two_tpu_board):
    bundle = load_bundle(shipped_bundle)
    options = CaptionerOptions(board=two_tpu_board, num_threads=1)
    start = choose(bundle, options)
    tpus = planner.board_tpus(start)
    first, second = tpus
    one_left = planner.choose_after(bundle, options, start, [first], tpus, planner.BundlePlans())
    assert (one_left.how, tpus_used(one_left.plan), one_left.tpus) == ("compiler", 1, [second])
    none_left = planner.choose_after(bundle, options, start, tpus, tpus, planner.BundlePlans())
    assert (none_left.how, tpus_used(none_left.plan), none_left.tpus) == ("compiler", 0, [])
    assert planner.choose_after(bundle, options, start, [], tpus, planner.BundlePlans()).how == "original"


def test_the_host_rules_reason_gives_both_schedules_times():
    assert "threads 102.50 ms, pipeline 200.00 ms a frame" in planner.host_schedule(200.0, 2.5, 2).reason


def test_a_plan_must_be_the_bundles_encoders(shipped_bundle, tmp_path):
    from runtime_plans import write_plan

    from edgecap.errors import PlanError
    from edgecap.plans.plan import single_cpu_plan

    bundle = load_bundle(shipped_bundle)
    tiny = Path(__file__).resolve().parent / "data" / "runtime" / "tiny_encoder.tflite"
    write_plan(tiny, [1], ["tpu:0", "cpu"], tmp_path / "tiny", [1.0, 1.0])
    with pytest.raises(PlanError, match="but the bundle's encoder takes"):
        choose(bundle, CaptionerOptions(plan=tmp_path / "tiny", num_threads=1))
    ours = single_cpu_plan(bundle.encoder_model)
    with pytest.raises(PlanError, match="compiled from another model"):
        choose(bundle, CaptionerOptions(plan=dataclasses.replace(ours, model_sha256="0" * 64), num_threads=1))
    assert choose(bundle, CaptionerOptions(plan=ours, num_threads=1)).how == "plan"
