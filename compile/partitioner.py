"""The partitioner: cut an op chain into pipeline stages with the smallest bottleneck.

``costs[d][a, b]`` is device d's time for ops ``[a, b)`` (inf where a > b); the
devices are the board's TPUs, then the CPU. A plan runs the devices along the
chain in some order, the CPU last, and gives each a contiguous op range (empty
ones included). For one order the exact optimum is found in two dynamic
programs: the first finds the smallest bottleneck B*, the second the smallest
end-to-end latency among the partitions whose every stage fits in B*. (One
lexicographic program would not be exact: a prefix with a worse bottleneck but
a better latency can win once a later stage dominates.) TPUs differ (a PCIe
and a USB one have different link rates), so the order matters too: every
order of the TPUs is searched (a board has at most a few, 4! = 24 orders) and
the best (bottleneck, latency) of the per-order optima is the optimum over
orders and cuts together, as the minimum over a union of sets is the minimum
of their minima.

A shared bus (the one PCIe lane two USB 3 ports or a PCIe switch sit behind)
bounds the period too: ``bus[d][a, b]`` is the milliseconds device d's link
bytes for ops ``[a, b)`` take on the bus (0 off the bus), and the bus's total
over the stages is one more term of the bottleneck. For one order the exact
optimum then takes more than two programs (``_bus_bottleneck``,
``_bus_latency``).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

# Stage times within this relative distance of the bottleneck count as equal to it.
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Partition:
    """Cut points, the device of each stage and the resulting stage times.

    Attributes:
      cuts: ``K + 1`` op boundaries, ``0 = cuts[0] <= ... <= cuts[K] = n``; stage k
        runs ops ``[cuts[k], cuts[k+1])``.
      stage_ms: Predicted time of each stage.
      order: Stage k runs on device ``order[k]`` (an index into ``costs``).
      bus_stage_ms: Milliseconds each stage's link bytes take on the shared
        bus, per frame (0 off the bus); empty without a bus.
      copies: Per stage, the other devices that run copies of it
        (``edgecap_compile.schedules``); empty: every stage on one device.
      shares: Per stage, the share of frames ``order[k]`` and each of its
        copies take; empty with ``copies``.
      stage_latency_ms: Per stage, the time a frame takes to pass it where
        that differs from ``stage_ms`` (a replicated stage's slowest copy);
        empty: ``stage_ms``.
    """

    cuts: Tuple[int, ...]
    stage_ms: Tuple[float, ...]
    order: Tuple[int, ...]
    bus_stage_ms: Tuple[float, ...] = ()
    copies: Tuple[Tuple[int, ...], ...] = ()
    shares: Tuple[Tuple[float, ...], ...] = ()
    stage_latency_ms: Tuple[float, ...] = ()

    @property
    def bus_ms(self) -> float:
        """The shared bus's busy milliseconds per frame: it bounds the period like a stage."""
        return float(sum(self.bus_stage_ms))

    @property
    def bottleneck_ms(self) -> float:
        return max(max(self.stage_ms), self.bus_ms)

    @property
    def bus_bound(self) -> bool:
        """Whether the shared bus, not a stage, sets the period."""
        return self.bus_ms > max(self.stage_ms)

    @property
    def bottleneck_stage(self) -> int:
        """The slowest stage; when the bus binds, the stage that moves the most bytes over it."""
        return int(np.argmax(self.bus_stage_ms if self.bus_bound else self.stage_ms))

    @property
    def latency_ms(self) -> float:
        return float(sum(self.stage_latency_ms or self.stage_ms))

    @property
    def replicated(self) -> bool:
        """Whether some stage runs as several copies."""
        return any(self.copies)

    @property
    def ranges(self) -> Tuple[Tuple[int, int], ...]:
        return tuple(zip(self.cuts[:-1], self.cuts[1:]))


Bus = Optional[Sequence[np.ndarray]]


def evaluate(costs: Sequence[np.ndarray], cuts: Sequence[int],
             order: Optional[Sequence[int]] = None, bus: Bus = None,
             latency: Optional[Sequence[np.ndarray]] = None) -> Partition:
    """Returns the partition with the given cut points and device order under ``costs``.

    Args:
      costs: One ``(n+1, n+1)`` matrix per device.
      cuts: ``len(costs) + 1`` op boundaries.
      order: Device of each stage (default: device k runs stage k).
      bus: One matrix per device of its bus milliseconds (zeros off the bus), or None.
      latency: One matrix per device of the time a frame takes to pass it,
        where that differs from its period (``costs``); None: ``costs``.

    Returns:
      The ``Partition``.
    """
    cuts = tuple(int(c) for c in cuts)
    order = tuple(range(len(costs))) if order is None else tuple(int(d) for d in order)
    ranges = list(zip(order, cuts, cuts[1:]))
    return Partition(cuts, tuple(float(costs[d][a, b]) for d, a, b in ranges), order,
                     () if bus is None else tuple(float(bus[d][a, b]) for d, a, b in ranges),
                     stage_latency_ms=() if latency is None else tuple(float(latency[d][a, b])
                                                                       for d, a, b in ranges))


def _better(candidate: Partition, best: Partition) -> bool:
    # Smaller bottleneck (beyond the tolerance), else smaller latency.
    b, best_b = candidate.bottleneck_ms, best.bottleneck_ms
    return b < best_b * (1 - _TOLERANCE) or (
        b <= best_b * (1 + _TOLERANCE) and candidate.latency_ms < best.latency_ms)


def _tied(a: Partition, b: Partition) -> bool:
    # Equal bottleneck and latency, up to the tolerance.
    return (abs(a.bottleneck_ms - b.bottleneck_ms) <= _TOLERANCE * b.bottleneck_ms
            and abs(a.latency_ms - b.latency_ms) <= _TOLERANCE * b.latency_ms)


def _empty_stages(p: Partition) -> Tuple[bool, ...]:
    return tuple(a == b for a, b in p.ranges)


def orders(costs: Sequence[np.ndarray], tpus: int) -> List[Tuple[int, ...]]:
    """Returns the device orders worth searching: every order of the first ``tpus`` devices.

    The devices after them (the CPU) keep their places. Of orders that differ
    only by swapping devices with equal cost matrices (two identical USB
    accelerators) only the first is kept: they give the same partitions.

    Args:
      costs: One matrix per device, the ``tpus`` TPUs first.
      tpus: How many leading devices may be reordered.

    Returns:
      Orders in ``itertools.permutations`` order, the given order first.
    """
    same = [next(j for j in range(i + 1) if np.array_equal(costs[i], costs[j]))
            for i in range(tpus)]
    seen = set()
    out = []
    for head in itertools.permutations(range(tpus)):
        key = tuple(same[d] for d in head)
        if key not in seen:
            seen.add(key)
            out.append(head + tuple(range(tpus, len(costs))))
    return out


def best_order(costs: Sequence[np.ndarray], tpus: int,
               split: Callable[[List[np.ndarray], Bus], Partition], bus: Bus = None) -> Partition:
    """Applies a split rule on every order of the TPUs and keeps the best result.

    Args:
      costs: One matrix per device, the ``tpus`` TPUs first, then the CPU.
      tpus: How many leading devices may be reordered.
      split: Takes the cost and bus matrices in one stage order and returns
        its partition (with ``order`` relative to that list).
      bus: Bus matrices per device, as for ``evaluate``.

    Returns:
      The partition with the smallest (bottleneck, latency), ``order`` naming
      devices of ``costs``. Among ties the one whose empty stages come last
      (an unused TPU leads no chain: an empty stage costs the same anywhere
      under the cost model), then the first order of ``orders``.
    """
    best = None
    for order in orders(costs if bus is None else [np.stack(pair) for pair in zip(costs, bus)],
                        tpus):
        found = split([costs[d] for d in order], None if bus is None else [bus[d] for d in order])
        found = dataclasses.replace(found, order=tuple(order[d] for d in found.order))
        if best is None or (_empty_stages(found) < _empty_stages(best) if _tied(found, best)
                            else _better(found, best)):
            best = found
    return best


def _backtrack(choice: Sequence[np.ndarray], n: int) -> Tuple[int, ...]:
    cuts = [n]
    for k in range(len(choice) - 1, -1, -1):
        cuts.append(int(choice[k][cuts[-1]]))
    return tuple(reversed(cuts))


def _stage_bottleneck(costs: Sequence[np.ndarray]) -> float:
    # best[b] = smallest bottleneck of stages 0..k covering ops [0, b).
    n = costs[0].shape[0] - 1
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for c in costs:
        best = np.min(np.maximum(best[:, None], c), axis=0)
    return float(best[n])


def _min_latency(costs: Sequence[np.ndarray], limit: float,
                 through: Optional[Sequence[np.ndarray]] = None) -> Tuple[int, ...]:
    # Cuts of the smallest latency (``through``, default the costs) with every stage within limit.
    n = costs[0].shape[0] - 1
    latency = np.full(n + 1, np.inf)
    latency[0] = 0.0
    choice = []
    for c, t in zip(costs, costs if through is None else through):
        total = latency[:, None] + np.where(c <= limit, t, np.inf)
        # The last start among exact ties: later stages take as few ops as they
        # can, so the TPUs a model does not need are the last ones.
        choice.append(n - np.argmin(total[::-1], axis=0))
        latency = np.min(total, axis=0)
    return _backtrack(choice, n)


def _min_bus(costs: Sequence[np.ndarray], bus: Sequence[np.ndarray], s: float) -> float:
    # f(s): the least bus time of a partition whose every stage is within s.
    n = costs[0].shape[0] - 1
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for c, m in zip(costs, bus):
        best = np.min(best[:, None] + np.where(c <= s, m, np.inf), axis=0)
    return float(best[n])


def _bus_bottleneck(costs: Sequence[np.ndarray], bus: Sequence[np.ndarray]) -> float:
    """Returns the smallest max(stage bottleneck, bus time) over the partitions of one order.

    The optimum P* has stage bottleneck s* among the finite matrix entries,
    and f(s*) <= bus(P*), so g(s) = max(s, f(s)) over those entries reaches
    it, and each g(s) is reached by the partition f(s) came from. f does not
    increase with s: g is f left of the first entry where f(s) <= s and s from
    there on, so its minimum is min(that entry, f(entry before)), found by
    binary search in O(K n^2 log n).
    """
    floor = _stage_bottleneck(costs)
    if _min_bus(costs, bus, floor) <= floor:
        return floor
    values = np.unique(np.concatenate([c[np.isfinite(c)] for c in costs]))
    values = values[values >= floor]
    lo, hi = 0, len(values) - 1
    if _min_bus(costs, bus, values[hi]) > values[hi]:
        return _min_bus(costs, bus, values[hi])
    while hi - lo > 1:  # f(values[lo]) > values[lo], f(values[hi]) <= values[hi]
        mid = (lo + hi) // 2
        if _min_bus(costs, bus, values[mid]) <= values[mid]:
            hi = mid
        else:
            lo = mid
    return min(float(values[hi]), _min_bus(costs, bus, values[lo]))


def _bus_latency(costs: Sequence[np.ndarray], bus: Sequence[np.ndarray],
                 limit: float, through: Optional[Sequence[np.ndarray]] = None) -> Tuple[int, ...]:
    """Returns the cuts of the smallest latency with every stage and the bus within ``limit``.

    Latency and bus time both add up along the chain, so a prefix is kept
    unless another ending at the same op has no more of either (a Pareto
    front per cut point): exact, and small in practice, as the stage limit
    leaves few ranges per end.
    """
    n = costs[0].shape[0] - 1
    # front[b]: (latency, bus ms, cuts so far) of the undominated prefixes ending at b.
    front: List[List[Tuple[float, float, Tuple[int, ...]]]] = [[] for _ in range(n + 1)]
    front[0] = [(0.0, 0.0, (0,))]
    for c, m, t in zip(costs, bus, costs if through is None else through):
        nxt: List[List[Tuple[float, float, Tuple[int, ...]]]] = [[] for _ in range(n + 1)]
        for a, b in zip(*np.nonzero(c <= limit)):
            for lat, busy, cuts in front[a]:
                if busy + m[a, b] <= limit:
                    nxt[b].append((lat + float(t[a, b]), busy + float(m[a, b]), cuts + (int(b),)))
        front = [_pareto(entries) for entries in nxt]
    return min(front[n], key=lambda e: e[0])[2]


def _pareto(entries: List[Tuple[float, float, Tuple[int, ...]]]):
    # The entries no other beats on both latency and bus time (first of exact ties).
    kept = []
    for entry in sorted(entries, key=lambda e: (e[0], e[1])):
        if not kept or entry[1] < kept[-1][1]:
            kept.append(entry)
    return kept


def _fixed_order(costs: Sequence[np.ndarray], bus: Bus = None,
                 latency: Optional[Sequence[np.ndarray]] = None) -> Partition:
    # The optimum for stage k on device k: the smallest bottleneck, then the
    # smallest latency (``latency``, default the costs) among the partitions that reach it.
    if bus is None or not any(np.any(m) for m in bus):
        cuts = _min_latency(costs, _stage_bottleneck(costs) * (1 + _TOLERANCE), latency)
        return evaluate(costs, cuts, bus=bus, latency=latency)
    limit = _bus_bottleneck(costs, bus) * (1 + _TOLERANCE)
    found = evaluate(costs, _min_latency(costs, limit, latency), bus=bus, latency=latency)
    if found.bus_ms <= limit:
        # The fastest chain within the limit keeps the bus within it too.
        return found
    return evaluate(costs, _bus_latency(costs, bus, limit, latency), bus=bus, latency=latency)


def partition(costs: Sequence[np.ndarray], tpus: int = 0, bus: Bus = None) -> Partition:
    """Finds the partition with the smallest bottleneck, ties broken by the smallest latency.

    Args:
      costs: One ``(n+1, n+1)`` matrix per device: the TPUs, then the CPU.
      tpus: How many leading devices (the TPUs) run in any order along the
        chain; 0 keeps the given order (stage k on device k).
      bus: Per device, the milliseconds its link bytes take on the shared bus
        (zeros off the bus); the bus's total bounds the period like a stage.

    Returns:
      The optimal ``Partition`` over cut points and TPU orders; among exact
      ties later stages get fewer ops, so the TPUs a model does not need are
      the last ones (``best_order``).
    """
    return best_order(costs, tpus, _fixed_order, bus)


def exhaustive(costs: Sequence[np.ndarray], tpus: int = 0, bus: Bus = None) -> Partition:
    """Finds the optimum by trying every TPU order and every set of cut points (checks ``partition``).

    Every permutation is tried, identical devices included, without
    ``orders`` or ``best_order``: the check shares no search code with
    ``partition``.

    Args:
      costs: As for ``partition``.
      tpus: As for ``partition``.

    Returns:
      The partition with the smallest (bottleneck, latency).
    """
    n = costs[0].shape[0] - 1
    best = None
    for head in itertools.permutations(range(tpus)):
        order = head + tuple(range(tpus, len(costs)))
        for inner in itertools.combinations_with_replacement(range(n + 1), len(costs) - 1):
            found = evaluate(costs, (0, *inner, n), order, bus)
            if best is None or _better(found, best):
                best = found
    return best


def equal_param_split(costs: Sequence[np.ndarray], param_prefix: np.ndarray,
                      n_tpus: int, bus: Bus = None) -> Partition:
    """The split ``edgetpu_compiler --num_segments N`` makes, on the best order of the TPUs.

    N TPU segments of about equal parameter bytes cover the whole model and the
    CPU stage runs no op; the cuts ignore the costs, the order does not.

    Args:
      costs: ``n_tpus`` TPU matrices then the CPU matrix.
      param_prefix: Parameter bytes of ops ``[0, i)`` for i = 0..n.
      n_tpus: Number of TPU segments.
      bus: Bus matrices per device, as for ``evaluate``.

    Returns:
      The partition, evaluated under ``costs`` and the bus, in the TPU order
      with the smallest (bottleneck, latency).
    """
    n = len(param_prefix) - 1
    if n_tpus == 0:
        return evaluate(costs, (0, n), bus=bus)
    total = param_prefix[-1]
    cuts = [0]
    for k in range(1, n_tpus):
        target = total * k / n_tpus
        cut = int(np.argmin(np.abs(param_prefix[cuts[-1]:] - target))) + cuts[-1]
        cuts.append(cut)
    return best_order(costs, n_tpus,
                      lambda ordered, ordered_bus: evaluate(ordered, (*cuts, n, n), bus=ordered_bus),
                      bus)


def whole_on_one_tpu(costs: Sequence[np.ndarray], n_tpus: int, bus: Bus = None) -> Partition:
    """Every op on one TPU (the one that runs the model fastest), the CPU stage with none.

    Args:
      costs: ``n_tpus`` TPU matrices then the CPU matrix.
      n_tpus: Number of TPUs (0: every op on the CPU).
      bus: Bus matrices per device, as for ``evaluate``.

    Returns:
      The partition, evaluated under ``costs`` and the bus.
    """
    n = costs[0].shape[0] - 1
    return best_order(costs, n_tpus, lambda ordered, ordered_bus: evaluate(
        ordered, (0,) + (n,) * len(ordered), bus=ordered_bus), bus)


def balanced_tpu_split(costs: Sequence[np.ndarray], n_tpus: int, bus: Bus = None) -> Partition:
    """Every op on the TPUs, cut to the smallest bottleneck of the TPU stages, in the best order.

    What Coral's profiling partitioner aims for: the model split over the TPUs
    only, balancing their (here modelled) segment times; the CPU stage runs
    no op and keeps only what it carries besides (the RNN step). Within each
    order the cuts minimise the bottleneck of the TPU stages and the shared
    bus, then their latency (a TPU may stay empty); the order is chosen on
    the whole pipeline.

    Args:
      costs: ``n_tpus`` TPU matrices then the CPU matrix.
      n_tpus: Number of TPUs (0: every op on the CPU).
      bus: Bus matrices per device, as for ``evaluate``.

    Returns:
      The partition, evaluated under ``costs`` and the bus.
    """
    n = costs[0].shape[0] - 1
    if n_tpus == 0:
        return evaluate(costs, (0, n), bus=bus)
    return best_order(costs, n_tpus, lambda ordered, ordered_bus: evaluate(
        ordered, (*_fixed_order(ordered[:n_tpus],
                                None if ordered_bus is None else ordered_bus[:n_tpus]).cuts, n),
        bus=ordered_bus), bus)
