"""The cost model: predicted milliseconds of a contiguous op range on one device.

One formula, ``ms = work_features(range) . device.coefficients()``:

time = compute (MACs, element work, per-op overhead; on a CPU with a memory
         bandwidth, also the parameter and activation bytes its ops move,
         unless they all fit in its cache)
     + the device's per-invoke overhead (a non-empty range)
     + link bytes: the parameters that do not fit in the TPU's SRAM, streamed
       every invoke, and the boundary tensors in and out (TPU only)
     + on the CPU stage, the RNN encoder step of every window the frame feeds.
Tensors that merely pass a stage by stay in host memory and cost nothing.
``CostModel.stage``, ``CostModel.matrix`` and calibration's fit all use it.
A TPU whose link sits behind a shared bus also occupies that bus for its link
bytes at the bus's rate (``CostModel.bus_matrix``): the partitioner bounds the
period by the bus's total as by a stage.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from edgecap.plans.plan import Bus, CpuFrame
from edgecap.windows import windows_per_frame
from edgecap_compile.boards import PRICES, Device
from edgecap_compile.graph import Graph

# Column of each work feature in work_features' last axis (PRICES order).
_COLUMN = {feature: i for i, (feature, _) in enumerate(PRICES)}


def work_features(macs, elements, ops, link_bytes, memory_bytes=0) -> np.ndarray:
    """Returns the work features of op ranges, stacked on a last axis in ``PRICES`` order.

    Args:
      macs: Multiply-accumulates of each range (a number or an array).
      elements: Element work of each range.
      ops: Op count of each range; a range with none pays no invoke overhead.
      link_bytes: Bytes over the device's link (streamed parameters plus
        boundary tensors on a TPU; 0 on the CPU).
      memory_bytes: Parameter and activation bytes the range's ops read and
        write (priced only on a CPU with ``memory_bytes_per_s``).

    Returns:
      ``float64`` array of shape ``broadcast shape + (len(PRICES),)``; its dot
      product with ``Device.coefficients()`` is the range's milliseconds.
    """
    values = {"macs": macs, "elements": elements, "ops": ops,
              "invokes": np.greater(ops, 0), "link_bytes": link_bytes,
              "memory_bytes": memory_bytes}
    columns = np.broadcast_arrays(*(np.asarray(values[f], dtype=np.float64) for f, _ in PRICES))
    return np.stack(columns, axis=-1)


@dataclass(frozen=True)
class StageCost:
    """The parts of one stage's predicted time.

    Attributes:
      compute_ms: MACs, element work, per-op overhead and (CPU) memory traffic.
      stream_ms: Parameters beyond SRAM streamed over the link every invoke.
      transfer_ms: Boundary tensors in and out over the link.
      invoke_ms: Fixed per-invoke overhead (0 for an empty stage).
      extra_ms: Work the stage carries besides its ops (the RNN step on the CPU).
      param_bytes: Parameter bytes of the range.
      streamed_bytes: Of those, bytes beyond SRAM.
      io_bytes: Boundary tensor bytes in and out.
      macs: Multiply-accumulates of the range.
      elements: Element work of the range.
      memory_bytes: Parameter and activation bytes its ops move from memory
        (0 where they fit in the CPU's cache, or the device prices none).
    """

    compute_ms: float
    stream_ms: float
    transfer_ms: float
    invoke_ms: float
    extra_ms: float
    param_bytes: int
    streamed_bytes: int
    io_bytes: int
    macs: int
    elements: int
    memory_bytes: int = 0

    @property
    def total_ms(self) -> float:
        return self.compute_ms + self.stream_ms + self.transfer_ms + self.invoke_ms + self.extra_ms


def dram_bytes(device: Device, memory):
    """Returns the bytes an op range moves from memory: all of them, or 0 where they fit the cache.

    Args:
      device: The device (its ``cache_bytes``, if any).
      memory: Parameter and activation bytes of each range (a number or an array).
    """
    if device.cache_bytes is None:
        return memory
    return np.where(np.asarray(memory) > device.cache_bytes, memory, 0)


def boundary_bytes(graph: Graph) -> np.ndarray:
    """Returns ``io[a, b]``: bytes of the tensors op range ``[a, b)`` reads in plus writes out.

    Matches ``Graph.segment_io`` for every range, computed for all ranges at once
    by adding each tensor's contribution to a 2-D difference array.
    """
    n = len(graph.ops)
    diff = np.zeros((n + 2, n + 2), dtype=np.int64)

    def add(rows: tuple, cols: tuple, size: int) -> None:
        # Adds size to io[rows[0]:rows[1], cols[0]:cols[1]].
        (r0, r1), (c0, c1) = rows, cols
        diff[r0, c0] += size
        diff[r1, c0] -= size
        diff[r0, c1] -= size
        diff[r1, c1] += size

    readers = {t: [] for t in graph.activations()}
    for op in graph.ops:
        for t in dict.fromkeys(op.inputs):
            if t in readers:
                readers[t].append(op.index)
    for t, reads in readers.items():
        size = graph.tensors[t].nbytes
        producer, last = int(graph.producer[t]), int(graph.last_use[t])
        # Read in: for a start a after the producer, the first reader r >= a
        # pulls the tensor into every range that ends after r.
        previous = producer
        for r in reads:
            add((previous + 1, r + 1), (r + 1, n + 1), size)
            previous = r
        # Written out: ranges that start at or before the producer and end
        # after it but no later than its last use.
        if producer >= 0 and last > producer:
            add((0, producer + 1), (producer + 1, last + 1), size)
    io = diff.cumsum(axis=0).cumsum(axis=1)[: n + 1, : n + 1]
    return np.triu(io, 1)


class CostModel:
    """Predicts stage times of one graph on one board's devices.

    Args:
      graph: The model.
      devices: Stage devices in pipeline order (TPUs, then the CPU).
      rnn_ms: Time of one RNN encoder step on the CPU.
      window: ``(frames, stride)`` of the captioning window: the CPU stage
        carries ``rnn_ms`` once for every window a frame feeds
        (``edgecap.windows.windows_per_frame``). None charges one step per
        frame (windows that do not overlap).
    """

    def __init__(self, graph: Graph, devices: List[Device], rnn_ms: float = 0.0,
                 window: Optional[Tuple[int, int]] = None):
        self.graph = graph
        self.devices = list(devices)
        self.rnn_ms = float(rnn_ms)
        self.window = window
        self.rnn_steps_per_frame = 1.0 if window is None else windows_per_frame(*window)
        # Per stage, the devices of its other copies (``in_order``); none until ordered.
        self.copies: List[List[Device]] = [[] for _ in self.devices]
        ops = graph.ops
        self._macs = np.concatenate([[0], np.cumsum([op.macs for op in ops], dtype=np.int64)])
        self._elements = np.concatenate(
            [[0], np.cumsum([op.elements for op in ops], dtype=np.int64)])
        self._params = np.concatenate(
            [[0], np.cumsum([op.param_bytes for op in ops], dtype=np.int64)])
        self._memory = np.concatenate([[0], np.cumsum(
            [op.param_bytes + op.act_in_bytes + op.act_out_bytes for op in ops], dtype=np.int64)])
        self._io = boundary_bytes(graph)

    def in_order(self, order: Sequence[int], copies: Sequence[Sequence[int]] = ()) -> "CostModel":
        """Returns the cost model with stage k on ``devices[order[k]]`` (a partition's ``order``).

        Args:
          order: Each stage's device, an index into ``devices``.
          copies: Each stage's other copies' devices (a partition's ``copies``), kept in ``copies``.
        """
        out = copy.copy(self)
        out.devices = [self.devices[d] for d in order]
        out.copies = [[self.devices[d] for d in c] for c in copies] or [[] for _ in order]
        return out

    @property
    def cpu_frame(self) -> CpuFrame:
        """The board CPU's own work a frame (``CpuFrame``): preprocessing at the model's input size, a hand-off per stage."""
        cpu = next((d for d in self.devices if not d.is_tpu), None)
        if cpu is None:
            return CpuFrame()
        elements = sum(int(np.prod(self.graph.tensors[t].shape, dtype=np.int64)) for t in self.graph.inputs)
        rate = cpu.frame_elements_per_s
        return CpuFrame(cpu.frame_ms + (elements * 1e3 / rate if rate else 0.0), cpu.handoff_ms)

    @property
    def n_ops(self) -> int:
        return len(self.graph.ops)

    @property
    def rnn_frame_ms(self) -> float:
        """RNN milliseconds the CPU stage carries per frame: one step per window the frame feeds."""
        return self.rnn_ms * self.rnn_steps_per_frame

    def param_bytes(self, start: int, end: int) -> int:
        """Returns the parameter bytes of op range ``[start, end)``."""
        return int(self._params[end] - self._params[start])

    def stage(self, k: int, start: int, end: int) -> StageCost:
        """Returns the cost of op range ``[start, end)`` on stage ``k``'s device."""
        return self.cost_on(self.devices[k], start, end)

    def cost_on(self, device: Device, start: int, end: int, rnn: bool = True) -> StageCost:
        """Returns the cost of op range ``[start, end)`` on ``device``.

        Args:
          device: Any device of the board (a stage's, or a copy's).
          start: First op.
          end: One past the last op.
          rnn: On the CPU, charge the RNN steps a frame (the CPU stage's);
            False for the CPU's copy of a replicated stage.
        """
        macs = int(self._macs[end] - self._macs[start])
        elements = int(self._elements[end] - self._elements[start])
        params = self.param_bytes(start, end)
        memory = int(dram_bytes(device, int(self._memory[end] - self._memory[start])))
        streamed = io = 0
        if device.is_tpu:
            streamed = max(0, params - device.sram_bytes)
            io = int(self._io[start, end])
        c = device.coefficients()
        terms = work_features(macs, elements, end - start, streamed + io, memory) * c
        per_byte = c[_COLUMN["link_bytes"]]
        return StageCost(
            compute_ms=float(terms[_COLUMN["macs"]] + terms[_COLUMN["elements"]]
                             + terms[_COLUMN["ops"]] + terms[_COLUMN["memory_bytes"]]),
            stream_ms=streamed * per_byte,
            transfer_ms=io * per_byte,
            invoke_ms=float(terms[_COLUMN["invokes"]]),
            extra_ms=0.0 if device.is_tpu or not rnn else self.rnn_frame_ms,
            param_bytes=params,
            streamed_bytes=streamed,
            io_bytes=io,
            macs=macs,
            elements=elements,
            memory_bytes=memory,
        )

    def link_bytes(self, k: int) -> np.ndarray:
        """Returns ``L[a, b]``: bytes over stage ``k``'s link for op range ``[a, b)`` (0 on the CPU)."""
        device = self.devices[k]
        if not device.is_tpu:
            return np.zeros_like(self._io)
        params = self._params[None, :] - self._params[:, None]
        return np.triu(np.maximum(0, params - device.sram_bytes) + self._io)

    def bus_matrices(self, buses: Sequence[Bus]) -> Optional[List[np.ndarray]]:
        """Returns per stage the milliseconds its link bytes take on the shared bus, or None.

        Args:
          buses: The board's shared buses; a device's ``bus`` names one.

        Returns:
          One ``(n+1, n+1)`` matrix per stage (zeros for a device off the
          bus), the partitioner's ``bus``; None when no stage's device sits
          behind a bus.
        """
        rate = {b.name: b.bytes_per_s for b in buses}
        if not any(d.bus in rate for d in self.devices):
            return None
        return [self.link_bytes(k) * (1e3 / rate[d.bus]) if d.bus in rate
                else np.zeros_like(self._io, dtype=np.float64)
                for k, d in enumerate(self.devices)]

    def matrix(self, k: int) -> np.ndarray:
        """Returns ``C[a, b]``: stage ``k``'s milliseconds for op range ``[a, b)``; inf where a > b."""
        device = self.devices[k]
        n = self.n_ops
        a = np.arange(n + 1)[:, None]
        b = np.arange(n + 1)[None, :]
        macs = self._macs[None, :] - self._macs[:, None]
        elements = self._elements[None, :] - self._elements[:, None]
        memory = dram_bytes(device, self._memory[None, :] - self._memory[:, None])
        link = 0
        if device.is_tpu:
            params = self._params[None, :] - self._params[:, None]
            link = np.maximum(0, params - device.sram_bytes) + self._io
        cost = work_features(macs, elements, b - a, link, memory) @ device.coefficients()
        if not device.is_tpu:
            cost = cost + self.rnn_frame_ms
        return np.where(b >= a, cost, np.inf)

    def ops_ms(self, device: Device, ops: Sequence[int]) -> float:
        """Returns the compute milliseconds of some ops on ``device``, inside a stage's invoke.

        What ops edgetpu_compiler leaves on the CPU cost inside a TPU stage: their
        MACs, element work and per-op overhead at the CPU's coefficients, no
        invoke overhead of their own and no link bytes.
        """
        if not ops:
            return 0.0
        picked = [self.graph.ops[i] for i in ops]
        memory = sum(op.param_bytes + op.act_in_bytes + op.act_out_bytes for op in picked)
        features = work_features(sum(op.macs for op in picked), sum(op.elements for op in picked),
                                 len(picked), 0, dram_bytes(device, memory))
        features[_COLUMN["invokes"]] = 0.0
        return float(features @ device.coefficients())

    def op_ms(self, k: int) -> np.ndarray:
        """Returns each op's compute plus streaming milliseconds alone on stage ``k``'s device."""
        alone = [self.stage(k, i, i + 1) for i in range(self.n_ops)]
        return np.array([c.compute_ms + c.stream_ms for c in alone])
