"""edgecap.candidates: the bundle's candidate plans, loaded and re-priced under per-device corrections."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
from pathlib import Path

import pytest

from edgecap.bundle import load_bundle
from edgecap.candidates import Correction, load_candidates, price, scan_candidates, stage_ms
from edgecap.devices import DeviceSpec
from edgecap.errors import ConfigError, PlanError
from edgecap.plan import Bus, CostParts, Plan, Stage, load_plan
from edgecap_compile.boards import BOARDS_DIR, PRICES
from edgecap_compile.candidates import MIN_GAIN
from edgecap_compile.compiler import compile_candidates, compile_model

USB2 = 37e6  # edgecap/data/links.json: usb2 usable


def _stage(index, device, ops, cost=None, predicted_ms=None):
    return Stage(index=index, spec=DeviceSpec(*device) if isinstance(device, tuple) else DeviceSpec(device),
                 segment=None, ops=ops, inputs=(), outputs=(), predicted_ms=predicted_ms, cost=cost)


def _plan(*stages, buses=()):
    return Plan(path=None, board="b", model_file="m.tflite", model_sha256="0" * 64,
                stages=tuple(stages), buses=tuple(buses))


PCI = ("tpu", 0, "pci")
USB = ("tpu", 0, "usb")


def test_each_part_of_a_stage_scales_with_its_own_correction():
    tpu = _stage(0, PCI, (0, 5), CostParts(compute_ms=2.0, invoke_ms=1.0, link_bytes=4_000_000,
                                           link_bytes_per_s=400e6, extra_ms=0.5, link="pcie"))
    cpu = _stage(1, "cpu", (5, 9), CostParts(compute_ms=3.0, invoke_ms=0.1, extra_ms=2.0))
    assert stage_ms(tpu, {}) == pytest.approx(2.0 + 1.0 + 10.0 + 0.5)
    # The TPU's compute and invoke follow its scale, its link the measured rate; the
    # ops left on the CPU inside it follow the CPU's scale.
    corrections = {"pci:0": Correction(compute_scale=2.0, link_bytes_per_s=200e6),
                   "cpu": Correction(compute_scale=3.0)}
    assert stage_ms(tpu, corrections) == pytest.approx(6.0 + 20.0 + 1.5)
    assert stage_ms(cpu, corrections) == pytest.approx(3.1 * 3.0 + 2.0 * 3.0)
    assert price(_plan(tpu, cpu), {}) == pytest.approx(13.5)
    assert price(_plan(tpu, cpu), corrections) == pytest.approx(27.5)
    # A device the corrections do not name runs as profiled.
    assert stage_ms(tpu, {"usb:0": Correction(compute_scale=5.0)}) == pytest.approx(13.5)


def test_an_empty_stage_costs_nothing_and_an_older_plan_scales_its_prediction():
    empty = _stage(0, USB, (0, 0), CostParts(compute_ms=0.0, invoke_ms=0.0))
    old = _stage(1, PCI, (0, 4), predicted_ms=4.0)
    cpu = _stage(2, "cpu", (4, 9), predicted_ms=1.0)
    plan = _plan(empty, old, cpu)
    assert price(plan, {"usb:0": Correction(compute_scale=9.0)}) == pytest.approx(4.0)
    assert price(plan, {"pci:0": Correction(compute_scale=0.5), "cpu": Correction(compute_scale=3)}) \
        == pytest.approx(3.0)
    with pytest.raises(PlanError, match=r"stages\[1\] on pci:0 has no predicted time"):
        price(_plan(_stage(1, PCI, (0, 4)), cpu), {})


def test_a_shared_bus_bounds_the_period_by_the_bytes_of_its_stages():
    # Two TPUs each fast alone, whose links together need more than their bus carries.
    a = _stage(0, ("tpu", 0, "usb"), (0, 3), CostParts(compute_ms=1.0, link_bytes=3_000_000,
                                                      link_bytes_per_s=500e6, bus="vl805"))
    b = _stage(1, ("tpu", 1, "usb"), (3, 6), CostParts(compute_ms=1.0, link_bytes=2_000_000,
                                                      link_bytes_per_s=500e6, bus="vl805"))
    cpu = _stage(2, "cpu", (6, 9), CostParts(compute_ms=1.0))
    plan = _plan(a, b, cpu, buses=[Bus("vl805", 400e6)])
    assert max(stage_ms(s, {}) for s in plan.stages) == pytest.approx(7.0)
    assert price(plan, {}) == pytest.approx(5e6 * 1e3 / 400e6)  # 12.5 ms: the bus, not a stage
    # A correction keyed by the bus's name is its measured rate.
    assert price(plan, {"vl805": Correction(link_bytes_per_s=1e9)}) == pytest.approx(7.0)
    assert price(_plan(a, b, cpu), {}) == pytest.approx(7.0)  # the same stages, no bus


@pytest.mark.parametrize("kwargs", [
    {"compute_scale": 0.0}, {"compute_scale": -1.0}, {"compute_scale": math.nan},
    {"compute_scale": math.inf}, {"compute_scale": True}, {"link_bytes_per_s": 0.0},
    {"link_bytes_per_s": math.inf}, {"compute_scale": "2"},
])
def test_a_correction_out_of_range_is_refused_in_one_line(kwargs):
    with pytest.raises(ConfigError) as err:
        Correction(**kwargs)
    assert "\n" not in str(err.value) and next(iter(kwargs)) in str(err.value)


# ---------------------------------------------------------------------------
# Against the compiler: a bundle's candidates, and the partitioner under a changed profile.


def _profile(tmp_path: Path, name: str, change) -> Path:
    """The devboard-usb profile with its TPUs slowed so the demo CNN spans both, then ``change`` applied."""
    doc = json.loads((BOARDS_DIR / "devboard-usb.json").read_text())
    doc["name"] = "slow-tpus"
    for tpu in doc["tpus"]:
        tpu["macs_per_s"] = tpu["elements_per_s"] = 4e9
    change(doc)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def with_candidates(tmp_path_factory, shipped_bundle):
    """A copy of the demo bundle compiled for the slow-TPU board with every candidate worth writing."""
    tmp = tmp_path_factory.mktemp("candidates")
    root = tmp / "bundle"
    shutil.copytree(shipped_bundle, root)
    board = _profile(tmp, "nominal", lambda doc: None)
    bundle = load_bundle(root)
    best = compile_model(bundle, board, root / "plans" / "slow-tpus").plan
    compile_candidates(bundle, board, best, count=64, max_bytes=10**9)
    return root, tmp


def _scale(device: dict, scale: float) -> None:
    """A profile device's every price but its link's, at ``scale`` times the time (rates divided)."""
    for _, name in PRICES:
        if name != "link_bytes_per_s" and device.get(name) is not None:
            device[name] = device[name] / scale if name.endswith("_per_s") else device[name] * scale


def _slower(tpu: int, scale: float):
    def change(doc):
        _scale(doc["tpus"][tpu], scale)
    return change


def _link(tpu: int, rate: float):
    def change(doc):
        doc["tpus"][tpu]["link_bytes_per_s"] = rate
    return change


def _slow_cpu(doc):
    _scale(doc["cpu"], 2.0)


@pytest.mark.parametrize("corrections,change,exact", [
    ({"pci:0": Correction(compute_scale=2.0)}, _slower(0, 2.0), True),
    ({"usb:0": Correction(compute_scale=1 / 0.7)}, _slower(1, 1 / 0.7), True),
    ({"usb:0": Correction(link_bytes_per_s=USB2)}, _link(1, USB2), True),
    ({"pci:0": Correction(compute_scale=1 / 1.5)}, _slower(0, 1 / 1.5), True),
    # The RNN step is priced at the CPU's coefficients: a CPU twice as slow doubles it too.
    ({"cpu": Correction(compute_scale=2.0)}, _slow_cpu, True),
    # Here a candidate comes within MIN_GAIN of the optimum, which is then not worth its bytes.
    ({"pci:0": Correction(link_bytes_per_s=449e6 / 2)}, _link(0, 449e6 / 2), False),
], ids=["pci-half-speed", "usb-0.7x", "usb-on-usb2", "pci-1.5x", "cpu-half-speed", "pci-link-gen1"])
def test_the_plan_the_partitioner_picks_for_a_changed_board_wins_in_price(
        with_candidates, corrections, change, exact):
    root, tmp = with_candidates
    bundle = load_bundle(root)
    plans = [load_plan(bundle.plans["slow-tpus"]), *load_candidates(bundle, "slow-tpus", bundle.window)]
    # The compiler's best plan for a profile that really is that slow: the oracle.
    oracle = compile_model(bundle, _profile(tmp, "changed", change), tmp / "oracle").plan
    ms = [price(p, corrections) for p in plans]
    winner = plans[ms.index(min(ms))]
    optimum = oracle.predicted.bottleneck_ms
    assert optimum * (1 - 1e-4) <= min(ms) <= optimum / (1 - MIN_GAIN)
    if exact:
        assert min(ms) == pytest.approx(optimum, rel=1e-4)
        assert [(s.device, s.ops) for s in winner.active_stages] == \
            [(s.device, s.ops) for s in oracle.active_stages]
        # And the best plan for the profile does not win here: the candidate matters.
        assert ms[0] > min(ms) * (1 + MIN_GAIN)


def test_with_no_corrections_a_candidate_costs_what_the_compiler_predicted(with_candidates):
    bundle = load_bundle(with_candidates[0])
    plans = load_candidates(bundle, "slow-tpus", bundle.window)
    assert len(plans) >= 4
    for plan in plans:
        assert price(plan, {}) == pytest.approx(plan.predicted.bottleneck_ms, rel=1e-5)
    # In the order the compiler ranked them, and for 1 and 2 TPUs.
    names = [p.path.parent.name for p in plans]
    assert names == sorted(names)
    assert {p.board_tpus for p in plans} == {1, 2}


def test_unusable_candidates_are_skipped_with_their_reason(with_candidates, tmp_path, caplog):
    root = tmp_path / "bundle"
    shutil.copytree(with_candidates[0], root)
    folders = sorted((root / "plans" / "slow-tpus" / "candidates").iterdir())
    other = folders[0] / "plan.json"
    doc = json.loads(other.read_text())
    doc["model"]["sha256"] = "f" * 64
    other.write_text(json.dumps(doc))
    segment = next(folders[1].glob("*.tflite"))
    segment.write_bytes(segment.read_bytes()[:100])
    bundle = load_bundle(root)
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        plans = load_candidates(bundle, "slow-tpus", bundle.window)
    assert len(plans) == len(folders) - 2
    why = dict(scan_candidates(bundle, "slow-tpus", bundle.window).skipped)
    assert why[f"slow-tpus/{folders[0].name}"] == "compiled from another encoder"
    assert why[f"slow-tpus/{folders[1].name}"].startswith("unreadable (")
    assert caplog.text.count("candidate plan slow-tpus/") == 2
    # Another window charges another number of RNN steps a frame: every candidate is timed wrong.
    window = dataclasses.replace(bundle.window, stride=2)
    found = scan_candidates(bundle, "slow-tpus", window)
    assert not found.usable and all("RNN steps a frame" in w for _, w in found.skipped[-3:])
    assert load_candidates(bundle, "no-such-board", bundle.window) == []


def test_candidates_behind_a_shared_bus_are_priced_with_it(shipped_bundle, tmp_path):
    # rpi4-2usb: both USB Accelerators behind the VL805's one PCIe lane. With a
    # small SRAM budget the demo CNN streams its weights, so the bus counts.
    root = tmp_path / "bundle"
    shutil.copytree(shipped_bundle, root)
    doc = json.loads((BOARDS_DIR / "rpi4-2usb.json").read_text())
    for tpu in doc["tpus"]:
        tpu["macs_per_s"] = tpu["elements_per_s"] = 4e9
    board = tmp_path / "rpi4-2usb.json"
    board.write_text(json.dumps(doc))
    bundle = load_bundle(root)
    best = compile_model(bundle, board, root / "plans" / "rpi4-2usb", sram=20_000).plan
    compile_candidates(bundle, board, best, count=64, max_bytes=10**9, sram=20_000)
    bundle = load_bundle(root)
    plans = [best, *load_candidates(bundle, "rpi4-2usb", bundle.window)]
    (bus,) = best.buses
    on_bus = [p for p in plans if sum(s.cost.bus == bus.name for s in p.active_stages) == 2]
    assert on_bus, "no plan uses both TPUs"
    for plan in plans:
        assert price(plan, {}) == pytest.approx(plan.predicted.bottleneck_ms, rel=1e-5)
        moved = sum(s.cost.link_bytes for s in plan.active_stages if s.cost.bus == bus.name)
        stages = max(stage_ms(s, {}) for s in plan.active_stages)
        slower = {bus.name: Correction(link_bytes_per_s=bus.bytes_per_s / 4)}
        assert price(plan, slower) == pytest.approx(max(stages, moved * 4e3 / bus.bytes_per_s))
    # On a bus at a fiftieth of its rate (the demo moves little) the plans that move less over it win.
    slower = {bus.name: Correction(link_bytes_per_s=bus.bytes_per_s / 50)}

    def moved(p):
        return sum(s.cost.link_bytes for s in p.active_stages if s.cost.bus == bus.name)
    assert any(price(p, slower) > max(stage_ms(s, {}) for s in p.active_stages) * 1.01 for p in on_bus)
    winner = min(plans, key=lambda p: price(p, slower))
    assert moved(winner) < moved(best) and price(winner, slower) < price(best, slower)
