"""``edgecap bench``: four schedules of the same bundle and clips, on an emulated board and on this host.

Schedules:
  a  CPU only, sequential: the whole encoder and the RNN on the CPU, one frame at a time.
  b  CNN on one TPU, then the RNN, no overlap (Coral's default: one model per TPU).
  c  The plan's fine-grained placement (TPU segments + CPU tail), no pipelining.
  d  The full pipeline: the plan's placement, every device busy on a different frame.

Profiles:
  <board> (default devboard-usb): TPU stages on emulated EdgeTPUs and the CPU
    stage paced to the board's predicted times (``--timing-only``: emulated
    stages compute nothing). A row "d timing-only" checks the pipeline against
    its bound 1/max(stage time).
  host: every stage computed on this machine's CPU; TPU stages become CPU
    worker threads (``cpu:1``, ``cpu:2``) and are not paced.

Every decoded frame of the clips is a sampled frame; clips are repeated up to
``--frames``. The scheduler's own cost is measured with null stages.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from edgecap.bundle import DEMO_DIR, Bundle, default_bundle, load_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.errors import ConfigError
from edgecap.plan import Plan
from edgecap.planning import plan_for_board
from edgecap.scheduler import Pipeline, Step
from edgecap.sources import open_source

SCHEDULES = {
    "a": "CPU only, sequential",
    "b": "CNN on one TPU, then RNN, no overlap",
    "c": "plan placement, no pipelining",
    "d": "full pipeline",
}


@dataclass
class Row:
    """One measured schedule."""

    profile: str
    schedule: str
    label: str
    frames: int
    fps: float
    latency_p50_ms: float
    latency_p99_ms: float
    utilization: Dict[str, float]
    speedup: float = 1.0
    bound_fps: Optional[float] = None
    same_captions: Optional[bool] = None
    placement: Dict[str, str] = field(default_factory=dict)

    @property
    def of_bound(self) -> Optional[float]:
        """Measured fps as a fraction of the bound, where there is one."""
        return self.fps / self.bound_fps if self.bound_fps else None


@dataclass
class Scaling:
    """Sequential vs pipelined fps of two CPU stages of ``invokes`` encoder invokes each."""

    invokes: int
    stage_ms: float
    sequential_fps: float
    pipelined_fps: float

    @property
    def speedup(self) -> float:
        """Pipelined over sequential throughput."""
        return self.pipelined_fps / self.sequential_fps if self.sequential_fps else 0.0


@dataclass
class Overhead:
    """Scheduler cost per frame per stage, measured with null stages."""

    stages: int
    frames: int
    wall_ms_per_frame_stage: float
    cpu_ms_per_frame_stage: float
    inline_wall_ms_per_frame_stage: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``edgecap bench`` options to ``parser``."""
    parser.add_argument("--bundle", type=Path, help="bundle directory (default: the shipped demo)")
    parser.add_argument("--clips", nargs="+", help="video files (default: the shipped sample clip)")
    parser.add_argument("--frames", type=int, default=480, help="frames per run (clips repeat)")
    parser.add_argument("--board", default="devboard-usb", help="board profile to emulate")
    parser.add_argument("--profiles", default="board,host",
                        help="comma list of: board (the emulated --board), host")
    parser.add_argument("--timing-only", action="store_true",
                        help="emulated stages compute nothing (all board rows)")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of each CPU encoder interpreter (default 1)")
    parser.add_argument("--batch", type=int, default=8,
                        help="frames per hand-off in the host's batched pipeline rows (default 8)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plot", type=Path, help="write a bar chart PNG here (needs matplotlib)")
    parser.add_argument("--timeline", type=Path, help="with --plot: PNG of the pipelined board run's "
                        "timeline (default: PLOT-timeline.png)")
    parser.add_argument("--trace", type=Path, help="write the Chrome trace of the pipelined board run here")


def run(args: argparse.Namespace) -> int:
    """Runs the benchmark; prints the table. Returns the exit code."""
    if args.threads < 1:
        raise ConfigError(f"--threads {args.threads}: use 1 or more")
    if args.frames < 1:
        raise ConfigError(f"--frames {args.frames}: use 1 or more")
    if args.batch < 1:
        raise ConfigError(f"--batch {args.batch}: use 1 or more")
    bundle = load_bundle(args.bundle or default_bundle())
    clips = args.clips or [str(DEMO_DIR / "sample.mp4")]
    frames = _load_frames(clips, args.frames)
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    unknown = set(profiles) - {"board", "host"}
    if unknown:
        raise ConfigError(f"--profiles {','.join(sorted(unknown))}: use board and/or host")
    trace = args.trace
    if args.plot is not None and trace is None:
        trace = Path(tempfile.mkdtemp(prefix="edgecap-bench-")) / "trace.json"
    rows: List[Row] = []
    if "board" in profiles:
        rows += bench_board(bundle, frames, args.board, args.timing_only, args.threads, trace)
    if "host" in profiles:
        rows += bench_host(bundle, frames, args.board, args.threads, args.batch)
    overhead = bench_overhead()
    scaling = bench_scaling(bundle) if "host" in profiles else []
    print(format_table(rows, overhead, scaling))
    result = {
        "argv": sys.argv[1:],
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "bundle": str(bundle.root),
        "clips": [str(c) for c in clips],
        "frames": len(frames),
        "rows": [dict(asdict(r), of_bound=r.of_bound) for r in rows],
        "overhead": asdict(overhead),
        "host_scaling": [dict(asdict(x), speedup=x.speedup) for x in scaling],
    }
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.plot is not None:
        from edgecap.plots import plot_bench, plot_timeline

        plot_bench(result, args.plot)
        if trace.is_file():
            plot_timeline(trace, args.timeline or args.plot.with_name(args.plot.stem + "-timeline.png"))
    return 0


def _load_frames(clips: Sequence[str], count: int) -> List[np.ndarray]:
    decoded: List[np.ndarray] = []
    for clip in clips:
        with open_source(clip) as src:
            decoded += [f.image for f in src]
    if not decoded:
        raise ConfigError(f"{', '.join(clips)}: no frames; pass --clips with video files")
    return [decoded[i % len(decoded)] for i in range(max(count, 1))]


def _measure(
    profile: str, schedule: str, label: str, cap: EdgeCaptioner, frames: List[np.ndarray]
) -> "tuple[Row, List[List[int]]]":
    # Warm up interpreters, caches and threads on two windows, then measure one run.
    cap.caption_frames(frames[: 2 * cap.window.frames])
    captions = [c.tokens for c in cap.stream(frames, fps=0)]
    stats = cap.stats()
    row = Row(
        profile=profile,
        schedule=schedule,
        label=label,
        frames=stats.frames_out,
        fps=stats.fps_out,
        latency_p50_ms=stats.latency_ms.get("p50", 0.0),
        latency_p99_ms=stats.latency_ms.get("p99", 0.0),
        utilization={k: round(v, 3) for k, v in stats.worker_utilization().items()},
        placement=dict(cap.devices),
    )
    return row, captions


def _bound_fps(plan: Plan, pipelined: bool) -> float:
    # The CPU stage's prediction carries the RNN step, also when it runs no CNN op.
    times = [s.predicted_ms or 0.0 for s in plan.stages if not s.empty or s.device == "cpu"]
    if not any(s.device == "cpu" for s in plan.stages):
        times.append(plan.rnn_ms or 0.0)
    period = max(times) if pipelined else sum(times)
    return 1000.0 / period if period > 0 else float("inf")


def bench_board(
    bundle: Bundle,
    frames: List[np.ndarray],
    board: str,
    timing_only: bool,
    threads: int,
    trace: Optional[Path],
) -> List[Row]:
    """Runs the four schedules on the emulated ``board``.

    Returns:
      Rows a-d, plus "d timing-only" (the bound check) unless every row is timing-only.
    """
    plans = {
        "a": plan_for_board(bundle, board, tpus=0),
        "b": plan_for_board(bundle, board, whole_on_tpu=True),
        "c": plan_for_board(bundle, board),
        "d": plan_for_board(bundle, board),
    }
    name = f"{board} (emulated)"
    rows: List[Row] = []
    reference: Optional[List[List[int]]] = None
    runs = [(s, plans[s], s == "d", timing_only) for s in SCHEDULES]
    if not timing_only:
        runs.append(("d timing-only", plans["d"], True, True))
    for schedule, plan, pipelined, zero in runs:
        with EdgeCaptioner(bundle, plan=plan, emulate=True, timing_only=zero, pipelined=pipelined,
                           num_threads=threads, sample_fps=0,
                           trace=trace if schedule == "d" else None) as cap:
            row, captions = _measure(name, schedule, SCHEDULES[schedule[0]], cap, frames)
        row.bound_fps = _bound_fps(plan, pipelined)
        if not zero:
            reference = captions if reference is None else reference
            row.same_captions = captions == reference
        rows.append(row)
    _speedups(rows)
    return rows


def bench_host(bundle: Bundle, frames: List[np.ndarray], board: str, threads: int,
               batch: int = 8) -> List[Row]:
    """Runs the four schedules with every stage computed on this machine's CPU.

    Returns:
      Rows a-d, plus "d one CNN worker" (the whole CNN on one CPU worker, the
      RNN on another), both pipelines again with ``batch`` frames per hand-off,
      and "a 2 threads" (the sequential path with XNNPACK on every core).
    """
    whole = plan_for_board(bundle, board, whole_on_tpu=True)
    split = plan_for_board(bundle, board)
    on_cpus = {s.device: f"cpu:{i + 1}" for i, s in enumerate(split.active_stages) if s.device != "cpu"}
    configs = [
        ("a", dict(pipelined=False)),
        ("b", dict(plan=whole, devices_map={"tpu:0": "cpu:1"}, pipelined=False)),
        ("c", dict(plan=split, devices_map=on_cpus, pipelined=False)),
        ("d", dict(plan=split, devices_map=on_cpus, pipelined=True)),
    ]
    rows: List[Row] = []
    reference: Optional[List[List[int]]] = None
    extra = [
        ("d one CNN worker", dict(plan=whole, devices_map={"tpu:0": "cpu:1"}, pipelined=True)),
        (f"d batched {batch}", dict(plan=split, devices_map=on_cpus, batch=batch)),
        (f"d one CNN worker, batched {batch}",
         dict(plan=whole, devices_map={"tpu:0": "cpu:1"}, batch=batch)),
        ("a 2 threads", dict(pipelined=False)),
    ]
    for schedule, kwargs in configs + extra:
        n = (os.cpu_count() or 1) if schedule == "a 2 threads" else threads
        with EdgeCaptioner(bundle, emulate=False, num_threads=n, sample_fps=0, **kwargs) as cap:
            row, captions = _measure("host", schedule, SCHEDULES[schedule[0]], cap, frames)
        reference = captions if reference is None else reference
        row.same_captions = captions == reference
        rows.append(row)
    _speedups(rows)
    return rows


def _speedups(rows: List[Row]) -> None:
    base = rows[0].fps
    for row in rows:
        row.speedup = row.fps / base if base else 0.0


def bench_overhead(stages: int = 4, frames: int = 4000) -> Overhead:
    """Measures the scheduler's cost per frame per stage with null stages.

    Returns:
      Wall and CPU (all threads) time per frame per stage of a pipelined run of
      ``stages`` null stages on their own threads, and the wall time of the
      sequential (inline) schedule for comparison.
    """
    steps = [Step(f"null{i}", f"w{i}", lambda: (lambda x: x)) for i in range(stages)]
    items = range(frames)
    with Pipeline(steps) as pipe:
        for _ in pipe.run(range(100)):  # start-up
            pass
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in pipe.run(items):
            pass
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    with Pipeline(steps, pipelined=False) as pipe:
        t1 = time.perf_counter()
        for _ in pipe.run(items):
            pass
        inline = time.perf_counter() - t1
    per = 1000.0 / (frames * stages)
    return Overhead(stages, frames, wall * per, cpu * per, inline * per)


def bench_scaling(bundle: Bundle, counts: Sequence[int] = (1, 4, 16), frames: int = 400) -> List[Scaling]:
    """Measures how pipelining two CPU stages pays off as the work per stage grows.

    Each stage invokes the bundle's encoder ``count`` times per frame (a CNN
    ``count`` times heavier), on its own worker; the sequential schedule runs
    both in one thread. Shows the stage size at which the scheduler's cost per
    hop stops mattering on this host.
    """
    from edgecap.interpreter import make_cpu_interpreter

    def heavy_stage(count: int) -> Any:
        interp = make_cpu_interpreter(bundle.encoder, 1)

        def run(x: int) -> int:
            for _ in range(count):
                interp.invoke()
            return x

        return run

    results = []
    for count in counts:
        steps = [Step(f"cnn-{w}", w, functools.partial(heavy_stage, count)) for w in ("cpu:1", "cpu")]
        fps = {}
        for pipelined in (False, True):
            with Pipeline(steps, pipelined=pipelined) as pipe:
                for _ in pipe.run(range(20)):  # warm-up
                    pass
                for _ in pipe.run(range(max(frames // count, 40))):
                    pass
                stats = pipe.stats()
            fps[pipelined] = stats.fps_out
            if not pipelined:
                stage_ms = stats.stages[0].mean_ms
        results.append(Scaling(count, stage_ms, fps[False], fps[True]))
    return results


def format_table(rows: Sequence[Row], overhead: Overhead, scaling: Sequence[Scaling] = ()) -> str:
    """Formats the results as the table ``edgecap bench`` prints."""
    lines: List[str] = []
    profile = None
    for r in rows:
        if r.profile != profile:
            profile = r.profile
            lines += ["", f"== {profile}", f"{'schedule':<42}{'fps':>8}{'p50 ms':>9}{'p99 ms':>9}"
                      f"{'speedup':>9}{'of bound':>9}  same  utilization"]
        util = " ".join(f"{k}={v:.0%}" for k, v in sorted(r.utilization.items()))
        bound = f"{r.of_bound:.1%}" if r.of_bound is not None else "-"
        same = {True: "yes", False: "NO", None: "-"}[r.same_captions]
        lines.append(f"{r.schedule + ' ' + r.label:<42}{r.fps:>8.1f}{r.latency_p50_ms:>9.2f}"
                     f"{r.latency_p99_ms:>9.2f}{r.speedup:>8.2f}x{bound:>9}  {same:<4}  {util}")
    lines += ["", f"scheduler overhead ({overhead.stages} null stages, {overhead.frames} frames): "
              f"{overhead.wall_ms_per_frame_stage:.4f} ms wall, {overhead.cpu_ms_per_frame_stage:.4f} ms CPU "
              f"per frame per stage (sequential: {overhead.inline_wall_ms_per_frame_stage:.4f} ms)"]
    if scaling:
        lines += ["", "host: two CPU stages of N encoder invokes each, sequential vs pipelined",
                  f"{'N':>4}{'stage ms':>10}{'seq fps':>10}{'pipe fps':>10}{'speedup':>9}"]
        lines += [f"{x.invokes:>4}{x.stage_ms:>10.3f}{x.sequential_fps:>10.1f}{x.pipelined_fps:>10.1f}"
                  f"{x.speedup:>8.2f}x" for x in scaling]
    return "\n".join(lines)
