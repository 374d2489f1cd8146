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
  host: every stage computed on this machine's CPU, unpaced, on the compiler's
    plan for the ``host`` profile (the whole CNN on the CPU); "one TPU" becomes
    one CPU worker thread (``cpu:1``) for the whole CNN.

Every decoded frame of the clips is a sampled frame; clips are repeated up to
``--frames``. ``strides`` repeats the board's rows with other window strides:
the runtime steps the RNN encoder once per open window, so the bound charges
that step ``frames / stride`` times a frame. The scheduler's own cost is
measured with null stages.

The command line (``edgecap bench``) is in ``edgecap.cli``; ``run_bench`` is
what it calls.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from edgecap.bundle import DEMO_DIR, Bundle, WindowSpec, default_bundle, load_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.errors import ConfigError
from edgecap.options import CaptionerOptions
from edgecap.plan import Plan
from edgecap.planning import plan_for_board
from edgecap.scheduler import Pipeline, Step
from edgecap.sources import open_source
from edgecap.windows import windows_per_frame

SCHEDULES = {
    "a": "CPU only, sequential",
    "b": "CNN on one TPU, then RNN, no overlap",
    "c": "plan placement, no pipelining",
    "d": "full pipeline",
}

# Called with the number of frames a run got through since the last call.
Progress = Callable[[int], object]


@dataclass
class Row:
    """One measured schedule."""

    profile: str
    schedule: str
    label: str
    frames: int
    stride: int
    fps: float
    latency_p50_ms: float
    latency_p99_ms: float
    utilization: Dict[str, float]
    speedup: float = 1.0
    bound_fps: Optional[float] = None
    same_captions: Optional[bool] = None
    placement: Dict[str, str] = field(default_factory=dict)
    plan_board: str = ""

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


@dataclass
class BenchResult:
    """Everything one ``edgecap bench`` measured."""

    bundle: str
    clips: List[str]
    frames: int
    rows: List[Row]
    overhead: Overhead
    scaling: List[Scaling]

    def to_json(self) -> Dict[str, Any]:
        """Returns the results as JSON-ready plain types (what ``--json`` writes)."""
        return {
            "argv": sys.argv[1:],
            "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                     "python": platform.python_version()},
            "bundle": self.bundle,
            "clips": self.clips,
            "frames": self.frames,
            "rows": [dict(asdict(r), of_bound=r.of_bound) for r in self.rows],
            "overhead": asdict(self.overhead),
            "host_scaling": [dict(asdict(x), speedup=x.speedup) for x in self.scaling],
        }


def run_bench(
    bundle: "str | os.PathLike[str] | Bundle | None" = None,
    clips: Optional[Sequence[str]] = None,
    frames: int = 480,
    board: str = "devboard-usb",
    profiles: Sequence[str] = ("board", "host"),
    timing_only: bool = False,
    threads: int = 1,
    batch: int = 8,
    strides: Optional[Sequence[int]] = None,
    trace: Optional[Path] = None,
    progress: Optional[Progress] = None,
) -> BenchResult:
    """Runs the benchmark.

    Args:
      bundle: Bundle directory or loaded ``Bundle`` (default: the shipped demo).
      clips: Video files (default: the shipped sample clip).
      frames: Frames per run; the clips repeat.
      board: Board profile to emulate.
      profiles: ``board`` (the emulated board) and/or ``host``.
      timing_only: Emulated stages compute nothing (every board row).
      threads: Threads of each CPU encoder interpreter.
      batch: Frames per hand-off in the host's batched pipeline rows.
      strides: Window strides to run the board's rows at (default: the bundle's).
      trace: Write the Chrome trace of the pipelined board run here.
      progress: Called with the frames each run got through, as it goes.

    Returns:
      The ``BenchResult``.

    Raises:
      ConfigError: If a count is out of range or a profile unknown.
      EdgecapError: If the bundle, a clip or the board is bad.
    """
    for flag, value in (("--threads", threads), ("--frames", frames), ("--batch", batch)):
        if value < 1:
            raise ConfigError(f"{flag} {value}: use 1 or more")
    unknown = set(profiles) - {"board", "host"}
    if unknown:
        raise ConfigError(f"--profiles {','.join(sorted(unknown))}: use board and/or host")
    for stride in strides or ():
        if stride < 1:
            raise ConfigError(f"--strides {stride}: use 1 or more")
    b = bundle if isinstance(bundle, Bundle) else load_bundle(bundle or default_bundle())
    clips = list(clips or [str(DEMO_DIR / "sample.mp4")])
    images = _load_frames(clips, frames)
    rows: List[Row] = []
    if "board" in profiles:
        rows += bench_board(b, images, board, timing_only, threads, trace, strides, progress)
    if "host" in profiles:
        rows += bench_host(b, images, threads, batch, progress)
    overhead = bench_overhead()
    scaling = bench_scaling(b) if "host" in profiles else []
    return BenchResult(str(b.root), [str(c) for c in clips], len(images), rows, overhead, scaling)


def runs(profiles: Sequence[str], timing_only: bool, strides: int = 1) -> int:
    """Number of measured runs ``run_bench`` makes (to size a progress bar).

    Args:
      strides: How many window strides the board's rows run at.
    """
    board = strides * (len(SCHEDULES) + (0 if timing_only else 1)) if "board" in profiles else 0
    return board + (len(_host_configs(CaptionerOptions(), 1)) if "host" in profiles else 0)


def _load_frames(clips: Sequence[str], count: int) -> List[np.ndarray]:
    decoded: List[np.ndarray] = []
    for clip in clips:
        with open_source(clip) as src:
            decoded += [f.image for f in src]
    if not decoded:
        raise ConfigError(f"{', '.join(clips)}: no frames; pass --clips with video files")
    return [decoded[i % len(decoded)] for i in range(max(count, 1))]


def _measure(
    profile: str, schedule: str, label: str, cap: EdgeCaptioner, frames: List[np.ndarray],
    progress: Optional[Progress] = None,
) -> "tuple[Row, List[List[int]]]":
    # Warm up interpreters, caches and threads on two windows, then measure one run.
    cap.caption_frames(frames[: 2 * cap.window.frames])
    captions = []
    done = 0
    for c in cap.stream(frames, fps=0):
        captions.append(c.tokens)
        if progress is not None:
            progress(c.end_frame + 1 - done)
            done = c.end_frame + 1
    if progress is not None:
        progress(len(frames) - done)
    stats = cap.stats()
    row = Row(
        profile=profile,
        schedule=schedule,
        label=label,
        frames=stats.frames_out,
        stride=cap.window.stride,
        fps=stats.fps_out,
        latency_p50_ms=stats.latency_ms.get("p50", 0.0),
        latency_p99_ms=stats.latency_ms.get("p99", 0.0),
        utilization={k: round(v, 3) for k, v in stats.worker_utilization().items()},
        placement=dict(cap.devices),
        plan_board=cap.plan.board,
    )
    return row, captions


def _bound_fps(plan: Plan, pipelined: bool, window: WindowSpec) -> float:
    # The plan's CPU stage charges its RNN steps for the window it was compiled
    # for (plan.rnn_frame_ms); the runtime steps the RNN once per open window of
    # the window it runs, so the bound charges that instead.
    rnn_ms = plan.rnn_ms or 0.0
    rnn_frame_ms = rnn_ms * windows_per_frame(window.frames, window.stride)
    times = [(s.predicted_ms or 0.0) - plan.rnn_frame_ms + rnn_frame_ms if s.spec.kind == "cpu"
             else (s.predicted_ms or 0.0)
             for s in plan.stages if not s.empty or s.spec.kind == "cpu"]
    if not any(s.spec.kind == "cpu" for s in plan.stages):
        times.append(rnn_frame_ms)
    period = max(times) if pipelined else sum(times)
    return 1000.0 / period if period > 0 else float("inf")


def bench_board(
    bundle: Bundle,
    frames: List[np.ndarray],
    board: str,
    timing_only: bool,
    threads: int,
    trace: Optional[Path],
    strides: Optional[Sequence[int]] = None,
    progress: Optional[Progress] = None,
) -> List[Row]:
    """Runs the four schedules on the emulated ``board``, at each window stride.

    Args:
      strides: Window strides (default: the bundle's); each repeats every row.

    Returns:
      Rows a-d, plus "d timing-only" (the bound check) unless every row is
      timing-only, per stride. Speedups are against row a of the same stride.
    """
    plans = {
        "a": plan_for_board(bundle, board, tpus=0),
        "b": plan_for_board(bundle, board, whole_on_tpu=True),
        "c": plan_for_board(bundle, board),
        "d": plan_for_board(bundle, board),
    }
    name = f"{board} (emulated)"
    rows: List[Row] = []
    for stride in strides or [bundle.window.stride]:
        reference: Optional[List[List[int]]] = None
        runs = [(s, plans[s], s == "d", timing_only) for s in SCHEDULES]
        if not timing_only:
            runs.append(("d timing-only", plans["d"], True, True))
        at_stride: List[Row] = []
        for schedule, plan, pipelined, zero in runs:
            options = CaptionerOptions(plan=plan, emulate=True, timing_only=zero, pipelined=pipelined,
                                       num_threads=threads, sample_fps=0, stride=stride,
                                       trace=trace if schedule == "d" else None)
            with EdgeCaptioner(bundle, options) as cap:
                row, captions = _measure(name, schedule, SCHEDULES[schedule[0]], cap, frames,
                                         progress)
                row.bound_fps = _bound_fps(plan, pipelined, cap.window)
            if not zero:
                reference = captions if reference is None else reference
                row.same_captions = captions == reference
            at_stride.append(row)
        _speedups(at_stride)
        rows += at_stride
        trace = None  # one pipelined run is traced: the first stride's
    return rows


def bench_host(bundle: Bundle, frames: List[np.ndarray], threads: int, batch: int = 8,
               progress: Optional[Progress] = None) -> List[Row]:
    """Runs the schedules with every stage computed on this machine's CPU (measured).

    The plan is the compiler's for the ``host`` profile, which has no TPU: the
    whole CNN as one CPU stage. So b and c would be a again (sequential, nothing
    to place) and are not run; "d one CNN worker" puts the CNN on a CPU worker
    of its own (``cpu:1``), where a board has its TPU.

    Returns:
      Rows a and d, "d one CNN worker" (the CNN on ``cpu:1``, the RNN on
      ``cpu``), both pipelines again with ``batch`` frames per hand-off, and
      "a 2 threads" (the sequential path with XNNPACK on every core).
    """
    base = CaptionerOptions(plan=plan_for_board(bundle, "host"), emulate=False, sample_fps=0,
                            num_threads=threads)
    rows: List[Row] = []
    reference: Optional[List[List[int]]] = None
    for schedule, options in _host_configs(base, batch):
        with EdgeCaptioner(bundle, options) as cap:
            row, captions = _measure("host", schedule, SCHEDULES[schedule[0]], cap, frames,
                                     progress)
        reference = captions if reference is None else reference
        row.same_captions = captions == reference
        rows.append(row)
    _speedups(rows)
    return rows


def _host_configs(base: CaptionerOptions, batch: int) -> List["tuple[str, CaptionerOptions]"]:
    worker = {"cpu": "cpu:1"}  # where a board has its TPU
    return [(name, base.with_overrides(**changes)) for name, changes in [
        ("a", dict(pipelined=False)),
        ("d", dict(pipelined=True)),
        ("d one CNN worker", dict(devices_map=worker, pipelined=True)),
        (f"d batched {batch}", dict(batch=batch)),
        (f"d one CNN worker, batched {batch}", dict(devices_map=worker, batch=batch)),
        ("a 2 threads", dict(pipelined=False, num_threads=os.cpu_count() or 1)),
    ]]


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
    group = None
    for r in rows:
        if (r.profile, r.stride) != group:
            group = (r.profile, r.stride)
            lines += ["", f"== {r.profile}, {r.plan_board} plan, window stride {r.stride}",
                      f"{'schedule':<42}{'fps':>8}{'p50 ms':>9}{'p99 ms':>9}"
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


# ---------------------------------------------------------------- process isolation
# Kept apart from run_bench: `python -m edgecap.bench --isolation [--json PATH]`.


@dataclass
class IsolationRow:
    """Wall time per frame of one stage in-process and in a worker process (``edgecap.isolation``)."""

    case: str
    frames: int
    in_process_ms: float
    isolated_ms: float

    @property
    def overhead_ms(self) -> float:
        """What isolation adds per frame."""
        return self.isolated_ms - self.in_process_ms


@dataclass
class IsolationBench:
    """What process isolation costs on this host, measured with the bundle's plan for ``board``.

    Attributes:
      startup_s: Seconds from starting each worker process to its stage being open.
      rows: Per-frame cost of single stages.
      pipeline_fps: Frames per second of the plan's CNN stages pipelined on their
        workers, in-process and with the emulated TPU stages isolated.
    """

    board: str
    startup_s: List[float]
    rows: List[IsolationRow]
    pipeline_fps: Dict[str, float]

    def to_json(self) -> Dict[str, Any]:
        """Returns the results as JSON-ready plain types."""
        return {
            "argv": sys.argv[1:],
            "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                     "python": platform.python_version()},
            "board": self.board,
            "startup_s": self.startup_s,
            "rows": [dict(asdict(r), overhead_ms=r.overhead_ms) for r in self.rows],
            "pipeline_fps": self.pipeline_fps,
        }


def bench_isolation(bundle: Bundle, board: str = "devboard-usb", frames: int = 300,
                    repeats: int = 3) -> IsolationBench:
    """Measures the per-frame cost of running stages in worker processes.

    Each case alternates in-process and isolated runs ``repeats`` times and
    keeps each side's median, so both see the same host load.

    Cases: a null stage (timing-only, unpaced: the round trip and the copies
    alone), the whole encoder on one emulated TPU paced to the board, and the
    whole encoder computed on the CPU unpaced; then the plan's CNN stages
    pipelined, with its emulated TPU stages isolated.

    Returns:
      The ``IsolationBench``.
    """
    import dataclasses
    import statistics

    from edgecap.stages import open_stage

    whole = plan_for_board(bundle, board, whole_on_tpu=True).active_stages[0]
    plan = plan_for_board(bundle, board)
    rng = np.random.default_rng(0)
    spec = whole.inputs[0]
    frame = {spec.name: rng.integers(-128, 128, spec.shape, dtype=np.dtype(spec.dtype))}
    startup: List[float] = []

    def timed(segment: Any, count: int) -> float:
        for _ in range(10):  # warm-up
            segment(frame)
        t0 = time.perf_counter()
        for _ in range(count):
            segment(frame)
        return (time.perf_counter() - t0) * 1000.0 / count

    cases = [
        ("null stage (round trip + copies)", dataclasses.replace(whole, predicted_ms=0.0), "emu-tpu:0",
         dict(timing_only=True), frames * 5),
        (f"encoder on emu-tpu:0, paced to {whole.predicted_ms:.2f} ms", whole, "emu-tpu:0", {}, frames),
        ("encoder on the CPU, unpaced", whole, "cpu", {}, frames),
    ]
    rows = []
    for case, stage, device, options, count in cases:
        local = open_stage(stage, device, **options)
        isolated = open_stage(stage, device, isolate=True, **options)
        startup.append(isolated.startup_s)
        try:
            times: Dict[bool, List[float]] = {False: [], True: []}
            for _ in range(repeats):
                times[False].append(timed(local, count))
                times[True].append(timed(isolated, count))
        finally:
            isolated.close()
        rows.append(IsolationRow(case, count, statistics.median(times[False]),
                                 statistics.median(times[True])))

    def pipeline_fps(isolate: bool) -> float:
        def opener(stage: Any) -> Callable[[], Any]:
            on_tpu = stage.spec.kind == "tpu"
            device = f"emu-tpu:{stage.spec.index}" if on_tpu else str(stage.spec)

            def open_() -> Any:
                segment = open_stage(stage, device, isolate=isolate and on_tpu)
                if segment.isolated:
                    startup.append(segment.startup_s)
                return segment
            return open_

        steps = [Step(f"stage {s.index}", str(s.spec), opener(s)) for s in plan.active_stages]
        with Pipeline(steps) as pipe:
            for _ in pipe.run([frame] * 20):  # warm-up
                pass
            for _ in pipe.run([frame] * frames):
                pass
            return pipe.stats().fps_out

    fps: Dict[str, List[float]] = {"in_process": [], "isolated": []}
    for _ in range(repeats):
        fps["in_process"].append(pipeline_fps(False))
        fps["isolated"].append(pipeline_fps(True))
    return IsolationBench(board, startup, rows, {k: statistics.median(v) for k, v in fps.items()})


def format_isolation(result: IsolationBench) -> str:
    """Formats ``bench_isolation``'s results as a table (host figures: measured)."""
    lines = [f"process isolation, {result.board} plan (measured on this host; medians)",
             f"{'case':<46}{'frames':>7}{'in-proc ms':>11}{'isolated ms':>12}{'added ms':>10}"]
    lines += [f"{r.case:<46}{r.frames:>7}{r.in_process_ms:>11.3f}{r.isolated_ms:>12.3f}"
              f"{r.overhead_ms:>10.3f}" for r in result.rows]
    fps = result.pipeline_fps
    lines += ["", f"CNN stages pipelined: {fps['in_process']:.1f} fps in-process, "
              f"{fps['isolated']:.1f} fps isolated ({fps['isolated'] / fps['in_process']:.3f}x)",
              f"worker start-up: median {sorted(result.startup_s)[len(result.startup_s) // 2]:.3f} s, "
              f"max {max(result.startup_s):.3f} s over {len(result.startup_s)} workers"]
    return "\n".join(lines)


def _isolation_main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse
    import json

    from edgecap.errors import EdgecapError

    parser = argparse.ArgumentParser(prog="python -m edgecap.bench",
                                     description="the per-frame cost of process isolation")
    parser.add_argument("--isolation", action="store_true", required=True)
    parser.add_argument("--bundle", type=Path, help="bundle directory (default: the shipped demo)")
    parser.add_argument("--board", default="devboard-usb")
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    try:
        if args.json is not None and not os.access(args.json.parent, os.W_OK):
            raise ConfigError(f"--json {args.json}: {args.json.parent} is not a writable directory")
        if args.frames < 1:
            raise ConfigError(f"--frames {args.frames}: use 1 or more")
        result = bench_isolation(load_bundle(args.bundle or default_bundle()), args.board, args.frames)
    except EdgecapError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_isolation(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_isolation_main())
