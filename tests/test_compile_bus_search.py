"""The partitioner with a shared bus: exact against brute force over cuts, TPU orders and the
bus on random boards (hypothesis), and where the latency tie-break needs the Pareto program.

Slower than the fast tier allows (brute force over 0-4 TPUs with hypothesis): the
hand-worked bus case is in test_compile_partitioner.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from edgecap_compile.partitioner import _TOLERANCE, evaluate, exhaustive, partition
from tests.test_compile_partitioner import _MS, _boards, _no_worse


@st.composite
def _bus_boards(draw):
    """``(tpus, costs, bus)``: random boards whose TPUs (some of them) share a bus."""
    tpus, costs = draw(_boards())
    n = costs[0].shape[0] - 1
    bus = []
    for d in range(tpus + 1):
        on_bus = d < tpus and draw(st.booleans())
        m = draw(hnp.arrays(np.float64, (n + 1, n + 1), elements=_MS)) if on_bus else \
            np.zeros((n + 1, n + 1))
        m[np.tril_indices(n + 1, -1)] = 0.0
        bus.append(m)
    return tpus, costs, bus


def _tiny_stage_board():
    """Hypothesis's case of a 1e-9 ms stage: latencies 1.25 and 1.25 + 1e-9 tie within the tolerance."""
    def upper(values):
        c = np.zeros((4, 4))
        c[np.tril_indices(4, -1)] = np.inf
        for (i, j), v in values.items():
            c[i, j] = v
        return c

    costs = [upper({}), upper({(1, 1): 1e-9}), upper({(0, 0): 1.5, (0, 1): 2.0, (1, 1): 1.25}),
             upper({(2, 3): 1.5, (3, 3): 1.5})]
    return 3, costs, [np.zeros((4, 4)) for _ in costs]


@settings(max_examples=200, deadline=None)
@given(_bus_boards())
@example(_tiny_stage_board())
def test_bus_search_equals_brute_force_over_every_order_and_cut(board):
    tpus, costs, bus = board
    ours, best = partition(costs, tpus, bus), exhaustive(costs, tpus, bus)
    # Equal up to the search's own tolerance (stage times that close count as ties): hypothesis
    # found a 1e-9 ms stage that made two latencies differ by 8e-10 relative, inside it.
    assert ours.bottleneck_ms == pytest.approx(best.bottleneck_ms, rel=_TOLERANCE)
    assert ours.latency_ms == pytest.approx(best.latency_ms, rel=_TOLERANCE)
    assert ours == evaluate(costs, ours.cuts, ours.order, bus)
    # No order beats the search, the bus counted in every one.
    for head in itertools.permutations(range(tpus)):
        order = (*head, tpus)
        fixed = partition([costs[d] for d in order], 0, [bus[d] for d in order])
        brute = exhaustive([costs[d] for d in order], 0, [bus[d] for d in order])
        assert fixed.bottleneck_ms == pytest.approx(brute.bottleneck_ms, rel=_TOLERANCE)
        assert fixed.latency_ms == pytest.approx(brute.latency_ms, rel=_TOLERANCE)
        assert _no_worse(ours, fixed)


def test_bus_latency_tie_break_is_exact_where_the_fastest_chain_overloads_the_bus():
    # Small integer costs make many partitions share the bottleneck; in some of
    # them the fastest chain within it overloads the bus, and only the Pareto
    # program over (latency, bus time) finds the fastest one that does not.
    from edgecap_compile import partitioner

    rng = np.random.default_rng(1)
    overloaded = 0
    for trial in range(60):
        n, tpus = int(rng.integers(2, 5)), int(rng.integers(1, 3))
        costs, bus = [], []
        for d in range(tpus + 1):
            c = rng.integers(0, 10, size=(n + 1, n + 1)).astype(float)
            c[np.tril_indices(n + 1, -1)] = np.inf
            m = rng.integers(0, 10, size=(n + 1, n + 1)).astype(float) * (d < tpus)
            m[np.tril_indices(n + 1, -1)] = 0.0
            costs.append(c)
            bus.append(m)
        limit = partitioner._bus_bottleneck(costs, bus)
        overloaded += evaluate(costs, partitioner._min_latency(costs, limit), bus=bus).bus_ms > limit
        ours, best = partition(costs, tpus, bus), exhaustive(costs, tpus, bus)
        assert ours.bottleneck_ms == best.bottleneck_ms, trial
        assert ours.latency_ms == best.latency_ms, trial
    assert overloaded >= 5
