"""The compute of already compiled segments, priced on the model they were compiled from.

A compiled segment (``*_segment_K_of_N_edgetpu.tflite``) hides its graph in
its ``edgetpu-custom-op``, but keeps its boundary tensors' names from the
source model. Given that source, each segment's operators are found between
its named inputs and outputs, and priced with the board's coefficients as the
compiler prices its own stages (``CostModel.ops_ms``): on the segment's TPU,
except ops edgetpu_compiler left on the CPU, which are priced on the board's
CPU. ``edgecap plan import --source`` uses it.
"""

from __future__ import annotations

import os
from typing import List, Sequence, Set, Tuple, Union

from edgecap_compile.boards import Board
from edgecap_compile.cost_model import CostModel
from edgecap_compile.errors import CompileError
from edgecap_compile.graph import Graph, read_graph

# A boundary tensor as the compiled segment declares it: name and shape.
Boundary = Tuple[str, Tuple[int, ...]]
# A segment as the importer sees it: its inputs, its outputs, the op types it runs on the CPU.
SegmentIO = Tuple[Sequence[Boundary], Sequence[Boundary], Sequence[str]]


def segment_ops(graph: Graph, inputs: Sequence[Boundary], outputs: Sequence[Boundary],
                where: str) -> List[int]:
    """Returns the ops of ``graph`` that compute ``outputs`` from ``inputs``, in execution order.

    Args:
      graph: The source model.
      inputs: The tensors the segment reads (name, shape).
      outputs: The tensors it writes.
      where: The segment, for the message.

    Raises:
      CompileError: If a tensor is not in the source model under that name and shape.
    """
    by_name = {t.name: t for t in graph.tensors}
    for name, shape in (*inputs, *outputs):
        found = by_name.get(name)
        if found is None or tuple(found.shape) != tuple(shape):
            has = "is not in" if found is None else f"is {list(found.shape)}, not {list(shape)}, in"
            raise CompileError(f"{where}: tensor {name!r} {has} the source model; pass the model the "
                               "segments were compiled from")
    stop = {by_name[n].index for n, _ in inputs}
    ops: Set[int] = set()
    pending = [by_name[n].index for n, _ in outputs]
    seen: Set[int] = set()
    while pending:
        t = pending.pop()
        if t in seen or t in stop:
            continue
        seen.add(t)
        producer = int(graph.producer[t])
        if producer >= 0 and producer not in ops:
            ops.add(producer)
            pending.extend(graph.ops[producer].inputs)
    return sorted(ops)


def compute_ms(source: Union[str, os.PathLike], board: Board, segments: Sequence[SegmentIO],
               names: Sequence[str]) -> List[float]:
    """Prices each compiled segment's operators in ``source`` on ``board``.

    Args:
      source: The model the segments were compiled from.
      board: The board profile; segment K runs on its TPU K (the last one again
        where it has fewer).
      segments: Each segment's input names, output names and the op types it
        runs on the CPU.
      names: Each segment's file name, for messages.

    Returns:
      Milliseconds of compute per segment (MACs, element work, per-op overhead).

    Raises:
      CompileError: If ``source`` is unreadable or lacks a segment's tensors, or
        the segments share an operator (they are not from this model).
    """
    graph = read_graph(source, require_integer=False)
    model = CostModel(graph, [*board.tpus, board.cpu])
    out = []
    claimed: Set[int] = set()
    for k, ((inputs, outputs, on_cpu), name) in enumerate(zip(segments, names)):
        ops = segment_ops(graph, inputs, outputs, name)
        if claimed & set(ops):
            raise CompileError(f"{name}: its operators overlap an earlier segment's in {os.fspath(source)}; "
                               "pass the model the segments were compiled from")
        claimed |= set(ops)
        tpu = board.tpus[min(k, len(board.tpus) - 1)]
        cpu_ops = [i for i in ops if graph.ops[i].type in set(on_cpu)]
        tpu_ops = [i for i in ops if i not in set(cpu_ops)]
        out.append(model.ops_ms(tpu, tpu_ops) + model.ops_ms(board.cpu, cpu_ops))
    return out
