"""``edgecap bench --profiles host``: ``edgecap caption`` against plain loops over a long video file (measured).

The baselines are ``edgecap_lab.plain_loops``, written without edgecap's
scheduler or captioner: one thread, all cores (XNNPACK's threads), and two
threads (a producer decodes and preprocesses, the calling thread runs the
models). "edgecap caption" is ``EdgeCaptioner(bundle).stream(file)`` with
nothing set, exactly what ``edgecap caption FILE`` runs: the planner's host
rule decides how it uses the cores. Every loop reads the same video file from
disk, decoding included, and is timed from opening it to its last caption
(the models are opened before); the captions of every loop are compared
token for token (all decode greedily, ``edgecap caption``'s default).

The file is long: the clips, decoded and written again one after the other
(mp4v, the first clip's size and rate) until it holds about
``seconds`` of one-thread work (measured on the clips first), in a
temporary folder removed afterwards. The loops run in rounds, interleaved, so
that load from elsewhere falls on all of them alike, each round starting
with the next loop; each round records the 1/5/15-minute load averages at
its start.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np

from edgecap import devices
from edgecap.bundle import Bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.errors import ConfigError
from edgecap.planner import HostSchedule

from edgecap_lab import plain_loops
from edgecap_lab.plain_loops import LoopRun

ONE, ALL, TWO, EDGECAP = "plain 1 thread", "plain all cores", "plain 2 threads", "edgecap caption"
LOOPS = (ONE, ALL, TWO, EDGECAP)
# Goals (issue 27): edgecap caption at least the one-thread loop in every round,
# and at least 0.9x the two-thread loop at the median of the rounds.
OVER_ONE_EVERY_ROUND = 1.0
OVER_TWO_MEDIAN = 0.9


@dataclass
class HostRound:
    """One round: every loop once, back to back.

    Attributes:
      round: Its number, from 0.
      load: The 1, 5 and 15-minute load averages as it started.
      fps: Sampled frames a second, by loop.
      cpu_ms: CPU milliseconds a frame of the process (all threads), by loop.
      same: Whether each loop's captions equal those of the round's first loop.
      order: The loops in the order they ran (each round starts with the next).
    """

    round: int
    load: Tuple[float, float, float]
    fps: Dict[str, float] = field(default_factory=dict)
    cpu_ms: Dict[str, float] = field(default_factory=dict)
    same: Dict[str, bool] = field(default_factory=dict)
    order: List[str] = field(default_factory=list)

    def ratio(self, loop: str, over: str) -> float:
        """``loop``'s fps over ``over``'s in this round."""
        return self.fps[loop] / self.fps[over] if self.fps.get(over) else 0.0


@dataclass
class HostBench:
    """What ``bench_host`` measured.

    Attributes:
      bundle: The bundle directory.
      clip: What the long file was made of, and how long it was.
      frames: Sampled frames each loop captioned.
      cores: The physical cores.
      choice: The host rule's schedule for ``edgecap caption`` (first round).
      rounds: Every round.
    """

    bundle: str
    clip: str
    frames: int
    cores: int
    choice: Optional[HostSchedule]
    rounds: List[HostRound]

    def median(self, loop: str) -> float:
        """The loop's median fps over the rounds."""
        return statistics.median(r.fps[loop] for r in self.rounds)

    def goals(self) -> Dict[str, Any]:
        """edgecap caption over the one-thread loop round by round, and over the two-thread loop at the median."""
        over_one = [r.ratio(EDGECAP, ONE) for r in self.rounds]
        over_two = [r.ratio(EDGECAP, TWO) for r in self.rounds]
        return {"over_one_thread_rounds": [round(x, 3) for x in over_one],
                "over_two_threads_rounds": [round(x, 3) for x in over_two],
                "over_one_thread_min": min(over_one), "over_two_threads_median": statistics.median(over_two),
                "every_round_met": min(over_one) >= OVER_ONE_EVERY_ROUND,
                "two_threads_met": statistics.median(over_two) >= OVER_TWO_MEDIAN,
                "same_captions": all(all(r.same.values()) for r in self.rounds)}

    def to_json(self) -> Dict[str, Any]:
        """Returns the results as JSON-ready plain types."""
        return {"bundle": self.bundle, "clip": self.clip, "frames": self.frames, "cores": self.cores,
                "loops": list(LOOPS), "choice": asdict(self.choice) if self.choice else None,
                "median_fps": {loop: self.median(loop) for loop in LOOPS},
                "rounds": [asdict(r) for r in self.rounds], "goals": self.goals()}


def read_frames(clips: Sequence[str]) -> Tuple[List[np.ndarray], float]:
    """Decodes every frame of the clips; returns them and the first clip's frame rate.

    Raises:
      ConfigError: If the clips hold no frame.
    """
    frames: List[np.ndarray] = []
    fps = 0.0
    for clip in clips:
        capture = cv2.VideoCapture(str(clip))
        fps = fps or capture.get(cv2.CAP_PROP_FPS)
        while True:
            ok, image = capture.read()
            if not ok:
                break
            frames.append(image)
        capture.release()
    if not frames:
        raise ConfigError(f"{', '.join(map(str, clips))}: no frames; pass --clips with video files")
    return frames, fps or 30.0


def write_long_clip(frames: Sequence[np.ndarray], fps: float, count: int, path: Path) -> Path:
    """Writes ``count`` frames, ``frames`` over and over, as one mp4v video at ``fps`` (sized as the first).

    Returns:
      ``path``.
    """
    height, width = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    try:
        for i in range(count):
            image = frames[i % len(frames)]
            if image.shape[:2] != (height, width):
                image = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
            writer.write(image)
    finally:
        writer.release()
    return path


def caption_file(bundle: Bundle, path: Path) -> Tuple[LoopRun, Optional[HostSchedule]]:
    """``edgecap caption``'s run of a file: the captioner with nothing set, timed like the plain loops.

    Returns:
      The run and the host rule's schedule.
    """
    with EdgeCaptioner(bundle) as cap:
        t0, c0 = time.perf_counter(), time.process_time()
        captions = [c.tokens for c in cap.stream(path)]
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        stats = cap.stats()
        return LoopRun(stats.frames_out if stats else 0, seconds, cpu, captions), cap.choice.host


def bench_host(bundle: Bundle, clips: Sequence[str], seconds: float = 20.0, rounds: int = 5,
               progress: Optional[Callable[[], object]] = None, cores: Optional[int] = None,
               on_round: Optional[Callable[[HostRound], object]] = None) -> HostBench:
    """Runs the plain loops and ``edgecap caption`` over one long file, in interleaved rounds.

    Args:
      bundle: The loaded bundle.
      clips: The video files the long file is made of.
      seconds: About how long one loop's rounds take together at the one-thread rate.
      rounds: How often each loop runs.
      progress: Called after each run.
      cores: The cores of the all-cores loop (default: the physical cores).
      on_round: Called with each round as it ends.

    Returns:
      The ``HostBench``.
    """
    cores = cores or devices.cpu_cores()
    frames, fps = read_frames(clips)
    window = bundle.window
    step = fps / window.sample_fps if window.sample_fps > 0 else 1.0
    with tempfile.TemporaryDirectory(prefix="edgecap-host-bench-") as tmp:
        # The one-thread rate on the clips as they are sets the long file's length.
        probe = plain_loops.one_thread(bundle, write_long_clip(frames, fps, len(frames), Path(tmp) / "probe.mp4"))
        sampled = max(4 * window.frames, int(probe.fps * seconds / rounds))
        count = int(sampled * step)
        path = write_long_clip(frames, fps, count, Path(tmp) / "long.mp4")
        runs: Dict[str, Callable[[], Any]] = {
            ONE: lambda: plain_loops.one_thread(bundle, path),
            ALL: lambda: plain_loops.one_thread(bundle, path, cnn_threads=cores),
            TWO: lambda: plain_loops.two_threads(bundle, path),
            EDGECAP: lambda: caption_file(bundle, path),
        }
        done: List[HostRound] = []
        choice: Optional[HostSchedule] = None
        frames_run = 0
        for n in range(rounds):
            this = HostRound(n, tuple(round(x, 2) for x in os.getloadavg()))
            reference: Optional[List[List[int]]] = None
            # Each round starts with the next loop, so that none always runs first or last.
            for loop in LOOPS[n % len(LOOPS):] + LOOPS[:n % len(LOOPS)]:
                got = runs[loop]()
                run, host = got if loop == EDGECAP else (got, None)
                choice = choice or host
                reference = run.captions if reference is None else reference
                frames_run = frames_run or run.frames
                this.fps[loop] = round(run.fps, 2)
                this.cpu_ms[loop] = round(run.cpu_ms_per_frame, 4)
                this.same[loop] = run.captions == reference
                this.order.append(loop)
                if progress is not None:
                    progress()
            done.append(this)
            if on_round is not None:
                on_round(this)
    what = (f"{', '.join(map(str, clips))} repeated to {count} frames ({count / fps:.0f} s at {fps:g} fps, "
            f"{frames[0].shape[1]}x{frames[0].shape[0]}, mp4v)")
    return HostBench(str(bundle.root), what, frames_run, cores, choice, done)


def format_round(r: HostRound) -> str:
    """One round as a table line: load, each loop's fps, edgecap over one and two threads."""
    fps = "".join(f"{r.fps[loop]:>10.1f}" for loop in LOOPS)
    return (f"{r.round:>5}{r.load[0]:>7.2f}{fps}{r.ratio(EDGECAP, ONE):>9.2f}x{r.ratio(EDGECAP, TWO):>9.2f}x"
            f"{r.ratio(EDGECAP, ALL):>9.2f}x  {'yes' if all(r.same.values()) else 'NO'}")


def format_host(result: HostBench) -> str:
    """The host rounds as the table ``edgecap bench --profiles host`` prints (measured)."""
    lines = ["", f"== host (measured): {result.bundle}, {result.frames} sampled frames a run of "
                 f"{result.clip}; {result.cores} cores",
             f"{'round':>5}{'load':>7}{'1 thread':>10}{'all cores':>10}{'2 threads':>10}{'edgecap':>10}"
             f"{'e/1 thr':>10}{'e/2 thr':>10}{'e/all':>10}  same"]
    lines += [format_round(r) for r in result.rounds]
    med = {loop: result.median(loop) for loop in LOOPS}
    lines.append(f"{'median':>12}" + "".join(f"{med[loop]:>10.1f}" for loop in LOOPS))
    cpu = {loop: statistics.median(r.cpu_ms[loop] for r in result.rounds) for loop in LOOPS}
    lines.append(f"{'CPU ms/frame':>12}" + "".join(f"{cpu[loop]:>10.3f}" for loop in LOOPS))
    g = result.goals()
    lines.append(f"goals, host (measured): edgecap caption >= {OVER_ONE_EVERY_ROUND:g}x the one-thread loop "
                 f"in every round (lowest {g['over_one_thread_min']:.2f}x: "
                 f"{'met' if g['every_round_met'] else 'NOT met'}), >= {OVER_TWO_MEDIAN:g}x the two-thread "
                 f"loop at the median ({g['over_two_threads_median']:.2f}x: "
                 f"{'met' if g['two_threads_met'] else 'NOT met'}); same captions in every loop: "
                 f"{'yes' if g['same_captions'] else 'NO'}")
    if result.choice is not None:
        lines.append(f"edgecap caption's host plan: {result.choice.kind}, {result.choice.num_threads} CNN "
                     f"thread(s) at start ({result.choice.reason})")
    return "\n".join(lines)
