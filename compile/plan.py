"""plan.json (docs/plan.md): the split the runtime follows, with the cost model's predictions.

The format (version, tensor records) is the runtime's, ``edgecap.plan``; this
module fills it in.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Union

from edgecap.plan import PLAN_VERSION, TensorSpec
from edgecap_compile.boards import Board
from edgecap_compile.cost_model import CostModel
from edgecap_compile.edgetpu import EdgeTpuReport
from edgecap_compile.graph import Graph
from edgecap_compile.partitioner import Partition
from edgecap_compile.segments import Segment


def _tensor(graph: Graph, index: int) -> dict:
    t = graph.tensors[index]
    # The runtime's record of a tensor is the format: 0 scale for an unquantized one.
    spec = TensorSpec(t.name, tuple(t.shape), t.dtype, t.scale or 0.0, t.zero_point or 0)
    return spec.to_json()


def build_plan(graph: Graph, model_file: str, board: Board, model: CostModel,
               split: Partition, segments: List[Segment],
               edgetpu: Dict[int, EdgeTpuReport]) -> dict:
    """Builds the plan.json document.

    Args:
      graph: The split model.
      model_file: Its path as recorded in the plan (relative to the bundle, if any).
      board: The board profile (with the TPU count and SRAM budget used).
      model: The cost model the split was chosen under.
      split: The chosen partition.
      segments: The written segment files, one per non-empty stage.
      edgetpu: Report of each TPU stage, by stage index.

    Returns:
      The plan as a JSON-ready dict.
    """
    by_range = {s.ops: s for s in segments}
    stages = []
    for k, (start, end) in enumerate(split.ranges):
        device = model.devices[k]
        cost = model.stage(k, start, end)
        segment: Optional[Segment] = by_range.get((start, end)) if end > start else None
        # On the CPU every parameter stays resident in memory: "on chip", nothing streamed.
        on_chip = cost.param_bytes - cost.streamed_bytes
        stages.append({
            "index": k,
            "device": device.name,
            "segment": segment.path.name if segment else None,
            "ops": [start, end],
            "param_bytes": {"on_chip": on_chip, "streamed": cost.streamed_bytes},
            "macs": cost.macs,
            "inputs": [_tensor(graph, t) for t in (segment.inputs if segment else ())],
            # Everything later stages read: the segment's outputs and the tensors it forwards.
            "outputs": [_tensor(graph, t) for t in (graph.live_across(end) if segment else ())],
            "predicted_ms": round(cost.total_ms, 6),
            "edgetpu": edgetpu[k].to_json() if device.is_tpu else None,
        })
    return {
        "plan_version": PLAN_VERSION,
        "model": {"file": model_file, "sha256": graph.sha256, "ops": len(graph.ops)},
        "board": {"name": board.name, "version": board.version},
        "sram_bytes": min((t.sram_bytes for t in board.tpus), default=None),
        "rnn_ms": round(model.rnn_ms, 6),
        "stages": stages,
        "predicted": {
            "fps": round(1e3 / split.bottleneck_ms, 2) if split.bottleneck_ms > 0 else None,
            "latency_ms": round(split.latency_ms, 6),
            "bottleneck_ms": round(split.bottleneck_ms, 6),
            "bottleneck_stage": split.bottleneck_stage,
        },
    }


def write_plan(plan: dict, path: Union[str, os.PathLike]) -> None:
    """Writes ``plan`` as indented JSON."""
    Path(path).write_text(json.dumps(plan, indent=2) + "\n")
