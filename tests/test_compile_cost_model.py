"""Cost model and board profiles: the terms of a stage's time, and every figure's source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgecap_compile.boards import BOARDS_DIR, board_names, load_board
from edgecap_compile.cost_model import CostModel
from edgecap_compile.errors import CompileError
from edgecap_compile.graph import read_graph

DATA = Path(__file__).parent / "data" / "compile"


@pytest.fixture(scope="module")
def graph():
    return read_graph(DATA / "tiny_mobilenet.tflite")


def test_streams_only_the_parameters_beyond_sram(graph):
    n = len(graph.ops)
    tpu = load_board("devboard").tpus[0]
    total = CostModel(graph, [tpu]).param_bytes(0, n)
    roomy = CostModel(graph, [load_board("devboard").with_sram(total).tpus[0]]).stage(0, 0, n)
    tight_tpu = load_board("devboard").with_sram(total // 4).tpus[0]
    tight = CostModel(graph, [tight_tpu]).stage(0, 0, n)
    assert roomy.streamed_bytes == 0 and roomy.stream_ms == 0
    assert tight.streamed_bytes == total - total // 4
    assert tight.stream_ms == pytest.approx(1e3 * tight.streamed_bytes / tpu.link_bytes_per_s)
    assert tight.total_ms - roomy.total_ms == pytest.approx(tight.stream_ms)


def test_tpu_pays_boundary_transfer_and_cpu_does_not(graph):
    board = load_board("devboard")
    model = CostModel(graph, [board.tpus[0], board.cpu])
    ins, outs = graph.segment_io(4, 9)
    io = sum(graph.tensors[t].nbytes for t in ins + outs)
    tpu, cpu = model.stage(0, 4, 9), model.stage(1, 4, 9)
    assert tpu.io_bytes == io
    assert tpu.transfer_ms == pytest.approx(1e3 * io / board.tpus[0].link_bytes_per_s)
    assert cpu.transfer_ms == 0 and cpu.stream_ms == 0


def test_cpu_stage_carries_the_rnn_even_when_empty(graph):
    board = load_board("devboard")
    model = CostModel(graph, [board.tpus[0], board.cpu], rnn_ms=1.25)
    assert model.stage(1, 5, 5).total_ms == pytest.approx(1.25)
    assert model.stage(0, 5, 5).total_ms == 0
    assert model.stage(1, 0, 5).total_ms == pytest.approx(model.stage(1, 0, 5).compute_ms
                                                          + board.cpu.invoke_overhead_ms + 1.25)


@pytest.mark.parametrize("board_name", ["devboard-usb", "rpi4-2usb"])
def test_matrix_agrees_with_stage(graph, board_name):
    board = load_board(board_name).with_sram(30_000)
    model = CostModel(graph, [*board.tpus, board.cpu], rnn_ms=0.5)
    n = len(graph.ops)
    for k in range(len(model.devices)):
        m = model.matrix(k)
        for a in range(n + 1):
            for b in range(a, n + 1):
                assert m[a, b] == pytest.approx(model.stage(k, a, b).total_ms, rel=1e-9)


def test_shipped_boards_have_their_devices_and_a_source_for_every_figure():
    assert set(board_names()) >= {"devboard", "devboard-usb", "rpi4-2usb", "host"}
    expected_tpus = {"devboard": 1, "devboard-usb": 2, "rpi4-2usb": 2, "host": 0}
    for name, count in expected_tpus.items():
        board = load_board(name)
        assert board.name == name and len(board.tpus) == count
        raw = json.loads((BOARDS_DIR / f"{name}.json").read_text())
        fields = [f"cpu.{k}" for k in raw["cpu"]] + [
            f"tpus[{i}].{k}" for i, t in enumerate(raw["tpus"]) for k in t if k != "link"]
        for field in fields:
            # A source may cover one figure, a device, or a device's whole list.
            keys = {field, field.split(".")[0], field.split("[")[0],
                    field.split("[")[0] + "." + field.split(".")[-1]}
            assert keys & set(raw["sources"]), (name, field)


def test_board_errors_are_one_line():
    with pytest.raises(CompileError, match="unknown board 'nano'.*devboard-usb"):
        load_board("nano")
    with pytest.raises(CompileError, match="--sram must be a positive"):
        load_board("devboard").with_sram(0)
    with pytest.raises(CompileError, match="no EdgeTPU"):
        load_board("host").with_tpus(1)


def test_more_tpus_than_the_profile_copy_its_last_tpu():
    board = load_board("devboard-usb").with_tpus(4)
    assert [t.name for t in board.tpus] == ["tpu:0", "tpu:1", "tpu:2", "tpu:3"]
    assert board.tpus[3].link == "usb3"
