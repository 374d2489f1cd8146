"""``edgecap bench --adapt``: a paced stream on an emulated board that differs from its profile.

The board's hidden truth (``$EDGECAP_EMULATE``, ``edgecap.emulation``) makes
its emulated devices slower, their links narrower or their clocks throttle;
the runtime starts from the plan made for the profile. The run streams the
clips (file mode, repeated) for a set time and reports how its fps compares
with the oracle's: the partitioner's best plan under the true costs
(``oracle``), what a runtime that corrects its plan from what it
measures should reach. Plan switches are read from the captioner's stats.

Every figure is *modelled*: emulated stages compute nothing and sleep to what
the truth makes of their cost (timing only), so fps measures the board model
and how well this host keeps its pace, not a board.
"""

from __future__ import annotations

import bisect
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import msgspec

from edgecap import emulation, planner, schema
from edgecap.bundle import DEMO_DIR, Bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.errors import ConfigError
from edgecap.options import CaptionerOptions
from edgecap.outputs import write_text
from edgecap.plans.compiler import board_profile, plan_for_board
from edgecap.plans.plan import Plan
from edgecap.sources import Frame, open_source

TRUTHS = Path(__file__).parent / "data" / "truths.json"
WINDOW_S = 1.0  # fps is counted over sliding windows this long
STEP_S = 0.25  # ... one ending every this often
EDGE_S = 2.0  # start_fps: the first this many seconds; final_fps: the last
GOAL = 0.95  # seconds_to_95: until fps stays at this fraction of the oracle's


class _TruthRow(msgspec.Struct, forbid_unknown_fields=True):
    truth: str
    what: str


class _TruthsDoc(msgspec.Struct, forbid_unknown_fields=True):
    version: schema.Positive
    boards: Dict[schema.Name, List[_TruthRow]]
    description: str = ""


def truth_table(board: str, path: Path = TRUTHS) -> List[Tuple[str, str]]:
    """The truths the table runs on ``board``: ``(spec, what it is)`` pairs.

    Raises:
      ConfigError: If the file is malformed or has no table for the board.
    """
    doc = schema.read_file(path, _TruthsDoc, what="truth table", fix="reinstall edgecap", error=ConfigError)
    if board not in doc.boards:
        raise ConfigError(f"--truth-table: {path.name} has no truths for board {board!r} (it has "
                          f"{', '.join(doc.boards)}); pick one of them with --board, or pass --truth SPEC")
    return [(row.truth, row.what) for row in doc.boards[board]]


@dataclass(frozen=True)
class Oracle:
    """The partitioner's best plan under an emulated board's true costs.

    Attributes:
      plan: The plan (its ``predicted`` figures are the true costs').
      fps: Its predicted fps under the truth (*modelled*).
      board: The board profile with the truth applied (an ``edgecap_compile`` ``Board``).
    """

    plan: Plan
    fps: float
    board: object


def true_board(board: str, truth: emulation.Truth, plan: Optional[Plan] = None) -> object:
    """The board profile as the truth makes it (``edgecap.plans.compiler.board_profile``).

    Each device runs at the speed it settles at (a throttling one throttled)
    and, given a link kind, at that kind's usable rate; the devices keep their
    profile's names and link kinds, so plans still name them ``pci:N`` / ``usb:N``.

    Args:
      board: A board profile name of the compiler.
      truth: The truth.
      plan: The plan the emulated run starts with, to name ``emu-tpu:N``
        (``emulation.resolve``); None: the truth names no ``emu-tpu:N``.

    Returns:
      The ``edgecap_compile`` ``Board`` as it really is.

    Raises:
      ConfigError: If the truth names a TPU the board lacks, or the compiler is missing.
    """
    if plan is not None:
        truth = emulation.resolve(truth, plan)
    return board_profile(board, truth.corrections())


def oracle(bundle: Bundle, board: str, truth: emulation.Truth, plan: Optional[Plan] = None) -> Oracle:
    """The partitioner's best plan for ``board`` under ``truth`` (the compiler never sees it otherwise).

    Args:
      bundle: The bundle.
      board: A board profile name of the compiler.
      truth: The emulated board's truth.
      plan: The plan the emulated run starts with (maps ``emu-tpu:N``; see ``true_board``).

    Returns:
      The ``Oracle``: the plan, compiled into the plan cache, and its fps.

    Raises:
      ConfigError: As ``plan_for_board``, or if the truth names a TPU the board lacks.
    """
    real = true_board(board, truth, plan)
    best = plan_for_board(bundle, real)
    fps = best.predicted.fps if best.predicted is not None and best.predicted.fps else 0.0
    return Oracle(plan=best, fps=fps, board=real)


@dataclass
class AdaptRun:
    """One paced stream under a truth, against its oracle (*modelled*).

    Attributes:
      truth: The truth as given.
      resolved: The truth with each device named as plans name it.
      board: The emulated board.
      seconds: How long the stream ran.
      frames: Frames out.
      plan_fps: The starting plan's fps as profiled (what the planner expected).
      start_bound_fps: The starting plan's fps under the truth: what the run
        settles at if it never switches (``emulation.steady_fps``).
      oracle_fps: The partitioner's best plan's fps under the true costs.
      oracle_plan: That plan's stages, ``device ops [a, b)``.
      start_fps: fps over the first ``EDGE_S`` seconds.
      final_fps: fps over the last ``EDGE_S`` seconds.
      seconds_to_95: Seconds from the start until fps reached 95% of the
        oracle's and stayed there; None: it never did.
      switches: Plan changes the runtime made (the captioner's stats).
      fps_timeline: ``[t, fps]``: fps over the ``WINDOW_S`` before t.
      what: What the truth is, in words (table rows).
      final_plan_fps: The plan running at the end, its fps under the truth
        (``emulation.steady_fps``): what the closed loop chose, apart from
        how well this host keeps the pace.
      final_plan: That plan's stages, ``device ops [a, b)``.
      final_plan_since_s: Seconds from the start until that plan ran its
        first frame (0: it is the start plan).
    """

    truth: str
    resolved: str
    board: str
    seconds: float
    frames: int
    plan_fps: float
    start_bound_fps: Optional[float]
    oracle_fps: float
    oracle_plan: List[str]
    start_fps: float
    final_fps: float
    seconds_to_95: Optional[float]
    switches: int
    fps_timeline: List[Tuple[float, float]] = field(default_factory=list)
    what: str = ""
    final_plan_fps: Optional[float] = None
    final_plan: List[str] = field(default_factory=list)
    final_plan_since_s: float = 0.0

    @property
    def final_of_oracle(self) -> float:
        """final_fps as a fraction of oracle_fps."""
        return self.final_fps / self.oracle_fps if self.oracle_fps else 0.0


def _rate(times: Sequence[float], start: float, end: float) -> float:
    """Frames per second among ``times`` (sorted) in ``(start, end]``."""
    count = bisect.bisect_right(times, end) - bisect.bisect_right(times, start)
    return count / (end - start) if end > start else 0.0


def timeline(times: Sequence[float], seconds: float) -> List[Tuple[float, float]]:
    """fps over sliding ``WINDOW_S`` windows, one ending every ``STEP_S``, from the frames' times.

    Args:
      times: Seconds from the stream's start at which each frame came out, sorted.
      seconds: How long the stream ran.
    """
    points = []
    t = WINDOW_S
    while t <= seconds + 1e-9:
        points.append((round(t, 3), round(_rate(times, t - WINDOW_S, t), 2)))
        t += STEP_S
    return points


def seconds_to(points: Sequence[Tuple[float, float]], fps: float) -> Optional[float]:
    """The first window end from which fps stays at or above ``fps``; None if it never does."""
    reached = None
    for t, value in points:
        if value >= fps:
            reached = t if reached is None else reached
        else:
            reached = None
    return reached


def _frames(images: Sequence[Any], rate: float, until: float) -> Iterator[Tuple[None, Frame]]:
    """The clip's frames, repeated, until ``time.perf_counter()`` passes ``until``."""
    i = 0
    while time.perf_counter() < until:
        yield None, Frame(i, i / rate, images[i % len(images)])
        i += 1


def run_adapt(bundle: Bundle, truth: str, board: str = "devboard-usb", seconds: float = 10.0,
              clips: Optional[Sequence[str]] = None, what: str = "") -> AdaptRun:
    """Streams the clips on the emulated ``board`` under ``truth`` for ``seconds``.

    Args:
      bundle: The bundle.
      truth: An ``$EDGECAP_EMULATE`` spec (``emu-tpu:N`` counts the starting plan's TPUs).
      board: The board profile the planner sees.
      seconds: How long to stream.
      clips: Video files (default: the shipped sample clip).
      what: The truth in words, for the table.

    Returns:
      The ``AdaptRun``.

    Raises:
      ConfigError: If the truth is malformed or names a TPU the board lacks.
      EdgecapError: If the bundle, a clip or the board is bad.
    """
    given = emulation.parse(truth, "--truth")
    images = []
    for clip in clips or [str(DEMO_DIR / "sample.mp4")]:
        with open_source(clip) as src:
            images += [f.image for f in src]
    if not images:
        raise ConfigError(f"{', '.join(clips or [])}: no frames; pass --clips with video files")
    options = CaptionerOptions(board=board, emulate=True, timing_only=True)
    # The plan the run starts with (the planner reads no truth): it numbers emu-tpu:N.
    start_plan = planner.choose(bundle, options).plan
    resolved = emulation.resolve(given, start_plan, "--truth")
    best = oracle(bundle, board, resolved)
    times: List[float] = []
    with emulation.emulating(resolved), EdgeCaptioner(bundle, options) as cap:
        t0, w0 = time.perf_counter(), time.time()
        for result in cap.run_frames(_frames(images, bundle.window.sample_fps, t0 + seconds), live=False):
            if result.frame is not None:
                times.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - t0
        stats = cap.stats()
        final = cap.plan
        # The last change of plan: when the runtime learned it should, plus until the new plan's first frame.
        since = max((f.at + (f.took_s or 0.0) - w0 for f in (stats.failovers if stats else ())), default=0.0)
    points = timeline(times, elapsed)
    edge = min(EDGE_S, elapsed / 2)
    predicted = start_plan.predicted
    return AdaptRun(
        truth=str(given), resolved=str(resolved), board=board, seconds=round(elapsed, 3), frames=len(times),
        plan_fps=(predicted.fps or 0.0) if predicted is not None else 0.0,
        start_bound_fps=_rounded(emulation.steady_fps(start_plan, resolved)),
        oracle_fps=best.fps,
        oracle_plan=[f"{s.device} ops [{s.ops[0]}, {s.ops[1]})" for s in best.plan.stages],
        start_fps=round(_rate(times, 0.0, edge), 2),
        final_fps=round(_rate(times, elapsed - edge, elapsed), 2),
        seconds_to_95=seconds_to(points, GOAL * best.fps),
        switches=len(stats.failovers) if stats is not None else 0,
        fps_timeline=points, what=what, final_plan_fps=_rounded(emulation.steady_fps(final, resolved)),
        final_plan=[f"{s.device} ops [{s.ops[0]}, {s.ops[1]})" for s in final.stages],
        final_plan_since_s=round(since, 3))


def _rounded(fps: Optional[float]) -> Optional[float]:
    return None if fps is None else round(fps, 2)


def to_json(run: AdaptRun) -> Dict[str, Any]:
    """One run as the ``adapt`` object ``--json`` writes."""
    return dict(asdict(run), final_of_oracle=round(run.final_of_oracle, 4), figures="modelled")


def format_table(runs: Sequence[AdaptRun]) -> str:
    """The adaptation table, a Markdown table (*modelled*)."""
    lines = ["| truth | what | oracle fps | start plan under truth fps | start fps | final fps | final/oracle "
             "| s to 95% | switches |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        to95 = "never" if r.seconds_to_95 is None else f"{r.seconds_to_95:.2f}"
        bound = "-" if r.start_bound_fps is None else f"{r.start_bound_fps:.1f}"
        lines.append(f"| `{r.truth or '(profile)'}` | {r.what} | {r.oracle_fps:.1f} | {bound} | {r.start_fps:.1f} | "
                     f"{r.final_fps:.1f} | {r.final_of_oracle:.2f} | {to95} | {r.switches} |")
    return "\n".join(lines)


def _document(runs: Sequence[AdaptRun], table: bool, bundle: Bundle, load: Tuple[float, ...]) -> Dict[str, Any]:
    doc: Dict[str, Any] = {
        "argv": sys.argv[1:],
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                 "load_avg_1m_at_start": round(load[0], 2), "load_avg_1m_now": round(os.getloadavg()[0], 2)},
        "bundle": str(bundle.root),
        "figures": "modelled (emulated board, timing only); fps as this host kept the board's pace",
    }
    if table:
        doc["adapt_table"] = [to_json(r) for r in runs]
    else:
        doc["adapt"] = to_json(runs[0])
    return doc


def bench_adapt(bundle: Bundle, truths: Sequence[Tuple[str, str]], board: str, seconds: float,
                clips: Optional[Sequence[str]] = None, json_path: Optional[Path] = None,
                table: bool = False, show: Callable[[str], object] = print) -> List[AdaptRun]:
    """Runs ``run_adapt`` for each truth; shows the table and rewrites the JSON as each row finishes.

    Args:
      bundle: The bundle.
      truths: ``(spec, what)`` pairs.
      board: The board profile.
      seconds: Each stream's length.
      clips: Video files (default: the shipped sample clip).
      json_path: Where to write the results (``adapt``, or ``adapt_table`` with ``table``).
      table: Write ``adapt_table`` (every row) instead of ``adapt`` (the one truth).
      show: Where each finished row's table goes.

    Returns:
      The runs.

    Raises:
      ConfigError: If a truth is malformed (all are parsed before the first runs).
    """
    for spec, _ in truths:
        emulation.parse(spec, "--truth")
    load = os.getloadavg()
    runs: List[AdaptRun] = []
    for spec, what in truths:
        runs.append(run_adapt(bundle, spec, board, seconds, clips, what))
        show(format_table(runs[-1:]) if len(runs) == 1 else format_table(runs[-1:]).splitlines()[-1])
        if json_path is not None:
            write_text(json_path, json.dumps(_document(runs, table, bundle, load), indent=2) + "\n")
    return runs
