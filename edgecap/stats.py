"""Measurements of one pipeline run: busy time per stage, queue depths, rates, drops, latency."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

# A service runs forever; latency percentiles come from the newest samples.
LATENCY_SAMPLES = 10_000


@dataclass(frozen=True)
class StageStats:
    """Work done by one stage (step) of the pipeline.

    ``predicted_ms`` is the plan's time for the step a frame (None where the
    plan predicts none); ``measured_ms`` the running median of its last
    invokes (``edgecap.adapt``; None before the first).
    """

    name: str
    worker: str
    invokes: int
    busy_s: float
    utilization: float
    predicted_ms: Optional[float] = None
    measured_ms: Optional[float] = None

    @property
    def mean_ms(self) -> float:
        """Mean time per invoke in milliseconds."""
        return 1000.0 * self.busy_s / self.invokes if self.invokes else 0.0


@dataclass(frozen=True)
class QueueStats:
    """One queue: its hand-offs, and its depth sampled at each of them."""

    name: str
    capacity: int
    mean_depth: float
    max_depth: int
    puts: int


@dataclass(frozen=True)
class FailoverRecord:
    """One change of plan at run time: a device failed, or a failed one came back.

    Attributes:
      device: The device (worker) that failed or returned, e.g. ``emu-tpu:1``.
      kind: How it failed (``error``, ``hung``, ``crashed``, ``vanished``),
        ``returned`` when a re-probe took it back, or ``measured`` when the
        running board measured it off the model and switched to a better plan
        (``edgecap.adapt``; ``device`` then names the plan devices).
      detail: The failure's one line.
      at: Wall-clock time (``time.time()``) the runtime learned of it.
      took_s: From then to the first frame out of the new plan's pipeline
        (None until that frame arrives).
      plan_before: The stages and their devices before, e.g.
        ``tpu:0@emu-tpu:0 tpu:1@emu-tpu:1 cpu@cpu``.
      plan_after: The same after.
      how: Where the new plan came from: ``bundle`` (a plan the bundle
        carries), ``compiler`` (re-partitioned in-process), ``cpu`` (the
        failed stage's segment on a CPU worker), ``original`` (every device
        back), ``measured`` (the best plan under the learned corrections).
      replayed: Frames run again so that no open window is lost (file mode).
      lost_frames: Frames in flight that were lost (live mode), counted as drops.
      lost_windows: Windows open at the fault that get no caption (live mode).
    """

    device: str
    kind: str
    detail: str
    at: float
    took_s: Optional[float]
    plan_before: str
    plan_after: str
    how: str
    replayed: int = 0
    lost_frames: int = 0
    lost_windows: int = 0


@dataclass(frozen=True)
class PipelineStats:
    """A snapshot of a run.

    ``fps_in`` and ``fps_out`` are steady-state rates: items between the first
    and the last one, over the time between them. Latency is from the moment an
    item leaves the source to the moment the consumer receives it. ``thermal``
    holds the temperature and throttle state of the PCIe EdgeTPUs the run uses
    (``edgecap.devices.TpuThermal``), read when the snapshot is taken: a
    throttled TPU runs slower than its plan predicts.

    After a device failed at run time, ``failovers`` holds a record per change
    of plan; the counts (``frames_in``, ``frames_out``, ``dropped``) are then
    totals over the pipelines of the stream, a frame run again after a
    failover counting again (``replayed`` says how many), while rates, latency,
    stages and queues are the current pipeline's. ``switches`` counts the
    changes of plan made because the board measured its devices off the model
    (``failovers`` records of kind ``measured``), ``corrections`` what it
    learned: plan device -> ``{"speed", "compute_scale", "link_bytes_per_s"}``
    (``compute_scale`` is ``1 / speed``, what the service's metric and API report).
    """

    frames_in: int
    frames_out: int
    dropped: int
    elapsed_s: float
    fps_in: float
    fps_out: float
    latency_ms: Dict[str, float]
    stages: Tuple[StageStats, ...]
    queues: Tuple[QueueStats, ...]
    thermal: Tuple[Any, ...] = ()
    failovers: Tuple[FailoverRecord, ...] = ()
    replayed: int = 0
    switches: int = 0
    corrections: Dict[str, Dict[str, Optional[float]]] = field(default_factory=dict)

    def worker_utilization(self) -> Dict[str, float]:
        """Busy fraction of each worker (device), summed over its stages."""
        util: Dict[str, float] = {}
        for s in self.stages:
            util[s.worker] = util.get(s.worker, 0.0) + s.utilization
        return util


@dataclass
class RunRecorder:
    """Collects a run's measurements from the pipeline's threads.

    Each counter has one writer: a step's ``busy`` and ``invokes`` entries its
    worker, the input counts the feeder, the output counts the consumer, and a
    queue's depth entries whoever puts into it, under that queue's lock. So no
    lock is needed here, and ``snapshot`` may run at any time. Steps and
    queues are indexed in pipeline order, so the hot path indexes lists
    instead of hashing names.
    """

    steps: Sequence[Tuple[str, str]]
    queues: Sequence[Tuple[str, int]]
    frames_in: int = 0
    frames_out: int = 0
    dropped: int = 0
    first_in: Optional[float] = None
    last_in: Optional[float] = None
    first_out: Optional[float] = None
    last_out: Optional[float] = None
    finished: Optional[float] = None

    def __post_init__(self) -> None:
        self.busy: List[float] = [0.0] * len(self.steps)
        self.invokes: List[int] = [0] * len(self.steps)
        self.depth_sum: List[int] = [0] * len(self.queues)
        self.depth_puts: List[int] = [0] * len(self.queues)
        self.depth_max: List[int] = [0] * len(self.queues)
        self.latencies: Deque[float] = collections.deque(maxlen=LATENCY_SAMPLES)

    def item_in(self, t: float) -> None:
        """An item left the source at ``t``."""
        if self.first_in is None:
            self.first_in = t
        self.last_in = t
        self.frames_in += 1

    def finish(self) -> None:
        """The run ended (completed, failed or stopped); the first call counts."""
        if self.finished is None:
            self.finished = time.perf_counter()

    def item_out(self, t_in: float, t: float) -> None:
        """The consumer received the item that left the source at ``t_in``."""
        if self.first_out is None:
            self.first_out = t
        self.last_out = t
        self.frames_out += 1
        self.latencies.append(t - t_in)

    def snapshot(self) -> PipelineStats:
        """Returns the run's statistics so far."""
        end = self.finished if self.finished is not None else time.perf_counter()
        elapsed = max(0.0, end - self.first_in) if self.first_in is not None else 0.0
        stages = tuple(
            StageStats(
                name=name,
                worker=worker,
                invokes=self.invokes[i],
                busy_s=self.busy[i],
                utilization=self.busy[i] / elapsed if elapsed else 0.0,
            )
            for i, (name, worker) in enumerate(self.steps)
        )
        queues = tuple(
            QueueStats(
                name=name,
                capacity=capacity,
                mean_depth=self.depth_sum[i] / self.depth_puts[i] if self.depth_puts[i] else 0.0,
                max_depth=self.depth_max[i],
                puts=self.depth_puts[i],
            )
            for i, (name, capacity) in enumerate(self.queues)
        )
        return PipelineStats(
            frames_in=self.frames_in,
            frames_out=self.frames_out,
            dropped=self.dropped,
            elapsed_s=elapsed,
            fps_in=_rate(self.frames_in, self.first_in, self.last_in),
            fps_out=_rate(self.frames_out, self.first_out, self.last_out),
            latency_ms=summarize([1000.0 * t for t in self.latencies]),
            stages=stages,
            queues=queues,
        )


def _rate(count: int, first: Optional[float], last: Optional[float]) -> float:
    if count < 2 or first is None or last is None or last <= first:
        return 0.0
    return (count - 1) / (last - first)


def summarize(latencies_ms: List[float]) -> Dict[str, float]:
    """p50/p90/p99/mean of a list of latencies in milliseconds."""
    lat = np.asarray(latencies_ms, dtype=np.float64)
    if not lat.size:
        return {}
    out = dict(zip(("p50", "p90", "p99"), np.percentile(lat, [50, 90, 99]).tolist()))
    out["mean"] = float(lat.mean())
    return out
