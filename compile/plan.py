"""Builds the runtime's ``Plan`` from a split, with the cost model's predictions.

The plan format and its writer are the runtime's (``edgecap.plans.plan``); this
module only fills the record in.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from edgecap.devices import parse_device
from edgecap.modelfile import TensorSpec
from edgecap.plans.plan import CostParts, CpuFrame, EdgeTpuReport, ParamBytes, Plan, Prediction, Replica, Stage
from edgecap.plans.pricing import price
from edgecap_compile.boards import Board, Device
from edgecap_compile.cost_model import CostModel, StageCost
from edgecap_compile.graph import Graph
from edgecap_compile.partitioner import Partition
from edgecap_compile.segments import Segment


def _tensor(graph: Graph, index: int) -> TensorSpec:
    t = graph.tensors[index]
    # The runtime's record of a tensor is the format: 0 scale for an unquantized one.
    return TensorSpec(t.name, tuple(t.shape), t.dtype, t.scale or 0.0, t.zero_point or 0)


# Board profile link -> the bus libedgetpu's device option names ("pci:N", "usb:N").
_BUS = {"pcie": "pci", "pci": "pci", "usb": "usb", "usb2": "usb", "usb3": "usb"}


def plan_devices(board: Board) -> List[str]:
    """Returns the device string of each of the board's TPUs, in the profile's order.

    libedgetpu numbers ``:N`` in its driver registration order, which differs
    between machines; a TPU whose profile names its link gets the bus-qualified
    ``pci:N`` / ``usb:N`` (N counted on that bus) instead. One without a link
    keeps ``tpu:N``.

    Args:
      board: The board profile.

    Returns:
      One device string per ``board.tpus``.
    """
    names, seen = [], {}
    for i, tpu in enumerate(board.tpus):
        bus = _BUS.get((tpu.link or "").lower())
        if bus is None:
            names.append(f"tpu:{i}")
        else:
            names.append(f"{bus}:{seen.get(bus, 0)}")
            seen[bus] = seen.get(bus, 0) + 1
    return names


def cpu_fallback_ops(graph: Graph, start: int, end: int,
                     cpu_ops: Sequence[dict]) -> Tuple[int, ...]:
    """Returns the ops of ``[start, end)`` that edgetpu_compiler left on the CPU.

    The compiler reports a count per op type; it maps ops from the start of the
    graph until one it cannot map, so the ones left are the last of each type.
    """
    picked: List[int] = []
    for row in cpu_ops:
        of_type = [i for i in range(start, end) if graph.ops[i].type == row["op"]]
        picked += of_type[len(of_type) - min(int(row["count"]), len(of_type)):]
    return tuple(sorted(set(picked)))


def _stage(graph: Graph, board: Board, model: CostModel, k: int, start: int, end: int,
           segment: Optional[Segment], compiled: Optional[EdgeTpuReport],
           names: Dict[str, str]) -> Tuple[Stage, float]:
    """Stage ``k`` of a split, and its predicted milliseconds (unrounded).

    ``compiled`` is what edgetpu_compiler reported for a TPU stage (None on the CPU).

    Ops edgetpu_compiler could not map run on the board's CPU inside a TPU
    stage's invoke: their time is added to the stage's, as CPU work.
    """
    device = model.devices[k]
    cost = model.stage(k, start, end)
    cpu_ops_ms = 0.0
    if compiled is not None and compiled.cpu_ops:
        compiled.cpu_ops_ms = round(model.ops_ms(
            board.cpu, cpu_fallback_ops(graph, start, end, compiled.cpu_ops)), 6)
        cpu_ops_ms = compiled.cpu_ops_ms
    ms = float(cost.total_ms) + cpu_ops_ms
    inputs, outputs = _boundary(graph, segment, start, end)
    stage = Stage(
        index=k,
        spec=_spec(device, names),
        segment=segment.path.resolve() if segment else None,
        ops=(start, end),
        inputs=inputs,
        outputs=outputs,
        predicted_ms=round(ms, 6),
        compiled_segment=(segment.path.with_name(compiled.compiled_segment).resolve()
                          if segment and compiled and compiled.compiled else None),
        # On the CPU every parameter stays resident in memory: "on chip", nothing streamed.
        param_bytes=ParamBytes(int(cost.param_bytes - cost.streamed_bytes), int(cost.streamed_bytes)),
        macs=int(cost.macs),
        edgetpu=compiled,
        cost=_parts(cost, device, ms),
    )
    return stage, ms


def _spec(device: Device, names: Dict[str, str]):
    return parse_device(names[device.name] if device.is_tpu else device.name)


def _parts(cost: StageCost, device: Device, ms: float) -> CostParts:
    """The plan's record of what a stage's time (``ms``: its cost and the ops left to the CPU) is made of."""
    return CostParts(
        compute_ms=round(float(cost.compute_ms), 6),
        invoke_ms=round(float(cost.invoke_ms), 6),
        link_bytes=int(cost.streamed_bytes + cost.io_bytes),
        link_bytes_per_s=device.link_bytes_per_s if device.is_tpu else None,
        extra_ms=round(ms - float(cost.total_ms - cost.extra_ms), 6),
        link=device.link if device.is_tpu else None,
        bus=device.bus if device.is_tpu else None)


def _shares(shares: Sequence[float]) -> List[float]:
    """Shares written to 6 decimals, the first taking the rounding so that they add up to 1."""
    rounded = [round(float(s), 6) for s in shares]
    rounded[0] = round(1.0 - sum(rounded[1:]), 6)
    return rounded


def _with_replicas(stage: Stage, model: CostModel, k: int, split: Partition,
                   names: Dict[str, str]) -> Stage:
    """Stage ``k`` with its copies on the split's other devices for it (an empty stage has none)."""
    if not split.copies or not split.copies[k] or stage.empty:
        return stage
    start, end = stage.ops
    cpu_ops_ms = (stage.edgetpu.cpu_ops_ms or 0.0) if stage.edgetpu is not None else 0.0
    shares = _shares(split.shares[k])
    replicas = []
    for device, share in zip(model.copies[k], shares[1:]):
        cost = model.cost_on(device, start, end, rnn=False)
        ms = float(cost.total_ms) + (cpu_ops_ms if device.is_tpu else 0.0)
        replicas.append(Replica(_spec(device, names), share, round(ms, 6), _parts(cost, device, ms)))
    return dataclasses.replace(stage, share=shares[0], replicas=tuple(replicas))


def _boundary(graph: Graph, segment: Optional[Segment], start: int,
              end: int) -> Tuple[Tuple[TensorSpec, ...], Tuple[TensorSpec, ...]]:
    """A stage's inputs and outputs: its segment's, and the tensors it forwards for later stages."""
    if segment is None:
        return (), ()
    # What the segment reads, then what passes it by for later stages (forwarded).
    passing = [t for t in graph.live_across(end) if graph.producer[t] < start and t not in segment.inputs]
    inputs = tuple(_tensor(graph, t) for t in [*segment.inputs, *passing])
    # Everything later stages read: the segment's outputs and the tensors it forwards.
    return inputs, tuple(_tensor(graph, t) for t in graph.live_across(end))


def build_plan(graph: Graph, model_file: str, board: Board, model: CostModel,
               split: Partition, segments: List[Segment],
               edgetpu: Dict[int, EdgeTpuReport]) -> Plan:
    """Builds the plan of a split.

    Args:
      graph: The split model.
      model_file: Its path as recorded in the plan (relative to the bundle, if any).
      board: The board profile (with the TPU count and SRAM budget used).
      model: The cost model the split was chosen under, its devices in stage
        order (the split's TPU order, then the CPU).
      split: The chosen partition.
      segments: The written segment files, one per non-empty stage.
      edgetpu: Report of each TPU stage, by stage index.

    Returns:
      The ``Plan`` (not yet written; see ``edgecap.plans.plan.write_plan``).
    """
    by_range = {s.ops: s for s in segments}
    # Stages run the board's TPUs in the split's order: each keeps its profile's name.
    names = dict(zip((t.name for t in board.tpus), plan_devices(board)))
    built = [_stage(graph, board, model, k, start, end, by_range.get((start, end)) if end > start else None,
                    edgetpu[k] if model.devices[k].is_tpu else None, names)
             for k, (start, end) in enumerate(split.ranges)]
    stages = [_with_replicas(stage, model, k, split, names) for k, (stage, _) in enumerate(built)]
    stage_ms = [ms for _, ms in built]
    # The bus's time rides on the split: a bus-bound period is its total, and
    # bottleneck_stage is then the stage moving the most bytes over it.
    timed = dataclasses.replace(split, stage_ms=tuple(stage_ms))
    used = {d.bus for d in [*model.devices, *(c for copies in model.copies for c in copies)] if d.bus is not None}
    plan = Plan(
        path=None,
        board=board.name,
        model_file=model_file,
        model_sha256=graph.sha256,
        stages=tuple(stages),
        rnn_ms=round(float(model.rnn_ms), 6),
        rnn_steps_per_frame=float(model.rnn_steps_per_frame),
        board_version=board.version,
        board_tpus=len(board.tpus),
        model_ops=len(graph.ops),
        sram_bytes=min((t.sram_bytes for t in board.tpus), default=None),
        predicted=Prediction(
            fps=round(1e3 / float(timed.bottleneck_ms), 2) if timed.bottleneck_ms > 0 else None,
            latency_ms=round(float(timed.latency_ms), 6),
            bottleneck_ms=round(float(timed.bottleneck_ms), 6),
            bottleneck_stage=int(timed.bottleneck_stage),
        ),
        buses=tuple(b for b in board.buses if b.name in used),
        cpu_frame=model.cpu_frame if model.cpu_frame != CpuFrame() else None,
    )
    # A replicated stage's time is its copies' together, and the CPU's own work a frame
    # depends on the stages: the one pricing function's.
    return dataclasses.replace(plan, predicted=price(plan).prediction()) \
        if split.replicated or plan.cpu_frame is not None else plan
