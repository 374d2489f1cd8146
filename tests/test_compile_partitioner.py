"""Partitioner: exact against brute force over cuts and TPU orders, tie-break by latency,
empty stages, baselines."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from edgecap_lab import compile_benchmark as benchmark
from edgecap_compile.boards import load_board
from edgecap_compile.cost_model import CostModel
from edgecap_compile.graph import read_graph
from edgecap_compile.partitioner import (balanced_tpu_split, equal_param_split, evaluate,
                                         exhaustive, orders, partition, whole_on_one_tpu)

DATA = Path(__file__).parent / "data" / "compile"


def _random_costs(rng, n: int, stages: int):
    costs = []
    for _ in range(stages):
        c = np.triu(rng.uniform(0.0, 10.0, size=(n + 1, n + 1)), 1)  # not monotone in range
        c[np.arange(n + 1), np.arange(n + 1)] = rng.choice([0.0, 1.5])
        c[np.tril_indices(n + 1, -1)] = np.inf
        costs.append(c)
    return costs


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_dynamic_program_equals_brute_force_on_random_costs(stages):
    rng = np.random.default_rng(stages)
    for trial in range(40):
        costs = _random_costs(rng, int(rng.integers(1, 9)), stages)
        ours, best = partition(costs), exhaustive(costs)
        assert ours.bottleneck_ms == pytest.approx(best.bottleneck_ms, rel=1e-12), trial
        assert ours.latency_ms == pytest.approx(best.latency_ms, rel=1e-12), trial
        assert ours.cuts[0] == 0 and ours.cuts[-1] == costs[0].shape[0] - 1
        assert list(ours.cuts) == sorted(ours.cuts)


def test_latency_breaks_bottleneck_ties_even_when_the_prefix_is_worse():
    # Stage 2 is 8 ms wherever it starts; a prefix ending at op 2 has bottleneck 6,
    # latency 6, ending at op 1 bottleneck 5, latency 10. Only the second pass sees
    # that 6 is as good as 5 under the final bottleneck of 8.
    inf = np.inf
    s0 = np.array([[0, 5, 6], [inf, 0, 9], [inf, inf, 0]], dtype=float)
    s1 = np.array([[0, 9, 9], [inf, 0, 5], [inf, inf, 0]], dtype=float)
    s2 = np.array([[8, 9, 9], [inf, 8, 9], [inf, inf, 8]], dtype=float)
    best = partition([s0, s1, s2])
    assert best.bottleneck_ms == 8 and best.latency_ms == 14
    assert best.cuts == (0, 2, 2, 2)
    assert best == exhaustive([s0, s1, s2])


@pytest.mark.parametrize("tpus", [0, 1, 2, 3])
def test_optimal_on_real_cost_model_for_any_number_of_tpus(tpus):
    graph = read_graph(DATA / "tiny_inception.tflite")
    board = load_board("devboard-usb").with_tpus(tpus).with_sram(20_000)
    model = CostModel(graph, [*board.tpus, board.cpu], rnn_ms=0.3)
    costs = [model.matrix(k) for k in range(tpus + 1)]
    ours, best = partition(costs), exhaustive(costs)
    assert ours.bottleneck_ms == pytest.approx(best.bottleneck_ms, rel=1e-12)
    assert ours.latency_ms == pytest.approx(best.latency_ms, rel=1e-12)
    if tpus == 0:
        assert ours.cuts == (0, len(graph.ops))


def test_a_slow_cpu_gets_an_empty_stage():
    graph = read_graph(DATA / "tiny_mobilenet.tflite")
    board = load_board("devboard")
    model = CostModel(graph, [*board.tpus, board.cpu], rnn_ms=2.0)
    split = partition([model.matrix(0), model.matrix(1)])
    assert split.ranges[-1][0] == split.ranges[-1][1]  # CPU runs no CNN op
    assert split.stage_ms[-1] == pytest.approx(2.0)  # but still carries the RNN step


def test_equal_param_split_balances_parameter_bytes():
    graph = read_graph(DATA / "tiny_densenet.tflite")
    board = load_board("devboard-usb")
    model = CostModel(graph, [*board.tpus, board.cpu])
    costs = [model.matrix(k) for k in range(3)]
    prefix = np.array([model.param_bytes(0, i) for i in range(len(graph.ops) + 1)])
    split = equal_param_split(costs, prefix, 2)
    a, b, c = (model.param_bytes(s, e) for s, e in split.ranges)
    assert c == 0 and split.ranges[-1] == (len(graph.ops), len(graph.ops))
    # The cut is where the halves are closest: moving it either way is no better.
    cut = split.cuts[1]
    for other in (cut - 1, cut + 1):
        assert abs(a - b) <= abs(2 * model.param_bytes(0, other) - prefix[-1])
    assert split == evaluate(costs, split.cuts)


def test_unneeded_stages_are_the_last_ones():
    n = 4
    a, b = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    # Cutting costs 0.5 ms of transfer on each side: one stage is best, any one.
    same = np.where(b > a, 1.0 + 0.01 * (b - a) + 0.5 * (a > 0) + 0.5 * (b < n), 0.0)
    same[b < a] = np.inf
    split = partition([same, same.copy(), same.copy()])
    assert split.cuts == (0, 4, 4, 4)
    assert split.bottleneck_ms == pytest.approx(1.04)


# Quarters give exact ties (empty stages, equal TPUs); floats give the rest.
_MS = st.one_of(st.integers(0, 40).map(lambda v: v / 4), st.floats(0.0, 10.0))


@st.composite
def _boards(draw, most=4, ms=_MS, ops=6):
    """``(tpus, costs)``: random non-monotone matrices for 0-``most`` TPUs and the CPU, some TPUs
    equal, 1-``ops`` ops (2 fewer with 4 TPUs), each time drawn from ``ms``."""
    tpus = draw(st.integers(0, most))
    n = draw(st.integers(1, ops - 2 if tpus == 4 else ops))
    costs = []
    for d in range(tpus + 1):
        if 0 < d < tpus and draw(st.booleans()):
            costs.append(costs[draw(st.integers(0, d - 1))].copy())  # two identical accelerators
            continue
        c = draw(hnp.arrays(np.float64, (n + 1, n + 1), elements=ms))
        c[np.tril_indices(n + 1, -1)] = np.inf
        costs.append(c)
    return tpus, costs


def _no_worse(a, b) -> bool:
    # (bottleneck, latency) of a is at most b's, up to the partitioner's tolerance.
    if a.bottleneck_ms < b.bottleneck_ms * (1 - 1e-9):
        return True
    return (a.bottleneck_ms <= b.bottleneck_ms * (1 + 1e-9)
            and a.latency_ms <= b.latency_ms + 1e-9 * max(1.0, b.latency_ms))


@settings(max_examples=150, deadline=None)
@given(_boards())
def test_order_search_equals_brute_force_over_every_order_and_cut(board):
    tpus, costs = board
    ours, best = partition(costs, tpus), exhaustive(costs, tpus)
    assert ours.bottleneck_ms == pytest.approx(best.bottleneck_ms, rel=1e-12)
    assert ours.latency_ms == pytest.approx(best.latency_ms, rel=1e-12)
    assert ours == evaluate(costs, ours.cuts, ours.order)
    assert sorted(ours.order[:tpus]) == list(range(tpus)) and ours.order[tpus:] == (tpus,)
    # Every fixed order: the single-order DP is exact there, and no order beats the search.
    for head in itertools.permutations(range(tpus)):
        ordered = [costs[d] for d in (*head, tpus)]
        fixed, brute = partition(ordered), exhaustive(ordered)
        assert fixed.bottleneck_ms == pytest.approx(brute.bottleneck_ms, rel=1e-12)
        assert fixed.latency_ms == pytest.approx(brute.latency_ms, rel=1e-12)
        assert _no_worse(ours, fixed)


def test_orders_skip_swaps_of_identical_tpus_only():
    a, b, cpu = (np.full((3, 3), v) for v in (1.0, 2.0, 3.0))
    assert orders([a, b, cpu], 2) == [(0, 1, 2), (1, 0, 2)]
    assert orders([a, a.copy(), cpu], 2) == [(0, 1, 2)]
    assert orders([a, b, a.copy(), cpu], 3) == [(0, 1, 2, 3), (0, 2, 1, 3), (1, 0, 2, 3)]
    assert orders([cpu], 0) == [(0,)]


def _faster_second_tpu():
    # devboard-usb whose PCIe TPU computes at a hundredth of the USB one's rate
    # and whose CPU is slow (on the real profiles the tiny fixtures are best on
    # the CPU): the order the profile lists the TPUs in is the worse one.
    board = load_board("devboard-usb").with_sram(20_000)
    slow = dataclasses.replace(board.tpus[0], macs_per_s=board.tpus[1].macs_per_s / 100,
                               elements_per_s=board.tpus[1].elements_per_s / 100)
    return board.with_device(slow).with_device(dataclasses.replace(board.cpu, macs_per_s=1e8))


def test_a_faster_tpu_later_in_the_profile_runs_first():
    graph = read_graph(DATA / "tiny_inception.tflite")
    board = _faster_second_tpu()
    model = CostModel(graph, [*board.tpus, board.cpu], rnn_ms=0.3)
    costs = [model.matrix(k) for k in range(3)]
    ours, fixed = partition(costs, tpus=2), partition(costs)
    assert ours.order == (1, 0, 2)
    assert ours.bottleneck_ms < fixed.bottleneck_ms * (1 - 1e-6)
    assert ours == exhaustive(costs, tpus=2)
    # The stage order's own cost model prices the same stages.
    staged = model.in_order(ours.order)
    assert [staged.stage(k, a, b).total_ms for k, (a, b) in enumerate(ours.ranges)] == \
        pytest.approx(ours.stage_ms, rel=1e-12)


@pytest.mark.parametrize("fixture", ["tiny_mobilenet", "tiny_inception", "tiny_densenet"])
@pytest.mark.parametrize("board_name", ["devboard-usb", "rpi4-2usb"])
@pytest.mark.parametrize("tpus", [1, 2, 3])
def test_search_and_brute_force_agree_on_benchmark_boards(fixture, board_name, tpus,
                                                           shipped_bundle):
    # The benchmark's rows on its boards and window, with the demo RNN step on the
    # CPU; a small cache makes the fixtures stream as the benchmark's CNNs do.
    from edgecap_compile.compiler import rnn_step_ms

    graph = read_graph(DATA / f"{fixture}.tflite")
    board = load_board(board_name).with_tpus(tpus).with_sram(20_000)
    # TPUs that differ, as on devboard-usb, the profile's first the slower.
    slower = dataclasses.replace(board.tpus[0], link_bytes_per_s=board.tpus[0].link_bytes_per_s / 4)
    board = board.with_device(slower)
    rnn = rnn_step_ms(shipped_bundle / "rnn_encoder_step.tflite", board)
    model = CostModel(graph, [*board.tpus, board.cpu], rnn, window=benchmark.WINDOW)
    costs = [model.matrix(k) for k in range(tpus + 1)]
    bus = model.bus_matrices(board.buses)  # rpi4-2usb's VL805 lane
    assert (bus is not None) == (board_name == "rpi4-2usb")
    ours, best = partition(costs, tpus, bus), exhaustive(costs, tpus, bus)
    assert ours.bottleneck_ms == pytest.approx(best.bottleneck_ms, rel=1e-12)
    assert ours.latency_ms == pytest.approx(best.latency_ms, rel=1e-12)
    prefix = np.array([model.param_bytes(0, i) for i in range(len(graph.ops) + 1)])
    for baseline in (equal_param_split(costs, prefix, tpus, bus), whole_on_one_tpu(costs, tpus, bus),
                     balanced_tpu_split(costs, tpus, bus)):
        assert _no_worse(ours, baseline)


def test_baselines_take_their_best_tpu_order():
    graph = read_graph(DATA / "tiny_densenet.tflite")
    board = _faster_second_tpu()
    model = CostModel(graph, [*board.tpus, board.cpu], rnn_ms=0.2)
    costs = [model.matrix(k) for k in range(3)]
    n = len(graph.ops)
    prefix = np.array([model.param_bytes(0, i) for i in range(n + 1)])
    equal = equal_param_split(costs, prefix, 2)
    assert equal == min((evaluate(costs, equal.cuts, o) for o in [(0, 1, 2), (1, 0, 2)]),
                        key=lambda p: (p.bottleneck_ms, p.latency_ms))
    one = whole_on_one_tpu(costs, 2)
    assert one.cuts == (0, n, n, n) and one.order == (1, 0, 2)  # the fast TPU alone
    assert one.bottleneck_ms < evaluate(costs, (0, n, n, n)).bottleneck_ms


def test_balanced_split_keeps_every_op_on_the_tpus_and_balances_them():
    graph = read_graph(DATA / "tiny_inception.tflite")
    board = _faster_second_tpu()
    model = CostModel(graph, [*board.tpus, board.cpu], rnn_ms=0.3)
    costs = [model.matrix(k) for k in range(3)]
    n = len(graph.ops)
    split = balanced_tpu_split(costs, 2)
    assert split.ranges[-1] == (n, n) and split.stage_ms[-1] == pytest.approx(0.3)
    # Brute force over the TPU cuts and orders: no TPU-only split has a smaller
    # TPU bottleneck.
    tpu_bottleneck = max(split.stage_ms[:2])
    for order in [(0, 1, 2), (1, 0, 2)]:
        for cut in range(n + 1):
            other = evaluate(costs, (0, cut, n, n), order)
            assert tpu_bottleneck <= max(other.stage_ms[:2]) * (1 + 1e-9)
    assert _no_worse(partition(costs, 2), split)


def test_an_unneeded_tpu_is_left_empty_at_the_end_of_the_chain():
    graph = read_graph(DATA / "tiny_inception.tflite")
    board = _faster_second_tpu()
    useless = dataclasses.replace(board.tpus[0], macs_per_s=1e6, elements_per_s=1e6)
    model = CostModel(graph, [useless, board.tpus[1], board.cpu], rnn_ms=0.3)
    costs = [model.matrix(k) for k in range(3)]
    fixed, ours = partition(costs), partition(costs, tpus=2)
    assert fixed.ranges[0] == (0, 0)  # in the profile's order the useless TPU leads, empty
    assert ours.order == (1, 0, 2) and ours.ranges[1][0] == ours.ranges[1][1]
    assert ours.bottleneck_ms == fixed.bottleneck_ms and ours.latency_ms == fixed.latency_ms


def test_a_busy_bus_is_the_bottleneck_and_moves_the_cut():
    # Two TPUs on one bus: without it one op on each TPU gives 2 ms, but each
    # op's link traffic takes 6 ms of the bus. Best: one op on a TPU, one on
    # the CPU (5 ms), the bus (6 ms) setting the period.
    inf = np.inf
    tpu = np.array([[0, 2, 4], [inf, 0, 2], [inf, inf, 0]], dtype=float)
    cpu = np.array([[0, 5, 10], [inf, 0, 5], [inf, inf, 0]], dtype=float)
    on_bus = np.array([[0, 6, 12], [0, 0, 6], [0, 0, 0]], dtype=float)
    costs, bus = [tpu, tpu.copy(), cpu], [on_bus, on_bus.copy(), np.zeros((3, 3))]
    free, bound = partition(costs, 2), partition(costs, 2, bus)
    assert free.bottleneck_ms == 2 and free.bus_ms == 0
    assert bound.bottleneck_ms == 6.0 and bound.bus_bound and max(bound.stage_ms) == 5.0
    assert bound.stage_ms[bound.bottleneck_stage] == 2.0  # the stage that uses the bus
    assert bound == exhaustive(costs, 2, bus)

