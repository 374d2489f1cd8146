"""The segment writer: one valid .tflite model per contiguous op range.

A segment keeps its operators, the tensors they touch (boundary tensors under
their original names), and only the buffers and operator codes those reference.
It is built as a new schema object tree that shares the source's tensor
objects and buffer data, so writing N segments never copies the whole model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

from edgecap_compile.graph import Graph


@dataclass(frozen=True)
class Segment:
    """A written segment.

    Attributes:
      path: The .tflite file.
      ops: Op range ``(start, end)`` of the source model.
      inputs: Source tensor indices it reads, in its input order.
      outputs: Source tensor indices it writes for later stages, in its output order.
    """

    path: Path
    ops: Tuple[int, int]
    inputs: Tuple[int, ...]
    outputs: Tuple[int, ...]


def segment_name(stem: str, index: int, count: int) -> str:
    """Returns Coral's segment file name, ``<stem>_segment_<i>_of_<N>.tflite``."""
    return f"{stem}_segment_{index}_of_{count}.tflite"


def build_segment(graph: Graph, start: int, end: int,
                  extra_outputs: Sequence[int] = ()) -> bytes:
    """Builds the model of op range ``[start, end)`` of ``graph``.

    Args:
      graph: The source model.
      start: First op.
      end: One past the last op; must be greater than ``start``.
      extra_outputs: Tensors written in the range to expose as outputs too
        (to compare intermediate values with a split run).

    Returns:
      The segment's .tflite bytes.
    """
    source = graph.model
    sub = source.subgraphs[0]
    inputs, outputs = graph.segment_io(start, end)
    outputs = sorted(set(outputs) | set(extra_outputs))
    ops = sub.operators[start:end]

    tensor_map: Dict[int, int] = {}
    buffer_map: Dict[int, int] = {0: 0}
    code_map: Dict[int, int] = {}
    tensors: List[schema.TensorT] = []
    buffers: List[schema.BufferT] = [schema.BufferT()]

    def keep_buffer(index: int) -> int:
        if index not in buffer_map:
            buffer_map[index] = len(buffers)
            buffers.append(source.buffers[index])
        return buffer_map[index]

    def keep_tensor(index: int) -> int:
        if index < 0:
            return index  # An omitted optional input stays omitted.
        if index not in tensor_map:
            tensor = copy.copy(sub.tensors[index])  # Shallow: shape, name, quantization shared.
            tensor.buffer = keep_buffer(tensor.buffer)
            tensor_map[index] = len(tensors)
            tensors.append(tensor)
        return tensor_map[index]

    for t in inputs:
        keep_tensor(t)
    new_ops = []
    for op in ops:
        new = copy.copy(op)
        if op.opcodeIndex not in code_map:
            code_map[op.opcodeIndex] = len(code_map)
        new.opcodeIndex = code_map[op.opcodeIndex]
        new.inputs = [keep_tensor(t) for t in op.inputs]
        new.outputs = [keep_tensor(t) for t in op.outputs]
        if op.intermediates is not None:
            new.intermediates = [keep_tensor(t) for t in op.intermediates]
        new_ops.append(new)

    subgraph = schema.SubGraphT()
    subgraph.tensors = tensors
    subgraph.operators = new_ops
    subgraph.inputs = [tensor_map[t] for t in inputs]
    subgraph.outputs = [tensor_map[t] for t in outputs]
    subgraph.name = sub.name

    model = schema.ModelT()
    model.version = source.version
    model.description = source.description
    model.operatorCodes = [source.operatorCodes[i]
                           for i, _ in sorted(code_map.items(), key=lambda kv: kv[1])]
    model.subgraphs = [subgraph]
    # Metadata (e.g. min_runtime_version) applies to the segment too; keep its buffers.
    model.metadata = []
    for entry in source.metadata or []:
        kept = copy.copy(entry)
        kept.buffer = keep_buffer(entry.buffer)
        model.metadata.append(kept)
    model.buffers = buffers
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def write_segments(graph: Graph, ranges: List[Tuple[int, int]], out_dir: Path) -> List[Segment]:
    """Writes a segment file for every non-empty range, numbered among the non-empty ones.

    Args:
      graph: The source model.
      ranges: Op ranges in pipeline order; empty ranges get no file.
      out_dir: Folder for the files.

    Returns:
      One ``Segment`` per non-empty range, in order.
    """
    kept = [r for r in ranges if r[1] > r[0]]
    segments = []
    for i, (start, end) in enumerate(kept):
        path = Path(out_dir) / segment_name(graph.name, i, len(kept))
        path.write_bytes(build_segment(graph, start, end))
        inputs, outputs = graph.segment_io(start, end)
        segments.append(Segment(path, (start, end), tuple(inputs), tuple(outputs)))
    return segments
