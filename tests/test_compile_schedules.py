"""The schedule search (pipelines, copies, hybrids) against brute force, and what it picks for the demo."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from edgecap.plans.plan import CpuFrame
from edgecap_compile import schedules
from edgecap_compile.boards import load_board
from edgecap_compile.compiler import rnn_step_ms
from edgecap_compile.cost_model import CostModel
from edgecap_compile.graph import read_graph
from edgecap_compile.partitioner import partition
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tests.test_compile_partitioner import _boards as partitioner_boards, _no_worse

# Stage times as the partitioner's tests draw them, without subnormal numbers: a copy's
# rate 1 / t overflows there, which no cost model's time comes near.
_MS = st.one_of(st.integers(0, 40).map(lambda v: v / 4), st.floats(0.0, 10.0, allow_subnormal=False))


def _boards(most=4):
    """``(tpus, costs)``: the partitioner's random boards, up to 5 ops, no subnormal times."""
    return partitioner_boards(most=most, ms=_MS, ops=5)


@st.composite
def _bus_boards(draw, most=3):
    """``(tpus, costs, bus)``: random boards whose TPUs (some of them) share a bus."""
    tpus, costs = draw(_boards(most))
    n = costs[0].shape[0] - 1
    bus = []
    for d in range(tpus + 1):
        m = draw(hnp.arrays(np.float64, (n + 1, n + 1), elements=_MS)) if d < tpus and draw(st.booleans()) \
            else np.zeros((n + 1, n + 1))
        m[np.tril_indices(n + 1, -1)] = 0.0
        bus.append(m)
    return tpus, costs, bus


def _same(a, b):
    assert a.bottleneck_ms == pytest.approx(b.bottleneck_ms, rel=1e-9, abs=1e-12)
    assert a.latency_ms == pytest.approx(b.latency_ms, rel=1e-9, abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(_boards())
def test_the_search_equals_brute_force_over_groups_cuts_and_cpu_copies(board):
    tpus, costs = board
    ours = schedules.search(costs, tpus)
    _same(ours, schedules.exhaustive(costs, tpus))
    # Never worse than the best pipeline, which it returns on a tie.
    pipe = partition(costs, tpus)
    assert _no_worse(ours, pipe)
    if not ours.replicated:
        assert ours == pipe


@settings(max_examples=100, deadline=None)
@given(_bus_boards())
def test_the_search_equals_brute_force_with_a_shared_bus(board):
    tpus, costs, bus = board
    _same(schedules.search(costs, tpus, bus), schedules.exhaustive(costs, tpus, bus))


_FRAMES = st.builds(CpuFrame, _MS, st.one_of(st.just(0.0), _MS))


@settings(max_examples=120, deadline=None)
@given(_bus_boards(), _FRAMES, st.booleans())
def test_the_search_equals_brute_force_with_the_cpus_own_work_a_frame(board, frame, shared):
    # The CPU pays preprocessing and a hand-off per stage that takes ops: the stage count
    # is part of the price, so an idle TPU is cheaper than an empty stage that takes no op.
    tpus, costs, bus = board
    bus = bus if shared else None
    for c in [*costs[:tpus], *(bus or [])]:  # as in every cost model, a TPU stage that takes no op
        np.fill_diagonal(c, 0.0)                # takes no time and moves no bytes
    ours = schedules.search(costs, tpus, bus, frame=frame)
    _same(ours, schedules.exhaustive(costs, tpus, bus, frame=frame))
    # Pipelines only: the brute force over pipelines (no group of several TPUs, no CPU copy).
    pipes = schedules.search(costs, tpus, bus, frame=frame, copies=False)
    assert not pipes.replicated and _no_worse(ours, pipes)
    if not frame.handoff_ms:
        assert pipes == partition(schedules._on_cpu(costs, frame.preprocess_ms), tpus, bus)


def test_hand_offs_leave_a_tpu_idle_where_its_stage_would_cost_the_cpu_more():
    inf = np.inf
    tpu = np.array([[0, 1.0, 2.0], [inf, 0, 1.0], [inf, inf, 0]])
    cpu = np.array([[0.1, 3.0, 6.0], [inf, 0.1, 3.0], [inf, inf, 0.1]])
    # Pipelines: two TPU stages (1 ms each) beat one (2 ms) when hand-offs are free; at 0.7 ms a
    # hand-off the CPU pays 0.1 + 3 x 0.7 = 2.2 ms for the split, 0.1 + 2 x 0.7 = 1.5 for one TPU stage.
    assert schedules.search([tpu, tpu, cpu], 2, copies=False).bottleneck_ms == pytest.approx(1.0)
    found = schedules.search([tpu, tpu, cpu], 2, copies=False, frame=CpuFrame(0.0, 0.7))
    assert found.bottleneck_ms == pytest.approx(2.0) and found.stage_ms[-1] == pytest.approx(1.5)
    # The idle TPU is an empty stage before the CPU, as the partitioner leaves one.
    assert found.ranges == ((0, 2), (2, 2), (2, 2)) and found.order == (0, 1, 2)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(_bus_boards(most=4))
def test_the_search_equals_brute_force_with_a_shared_bus_on_four_tpus(board):
    tpus, costs, bus = board
    _same(schedules.search(costs, tpus, bus), schedules.exhaustive(costs, tpus, bus))


def test_ordered_groups_are_the_ordered_set_partitions():
    # Fubini numbers: 1, 3, 13, 75 ordered set partitions of 1-4 TPUs.
    assert [len(list(schedules.ordered_groups(t))) for t in (1, 2, 3, 4)] == [1, 3, 13, 75]
    assert set(schedules.ordered_groups(2)) == {((0,), (1,)), ((1,), (0,)), ((0, 1),)}


def test_a_group_of_copies_sustains_the_sum_of_their_rates():
    inf = np.inf
    a = np.array([[0, 2.0], [inf, 0]])
    b = np.array([[0, 6.0], [inf, 0]])
    period, latency, moved = schedules.group_matrices([a, b], (0, 1), [np.full((2, 2), 1.0), np.full((2, 2), 3.0)])
    assert period[0, 1] == pytest.approx(1 / (1 / 2 + 1 / 6))  # 1.5 ms a frame
    assert latency[0, 1] == 6.0  # a frame passes one copy: the slowest bounds it
    assert moved[0, 1] == pytest.approx(0.75 * 1 + 0.25 * 3)  # each copy's bus time for its share
    assert period[0, 0] == 0 and latency[0, 0] == 0 and period[1, 0] == inf
    assert schedules.shares_of([a, b], (0, 1), 0, 1) == pytest.approx((0.75, 0.25))


def test_the_cpu_takes_whole_frames_only_where_it_has_time_beside_the_rnn():
    inf = np.inf
    tpu = np.array([[0, 2.0], [inf, 0]])
    cpu = lambda rnn: np.array([[rnn, 8.0 + rnn], [inf, rnn]])
    found = schedules.cpu_copies([tpu, cpu(0.5)], (0,))
    # TPU 2 ms a frame alone; with the CPU (8 ms a frame plus 0.5 ms of RNN every frame):
    # P = (c + r) / (c / t + 1) = 8.5 / 5 = 1.7 ms, the CPU's load s c + r = P.
    assert found.bottleneck_ms == pytest.approx(1.7)
    (tpu_share, cpu_share), _ = found.shares
    assert tpu_share * 2.0 == pytest.approx(1.7) and cpu_share * 8.0 + 0.5 == pytest.approx(1.7)
    assert schedules.cpu_copies([tpu, cpu(2.5)], (0,)) is None  # the RNN alone is over 2 ms


@pytest.fixture(scope="module")
def demo_costs():
    from pathlib import Path

    from edgecap_compile.model_source import resolve_source

    source = resolve_source(Path(__file__).resolve().parents[1] / "models" / "demo" / "bundle")
    graph = read_graph(source.encoder)

    def costs(name, tpus=None):
        board = load_board(name)
        board = board if tpus is None else board.with_tpus(tpus)
        model = CostModel(graph, [*board.tpus, board.cpu], rnn_step_ms(source.rnn_step, board),
                          window=source.window)
        return [model.matrix(k) for k in range(len(model.devices))], len(board.tpus), \
            model.bus_matrices(board.buses)

    # The board CPU's own work a frame for the demo's input.
    costs.frame = lambda name: CostModel(graph, [load_board(name).cpu]).cpu_frame
    return costs


@pytest.mark.slow
@pytest.mark.parametrize("board, tpus", [("devboard", None), ("devboard-usb", None), ("rpi4-2usb", None),
                                         ("rpi5-dualtpu", None), ("pc-4tpu-pcie", 2), ("rpi4-2usb", 3)])
def test_the_search_equals_brute_force_on_the_demo_encoder(demo_costs, board, tpus):
    costs, n_tpus, bus = demo_costs(board, tpus)
    _same(schedules.search(costs, n_tpus, bus), schedules.exhaustive(costs, n_tpus, bus))
    # With the board CPU's own work a frame, as `edgecap compile` searches it.
    frame = demo_costs.frame(board)
    assert frame.handoff_ms > 0
    _same(schedules.search(costs, n_tpus, bus, frame=frame), schedules.exhaustive(costs, n_tpus, bus, frame=frame))


def test_copies_beat_the_pipeline_for_the_demo_on_two_tpus(demo_costs):
    for board in ("devboard-usb", "rpi4-2usb"):
        costs, tpus, bus = demo_costs(board)
        ours, pipe = schedules.search(costs, tpus, bus), partition(costs, tpus, bus)
        assert ours.replicated and ours.bottleneck_ms < pipe.bottleneck_ms / 1.7
        copies = schedules.whole_model_copies(costs, tpus, bus)
        slowest = schedules.replicate_slowest(costs, tpus, bus)
        assert ours.bottleneck_ms <= min(copies.bottleneck_ms, slowest.bottleneck_ms) * (1 + 1e-9)
