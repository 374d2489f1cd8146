"""The hidden truth (``$EDGECAP_EMULATE``): its grammar, and emulated stages paced by it.

Paced stages here are timing-only (no segment is run), so an invoke's time is
its pace plus the host's wake-up: each floor is exact (pacing guarantees it),
each ceiling generous, for a loaded 2-core CI machine.
"""

from __future__ import annotations

import threading
import time

import pytest

from edgecap import emulation
from edgecap.devices import parse_device
from edgecap.errors import ConfigError
from edgecap.plans.plan import Bus, CostParts, Stage
from edgecap.stages import open_stage

# What a loaded host may add to one paced invoke (a wake-up late, a thread descheduled).
LATE_S = 0.1
FLOOR = 0.98  # a floor misses by the clock's rounding at most


def _stage(device: str = "pci:0", predicted_ms: float = 10.0, cost: "CostParts | None" = None) -> Stage:
    return Stage(index=0, spec=parse_device(device), segment=None, ops=(0, 1), inputs=(), outputs=(),
                 predicted_ms=predicted_ms, cost=cost)


def _seconds(runner, n: int = 3) -> float:
    """Mean seconds of ``n`` invokes."""
    t0 = time.perf_counter()
    for _ in range(n):
        runner({})
    return (time.perf_counter() - t0) / n


def _open(stage: Stage, worker: str, bus: "Bus | None" = None):
    return open_stage(stage, worker, timing_only=True, pace_ms=stage.predicted_ms, bus=bus)


# ------------------------------------------------------------------ the grammar


def test_the_issues_example_parses_device_by_device():
    truth = emulation.parse("emu-tpu:1=speed:0.5;emu-tpu:0=link:usb2;emu-tpu:0=throttle:60s")
    assert truth.get("emu-tpu:1") == emulation.DeviceTruth(speed=0.5)
    assert truth.get("emu-tpu:0") == emulation.DeviceTruth(link="usb2", throttle_after_s=60.0)
    assert truth.get("emu-tpu:2") is None
    assert emulation.parse(str(truth)) == truth  # the canonical spec reads back the same


def test_devices_are_named_as_plans_and_workers_name_them():
    truth = emulation.parse(" EMU-TPU:01 = speed:2 ; usb:0=link:usb3,speed:0.25 ; cpu=speed:0.8 ;")
    assert truth.get("emu-tpu:1").speed == 2.0
    assert truth.get("usb:0") == emulation.DeviceTruth(speed=0.25, link="usb3")
    assert truth.get("cpu").speed == 0.8
    assert not emulation.parse("")
    assert emulation.DeviceTruth(link="usb2").link_bytes_per_s == 37e6  # edgecap/data/links.json


def test_a_throttled_device_halves_its_speed_from_its_time_on():
    truth = emulation.parse("pci:0=speed:0.8,throttle:1.5").get("pci:0")
    assert truth.speed_at(1.49) == 0.8 and truth.speed_at(1.5) == 0.4 and truth.steady_speed == 0.4


@pytest.mark.parametrize("text, part, why", [
    ("emu-tpu:1", "emu-tpu:1", "is not DEVICE=KEY:VALUE"),
    ("emu-tpu:1=", "emu-tpu:1=", "is not DEVICE=KEY:VALUE"),
    ("gpu:0=speed:2", "gpu:0=speed:2", "names no device"),
    ("usb=speed:2", "usb=speed:2", "names no single EdgeTPU"),
    ("emu-tpu:0=speed:0", "speed:0", "no speed factor in [0.01, 100]"),
    ("emu-tpu:0=speed:nan", "speed:nan", "no speed factor"),
    ("emu-tpu:0=speed:fast", "speed:fast", "no speed factor"),
    ("emu-tpu:0=link:usb4", "link:usb4",
     f"names no link kind of edgecap/data/links.json ({', '.join(emulation.link_rates())})"),
    ("emu-tpu:0=throttle:soon", "throttle:soon", "no throttle time in seconds"),
    ("emu-tpu:0=throttle:-5s", "throttle:-5s", "no throttle time in seconds"),
    ("emu-tpu:0=volts:5", "volts:5", "is not speed:F, link:KIND or throttle:Ts"),
    ("cpu=link:usb2", "cpu=link:usb2", "gives the CPU a link"),
    ("emu-tpu:0=speed:2;emu-tpu:00=speed:3", "emu-tpu:00=speed:3", "sets speed of emu-tpu:0 twice"),
])
def test_a_malformed_truth_is_one_line_naming_the_part_and_the_grammar(text, part, why):
    with pytest.raises(ConfigError) as err:
        emulation.parse(text)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"EDGECAP_EMULATE: {part!r}"), message
    assert why in message and "DEVICE=KEY:VALUE" in message and "speed:F, link:KIND, throttle:Ts" in message


def test_the_caption_command_refuses_a_malformed_truth_with_exit_2(shipped_bundle, monkeypatch, capsys):
    from edgecap.cli import main

    monkeypatch.setenv(emulation.ENV, "emu-tpu:0=speed:zero")
    code = main(["caption", "--bundle", str(shipped_bundle), "--board", "devboard-usb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "EDGECAP_EMULATE: 'speed:zero' has no speed factor" in err[0], err


# ------------------------------------------------------------------ pacing by the truth


def test_no_truth_and_no_bus_paces_plainly(monkeypatch):
    monkeypatch.delenv(emulation.ENV, raising=False)
    stage = _stage(cost=CostParts(compute_ms=10.0))
    assert emulation.pace(stage, parse_device("emu-tpu:0"), 10.0) is None
    monkeypatch.setenv(emulation.ENV, "emu-tpu:5=speed:0.5")  # another device's truth
    assert emulation.pace(stage, parse_device("emu-tpu:0"), 10.0) is None


@pytest.mark.parametrize("cost", [None, CostParts(compute_ms=18.0, invoke_ms=2.0)], ids=["older-plan", "cost"])
def test_a_stage_slowed_to_half_speed_takes_twice_as_long(monkeypatch, cost):
    stage = _stage(predicted_ms=20.0, cost=cost)
    monkeypatch.setenv(emulation.ENV, "emu-tpu:3=speed:0.5")
    slow = _seconds(_open(stage, "emu-tpu:3"))
    monkeypatch.delenv(emulation.ENV)
    plain = _seconds(_open(stage, "emu-tpu:3"))
    assert FLOOR * 0.040 <= slow < 0.040 + LATE_S, slow
    assert FLOOR * 0.020 <= plain < 0.020 + LATE_S, plain


def test_a_truth_for_the_plans_device_follows_it_onto_any_worker(monkeypatch):
    stage = _stage("usb:0", predicted_ms=10.0, cost=CostParts(compute_ms=10.0))
    monkeypatch.setenv(emulation.ENV, "usb:0=speed:0.25")
    assert FLOOR * 0.040 <= _seconds(_open(stage, "emu-tpu:4")) < 0.040 + LATE_S


def test_a_usb2_link_moves_the_stages_bytes_at_37_mb_per_s(monkeypatch):
    # 740 kB: 1.65 ms at the profile's PCIe rate, 20 ms at USB 2's usable 37 MB/s.
    cost = CostParts(compute_ms=1.0, link_bytes=740_000, link_bytes_per_s=449e6, link="pcie")
    stage = _stage(predicted_ms=cost.total_ms, cost=cost)
    monkeypatch.setenv(emulation.ENV, "emu-tpu:6=link:usb2")
    want = 1.0e-3 + 740_000 / 37e6
    assert FLOOR * want <= _seconds(_open(stage, "emu-tpu:6")) < want + LATE_S


def test_ops_left_on_the_cpu_inside_a_tpu_stage_run_at_the_cpus_speed(monkeypatch):
    stage = _stage(predicted_ms=12.0, cost=CostParts(compute_ms=2.0, extra_ms=10.0))
    monkeypatch.setenv(emulation.ENV, "cpu=speed:0.5")
    want = 0.002 + 0.020
    assert FLOOR * want <= _seconds(_open(stage, "emu-tpu:7")) < want + LATE_S


def test_the_boards_cpu_stage_is_paced_at_the_cpus_true_speed(monkeypatch):
    stage = _stage("cpu", predicted_ms=10.0, cost=CostParts(compute_ms=10.0))
    monkeypatch.setenv(emulation.ENV, "cpu=speed:0.5")
    assert FLOOR * 0.020 <= _seconds(_open(stage, "cpu")) < 0.020 + LATE_S


def test_throttling_starts_after_its_time_and_halves_the_clock(monkeypatch):
    stage = _stage(predicted_ms=10.0, cost=CostParts(compute_ms=10.0))
    monkeypatch.setenv(emulation.ENV, "emu-tpu:8=throttle:0.3s")
    runner = _open(stage, "emu-tpu:8")
    first = time.perf_counter()
    before = _seconds(runner)  # the device's first invoke starts the throttle's clock
    assert FLOOR * 0.010 <= before < 0.010 + LATE_S
    while time.perf_counter() - first < 0.35:  # past the throttle time, counted from a moment later
        runner({})
    after = _seconds(runner)
    assert FLOOR * 0.020 <= after < 0.020 + LATE_S, (before, after)


def test_two_stages_on_one_bus_together_move_no_more_than_its_rate():
    # Each invoke moves 100 kB: 0.2 ms on its own 500 MB/s link, 50 ms of a 2 MB/s bus.
    cost = CostParts(compute_ms=0.0, link_bytes=100_000, link_bytes_per_s=500e6, link="usb3", bus="lane")
    bus = Bus("lane", 2e6)
    invokes = 4

    def run(stage_bus):
        # Two threads, as two pipeline workers, each opening its own stage.
        runners = [_open(_stage(d, predicted_ms=cost.total_ms, cost=cost), w, stage_bus)
                   for d, w in (("usb:0", "emu-tpu:0"), ("usb:1", "emu-tpu:1"))]
        threads = [threading.Thread(target=_seconds, args=(r, invokes)) for r in runners]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    shared = run(bus)
    want = 2 * invokes * 100_000 / 2e6  # every byte of both stages through the one bus: 0.4 s
    assert FLOOR * want <= shared < want + 0.3, shared  # a loaded host may start a thread late
    assert run(None) < 0.5 * want  # without the bus each link alone is 250 times faster


def test_the_planner_never_reads_the_truth(shipped_bundle, tmp_path, monkeypatch):
    import edgecap_compile
    from edgecap.bundle import load_bundle

    bundle = load_bundle(shipped_bundle)
    board = edgecap_compile.make_board("devboard-usb")
    monkeypatch.delenv(emulation.ENV, raising=False)
    edgecap_compile.compile_model(bundle, board, tmp_path / "plain")
    monkeypatch.setenv(emulation.ENV, "emu-tpu:0=speed:0.01;pci:0=link:usb2;usb:0=speed:0.01;cpu=speed:100")
    edgecap_compile.compile_model(bundle, board, tmp_path / "truth")
    assert (tmp_path / "plain" / "plan.json").read_text() == (tmp_path / "truth" / "plan.json").read_text()


# ------------------------------------------------------------------ through the captioner


@pytest.fixture(scope="module")
def paced_plan(shipped_bundle, tmp_path_factory):
    import json

    from runtime_plans import write_plan

    path = write_plan(shipped_bundle / "encoder.tflite", [], ["tpu:0"], tmp_path_factory.mktemp("paced"), [5.0])
    doc = json.loads(path.read_text())
    doc["rnn_ms"] = 2.0
    path.write_text(json.dumps(doc))
    return path


def test_a_captioner_paces_its_emulated_tpu_and_rnn_step_by_the_truth(shipped_bundle, paced_plan, story,
                                                                      monkeypatch):
    from edgecap.captioner import EdgeCaptioner

    monkeypatch.setenv(emulation.ENV, "emu-tpu:0=speed:0.5;cpu=speed:0.5")
    frames = 4
    with EdgeCaptioner(shipped_bundle, plan=paced_plan, num_threads=1, frames=frames, stride=frames,
                       timing_only=True) as cap:
        assert cap.devices == {"tpu:0": "emu-tpu:0"}
        (caption,) = cap.caption_frames(story.frames[:frames])
    # Profiled: 5 ms a frame on the TPU, 2 ms an RNN step; the truth runs both at half speed
    # (timing only: neither computes, so neither takes longer for this host's sake).
    assert caption.stage_ms["cnn"] >= FLOOR * frames * 10.0, caption.stage_ms
    assert caption.stage_ms["rnn_step"] >= FLOOR * frames * 4.0, caption.stage_ms


def test_the_planner_hands_each_stage_the_bus_its_link_shares(shipped_bundle, paced_plan, tmp_path):
    import json
    import shutil

    from edgecap import planner
    from edgecap.bundle import load_bundle
    from edgecap.options import CaptionerOptions

    folder = tmp_path / "plan"
    shutil.copytree(paced_plan.parent, folder)
    doc = json.loads((folder / "plan.json").read_text())
    doc["stages"][0]["cost"] = {"compute_ms": 4.0, "link_bytes": 4000, "link_bytes_per_s": 4e6, "bus": "lane"}
    doc["buses"] = [{"name": "lane", "bytes_per_s": 2e6}]
    (folder / "plan.json").write_text(json.dumps(doc))
    choice = planner.choose(load_bundle(shipped_bundle), CaptionerOptions(plan=folder / "plan.json"))
    assert [run.bus for run in choice.stages] == [Bus("lane", 2e6)]
