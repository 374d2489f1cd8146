"""Cost model and board profiles: the terms of a stage's time, and every figure's source."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from edgecap_compile.boards import BOARDS_DIR, Device, board_names, load_board
from edgecap_compile.cost_model import CostModel
from edgecap_compile.errors import CompileError
from edgecap_compile.graph import Graph, Op, Tensor, read_graph
from edgecap_compile.partitioner import partition

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


def _two_op_graph() -> Graph:
    # input t0 (1000 B) -> op0 (weights t1, 3000 B) -> t2 (500 B) -> op1 (weights t3, 1000 B)
    # -> output t4 (100 B)
    def tensor(i, nbytes, constant=False):
        return Tensor(i, f"t{i}", (nbytes,), "int8", 1.0, 0, nbytes, constant)

    tensors = [tensor(0, 1000), tensor(1, 3000, True), tensor(2, 500), tensor(3, 1000, True),
               tensor(4, 100)]
    ops = [Op(0, "CONV_2D", (0, 1), (2,), macs=2_000_000, elements=1000, param_bytes=3000,
              act_in_bytes=1000, act_out_bytes=500),
           Op(1, "FULLY_CONNECTED", (2, 3), (4,), macs=1_000_000, elements=500,
              param_bytes=1000, act_in_bytes=500, act_out_bytes=100)]
    return Graph("two_ops", "0" * 64, None, tensors, ops, inputs=(0,), outputs=(4,))


_TPU = Device("tpu:0", macs_per_s=1e9, elements_per_s=1e8, op_overhead_ms=0.01,
              invoke_overhead_ms=2.0, link_bytes_per_s=1e6, sram_bytes=2000, link="usb3")
_CPU = Device("cpu", macs_per_s=1e8, elements_per_s=1e7, op_overhead_ms=0.05,
              invoke_overhead_ms=0.1, cores=1)


def test_stage_times_match_figures_worked_out_by_hand():
    model = CostModel(_two_op_graph(), [_TPU, _CPU], rnn_ms=0.5, window=(8, 2))
    # Both ops on the TPU: 3e6 MACs / 1e9 = 3 ms, 1500 elements / 1e8 = 0.015 ms,
    # 2 ops x 0.01 = 0.02 ms, invoke 2 ms, 4000 - 2000 B of SRAM streamed / 1e6 = 2 ms,
    # t0 in + t4 out = 1100 B / 1e6 = 1.1 ms.
    whole = model.stage(0, 0, 2)
    assert (whole.compute_ms, whole.invoke_ms, whole.stream_ms, whole.transfer_ms) == \
        pytest.approx((3.035, 2.0, 2.0, 1.1))
    assert whole.total_ms == pytest.approx(8.135)
    # op0 alone: 2 + 0.01 + 0.01 + invoke 2 + (3000 - 2000) B streamed 1 ms
    # + t0 in, t2 out 1500 B 1.5 ms.
    assert model.stage(0, 0, 1).total_ms == pytest.approx(6.52)
    # op1 on the CPU: 1e6 / 1e8 = 10 ms, 500 / 1e7 = 0.05, 1 op 0.05, invoke 0.1, nothing
    # over a link, and the RNN step (0.5 ms) for each of the 8 / 2 = 4 windows a frame feeds.
    cpu = model.stage(1, 1, 2)
    assert (cpu.compute_ms, cpu.invoke_ms, cpu.extra_ms) == pytest.approx((10.1, 0.1, 2.0))
    assert cpu.total_ms == pytest.approx(12.2)
    assert model.stage(1, 2, 2).total_ms == pytest.approx(2.0)  # an empty CPU stage: RNN only
    assert model.stage(0, 1, 1).total_ms == 0  # an empty TPU stage: no invoke
    for k, a, b, ms in [(0, 0, 2, 8.135), (0, 0, 1, 6.52), (1, 1, 2, 12.2), (1, 2, 2, 2.0),
                        (0, 1, 1, 0.0)]:
        assert model.matrix(k)[a, b] == pytest.approx(ms), (k, a, b)
    # Bottlenecks: both ops on the TPU 8.135 ms (CPU: RNN 2 ms), cut after op0 12.2 ms,
    # both on the CPU 30 + 0.15 + 0.1 + 0.1 + 2 = 32.35 ms.
    split = partition([model.matrix(0), model.matrix(1)])
    assert split.cuts == (0, 2, 2) and split.stage_ms == pytest.approx((8.135, 2.0))


def test_dropping_the_invoke_overhead_changes_every_non_empty_stage():
    board = load_board("devboard-usb")
    graph = _two_op_graph()
    with_ = CostModel(graph, [*board.tpus, board.cpu])
    without = CostModel(graph, [dataclasses.replace(d, invoke_overhead_ms=0.0)
                                for d in with_.devices])
    for k, device in enumerate(with_.devices):
        assert device.invoke_overhead_ms > 0
        a, b = np.triu_indices(3, 1)  # every non-empty range of the two ops
        assert with_.matrix(k)[a, b] - without.matrix(k)[a, b] == \
            pytest.approx(device.invoke_overhead_ms)
        assert with_.stage(k, 0, 2).invoke_ms == device.invoke_overhead_ms
        assert with_.stage(k, 0, 2).total_ms - without.stage(k, 0, 2).total_ms == \
            pytest.approx(device.invoke_overhead_ms)
        assert with_.matrix(k)[1, 1] == without.matrix(k)[1, 1]  # an empty range pays none


@pytest.mark.parametrize("frames, stride, steps", [(8, 8, 1.0), (8, 4, 2.0), (8, 2, 4.0),
                                                   (4, 8, 0.5)])
def test_the_cpu_stage_carries_one_rnn_step_per_open_window(frames, stride, steps):
    board = load_board("devboard")
    base = CostModel(_two_op_graph(), [board.tpus[0], board.cpu])
    model = CostModel(_two_op_graph(), [board.tpus[0], board.cpu], rnn_ms=0.75,
                      window=(frames, stride))
    assert model.rnn_frame_ms == pytest.approx(0.75 * steps)
    assert model.stage(1, 0, 2).total_ms - base.stage(1, 0, 2).total_ms == \
        pytest.approx(0.75 * steps)
    assert model.matrix(1)[0, 2] - base.matrix(1)[0, 2] == pytest.approx(0.75 * steps)
    assert model.stage(0, 0, 2).total_ms == base.stage(0, 0, 2).total_ms  # TPUs carry none


def test_a_cpu_with_a_memory_bandwidth_pays_for_the_bytes_its_ops_move():
    # op1 on the CPU reads t2 (500 B) and its weights t3 (1000 B) and writes t4
    # (100 B): 1600 B at 1 MB/s = 1.6 ms on top of the 12.2 ms worked out above.
    cpu = dataclasses.replace(_CPU, memory_bytes_per_s=1e6)
    tpu = dataclasses.replace(_TPU, memory_bytes_per_s=None)
    model = CostModel(_two_op_graph(), [tpu, cpu], rnn_ms=0.5, window=(8, 2))
    stage = model.stage(1, 1, 2)
    assert stage.memory_bytes == 1600
    assert stage.compute_ms == pytest.approx(10.1 + 1.6)
    assert stage.total_ms == pytest.approx(12.2 + 1.6)
    assert model.matrix(1)[1, 2] == pytest.approx(13.8)
    # Both ops: 1000 + 3000 + 500 for op0, 1600 for op1.
    assert model.stage(1, 0, 2).memory_bytes == 6100
    # The TPU's ops do not touch host memory: its figures are the ones worked out above.
    assert model.stage(0, 0, 2).total_ms == pytest.approx(8.135)
    # Ops edgetpu_compiler leaves on the CPU pay it too.
    assert model.ops_ms(cpu, [1]) == pytest.approx(10.0 + 0.05 + 0.05 + 1.6)


def test_the_dev_boards_cpu_is_priced_at_a_sourced_memory_bandwidth():
    for name in ("devboard", "devboard-usb"):
        board = load_board(name)
        assert 1e9 < board.cpu.memory_bytes_per_s <= 12.8e9  # below the LPDDR4 peak
        assert "LPDDR4" in board.sources["cpu.memory_bytes_per_s"]
        assert all(t.memory_bytes_per_s is None for t in board.tpus)
