"""Partitioner: exact against brute force, tie-break by latency, empty stages, baselines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgecap_compile.boards import load_board
from edgecap_compile.cost_model import CostModel
from edgecap_compile.graph import read_graph
from edgecap_compile.partitioner import equal_param_split, evaluate, exhaustive, partition

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
