"""Which other plans a bundle carries for a board: the best plan of each way the board may differ.

A running board cannot compile, so the plans it may switch to are chosen
here. Each *scenario* is a way the board may differ from its profile, in the
runtime's own terms (``edgecap.plans.pricing.Correction`` per device): one TPU
at 0.5x, 0.7x or 1.5x its profile's speed, one TPU's link slower (a USB one
at USB 2's usable rate, a PCIe one trained down to Gen1), the CPU at half or
twice its speed, or fewer TPUs attached. The pool is the
schedule search's optimum under each scenario (``edgecap_compile.schedules``:
exact over pipelines, copies and hybrids) plus the best pipeline in each TPU
order under the profile; plans that run the
same op ranges on the same devices are one. Every plan is priced under every
scenario with ``edgecap.plans.pricing.price``, the function the running board
re-chooses with, so what is chosen here is what wins there. ``corrected_board``
is the board as a scenario (or a measurement, or an emulated truth) says it runs.

Candidates are then ranked greedily from the best plan: first those that
give a plan to a TPU count nothing chosen can run on (a board with a TPU
missing), then the one that most lowers the sum over scenarios of the chosen
set's best period over the scenario's optimum; a plan that speeds no
scenario up by ``MIN_GAIN`` or more is not worth its bytes and ends the list.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from edgecap.links import link_kinds
from edgecap.plans.plan import EdgeTpuReport, Plan
from edgecap.plans.pricing import AS_PROFILED, CPU, Correction, Corrections, price
from edgecap_compile.boards import PRICES, Board, Device
from edgecap_compile.cost_model import CostModel
from edgecap_compile.graph import Graph
from edgecap_compile.partitioner import Partition, evaluate, orders, partition
from edgecap_compile.schedules import search
from edgecap_compile.plan import build_plan, plan_devices

# TPU speeds tried (``Correction.speed``): a TPU at 0.5x and 0.7x its
# profile's speed (thermal throttling halves the clock; another libedgetpu
# build or clock setting), and at 1.5x (libedgetpu-max on a board profiled at
# the standard clock).
TPU_SPEEDS = (0.5, 0.7, 1.5)
# CPU speeds tried: a governor at half speed, a core twice as fast.
CPU_SPEEDS = (0.5, 2.0)
# The link a USB TPU falls back to on a USB 2 port, or a USB 3 port that
# trains at high speed (edgecap/data/links.json).
SLOW_LINK = "usb2"
# Any other link's rate when it trains down a generation: a PCIe Gen2 x1 link
# at Gen1's 2.5 GT/s carries half (PCI Express Base Specification 2.0).
DOWNTRAINED = 0.5
# A candidate that shortens no scenario's period by this much is not worth its bytes.
MIN_GAIN = 0.02
_LINK = [feature for feature, _ in PRICES].index("link_bytes")


@dataclass(frozen=True)
class Scenario:
    """A way the board may differ from its profile.

    Attributes:
      label: What differs, in words (``usb:0 at 0.5x speed``).
      tpus: TPUs attached: the first ``tpus`` of the profile.
      corrections: Device string to ``Correction``, as the runtime writes them.
    """

    label: str
    tpus: int
    corrections: Mapping[str, Correction]


@dataclass(frozen=True)
class Candidate:
    """A plan chosen to ship beside the best one.

    Attributes:
      name: Its folder under ``plans/<board>/candidates/``: rank, TPU count,
        each TPU stage's device and op range.
      board: The board it is compiled for (its first ``tpus`` TPUs).
      model: The profile's cost model, its devices in the split's stage order.
      split: The cut points and TPU order.
      plan: The plan in memory, priced under the profile (no segment files).
      why: The scenario it is chosen for, with the periods before and after.
    """

    name: str
    board: Board
    model: CostModel
    split: Partition
    plan: Plan
    why: str


def slow_link_rate() -> float:
    """Returns the usable rate of ``SLOW_LINK`` from edgecap/data/links.json, in bytes per second."""
    return link_kinds()[SLOW_LINK].usable_bytes_per_s


def scenarios(board: Board) -> List[Scenario]:
    """Returns the ways the board may differ from its profile that candidates are chosen for.

    With every TPU attached: the profile as it is, each TPU at each
    ``TPU_SPEEDS`` speed and with a slower link (a USB one at ``SLOW_LINK``'s
    rate where that is slower, any other at ``DOWNTRAINED`` times its rate),
    and the CPU at each ``CPU_SPEEDS`` speed; then, for each smaller TPU
    count, the profile with only the first TPUs attached.

    Args:
      board: The board, with the TPU count and budgets the best plan was made for.

    Returns:
      The scenarios, the profile's with every TPU first.
    """
    names = plan_devices(board)
    usb2 = slow_link_rate()
    every = len(board.tpus)
    out = [Scenario("as profiled", every, {})]
    for name, tpu in zip(names, board.tpus):
        for speed in TPU_SPEEDS:
            out.append(Scenario(f"{name} at {speed:.2g}x speed", every, {name: Correction(speed=speed)}))
        if (tpu.link or "").startswith("usb"):
            if (tpu.link_bytes_per_s or 0) > usb2:
                out.append(Scenario(f"{name} on {SLOW_LINK}", every,
                                    {name: Correction(link_bytes_per_s=usb2)}))
        elif tpu.link_bytes_per_s:
            out.append(Scenario(f"{name} link at {DOWNTRAINED:g}x", every, {name: Correction(
                link_bytes_per_s=tpu.link_bytes_per_s * DOWNTRAINED)}))
    for speed in CPU_SPEEDS:
        out.append(Scenario(f"cpu at {speed:.2g}x speed", every, {CPU: Correction(speed=speed)}))
    # A TPU missing: the profile's optimum for those left. Combined with a device
    # off its profile too it would cost a whole encoder's bytes for a rare case.
    out += [Scenario(f"{t} of {every} TPUs attached", t, {}) for t in range(every - 1, 0, -1)]
    return out


def corrected_board(board: Board, corrections: Corrections = AS_PROFILED) -> Board:
    """Returns the board as the corrections say it runs.

    A device's ``speed`` divides every price of its work but the link's (the
    MAC, element, per-op, per-invoke and memory costs that a stage's compute
    and invoke time are made of, as ``edgecap.plans.pricing`` re-prices
    them); its ``link_bytes_per_s`` replaces its link rate. It keeps its name
    and link kind.

    Args:
      board: The board profile.
      corrections: Plan device (``plan_devices``: ``pci:0``, ``usb:0``;
        ``cpu``) -> its ``Correction``; a name the board lacks is ignored.

    Returns:
      The corrected board.
    """
    names = plan_devices(board)
    return dataclasses.replace(
        board, cpu=_corrected(board.cpu, corrections.get(CPU)),
        tpus=[_corrected(t, corrections.get(n)) for t, n in zip(board.tpus, names)])


def _corrected(device: Device, c: Optional[Correction]) -> Device:
    if c is None:
        return device
    prices = device.coefficients()
    slowed = prices / c.speed
    slowed[_LINK] = prices[_LINK]
    device = device.with_coefficients(slowed) if c.speed != 1.0 else device
    if c.link_bytes_per_s and device.link_bytes_per_s is not None:
        device = dataclasses.replace(device, link_bytes_per_s=c.link_bytes_per_s)
    if c.speed != 1.0 and not device.is_tpu:  # the CPU's own work a frame is CPU work too
        rate = device.frame_elements_per_s
        device = dataclasses.replace(device, frame_ms=device.frame_ms / c.speed,
                                     handoff_ms=device.handoff_ms / c.speed,
                                     frame_elements_per_s=None if rate is None else rate * c.speed)
    return device


@dataclass(frozen=True)
class _Option:
    tpus: int
    model: CostModel
    split: Partition
    plan: Plan

    @property
    def key(self) -> Tuple[Tuple[str, Tuple[int, int]], ...]:
        return _key(self.plan)


def _key(plan: Plan) -> Tuple[Tuple[str, Tuple[int, int]], ...]:
    # Plans that run the same op ranges on the same devices (copies included) are the same plan.
    return tuple((",".join(map(str, s.devices)), s.ops) for s in plan.active_stages)


def _option(graph: Graph, model_file: str, board: Board, nominal: CostModel,
            split: Partition) -> _Option:
    model = nominal.in_order(split.order, split.copies)
    reports = {k: EdgeTpuReport(compiled=False, reason="not written")
               for k, d in enumerate(model.devices) if d.is_tpu}
    plan = build_plan(graph, model_file, board, model, split, [], reports)
    return _Option(len(board.tpus), model, split, plan)


def _pool(graph: Graph, model_file: str, board: Board, rnn_ms: float,
          window: Optional[Tuple[int, int]], cases: Sequence[Scenario], replicas: bool = True) -> List[_Option]:
    """The optimum of every scenario and of every TPU order, each plan once."""
    found: Dict[tuple, _Option] = {}
    boards = {t: board.with_tpus(t) for t in range(1, len(board.tpus) + 1)}

    def add(option: _Option) -> None:
        # The same plan for fewer TPUs runs on more boards: keep that one.
        old = found.get(option.key)
        if old is None or option.tpus < old.tpus:
            found[option.key] = option

    for t, board_t in boards.items():
        devices = [*board_t.tpus, board_t.cpu]
        nominal = CostModel(graph, devices, rnn_ms, window=window)
        costs = [nominal.matrix(k) for k in range(len(devices))]
        bus = nominal.bus_matrices(board_t.buses)
        for order in orders(costs, t):
            within = partition([costs[d] for d in order],
                               bus=None if bus is None else [bus[d] for d in order])
            add(_option(graph, model_file, board_t, nominal, evaluate(
                costs, within.cuts, tuple(order[d] for d in within.order), bus=bus)))
        for case in (c for c in cases if c.tpus == t):
            fixed = corrected_board(board_t, case.corrections)
            model = CostModel(graph, [*fixed.tpus, fixed.cpu],
                              rnn_ms / case.corrections.get(CPU, Correction()).speed, window=window)
            # The best schedule as the scenario says the board runs: a pipeline, copies or a hybrid.
            matrices, scenario_bus = [model.matrix(k) for k in range(len(devices))], model.bus_matrices(board_t.buses)
            split = search(matrices, t, scenario_bus, frame=model.cpu_frame, copies=replicas)
            add(_option(graph, model_file, board_t, nominal, _as_profiled(costs, bus, split)))
    return list(found.values())


def _as_profiled(costs: Sequence[np.ndarray], bus, split: Partition) -> Partition:
    """A schedule found under a scenario, timed as profiled.

    A replicated one keeps the scenario's shares (what makes it the best
    there); its plan's prediction is the pricing function's (``build_plan``).
    """
    return split if split.replicated else evaluate(costs, split.cuts, split.order, bus=bus)


def _runs_on(plan: Plan, devices: Sequence[str]) -> bool:
    return all(str(d) in devices for s in plan.active_stages for d in s.devices if d.kind == "tpu")


def choose(graph: Graph, model_file: str, board: Board, best: Plan,
           window: Optional[Tuple[int, int]] = None, replicas: bool = True) -> List[Candidate]:
    """Ranks the plans worth carrying beside the best one, most useful first.

    Args:
      graph: The encoder.
      model_file: Its path as plans record it (relative to the bundle).
      board: The board the best plan was made for (TPU count, budgets).
      best: The best plan, as written; its ``rnn_ms`` is charged to every candidate.
      window: ``(frames, stride)`` the plans charge RNN steps for.
      replicas: Also offer copies and hybrids (False: pipelines only).

    Returns:
      The candidates in rank order; the list ends where a further plan
      would shorten no scenario's period by ``MIN_GAIN``.
    """
    cases = scenarios(board)
    pool = [o for o in _pool(graph, model_file, board, best.rnn_ms or 0.0, window, cases, replicas)
            if o.key != _key(best)]
    names = plan_devices(board)
    usable = np.array([[_runs_on(p, names[:c.tpus]) for c in cases]
                       for p in [best, *(o.plan for o in pool)]])
    priced = np.array([[price(p, c.corrections).period_ms for c in cases]
                       for p in [best, *(o.plan for o in pool)]])
    priced = np.where(usable, priced, np.inf)
    oracle = priced.min(axis=0)
    current = priced[0].copy()
    left = list(range(len(pool)))
    out: List[Candidate] = []
    while left:
        def merit(i: int) -> Tuple[int, float]:
            row = priced[i + 1]
            newly = int(np.sum(np.isinf(current) & np.isfinite(row)))
            covered = np.isfinite(current) & (row < current)
            return newly, float(np.sum((current[covered] - row[covered]) / oracle[covered]))
        pick = max(left, key=merit)
        newly, _ = merit(pick)
        row = priced[pick + 1]
        with np.errstate(invalid="ignore"):
            gains = np.where(np.isfinite(current), (current - row) / current, 0.0)
        if not newly and gains.max() < MIN_GAIN:
            break
        if newly:
            case = int(np.argmax(np.isinf(current) & np.isfinite(row)))
            why = f"{cases[case].label}: {1e3 / row[case]:.1f} fps, where no plan chosen before runs"
        else:
            case = int(np.argmax(gains))
            why = (f"{cases[case].label}: {1e3 / row[case]:.1f} fps against "
                   f"{1e3 / current[case]:.1f}")
        option = pool[pick]
        out.append(Candidate(_name(len(out) + 1, option.plan), board.with_tpus(option.tpus),
                             option.model, option.split, option.plan, why))
        current = np.minimum(current, row)
        left.remove(pick)
    return out


def _name(rank: int, plan: Plan) -> str:
    tpus = "".join(f"-{'+'.join(str(d).replace(':', '') for d in s.devices)}.{s.ops[0]}-{s.ops[1]}"
                   for s in plan.active_stages if s.spec.kind == "tpu")
    return f"{rank:02d}-{plan.board_tpus}tpu{tpus or '-cpuonly'}"
