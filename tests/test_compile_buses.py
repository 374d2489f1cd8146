"""Shared buses in the compiler: plan.json's buses and cost.bus, bus-bound predictions, and
boards of 1-4 TPUs compiled and captioned on emulated TPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgecap.cli import run as main
from edgecap.plans.plan import load_plan
from edgecap_compile.boards import BOARDS_DIR
from edgecap_compile.compiler import compile_model
from edgecap_compile.cost_model import CostModel
from edgecap_compile.graph import read_graph
from edgecap_compile.partitioner import exhaustive
from tests.conftest import write_noise_clip

DATA = Path(__file__).parent / "data" / "compile"


def _board(tmp_path: Path, base: str, bus_bytes_per_s: float = 0.0, **tpu) -> Path:
    # A shipped profile with a slow CPU (so the test models go to the TPUs),
    # every TPU's figures changed and the bus slowed (test only).
    doc = json.loads((BOARDS_DIR / f"{base}.json").read_text())
    doc["name"] = f"test-{base}"
    doc["cpu"].update(macs_per_s=1e8, elements_per_s=1e8)
    for t in doc["tpus"]:
        t.update(tpu)
    for bus in doc.get("buses", []):
        bus["bytes_per_s"] = bus_bytes_per_s or bus["bytes_per_s"]
    path = tmp_path / f"{doc['name']}.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_shared_bus_bounds_the_period_and_the_plan_records_it(tmp_path):
    # rpi4-2usb with a tiny cache (everything streams) and a slow VL805 lane:
    # the bus, not a stage, sets the period, and the search keeps the bus in mind.
    board = _board(tmp_path, "rpi4-2usb", bus_bytes_per_s=4e6)
    model = DATA / "tiny_inception.tflite"
    plan = compile_model(model, board, tmp_path / "out", sram=20_000).plan
    assert [b.name for b in plan.buses] == ["vl805"]
    assert plan.buses[0].bytes_per_s == 4e6
    tpu_stages = [s for s in plan.stages if s.spec.kind != "cpu"]
    assert all(s.cost.bus == "vl805" and s.cost.link == "usb3" for s in tpu_stages)
    assert next(s for s in plan.stages if s.spec.kind == "cpu").cost.bus is None
    bus_ms = sum(s.cost.link_bytes for s in tpu_stages) * 1e3 / 4e6
    slowest = max(s.predicted_ms for s in plan.stages)
    assert bus_ms > slowest  # the bus binds
    assert plan.predicted.bottleneck_ms == pytest.approx(bus_ms, rel=1e-5)
    assert plan.predicted.fps == pytest.approx(1e3 / bus_ms, rel=1e-3)
    # bottleneck_stage: the stage that moves the most bytes over the bus.
    heaviest = max(tpu_stages, key=lambda s: s.cost.link_bytes)
    assert plan.predicted.bottleneck_stage == heaviest.index
    # The same optimum as brute force under the bus.
    graph = read_graph(model)
    from edgecap_compile.compiler import make_board

    chosen = make_board(board, sram=20_000)
    cost = CostModel(graph, [*chosen.tpus, chosen.cpu])
    costs = [cost.matrix(k) for k in range(3)]
    best = exhaustive(costs, 2, cost.bus_matrices(chosen.buses))
    assert plan.predicted.bottleneck_ms == pytest.approx(best.bottleneck_ms, rel=1e-5)


def test_without_the_bus_the_same_board_would_promise_more(tmp_path):
    board = _board(tmp_path, "rpi4-2usb", bus_bytes_per_s=4e6)
    free = json.loads(board.read_text())
    free.pop("buses")
    unbused = tmp_path / "free.json"
    unbused.write_text(json.dumps(free))
    bound = compile_model(DATA / "tiny_inception.tflite", board, tmp_path / "a", sram=20_000).plan
    loose = compile_model(DATA / "tiny_inception.tflite", unbused, tmp_path / "b", sram=20_000).plan
    assert loose.buses == () and all(s.cost.bus is None for s in loose.stages)
    assert bound.predicted.fps < loose.predicted.fps


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return write_noise_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", 24, 96)


@pytest.mark.parametrize("tpus", [1, 2, 3, 4])
def test_every_tpu_of_a_board_compiles_and_captions_on_emulated_tpus(tmp_path, clip,
                                                                       shipped_bundle, tpus,
                                                                       capsys):
    # The 4-TPU card with slow TPUs and a slow CPU, so the demo CNN spans every
    # TPU it is given; --tpus auto is the board's four.
    board = _board(tmp_path, "pc-4tpu-pcie", macs_per_s=2e9, elements_per_s=2e9,
                   invoke_overhead_ms=0.05)
    out = tmp_path / "plan"
    count = "auto" if tpus == 4 else str(tpus)
    assert main(["compile", str(shipped_bundle), "--board", str(board), "--tpus", count,
                 "-o", str(out)]) == 0
    plan = load_plan(out)
    tpu_stages = [s for s in plan.stages if s.spec.kind != "cpu"]
    # Every TPU runs a segment: a stage of its own, or a copy of one.
    assert sorted(str(d) for s in tpu_stages for d in s.devices if d.kind != "cpu") == \
        [f"pci:{i}" for i in range(tpus)]
    assert all(s.ops[1] > s.ops[0] for s in tpu_stages)
    assert plan.board_tpus == tpus and [b.name for b in plan.buses] == ["card-switch"]
    capsys.readouterr()
    assert main(["caption", str(clip), "--bundle", str(shipped_bundle), "--plan", str(out),
                 "--emulate"]) == 0
    printed = capsys.readouterr().out
    assert all(f"emu-tpu:{i} " in printed for i in range(tpus)), printed
