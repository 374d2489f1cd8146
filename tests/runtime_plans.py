"""Writes plan directories for runtime tests with the compiler's segment writer.

The runtime never imports the compiler; its tests may, to cut a model where
they choose and check that every plan shape runs the same. Plans are written
by the runtime's own writer, ``edgecap.plans.plan.write_plan``.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from edgecap.devices import parse_device
from edgecap.modelfile import TensorSpec
from edgecap.plans.plan import Plan, Stage, write_plan as write_plan_file
from edgecap_compile.graph import read_graph
from edgecap_compile.segments import write_segments


def _spec(graph, index: int) -> TensorSpec:
    t = graph.tensors[index]
    return TensorSpec(t.name, tuple(t.shape), t.dtype, t.scale or 0.0, t.zero_point or 0)


def write_plan(model: Path, cuts: Sequence[int], devices: Sequence[str], out: Path,
               predicted_ms: Optional[Sequence[float]] = None, board: str = "test") -> Path:
    """Cuts ``model`` at op indices ``cuts`` into len(devices) stages and writes plan.json.

    Stage outputs list the segment's outputs plus the tensors that pass it by
    for later stages, as docs/plan.md asks.
    """
    graph = read_graph(model)
    bounds = [0, *cuts, len(graph.ops)]
    ranges = list(zip(bounds, bounds[1:]))
    assert len(ranges) == len(devices)
    out.mkdir(parents=True, exist_ok=True)
    written = iter(write_segments(graph, ranges, out))
    stages: List[Stage] = []
    for i, ((start, end), device) in enumerate(zip(ranges, devices)):
        ins, outs = graph.segment_io(start, end) if end > start else ([], [])
        passing = [t for t in graph.activations()
                   if graph.producer[t] < start and graph.last_use[t] >= end
                   and (graph.producer[t] >= 0 or t in graph.inputs)]
        if end == start:
            ins = outs = passing
        seg = next(written) if end > start else None
        stages.append(Stage(
            index=i, spec=parse_device(device),
            segment=seg.path.resolve() if seg else None,
            ops=(start, end),
            inputs=tuple(_spec(graph, t) for t in sorted(set(ins) | set(passing))),
            outputs=tuple(_spec(graph, t) for t in sorted(set(outs) | set(passing))),
            predicted_ms=None if predicted_ms is None else predicted_ms[i],
        ))
    plan = Plan(path=None, board=board, model_file=model.name, model_sha256=graph.sha256,
                stages=tuple(stages), rnn_ms=0.0, board_version=1, model_ops=len(graph.ops),
                sram_bytes=8388608)
    return write_plan_file(plan, out).path
