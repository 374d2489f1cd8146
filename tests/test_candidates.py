"""The candidate plans a bundle carries (``edgecap.plans.bundled``), loaded and priced under per-device corrections."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import pytest

from edgecap import planner
from edgecap.bundle import load_bundle
from edgecap.plans.bundled import bundle_plans
from edgecap.plans.plan import load_plan
from edgecap.plans.pricing import Correction, price, stage_price
from edgecap_compile.boards import BOARDS_DIR, PRICES
from edgecap_compile.scenario_plans import MIN_GAIN
from edgecap_compile.compiler import compile_candidates, compile_model

USB2 = 37e6  # edgecap/data/links.json: usb2 usable


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
    best = compile_model(bundle, board, root / "plans" / "slow-tpus", replicas=False).plan
    compile_candidates(bundle, board, best, count=64, max_bytes=10**9, replicas=False)
    return root, tmp


def _at_speed(device: dict, speed: float) -> None:
    """A profile device's every price but its link's, at ``1 / speed`` the time (rates times ``speed``);
    a CPU's own work a frame too."""
    for name in [n for _, n in PRICES] + ["frame_ms", "frame_elements_per_s", "handoff_ms"]:
        if name != "link_bytes_per_s" and device.get(name) is not None:
            device[name] = device[name] * speed if name.endswith("_per_s") else device[name] / speed


def _candidates(bundle, board, window=None):
    """The board's usable candidate plans, in the compiler's rank order."""
    return [plan for _, plan in bundle_plans(bundle, window or bundle.window, board, best=False,
                                             candidates=True).usable]


def _speed(tpu: int, speed: float):
    def change(doc):
        _at_speed(doc["tpus"][tpu], speed)
    return change


def _link(tpu: int, rate: float):
    def change(doc):
        doc["tpus"][tpu]["link_bytes_per_s"] = rate
    return change


def _slow_cpu(doc):
    _at_speed(doc["cpu"], 0.5)


@pytest.mark.parametrize("corrections,change,exact", [
    ({"pci:0": Correction(speed=0.5)}, _speed(0, 0.5), True),
    ({"usb:0": Correction(speed=0.7)}, _speed(1, 0.7), True),
    ({"usb:0": Correction(link_bytes_per_s=USB2)}, _link(1, USB2), True),
    ({"pci:0": Correction(speed=1.5)}, _speed(0, 1.5), True),
    # The RNN step is priced at the CPU's coefficients: a CPU at half speed doubles it too.
    ({"cpu": Correction(speed=0.5)}, _slow_cpu, True),
    # Here a candidate comes within MIN_GAIN of the optimum, which is then not worth its bytes.
    ({"pci:0": Correction(link_bytes_per_s=449e6 / 2)}, _link(0, 449e6 / 2), False),
], ids=["pci-half-speed", "usb-0.7x", "usb-on-usb2", "pci-1.5x", "cpu-half-speed", "pci-link-gen1"])
def test_the_plan_the_partitioner_picks_for_a_changed_board_wins_in_price(
        with_candidates, corrections, change, exact):
    root, tmp = with_candidates
    bundle = load_bundle(root)
    plans = [load_plan(bundle.plans["slow-tpus"]), *_candidates(bundle, "slow-tpus")]
    # The compiler's best plan for a profile that really is that slow: the oracle.
    oracle = compile_model(bundle, _profile(tmp, "changed", change), tmp / "oracle", replicas=False).plan
    ms = [price(p, corrections).period_ms for p in plans]
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
    plans = _candidates(bundle, "slow-tpus")
    assert len(plans) >= 4
    for plan in plans:
        assert price(plan).period_ms == pytest.approx(plan.predicted.bottleneck_ms, rel=1e-5)
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
        found = planner.measured_plans(bundle, bundle.window, "slow-tpus")
    assert len(found.usable) == 1 + len(folders) - 2  # the best plan, and the candidates that read
    why = dict(bundle_plans(bundle, bundle.window, "slow-tpus", best=False, candidates=True).skipped)
    assert why[f"slow-tpus/{folders[0].name}"] == "compiled from another encoder"
    assert why[f"slow-tpus/{folders[1].name}"].startswith("unreadable (")
    assert caplog.text.count("candidate plan slow-tpus/") == 2
    # Another window charges another number of RNN steps a frame: every candidate is timed wrong.
    window = dataclasses.replace(bundle.window, stride=2)
    found = bundle_plans(bundle, window, "slow-tpus", best=False, candidates=True)
    assert not found.usable and all("RNN steps a frame" in w for _, w in found.skipped[-3:])
    assert _candidates(bundle, "no-such-board") == []


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
    best = compile_model(bundle, board, root / "plans" / "rpi4-2usb", sram=20_000, replicas=False).plan
    compile_candidates(bundle, board, best, count=64, max_bytes=10**9, sram=20_000, replicas=False)
    bundle = load_bundle(root)
    plans = [best, *_candidates(bundle, "rpi4-2usb")]
    (bus,) = best.buses
    on_bus = [p for p in plans if sum(s.cost.bus == bus.name for s in p.active_stages) == 2]
    assert on_bus, "no plan uses both TPUs"
    for plan in plans:
        assert price(plan).period_ms == pytest.approx(plan.predicted.bottleneck_ms, rel=1e-5)
        moved = sum(s.cost.link_bytes for s in plan.active_stages if s.cost.bus == bus.name)
        # The stages and the devices' loads (the CPU's with its own work a frame), the bus aside.
        stages = dataclasses.replace(price(plan), buses=()).period_ms
        slower = {bus.name: Correction(link_bytes_per_s=bus.bytes_per_s / 4)}
        assert price(plan, slower).period_ms == pytest.approx(max(stages, moved * 4e3 / bus.bytes_per_s))
    # On a bus at a fiftieth of its rate (the demo moves little) the plans that move less over it win.
    slower = {bus.name: Correction(link_bytes_per_s=bus.bytes_per_s / 50)}

    def moved(p):
        return sum(s.cost.link_bytes for s in p.active_stages if s.cost.bus == bus.name)
    assert any(price(p, slower).period_ms > max(stage_price(s).ms for s in p.active_stages) * 1.01
               for p in on_bus)
    winner = min(plans, key=lambda p: price(p, slower).period_ms)
    assert moved(winner) < moved(best) and price(winner, slower).period_ms < price(best, slower).period_ms
