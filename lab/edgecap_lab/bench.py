"""``edgecap bench``: five schedules of the same bundle and clips, on emulated boards and on this host.

Schedules:
  a  CPU only, sequential: the whole encoder and the RNN on the CPU, one frame at a time.
  b  CNN on one TPU, then the RNN, no overlap (Coral's default: one model per TPU;
     what does not fit its parameter cache streams over the link).
  e  The equal-parameter split over the board's TPUs (``edgetpu_compiler
     --num_segments N``), the CPU left with the RNN, pipelined.
  c  The plan's fine-grained placement (TPU segments + CPU tail), no pipelining.
  d  The full pipeline: the plan's placement, every device busy on a different frame.

Profiles:
  <board> (default devboard-usb; a comma list runs several): TPU stages on
    emulated EdgeTPUs and the CPU stage paced to the board's predicted times
    (*modelled*). With ``--timing-only`` emulated stages compute nothing, so
    the fps rows pace the board even where this host computes slower than it;
    the column ``same`` then comes from a check with real compute on a few
    frames (``check_outputs``): each schedule's segments chained on this
    host's CPU give the CPU path's features bit for bit, and its pipeline run
    unpaced gives the same captions. Without it every row computes, a row
    "d timing-only" checks the pipeline against its bound 1/max(stage time).
  host: ``edgecap caption`` against plain loops written without edgecap's
    scheduler or captioner (one thread, all cores, two threads), over a long
    video file, decoding included, in interleaved rounds (*measured*;
    ``edgecap_lab.host_bench``).

Every decoded frame of the clips is a sampled frame; clips are repeated up to
``--frames`` (a row whose bound is slow runs fewer: about ``row_seconds``).
``strides`` repeats the board's rows with other window strides: the runtime
steps the RNN encoder once per open window, so the bound charges that step
``frames / stride`` times a frame. The scheduler's own cost is measured with
null stages. ``bench_startup`` measures ``edgecap caption`` in a child
process: peak resident memory and time to the first caption.

The command line (``edgecap bench``) is in ``edgecap.cli``; ``run_bench`` is
what it calls (``edgecap bench --adapt``, a board that differs from its
profile, is ``edgecap_lab.truth_bench``). ``bench_isolation``, the cost of process isolation, is a
developer's measurement: ``python tools/isolation_bench.py``.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import msgspec
import numpy as np

from edgecap import emulation, schema, stages
from edgecap.bundle import DEMO_DIR, Bundle, WindowSpec, default_bundle, load_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.errors import ConfigError, EdgecapError
from edgecap.limits import DEFAULT_BEAM, DEFAULT_HOST_ROUNDS
from edgecap.options import CaptionerOptions
from edgecap.plans.plan import Plan
from edgecap.plans.pricing import price
from edgecap.planner import Choice, HostSchedule
from edgecap.plans.compiler import plan_for_board
from edgecap.preprocess import Preprocessor
from edgecap.scheduler import Pipeline, Step
from edgecap.sources import open_source

from edgecap_lab import host_bench
from edgecap_lab.host_bench import HostBench
from edgecap.stats import PipelineStats

SCHEDULES = {
    "a": "CPU only, sequential",
    "b": "CNN on one TPU, then RNN, no overlap",
    "e": "equal-parameter TPU split, pipelined",
    "c": "plan placement, no pipelining",
    "d": "full pipeline",
}
PROFILES = ("board", "host", "startup")
# An isolated stage in the isolation bench may take this long before it counts as hung: a bench is
# no place for the watchdog's tight deadlines (edgecap.planner.deadlines), a stalled host must not abort it.
BENCH_DEADLINE_S = 60.0
# The headline's published figures, each with its source.
PUBLISHED = Path(__file__).parent / "data" / "published.json"

# Called with the number of frames a run got through since the last call.
Progress = Callable[[int], object]
# The table's mark on a row during which a failover or fallback happened.
OFF_PLAN = "!"


@dataclass
class Row:
    """One measured schedule.

    ``same_captions`` compares the captions with row a's; ``same_features``
    the encoder's output of a few frames through the schedule's segments with
    row a's, bit for bit (None where not checked). ``incidents`` says what
    took the run off its plan (a fallback at the start, a failover during
    it): such a row's fps is not the plan's.
    """

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
    same_features: Optional[bool] = None
    checked_frames: int = 0
    fps_rounds: List[float] = field(default_factory=list)
    placement: Dict[str, str] = field(default_factory=dict)
    plan_board: str = ""
    incidents: List[str] = field(default_factory=list)

    @property
    def plan_held(self) -> bool:
        """Whether the whole run ran the plan it was given: no fallback, no failover."""
        return not self.incidents

    @property
    def of_bound(self) -> Optional[float]:
        """Measured fps as a fraction of the bound, where there is one."""
        return self.fps / self.bound_fps if self.bound_fps else None

    @property
    def same(self) -> Optional[bool]:
        """Whether every checked output equals the CPU path's (None: nothing checked)."""
        checked = [x for x in (self.same_captions, self.same_features) if x is not None]
        return all(checked) if checked else None


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
class Startup:
    """``edgecap caption`` of one clip in a child process (measured).

    Attributes:
      command: The ``edgecap`` command line the child ran.
      peak_rss_mb: Peak resident memory of the child (its ``VmHWM``).
      first_caption_s: From starting the child to its first caption line.
      total_s: Until the child exited.
      captions: Caption lines it printed.
    """

    command: List[str]
    peak_rss_mb: float
    first_caption_s: float
    total_s: float
    captions: int


class Published(msgspec.Struct, forbid_unknown_fields=True):
    """One published figure of ``data/published.json``."""

    label: str
    fps: schema.Fps
    speedup: float
    hardware: str
    source: str


class PublishedDoc(msgspec.Struct, forbid_unknown_fields=True):
    """``data/published.json``."""

    about: str
    rows: List[Published]


@dataclass
class BenchResult:
    """Everything one ``edgecap bench`` measured."""

    bundle: str
    clips: List[str]
    frames: int
    rows: List[Row]
    overhead: Overhead
    scaling: List[Scaling]
    published: List[Published] = field(default_factory=list)
    host_choice: Optional[HostSchedule] = None
    startup: List[Startup] = field(default_factory=list)
    beam: int = DEFAULT_BEAM
    host: Optional[HostBench] = None

    def to_json(self) -> Dict[str, Any]:
        """Returns the results as JSON-ready plain types (what ``--json`` writes)."""
        return {
            "argv": sys.argv[1:],
            "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                     "python": platform.python_version()},
            "bundle": self.bundle,
            "clips": self.clips,
            "frames": self.frames,
            "beam": self.beam,
            "rows": [row_json(r) for r in self.rows],
            "published": [msgspec.to_builtins(p) for p in self.published],
            "goals": goals(self.rows),
            "host_choice": asdict(self.host_choice) if self.host_choice else None,
            "host_bench": self.host.to_json() if self.host else None,
            "startup": [asdict(x) for x in self.startup],
            "overhead": asdict(self.overhead),
            "host_scaling": [dict(asdict(x), speedup=x.speedup) for x in self.scaling],
        }


def row_json(row: Row) -> Dict[str, Any]:
    """Returns one row as JSON-ready plain types, as ``--json`` writes it."""
    return dict(asdict(row), of_bound=row.of_bound, same=row.same, plan_held=row.plan_held)


def load_published(path: Path = PUBLISHED) -> List[Published]:
    """Reads the published figures the headline table stands beside.

    Raises:
      ConfigError: If the file is missing or malformed.
    """
    return schema.read_file(path, PublishedDoc, what="published figures", fix="reinstall edgecap",
                            error=ConfigError).rows


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
    row_seconds: float = 20.0,
    check_windows: int = 2,
    beam: int = DEFAULT_BEAM,
    on_row: Optional[Callable[[Row], object]] = None,
    host_rounds: int = DEFAULT_HOST_ROUNDS,
    on_round: Optional[Callable[[host_bench.HostRound], object]] = None,
    host_seconds: float = 20.0,
) -> BenchResult:
    """Runs the benchmark.

    Args:
      bundle: Bundle directory or loaded ``Bundle`` (default: the shipped demo).
      clips: Video files (default: the shipped sample clip).
      frames: Frames per run; the clips repeat.
      board: Board profile to emulate, or a comma list of them.
      profiles: Any of ``board`` (the emulated boards), ``host`` and
        ``startup`` (``edgecap caption`` of the first clip in a child process,
        ``bench_startup``: on the CPU, and on the first board with its plan
        cached).
      timing_only: Emulated stages compute nothing (every board row); the
        outputs are then checked on ``check_windows`` windows of real compute.
      threads: Threads of each CPU encoder interpreter of the board rows.
      batch: Unused since the host rows compare with plain loops (kept for callers).
      strides: Window strides to run the board's rows at (default: the bundle's).
      trace: Write the Chrome trace of the (first board's) pipelined run here.
      progress: Called with the frames each run got through, as it goes.
      row_seconds: A board row whose bound would take longer than this for
        ``frames`` runs fewer frames, at least two windows.
      check_windows: Windows of frames the output check computes.
      beam: The decoder's beam width in every run.
      on_row: Called with each row as soon as it is final (a board row when
        it has run, the host rows after their last round), so that a failure
        later keeps it.
      host_rounds: How often each host loop runs, the loops interleaved; a
        row is its median round.
      on_round: Called with each host round as it ends (its load and fps).
      host_seconds: Each host loop's rounds take about this long together at
        the one-thread loop's rate: it sets the long file's length (``host_bench``).

    Returns:
      The ``BenchResult``.

    Raises:
      ConfigError: If a count is out of range or a profile unknown.
      EdgecapError: If the bundle, a clip or the board is bad.
    """
    _check_counts({"--threads": threads, "--frames": frames, "--batch": batch, "--host-rounds": host_rounds})
    boards = _check_profiles(profiles, strides, board)
    published = load_published()
    b = bundle if isinstance(bundle, Bundle) else load_bundle(bundle or default_bundle())
    clips = list(clips or [str(DEMO_DIR / "sample.mp4")])
    images = _load_frames(clips, frames)
    rows: List[Row] = []
    if "board" in profiles:
        for name in boards:
            rows += bench_board(b, images, name, timing_only, threads, trace, strides, progress,
                                row_seconds, check_windows, beam, on_row)
            trace = None  # one pipelined run is traced: the first board's
    host = None
    if "host" in profiles:
        host = host_bench.bench_host(b, clips, host_seconds, host_rounds,
                                     progress=(lambda: progress(frames)) if progress else None,
                                     on_round=on_round)
        host_rows = host_rows_of(host)
        rows += host_rows
        for row in host_rows if on_row is not None else ():
            on_row(row)
    overhead = bench_overhead()
    scaling = bench_scaling(b, seconds=row_seconds / 2) if "host" in profiles else []
    started = _startups(b, clips[0], boards[:1], beam) if "startup" in profiles else []
    return BenchResult(str(b.root), [str(c) for c in clips], len(images), rows, overhead, scaling,
                       published, host.choice if host else None, started, beam, host)


def host_rows_of(host: HostBench) -> List[Row]:
    """The host bench's loops as table rows: each its median round, speedups over the one-thread loop."""
    rows = []
    for loop in host_bench.LOOPS:
        rounds = [r.fps[loop] for r in host.rounds]
        row = Row(profile="host", schedule=loop, label="", frames=host.frames, stride=0,
                  fps=host.median(loop), latency_p50_ms=0.0, latency_p99_ms=0.0, utilization={},
                  fps_rounds=rounds, same_captions=all(r.same[loop] for r in host.rounds),
                  plan_board="host" if loop == host_bench.EDGECAP else "")
        rows.append(row)
    _speedups(rows)
    return rows


def _check_counts(counts: Dict[str, int]) -> None:
    for flag, value in counts.items():
        if value < 1:
            raise ConfigError(f"{flag} {value}: use 1 or more")


def _check_profiles(profiles: Sequence[str], strides: Optional[Sequence[int]], board: str) -> List[str]:
    """Checks ``profiles`` and ``strides``; returns the boards of the comma list ``board``."""
    unknown = set(profiles) - set(PROFILES)
    if unknown:
        raise ConfigError(f"--profiles {','.join(sorted(unknown))}: use {', '.join(PROFILES)}")
    for stride in strides or ():
        if stride < 1:
            raise ConfigError(f"--strides {stride}: use 1 or more")
    boards = [b.strip() for b in board.split(",") if b.strip()]
    if "board" in profiles and not boards:
        raise ConfigError(f"--board {board!r}: name a board profile, e.g. devboard-usb")
    return boards


def _startups(bundle: Bundle, clip: str, boards: Sequence[str], beam: int) -> List[Startup]:
    """``edgecap caption`` started on the CPU, and on the first board with its plan cached."""
    beam_args = ["--beam", str(beam)]
    started = [bench_startup(bundle.root, clip, beam_args)]
    for name in boards:
        plan_for_board(bundle, name)  # cached: the child plans nothing
        started.append(bench_startup(bundle.root, clip, ["--board", name, *beam_args]))
    return started


def runs(profiles: Sequence[str], timing_only: bool, strides: int = 1, boards: int = 1,
         host_rounds: int = DEFAULT_HOST_ROUNDS) -> int:
    """Number of measured runs ``run_bench`` makes (to size a progress bar).

    Args:
      strides: How many window strides the board's rows run at.
      boards: How many boards.
      host_rounds: How often each host row runs.
    """
    per_board = strides * (len(SCHEDULES) + (0 if timing_only else 1))
    board = boards * per_board if "board" in profiles else 0
    return board + (host_rounds * len(host_bench.LOOPS) if "host" in profiles else 0)


def _load_frames(clips: Sequence[str], count: int) -> List[np.ndarray]:
    decoded: List[np.ndarray] = []
    for clip in clips:
        with open_source(clip) as src:
            decoded += [f.image for f in src]
    if not decoded:
        raise ConfigError(f"{', '.join(clips)}: no frames; pass --clips with video files")
    return [decoded[i % len(decoded)] for i in range(max(count, 1))]


def _row_frames(frames: List[np.ndarray], fps: float, seconds: float, window: WindowSpec
                ) -> List[np.ndarray]:
    # At least two windows, so the caption stream has a steady state to measure.
    wanted = max(2 * window.frames, int(fps * seconds)) if fps > 0 else len(frames)
    return frames[: min(len(frames), wanted)]


def _measure(
    profile: str, schedule: str, label: str, cap: EdgeCaptioner, frames: List[np.ndarray],
    progress: Optional[Progress] = None,
) -> "tuple[Row, List[List[int]]]":
    # Warm up interpreters, caches and threads on a window, then measure one run.
    start = cap.choice
    cap.caption_frames(frames[: cap.window.frames])
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
        incidents=_incidents(start, cap.choice, stats),
    )
    return row, captions


def _incidents(start: Choice, end: Choice, stats: PipelineStats) -> List[str]:
    """What took a run off the plan it was given: a fallback at the start, failovers since."""
    found = [f"fallback {start.fallback}: {start.reason}"] if start.fallback else []
    found += [f"failover: {f.device} {f.kind}, {f.plan_before} -> {f.plan_after} ({f.how})"
              for f in stats.failovers]
    if end is not start and not stats.failovers:  # during the warm-up, before the measured stream
        found.append(f"failover before the measured frames: now {end.how}, {end.reason}")
    return found


def _bound_fps(plan: Plan, pipelined: bool) -> float:
    """The modelled fps of a plan as it runs: the pricing function's period, or its serial time unpipelined.

    The plan is made for the window it runs (``board_plans``): its CPU stage
    charges the RNN steps of that window, one per open window a frame feeds.
    Under an emulated truth (``$EDGECAP_EMULATE``) every device is priced as
    the truth makes it settle, as ``emulation.steady_fps`` does.
    """
    priced = price(plan, emulation.resolve(emulation.current(), plan).corrections())
    period = priced.period_ms if pipelined else priced.serial_ms
    return 1000.0 / period if period > 0 else float("inf")


def board_plans(bundle: Bundle, board: str, window: Optional[WindowSpec] = None) -> Dict[str, Plan]:
    """Returns the plan of each schedule on ``board`` for ``window`` (compiled on the fly, cached)."""
    plans = {
        "a": plan_for_board(bundle, board, tpus=0, window=window),
        "b": plan_for_board(bundle, board, whole_on_tpu=True, window=window),
        "e": plan_for_board(bundle, board, equal_param=True, window=window),
        "c": plan_for_board(bundle, board, window=window),
    }
    plans["d"] = plans["c"]
    return plans


def bench_board(
    bundle: Bundle,
    frames: List[np.ndarray],
    board: str,
    timing_only: bool,
    threads: int,
    trace: Optional[Path],
    strides: Optional[Sequence[int]] = None,
    progress: Optional[Progress] = None,
    row_seconds: float = float("inf"),
    check_windows: int = 2,
    beam: int = DEFAULT_BEAM,
    on_row: Optional[Callable[[Row], object]] = None,
) -> List[Row]:
    """Runs the five schedules on the emulated ``board``, at each window stride.

    Args:
      strides: Window strides (default: the bundle's); each repeats every row.
      row_seconds: Cap on a row's run time at its bound (see ``run_bench``).
      check_windows: Windows the output check computes (timing-only rows).
      beam: The decoder's beam width.
      on_row: Called with each row as it finishes.

    Returns:
      Rows a, b, e, c, d, plus "d timing-only" (the bound check) unless every
      row is timing-only, per stride. Speedups are against row a of the same
      stride. Every row's ``same_features`` is checked; with ``timing_only``
      ``same_captions`` comes from ``check_outputs`` too.
    """
    pipelined = {"a": False, "b": False, "e": True, "c": False, "d": True}
    name = f"{board} (emulated)"
    rows: List[Row] = []
    for stride in strides or [bundle.window.stride]:
        window = CaptionerOptions(stride=stride).window(bundle.window)
        plans = board_plans(bundle, board, window)  # planned for the window it runs
        checks = check_outputs(bundle, plans, pipelined, frames[: check_windows * window.frames],
                               window, threads, with_captions=timing_only, beam=beam)
        reference: Optional[List[List[int]]] = None
        runs = [(s, plans[s], pipelined[s], timing_only) for s in SCHEDULES]
        if not timing_only:
            runs.append(("d timing-only", plans["d"], True, True))
        at_stride: List[Row] = []
        for schedule, plan, pipe, zero in runs:
            # Each row runs its schedule as named: the closed loop measures but does not switch
            # plans (under an emulated truth it would; `bench --adapt` measures that).
            options = CaptionerOptions(plan=plan, emulate=True, timing_only=zero, pipelined=pipe,
                                       num_threads=threads, sample_fps=0, stride=stride, beam=beam,
                                       trace=trace if schedule == "d" else None, adapt=False)
            bound = _bound_fps(plan, pipe)
            with EdgeCaptioner(bundle, options) as cap:
                row, captions = _measure(name, schedule, SCHEDULES[schedule[0]], cap,
                                         _row_frames(frames, bound, row_seconds, window), progress)
                row.bound_fps = bound
            row.same_features, checked_captions, row.checked_frames = checks[schedule.split()[0]]
            if zero:
                row.same_captions = checked_captions
            else:
                reference = captions if reference is None else reference
                row.same_captions = _same_windows(captions, reference)
            at_stride.append(row)
            _speedups(at_stride)
            if on_row is not None:
                on_row(row)
        rows += at_stride
        trace = None  # one pipelined run is traced: the first stride's
    return rows


def _same_windows(captions: List[List[int]], reference: List[List[int]]) -> bool:
    """Whether two rows captioned every window both ran alike (a row whose bound is slow runs fewer frames)."""
    both = min(len(captions), len(reference))
    return both > 0 and captions[:both] == reference[:both]


def check_outputs(
    bundle: Bundle, plans: Dict[str, Plan], pipelined: Dict[str, bool], frames: List[np.ndarray],
    window: WindowSpec, threads: int = 1, with_captions: bool = True, beam: int = DEFAULT_BEAM,
) -> Dict[str, "tuple[bool, Optional[bool], int]"]:
    """Checks each schedule's outputs against the CPU path's (row a's) with real compute.

    Features: every frame through the plan's segments chained on this host's
    CPU (the kernels an emulated TPU runs), compared with plan a's whole
    encoder bit for bit. Captions: the schedule's plan and pipelining run
    unpaced, every TPU stage on a CPU worker of its own, compared token for
    token.

    Args:
      plans: Schedule -> plan; ``a`` is the reference.
      pipelined: Schedule -> whether it runs pipelined.
      frames: The frames to check (whole windows caption).
      window: The window the captions run at.
      threads: Threads of each CPU interpreter.
      with_captions: Also compare captions (else None).
      beam: The decoder's beam width.

    Returns:
      Schedule -> ``(same features, same captions, frames checked)``.
    """
    features = {name: _features(bundle, plan, frames, threads) for name, plan in plans.items()}
    captions: Dict[str, Optional[List[List[int]]]] = {}
    for name, plan in plans.items():
        if not with_captions:
            captions[name] = None
            continue
        # Every TPU that runs a stage or a copy of one, on a CPU worker of its own.
        tpus = [d for s in plan.active_stages for d in s.devices if d.kind == "tpu"]
        to_cpu = {str(d): f"cpu:{i + 1}" for i, d in enumerate(tpus)}
        options = CaptionerOptions(plan=plan, emulate=False, devices_map=to_cpu, num_threads=threads,
                                   pipelined=pipelined[name], sample_fps=0, frames=window.frames,
                                   stride=window.stride, beam=beam)
        with EdgeCaptioner(bundle, options) as cap:
            captions[name] = [c.tokens for c in cap.stream(frames, fps=0)]
    return {name: (all(np.array_equal(x, y) for x, y in zip(features[name], features["a"])),
                   None if captions[name] is None else captions[name] == captions["a"],
                   len(frames))
            for name in plans}


def _features(bundle: Bundle, plan: Plan, frames: List[np.ndarray], threads: int) -> List[np.ndarray]:
    model_in, model_out = plan.inputs[0], plan.outputs[0]
    prep = Preprocessor(bundle.input, {"dtype": np.dtype(model_in.dtype),
                                       "quantization": model_in.quantization})
    runners = [stages.open_stage(s, "cpu", num_threads=threads) for s in plan.active_stages]
    out = []
    for image in frames:
        tensors = {model_in.name: prep(image)}
        for run in runners:
            tensors = run(tensors)
        out.append(np.array(tensors[model_out.name], copy=True))
    return out


def goals(rows: Sequence[Row], fps: float = 59.0, speedup: float = 55.0, over_equal: float = 1.3
          ) -> List[Dict[str, Any]]:
    """Checks the headline's goals on each emulated board at each stride (issue #11).

    Returns:
      One record per board and stride: row d's fps and speedup over a, d over
      e, and whether each goal is met.
    """
    out = []
    groups: Dict[Any, Dict[str, Row]] = {}
    for r in rows:
        if r.profile != "host":
            groups.setdefault((r.profile, r.stride), {})[r.schedule] = r
    for (profile, stride), by in groups.items():
        d, e = by.get("d"), by.get("e")
        if d is None:
            continue
        ratio = d.fps / e.fps if e is not None and e.fps else None
        out.append({"profile": profile, "stride": stride, "fps": d.fps, "speedup": d.speedup,
                    "d_over_e": ratio, "fps_met": d.fps >= fps, "speedup_met": d.speedup >= speedup,
                    "d_over_e_met": ratio is not None and ratio >= over_equal})
    return out + _host_goal(rows)


def _host_goal(rows: Sequence[Row]) -> List[Dict[str, Any]]:
    """edgecap caption over the plain one-thread loop in every round, and over the two-thread one at the median."""
    host = {r.schedule: r for r in rows if r.profile == "host"}
    edgecap, one, two = (host.get(x) for x in (host_bench.EDGECAP, host_bench.ONE, host_bench.TWO))
    if not (edgecap and one and two):
        return []
    # Round by round: the loops of a round ran back to back, under the same load.
    over_one = [a / b for a, b in zip(edgecap.fps_rounds, one.fps_rounds) if b]
    over_two = sorted(a / b for a, b in zip(edgecap.fps_rounds, two.fps_rounds) if b)
    median_two = (over_two[(len(over_two) - 1) // 2] + over_two[len(over_two) // 2]) / 2 if over_two else 0.0
    return [{"profile": "host", "stride": edgecap.stride, "fps": edgecap.fps,
             "over_one_thread_rounds": over_one, "over_two_threads_median": median_two,
             "every_round_met": bool(over_one) and min(over_one) >= host_bench.OVER_ONE_EVERY_ROUND,
             "two_threads_met": median_two >= host_bench.OVER_TWO_MEDIAN}]


def _speedups(rows: List[Row]) -> None:
    base = rows[0].fps
    for row in rows:
        row.speedup = row.fps / base if base else 0.0


# The code of the child process that `bench_startup` measures: the `edgecap` command as its
# script runs it (the CLI is the child's, never imported into this process). The child reports its
# own peak: VmHWM is its address space's high-water mark.
# (ru_maxrss would not do: Linux carries the forking parent's peak into it at exec.)
_EDGECAP = """\
import sys
from edgecap.cli import main
try:
    code = main()
finally:
    with open("/proc/self/status") as status:
        peak = [line.split()[1] for line in status if line.startswith("VmHWM:")]
    print("EDGECAP_PEAK_KB", *peak, file=sys.stderr)
sys.exit(code)
"""


def bench_startup(bundle: "str | os.PathLike[str]", clip: str,
                  extra: Sequence[str] = ()) -> Startup:
    """Measures ``edgecap caption`` in a child process: peak memory and time to the first caption.

    The child runs what the ``edgecap`` script runs (``edgecap.cli.main``),
    ``caption --json`` of ``clip``, in this Python; its peak resident memory
    is its own ``VmHWM`` (``/proc/self/status``, read as it exits: Linux), which
    counts every page it touched, interpreters, XNNPACK's packed weights
    and the RNN models included.

    Args:
      bundle: The bundle directory.
      clip: The video file.
      extra: More ``edgecap caption`` arguments (e.g. ``--plan``).

    Returns:
      The ``Startup``.

    Raises:
      EdgecapError: If the child fails (or cannot read its peak: not Linux).
    """
    args = ["caption", "--json", "--bundle", os.fspath(bundle), *extra, clip]
    command = [sys.executable, "-c", _EDGECAP, *args]
    start = time.perf_counter()
    # stderr goes to a file: a pipe read only after stdout ends would block a chatty child.
    with tempfile.TemporaryFile("w+") as errors:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
        first = None
        lines = 0
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith("{"):
                lines += 1
                first = first if first is not None else time.perf_counter() - start
        child.wait()
        errors.seek(0)
        err = errors.read()
    total = time.perf_counter() - start
    peak = [line.split()[1:] for line in err.splitlines() if line.startswith("EDGECAP_PEAK_KB")]
    if child.returncode != 0 or first is None or not peak or not peak[-1]:
        last = (err.strip().splitlines() or ["no caption"])[-1]
        raise EdgecapError(f"edgecap {' '.join(args)}: exited {child.returncode} ({last})")
    return Startup(["edgecap", *args], int(peak[-1][0]) / 1024.0, first, total, lines)


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


def _invoke_s(model: Path) -> float:
    """Seconds of one invoke of ``model`` on one CPU thread (after a warm-up invoke)."""
    from edgecap.interpreter import make_cpu_interpreter

    probe = make_cpu_interpreter(model, 1)
    probe.invoke()
    t0 = time.perf_counter()
    probe.invoke()
    return time.perf_counter() - t0


def bench_scaling(bundle: Bundle, counts: Sequence[int] = (1, 4, 16), frames: int = 400,
                  seconds: float = 20.0) -> List[Scaling]:
    """Measures how pipelining two CPU stages pays off as the work per stage grows.

    Each stage invokes the bundle's encoder ``count`` times per frame (a CNN
    ``count`` times heavier), on its own worker; the sequential schedule runs
    both in one thread. Shows the stage size at which the scheduler's cost per
    hop stops mattering on this host. A large encoder runs fewer frames: about
    ``seconds`` of sequential work per count, at least 10.
    """
    from edgecap.interpreter import make_cpu_interpreter

    invoke_s = _invoke_s(bundle.encoder)

    def heavy_stage(count: int) -> Any:
        interp = make_cpu_interpreter(bundle.encoder, 1)

        def run(x: int) -> int:
            for _ in range(count):
                interp.invoke()
            return x

        return run

    results = []
    for count in counts:
        n = max(10, min(max(frames // count, 40), int(seconds / (2 * count * invoke_s))))
        steps = [Step(f"cnn-{w}", w, functools.partial(heavy_stage, count)) for w in ("cpu:1", "cpu")]
        fps = {}
        for pipelined in (False, True):
            with Pipeline(steps, pipelined=pipelined) as pipe:
                for _ in pipe.run(range(min(20, n))):  # warm-up
                    pass
                for _ in pipe.run(range(n)):
                    pass
                stats = pipe.stats()
            fps[pipelined] = stats.fps_out
            if not pipelined:
                stage_ms = stats.stages[0].mean_ms
        results.append(Scaling(count, stage_ms, fps[False], fps[True]))
    return results


def _summary_lines(result: BenchResult) -> List[str]:
    lines: List[str] = []
    if result.published and any(r.profile != "host" for r in result.rows):
        lines += ["", "== published (not measured here)"]
        lines += [f"{p.label:<44}{p.fps:>8.1f}{'':>18}{p.speedup:>8.1f}x  {p.hardware}; {p.source}"
                  for p in result.published]
    checked = {r.checked_frames for r in result.rows if r.checked_frames}
    if checked:
        lines += ["", f"same: features bit for bit and captions token for token against the CPU "
                  f"path, on {max(checked)} frames computed per schedule (timing-only rows compute "
                  "nothing)"]
    for g in goals(result.rows):
        if g["profile"] != "host":  # the host's goals come with its rounds (host_bench.format_host)
            ratio = f"{g['d_over_e']:.2f}x" if g["d_over_e"] is not None else "-"
            lines.append(f"goals, {g['profile']} stride {g['stride']} (modelled): full pipeline "
                         f"{g['fps']:.1f} fps (>= 59: {_met(g['fps_met'])}), {g['speedup']:.1f}x CPU "
                         f"only (>= 55: {_met(g['speedup_met'])}), {ratio} the equal-parameter "
                         f"split (>= 1.3: {_met(g['d_over_e_met'])})")
    if result.host is not None:
        lines += host_bench.format_host(result.host).splitlines()
    for st in result.startup:
        how = " ".join(st.command[st.command.index("caption"):])
        lines.append(f"`edgecap {how}` (measured, child process): peak RSS {st.peak_rss_mb:.0f} MB "
                     f"(goal <= 300: {_met(st.peak_rss_mb <= 300)}), first caption "
                     f"{st.first_caption_s:.2f} s (goal <= 3: {_met(st.first_caption_s <= 3)}), "
                     f"{st.captions} captions in {st.total_s:.2f} s")
    return lines


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _row_line(r: Row) -> str:
    util = " ".join(f"{k}={v:.0%}" for k, v in sorted(r.utilization.items()))
    bound = f"{r.of_bound:.1%}" if r.of_bound is not None else "-"
    same = {True: "yes", False: "NO", None: "-"}[r.same]
    name = f"{r.schedule} {r.label}".strip()
    rounds = f"  rounds {'/'.join(f'{x:.1f}' for x in r.fps_rounds)} fps" if r.fps_rounds else ""
    name = name if r.plan_held else f"{name} {OFF_PLAN}"
    return (f"{name:<44}{r.fps:>8.1f}{r.latency_p50_ms:>9.2f}"
            f"{r.latency_p99_ms:>9.2f}{r.speedup:>8.2f}x{bound:>9}  {same:<4}  {util}{rounds}")


def format_row(row: Row) -> str:
    """Formats one finished row as ``bench`` prints it while it runs: its profile, then its table line."""
    kind = "measured" if row.profile == "host" else "modelled"
    return f"[{row.profile}, stride {row.stride}, {kind}] {_row_line(row)}"


def format_table(rows: Sequence[Row], overhead: Overhead, scaling: Sequence[Scaling] = (),
                 result: Optional[BenchResult] = None) -> str:
    """Formats the results as the table ``edgecap bench`` prints.

    Args:
      result: The whole result, for the published figures, the goals, the
        host's choice and start-up (optional).
    """
    lines: List[str] = []
    group = None
    for r in rows:
        if r.profile == "host":  # the host's rounds are a table of their own (host_bench.format_host)
            continue
        if (r.profile, r.stride) != group:
            group = (r.profile, r.stride)
            kind = "measured" if r.profile == "host" else "modelled"
            lines += ["", f"== {r.profile}, {r.plan_board} plan, window stride {r.stride} ({kind})",
                      f"{'schedule':<44}{'fps':>8}{'p50 ms':>9}{'p99 ms':>9}"
                      f"{'speedup':>9}{'of bound':>9}  same  utilization"]
        lines.append(_row_line(r))
    for r in rows:
        if not r.plan_held:
            lines.append(f"{OFF_PLAN} {r.profile} {r.schedule}: not the plan's fps: {'; '.join(r.incidents)}")
    if result is not None:
        lines += _summary_lines(result)
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
# Kept apart from run_bench: `python tools/isolation_bench.py [--json PATH]`.


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

    from edgecap.devices import parse_device
    from edgecap.isolation import IsolatedSegment
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
        isolated = IsolatedSegment(stage, parse_device(device), deadline_s=BENCH_DEADLINE_S, **options)
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
                if isolate and on_tpu:
                    segment = IsolatedSegment(stage, parse_device(device), deadline_s=BENCH_DEADLINE_S)
                else:
                    segment = open_stage(stage, device)
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
