"""The schedule search: pipelines, copies and hybrids, exact under the cost model.

A schedule runs the op chain as stages in order: each stage a contiguous op
range on a *group* of TPUs, then the CPU tail, which also carries the RNN
steps. A group of one TPU is a pipeline stage; a group of several runs copies
of the same segment, frames dealt in proportion to each copy's speed
(``1 / C_d``), so the group sustains ``sum_d 1 / C_d[a, b]`` frames a
millisecond, a frame passes it in its slowest copy's time, and the shared bus
carries each copy's bytes for its share (``edgecap.plans.pricing`` prices a
plan the same way). So the whole model copied on every TPU ("copies"), a
pipeline, and a pipeline whose slowest segment runs on two TPUs ("hybrid")
are all schedules. One more kind: the whole model copied on some TPUs and on
the CPU too, the CPU taking whole frames beside its RNN steps, its share set
so that its load (its frames' CNN plus the RNN) equals the TPUs'.

``search`` is exact over that space. For a fixed sequence of groups, a
group's period, latency and bus matrices (``group_matrices``) make it one
stage of the partitioner's chain, whose programs are exact for any matrices
(``edgecap_compile.partitioner``); every ordered set partition of the TPUs is
such a sequence (a group given no ops leaves its TPUs idle), and the minimum
over a union of sets is the minimum of their minima. The CPU copies have a
closed form per set of TPUs. Among equal schedules the plain pipeline wins
(it is searched first, and only a strictly better schedule replaces it).
``exhaustive`` checks it by brute force without sharing its code.

The board CPU's own work a frame (``CpuFrame``: preprocessing, and a hand-off
per stage a frame passes) is CPU time every schedule pays: the preprocessing
is a constant on the CPU's matrix; the hand-offs depend on how many stages
run. With hand-offs priced the search runs every ordered set partition of
every subset of the TPUs, each group made to take ops (a TPU left idle is one
left out), so a sequence's stage count, and the CPU's charge, is known before
its cuts are chosen: exact again, over the same space.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from edgecap.plans.plan import CpuFrame
from edgecap_compile.partitioner import (_TOLERANCE, Bus, Partition, _better, _fixed_order, evaluate,
                                         partition)

# No CPU work a frame besides the stages' (a profile that models none).
NO_FRAME = CpuFrame()


def group_matrices(costs: Sequence[np.ndarray], group: Sequence[int], bus: Bus = None
                   ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """Returns a group of copies as one stage: its period, latency and bus matrices.

    Args:
      costs: One ``(n+1, n+1)`` matrix per device.
      group: The devices that run copies of the stage.
      bus: Bus matrices per device, or None.

    Returns:
      ``(period, latency, bus)``: ``1 / sum_d 1 / C_d``, ``max_d C_d`` and
      ``sum_d share_d * bus_d`` per op range (0 for an empty range, inf for
      ``a > b``); bus None without ``bus``.
    """
    if len(group) == 1:
        (d,) = group
        return costs[d], costs[d], None if bus is None else bus[d]
    stacked = np.stack([costs[d] for d in group])
    shares = _shares(stacked)
    with np.errstate(all="ignore"):
        period = 1.0 / (1.0 / stacked).sum(axis=0)
    free = (stacked == 0).any(axis=0)
    latency = np.where(free, 0.0, stacked.max(axis=0))
    if bus is None:
        return period, latency, None
    moved = np.nan_to_num((shares * np.stack([bus[d] for d in group])).sum(axis=0), nan=0.0, posinf=0.0)
    return period, latency, moved


def _shares(times: np.ndarray) -> np.ndarray:
    """Each copy's share of the frames (first axis) in proportion to its speed: ``(1 / t_d) / sum 1 / t``.

    Where some copies take no time they share the frames equally (0 where every range is impossible).
    """
    free = times == 0
    with np.errstate(all="ignore"):
        speed = np.where(free, 0.0, 1.0 / times)
        shares = np.where(free.any(axis=0), free / free.sum(axis=0), speed / speed.sum(axis=0))
    return np.nan_to_num(shares, nan=0.0)


def shares_of(costs: Sequence[np.ndarray], group: Sequence[int], start: int, end: int) -> Tuple[float, ...]:
    """Returns each copy's share of the frames for ops ``[start, end)``: in proportion to its speed."""
    return tuple(float(s) for s in _shares(np.array([float(costs[d][start, end]) for d in group])))


def ordered_groups(tpus: int) -> Iterator[Tuple[Tuple[int, ...], ...]]:
    """Yields every ordered set partition of ``range(tpus)``: the group sequences a schedule may run."""
    def split(items: Tuple[int, ...]) -> Iterator[Tuple[Tuple[int, ...], ...]]:
        if not items:
            yield ()
            return
        for size in range(1, len(items) + 1):
            for first in itertools.combinations(items, size):
                rest = tuple(i for i in items if i not in first)
                for tail in split(rest):
                    yield (first, *tail)
    yield from split(tuple(range(tpus)))


def _same(costs: Sequence[np.ndarray], bus: Bus, tpus: int) -> List[int]:
    # Each TPU's first twin (equal cost and bus matrices): twins give the same schedules.
    keyed = costs if bus is None else [np.stack(pair) for pair in zip(costs, bus)]
    return [next(j for j in range(i + 1) if np.array_equal(keyed[i], keyed[j])) for i in range(tpus)]


def grouped(costs: Sequence[np.ndarray], groups: Sequence[Sequence[int]], bus: Bus = None,
            busy: bool = False) -> Partition:
    """The optimum with the TPU groups in this order, then the CPU (the last device): cuts chosen exactly.

    Args:
      busy: Every group takes at least one op.

    Returns:
      The ``Partition``: ``order`` each stage's first device, ``copies`` the
      rest of its group, ``shares`` their shares of the frames.
    """
    cpu = len(costs) - 1
    mats = [group_matrices(costs, g, bus) for g in groups]
    if busy:
        mats = [(_busy(m[0]), _busy(m[1]), m[2]) for m in mats]
    periods = [m[0] for m in mats] + [costs[cpu]]
    latencies = [m[1] for m in mats] + [costs[cpu]]
    buses = None if bus is None else [m[2] for m in mats] + [bus[cpu]]
    found = _fixed_order(periods, buses, latencies)
    return _with_groups(costs, found, [*groups, (cpu,)])


def _busy(matrix: np.ndarray) -> np.ndarray:
    # No empty range: a stage that must take ops.
    out = np.array(matrix, dtype=np.float64)
    np.fill_diagonal(out, np.inf)
    return out


def _on_cpu(costs: Sequence[np.ndarray], ms: float) -> List[np.ndarray]:
    # The CPU's matrix (the last) with ``ms`` more a frame: CPU work every range of it pays.
    return [*costs[:-1], costs[-1] + ms] if ms else list(costs)


def _with_groups(costs: Sequence[np.ndarray], found: Partition, groups: Sequence[Sequence[int]]) -> Partition:
    shares = tuple(shares_of(costs, g, a, b) if len(g) > 1 and b > a else (1.0,) * len(g)
                   for g, (a, b) in zip(groups, found.ranges))
    return Partition(found.cuts, found.stage_ms, tuple(g[0] for g in groups), found.bus_stage_ms,
                     copies=tuple(tuple(g[1:]) for g in groups), shares=shares,
                     stage_latency_ms=found.stage_latency_ms)


def cpu_copies(costs: Sequence[np.ndarray], group: Sequence[int], bus: Bus = None) -> Optional[Partition]:
    """The whole model copied on ``group``'s TPUs and on the CPU, or None where the CPU cannot help.

    The TPUs take frames in proportion to their speed; the CPU takes the
    share that makes its load (its frames' CNN, ``c`` each, plus the RNN
    steps ``r`` of every frame) equal to theirs: with ``R = sum 1 / t_i`` the
    period is ``(c + r) / (c R + 1)``, below the TPUs' own ``1 / R`` only when
    that is above ``r``.

    Returns:
      The ``Partition`` (stage 0 on the group and the CPU, an empty CPU tail),
      or None.
    """
    cpu = len(costs) - 1
    n = costs[0].shape[0] - 1
    times = [float(costs[d][0, n]) for d in group]
    rnn = float(costs[cpu][n, n])
    cnn = float(costs[cpu][0, n]) - rnn
    if min(times) <= 0 or cnn <= 0:
        return None
    rate = sum(1.0 / t for t in times)
    if 1.0 / rate <= rnn * (1 + _TOLERANCE):
        return None
    period = (cnn + rnn) / (cnn * rate + 1.0)
    shares = (*(period / t for t in times), (period - rnn) / cnn)
    moved = 0.0 if bus is None else sum(s * float(bus[d][0, n]) for s, d in zip(shares, group))
    return Partition((0, n, n), (period, rnn), (group[0], cpu),
                     () if bus is None else (moved, float(bus[cpu][n, n])),
                     copies=(tuple(group[1:]) + (cpu,), ()), shares=(shares, (1.0,)),
                     stage_latency_ms=(max(*times, cnn), rnn))


def search(costs: Sequence[np.ndarray], tpus: int, bus: Bus = None, cpu: bool = True,
           frame: CpuFrame = NO_FRAME, copies: bool = True) -> Partition:
    """Finds the schedule with the smallest period, ties broken by latency, then by fewer copies.

    Args:
      costs: One ``(n+1, n+1)`` matrix per device: the ``tpus`` TPUs, then the CPU.
      tpus: How many leading devices are TPUs.
      bus: Per device, its link bytes' milliseconds on the shared bus, or None.
      cpu: Also try the CPU taking whole frames beside copies on TPUs.
      frame: The board CPU's own work a frame, charged to the CPU stage.
      copies: Also try copies of a stage; False: pipelines only.

    Returns:
      The optimal ``Partition``: a pipeline (``copies`` empty) unless copies
      are strictly better. Its CPU stage's time includes ``frame``'s work.
    """
    if frame.handoff_ms:
        return _search_counted(costs, tpus, bus, cpu and copies, frame, copies)
    costs = _on_cpu(costs, frame.preprocess_ms)
    best = partition(costs, tpus, bus)
    if not copies:
        return best
    same = _same(costs, bus, tpus)
    seen = set()
    for groups in ordered_groups(tpus):
        key = tuple(tuple(sorted(same[d] for d in g)) for g in groups)
        if all(len(g) == 1 for g in groups) or key in seen:
            continue
        seen.add(key)
        found = grouped(costs, groups, bus)
        if _better(found, best):
            best = found
    if cpu:
        for group in _subsets(same, tpus):
            found = cpu_copies(costs, group, bus)
            if found is not None and _better(found, best):
                best = found
    return best


def _search_counted(costs: Sequence[np.ndarray], tpus: int, bus: Bus, cpu: bool, frame: CpuFrame,
                    copies: bool) -> Partition:
    # ``search`` where the CPU's charge depends on the stage count: every group
    # sequence of every subset of the TPUs, each group busy, charged for its stages.
    same = _same(costs, bus, tpus)
    best: Optional[Partition] = None
    seen = set()
    for groups in used_groups(tpus):
        key = tuple(tuple(sorted(same[d] for d in g)) for g in groups)
        if (not copies and any(len(g) > 1 for g in groups)) or key in seen:
            continue
        seen.add(key)
        found = grouped(_on_cpu(costs, frame.ms(len(groups) + 1)), groups, bus, busy=True)
        if best is None or _better(found, best):
            best = found
    best = _idle_last(costs, best, tpus, bus)
    if cpu:
        for group in _subsets(same, tpus):
            found = cpu_copies(_on_cpu(costs, frame.ms(2)), group, bus)
            if found is not None and _better(found, best):
                best = found
    return best


def _idle_last(costs: Sequence[np.ndarray], found: Partition, tpus: int, bus: Bus) -> Partition:
    # The TPUs a schedule leaves idle as empty stages before the CPU, as the partitioner leaves them.
    idle = [d for d in range(tpus) if d not in found.order and not any(d in c for c in found.copies)]
    if not idle:
        return found
    at = found.cuts[-2]
    empty = [float(costs[d][at, at]) for d in idle]
    return Partition((*found.cuts[:-1], *(at for _ in idle), found.cuts[-1]),
                     (*found.stage_ms[:-1], *empty, found.stage_ms[-1]),
                     (*found.order[:-1], *idle, found.order[-1]),
                     () if bus is None else (*found.bus_stage_ms[:-1], *(float(bus[d][at, at]) for d in idle),
                                             found.bus_stage_ms[-1]),
                     copies=(*found.copies[:-1], *(() for _ in idle), found.copies[-1]),
                     shares=(*found.shares[:-1], *((1.0,) for _ in idle), found.shares[-1]),
                     stage_latency_ms=(*found.stage_latency_ms[:-1], *empty, found.stage_latency_ms[-1])
                     if found.stage_latency_ms else ())


def used_groups(tpus: int) -> Iterator[Tuple[Tuple[int, ...], ...]]:
    """Yields every ordered set partition of every subset of ``range(tpus)``, the empty one first."""
    for size in range(tpus + 1):
        for used in itertools.combinations(range(tpus), size):
            for groups in ordered_groups(size):
                yield tuple(tuple(used[i] for i in g) for g in groups)


def charged(costs: Sequence[np.ndarray], found: Partition, frame: CpuFrame, bus: Bus = None) -> Partition:
    """A schedule found without the CPU's own work a frame, priced with it (a baseline's).

    The CPU stage (the last) pays ``frame`` for the stages its frames pass:
    the TPU stages that take ops, and itself.
    """
    stages = sum(1 for a, b in found.ranges[:-1] if b > a) + 1
    extra = frame.ms(stages)
    if not extra:
        return found
    latency = list(found.stage_latency_ms or found.stage_ms)
    latency[-1] += extra
    return dataclasses.replace(found, stage_ms=(*found.stage_ms[:-1], found.stage_ms[-1] + extra),
                               stage_latency_ms=tuple(latency))


def _subsets(same: Sequence[int], tpus: int) -> Iterator[Tuple[int, ...]]:
    seen = set()
    for size in range(1, tpus + 1):
        for group in itertools.combinations(range(tpus), size):
            key = tuple(sorted(same[d] for d in group))
            if key not in seen:
                seen.add(key)
                yield group


def whole_model_copies(costs: Sequence[np.ndarray], tpus: int, bus: Bus = None) -> Partition:
    """The whole model copied on every TPU, frames dealt by speed, the CPU with only the RNN (Frigate's way)."""
    n = costs[0].shape[0] - 1
    if tpus == 0:
        return evaluate(costs, (0, n), bus=bus)
    cpu = len(costs) - 1
    group = tuple(range(tpus))
    period, latency, moved = group_matrices(costs, group, bus)
    found = evaluate([period, costs[cpu]], (0, n, n), bus=None if bus is None else [moved, bus[cpu]],
                     latency=[latency, costs[cpu]])
    return _with_groups(costs, found, [group, (cpu,)])


def replicate_slowest(costs: Sequence[np.ndarray], tpus: int, bus: Bus = None) -> Optional[Partition]:
    """The best pipeline on all TPUs but one, its slowest TPU segment copied on the spare one.

    Returns:
      The best such schedule over the choice of the spare TPU, or None with fewer than 2 TPUs.
    """
    if tpus < 2:
        return None
    cpu = len(costs) - 1
    best = None
    for spare in range(tpus):
        kept = [d for d in range(tpus) if d != spare]
        pipe = partition([costs[d] for d in kept] + [costs[cpu]], tpus - 1,
                         None if bus is None else [bus[d] for d in kept] + [bus[cpu]])
        order = [kept[d] if d < len(kept) else cpu for d in pipe.order]
        slowest = max(range(len(order) - 1), key=lambda k: pipe.stage_ms[k])
        groups = [(d, spare) if k == slowest else (d,) for k, d in enumerate(order)]
        mats = [group_matrices(costs, g, bus) for g in groups]
        found = evaluate([m[0] for m in mats], pipe.cuts, bus=None if bus is None else [m[2] for m in mats],
                         latency=[m[1] for m in mats])
        found = _with_groups(costs, found, groups)
        if best is None or _better(found, best):
            best = found
    return best


def exhaustive(costs: Sequence[np.ndarray], tpus: int, bus: Bus = None, cpu: bool = True,
               frame: CpuFrame = NO_FRAME) -> Partition:
    """The optimum by brute force over every group sequence, every set of cuts and every CPU copy (checks ``search``).

    It prices each schedule stage by stage from the device matrices, sharing
    no search code with ``search``; the CPU stage pays ``frame`` for the
    stages that take ops, and itself.
    """
    n = costs[0].shape[0] - 1
    last = len(costs) - 1
    best = None
    for groups in ordered_groups(tpus):
        stages = [*groups, (last,)]
        for inner in itertools.combinations_with_replacement(range(n + 1), len(stages) - 1):
            cuts = (0, *inner, n)
            found = _priced(costs, bus, stages, cuts, frame)
            if best is None or _better(found, best):
                best = found
    if cpu:
        for size in range(1, tpus + 1):
            for group in itertools.combinations(range(tpus), size):
                found = _priced_cpu_copy(costs, bus, group, frame)
                if found is not None and _better(found, best):
                    best = found
    return best


def _priced(costs, bus, stages, cuts, frame) -> Partition:
    period, latency, moved, shares = [], [], [], []
    for g, a, b in zip(stages, cuts, cuts[1:]):
        times = [float(costs[d][a, b]) for d in g]
        if len(g) == 1:
            share = [1.0]
            period.append(times[0]), latency.append(times[0])
        elif 0.0 in times:  # copies that take no time take the frames, equally
            share = [float(t == 0.0) / times.count(0.0) for t in times]
            period.append(0.0), latency.append(0.0)
        else:
            rate = sum(1.0 / t for t in times)
            share = [1.0 / t / rate for t in times]
            period.append(1.0 / rate), latency.append(max(times))
        shares.append(tuple(share))
        moved.append(0.0 if bus is None else sum(s * float(bus[d][a, b]) for s, d in zip(share, g)))
    own = frame.ms(1 + sum(1 for a, b in zip(cuts[:-2], cuts[1:-1]) if b > a))
    period[-1] += own
    latency[-1] += own
    return Partition(tuple(cuts), tuple(period), tuple(g[0] for g in stages), () if bus is None else tuple(moved),
                     copies=tuple(tuple(g[1:]) for g in stages), shares=tuple(shares),
                     stage_latency_ms=tuple(latency))


def _priced_cpu_copy(costs, bus, group, frame) -> Optional[Partition]:
    # Bisects the period P at which the TPUs (P / t_i each) and the CPU ((P - r) / c) take every frame;
    # r: the CPU's RNN steps and its own work for two stages.
    n = costs[0].shape[0] - 1
    last = len(costs) - 1
    times = [float(costs[d][0, n]) for d in group]
    cnn = float(costs[last][0, n]) - float(costs[last][n, n])
    rnn = float(costs[last][n, n]) + frame.ms(2)
    if 0.0 in times or cnn <= 0:
        return None
    lo, hi = rnn, 1.0 / sum(1.0 / t for t in times)
    if hi <= rnn * (1 + _TOLERANCE):
        return None
    for _ in range(200):
        mid = (lo + hi) / 2
        if sum(mid / t for t in times) + (mid - rnn) / cnn >= 1.0:
            hi = mid
        else:
            lo = mid
    shares = (*(hi / t for t in times), (hi - rnn) / cnn)
    moved = 0.0 if bus is None else sum(s * float(bus[d][0, n]) for s, d in zip(shares, group))
    return Partition((0, n, n), (hi, rnn), (group[0], last), () if bus is None else (moved, 0.0),
                     copies=(tuple(group[1:]) + (last,), ()), shares=(shares, (1.0,)),
                     stage_latency_ms=(max(*times, cnn), rnn))
