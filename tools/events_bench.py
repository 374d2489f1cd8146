"""Event boundaries against the synthetic ground truth: ``python tools/events_bench.py``.

Renders two videos of synthetic scenes (``models.dataset``) with known
caption changes: each is a run of *segments*, each one shape doing one thing
unbroken for 2 to 8 seconds (``render_segment``), and consecutive segments
(the last and the first too, for the loop) differ in caption. It runs a real ``edgecap serve`` on them
as two looping file cameras for ``--minutes``, with the JSON-lines sink
writing captions and events (``[sinks.jsonl] events = true``), stops it with
SIGTERM and compares the events with the truth:

* a *boundary* is where an event starts after another one of its camera; a
  true one is where the video's caption changes (the wrap of the loop
  included). Events are joined to their windows by their ``windows`` counts
  (every window is in exactly one event), so a boundary sits at the first
  source frame of its event's first window; it matches a true change within
  ``--tolerance-windows`` windows (one-to-one, nearest first).
* precision = matched / boundaries the events put, recall = matched / true
  changes; the breakdown counts windows whose caption is wrong, windows that
  dropped frames *shifted* off the one-second grid the video was rendered on
  (and how many of those were wrong), and windows that straddle a true change.
* the same recorded captions replayed through ``EventTracker`` offline: with
  the service's rule (a check: the same events) and with every change
  confirmed by 2 windows, what the rule does for unsure captions.
* frames the feeds dropped (the pipeline was behind), windows with a frame
  dropped inside (one step of their motion twice as long) and how many of
  those were wrong;
* the service's resident memory (peak and last), and events per camera-hour.

Prints a table and writes JSON (``--json``). Every figure is *measured* on
this host. ``--config-extra`` adds TOML lines at the top of the service's
config (e.g. ``'[history]' 'path = "/tmp/h.db"'``). Bad input exits 2 with one line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import sqlite3
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np
import psutil

from edgecap.bundle import DEMO_DIR, load_bundle
from edgecap.captioner import Caption
from edgecap.command import run_command
from edgecap.errors import ConfigError
from edgecap.events import EventRule, EventTracker
from edgecap.outputs import check_output, write_text

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # models/ is a top-level package of the repository, not installed
    sys.path.insert(0, str(REPO))

from models.dataset import (FPS, FRAMES, GROW_TOTAL, ROTATIONS, SHRINK_TOTAL, ClipSpec,  # noqa: E402
                            random_spec, render_clip)

PROG = "python tools/events_bench.py"
CAMERAS = ("cam0", "cam1")
SEGMENT_SECONDS = (3, 8)  # a rotation's segment, inclusive
OTHER_SECONDS = 2  # a move's, a growth's, a shrinking's: longer would leave the frame or the sizes trained on


@dataclass
class Segment:
    """A stretch of a video with one true caption: source frames ``[start, end)``."""

    start: int
    end: int
    caption: str


def render_segment(spec: ClipSpec, rng: np.random.Generator) -> np.ndarray:
    """Renders one segment: ``spec``'s motion going on, unbroken, for several seconds.

    A camera watching something happen sees one motion, not a clip that
    restarts every second; a window that dropped frames shift off the seconds
    must still see one coherent motion. So the shape, its background and its
    pace stay; a rotation goes on for 3 to 8 s, and a move, a growth or a
    shrinking for 2 s, from a start that keeps every second within the
    positions and sizes the demo model was trained on (longer, they leave it:
    3 s made a quarter of those windows wrong, aligned or not).

    Args:
      spec: The segment's shape, colour, motion and background (one second's clip).
      rng: Source of the length, the start and the rendering's seed.

    Returns:
      uint8 BGR frames ``[T, H, W, 3]``, ``T`` a whole number of seconds.
    """
    seed = int(rng.integers(2**31))
    if spec.motion in ROTATIONS:
        seconds = int(rng.integers(SEGMENT_SECONDS[0], SEGMENT_SECONDS[1] + 1))
        return render_clip(replace(spec, frames=FRAMES * seconds), seed)[0]
    seconds = OTHER_SECONDS
    if spec.motion.startswith("moves"):
        # At the slowest paces it crosses 0.2-0.23 of the frame a second: each
        # second starts where the model's training clips start (0.32-0.68).
        start = {"moves left": 0.66, "moves right": 0.34, "moves up": 0.66, "moves down": 0.34}[spec.motion]
        axis = "x0" if spec.motion in ("moves left", "moves right") else "y0"
        clip = replace(spec, frames=FRAMES * seconds, rate=float(rng.uniform(0.0, 0.25)), **{axis: start})
        return render_clip(clip, seed)[0]
    # Growth is a factor per clip: clips chained, each starting at the size the last one would reach next.
    growing = spec.motion == "grows"
    rate = 0.0 if growing else 1.0  # the gentlest: x1.5 or x0.65 a second
    total = GROW_TOTAL[0] if growing else SHRINK_TOTAL[1]
    radius = 0.15 if growing else 0.21
    clips = []
    for _ in range(seconds):
        clips.append(render_clip(replace(spec, rate=rate, radius0=radius), seed)[0])
        radius *= total ** (FRAMES / (FRAMES - 1))
    return np.concatenate(clips)


def render_video(path: Path, segments: int, seed: int) -> List[Segment]:
    """Writes a video of ``segments`` segments, each one caption's motion unbroken; returns its truth.

    Args:
      path: The .mp4 to write (mp4v, 16 fps, 128x128).
      segments: How many segments (at least 2); consecutive ones (and the
        last and the first) differ in caption.
      seed: Seed of everything drawn.

    Returns:
      The segments, in order, covering every frame.
    """
    rng = np.random.default_rng(seed)
    specs: List[ClipSpec] = []
    while len(specs) < segments:
        spec = random_spec(rng)
        last = len(specs) == segments - 1
        if specs and (spec.caption == specs[-1].caption or (last and spec.caption == specs[0].caption)):
            continue
        specs.append(spec)
    size = specs[0].size
    writer = cv2.VideoWriter(os.fspath(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (size, size))
    if not writer.isOpened():
        raise OSError(f"OpenCV cannot write {path}")
    truth: List[Segment] = []
    frame = 0
    try:
        for spec in specs:
            frames = render_segment(spec, rng)
            for image in frames:
                writer.write(image)
            truth.append(Segment(frame, frame + len(frames), spec.caption))
            frame += len(frames)
    finally:
        writer.release()
    return truth


def _config(directory: Path, port: int, videos: Sequence[Path], extra: Sequence[str]) -> Path:
    # The extra lines come before the first table (a top-level key is one only there);
    # a table they open ends at the [http] header that follows them.
    lines = [f'bundle = "{DEMO_DIR / "bundle"}"', ""] + list(extra) + ["", "[http]", f"port = {port}", "",
                           "[sinks.stdout]", "enabled = false", "",
                           "[sinks.jsonl]", f'path = "{directory / "out.jsonl"}"', "max_bytes = 1000000000",
                           "events = true", ""]
    for name, video in zip(CAMERAS, videos):
        lines += ["[[cameras]]", f'name = "{name}"', f'source = "{video}"', "loop = true", ""]
    path = directory / "edgecap.toml"
    path.write_text("\n".join(lines))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dropped(port: int) -> Dict[str, float]:
    """Sampled frames each camera's feed dropped for newer ones (the pipeline was busy), from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^edgecap_frames_dropped_total\{camera="([^"]*)"\} (\S+)$', text, re.M)}


def _ready(notify: socket.socket, proc: subprocess.Popen, deadline: float) -> bool:
    """Waits for READY=1; False if the service exits or the deadline passes first."""
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if b"READY=1" in notify.recv(4096):
                return True
        except socket.timeout:
            pass
    return False


def run_service(directory: Path, videos: Sequence[Path], seconds: float,
                extra: Sequence[str] = ()) -> Dict[str, Any]:
    """Runs ``edgecap serve`` on the videos as looping cameras for ``seconds``; returns what it wrote.

    Returns:
      ``records`` (the JSON lines), ``seconds`` (from READY to SIGTERM),
      ``exit_code``, ``rss_mb`` samples and ``dropped`` frames per camera.

    Raises:
      ConfigError: The service refused its config (say, a bad ``--config-extra``)
        or never became ready.
    """
    port = _free_port()
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(directory / "notify.sock"))
    notify.settimeout(0.5)  # short: a service that refuses its config exits, and is noticed
    # The state directory is the bench's own, so the history (on by default) is measured, then deleted.
    env = dict(os.environ, NOTIFY_SOCKET=str(directory / "notify.sock"), STATE_DIRECTORY=str(directory))
    stderr = open(directory / "stderr.txt", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "edgecap.cli", "serve", "--config",
                             str(_config(directory, port, videos, extra))],
                            stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    try:
        if not _ready(notify, proc, deadline=time.monotonic() + 60.0):
            proc.kill()
            proc.wait()
            stderr.seek(0)
            why = (stderr.read().strip().splitlines() or ["no error line"])[-1]
            raise ConfigError(f"edgecap serve did not become ready (exit {proc.returncode}): {why}; "
                              "check --config-extra") from None
        ps = psutil.Process(proc.pid)
        rss: List[float] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds and proc.poll() is None:
            rss.append(ps.memory_info().rss / 2**20)
            time.sleep(min(5.0, max(0.2, seconds - (time.monotonic() - t0))))
        elapsed = time.monotonic() - t0
        dropped = _dropped(port)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        notify.close()
        stderr.close()
    records = [json.loads(line) for line in (directory / "out.jsonl").read_text().splitlines()]
    return {"records": records, "seconds": elapsed, "exit_code": proc.returncode, "rss_mb": rss,
            "dropped": dropped, "history": _history(directory / "history.db")}


def _history(path: Path) -> Optional[Dict[str, Any]]:
    """The history the service kept: its files' bytes and its events (None when it kept none)."""
    if not path.exists():
        return None
    size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))  # with -wal and -shm
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        events = db.execute("SELECT count(*) FROM events").fetchone()[0]
    return {"bytes": size, "events": events}


def _match(predicted: List[int], true: List[int], tolerance: int) -> List[Tuple[int, int]]:
    """One-to-one pairs (predicted, true) within ``tolerance`` frames, nearest first."""
    pairs = sorted((abs(p - t), i, j) for i, p in enumerate(predicted) for j, t in enumerate(true)
                   if abs(p - t) <= tolerance)
    used_p, used_t, out = set(), set(), []
    for _, i, j in pairs:
        if i not in used_p and j not in used_t:
            used_p.add(i)
            used_t.add(j)
            out.append((predicted[i], true[j]))
    return out


def evaluate(captions: List[Dict[str, Any]], events: List[Dict[str, Any]], truth: List[Segment],
             tolerance: int, span: int = FRAMES - 2) -> Dict[str, Any]:
    """Scores one camera's closed events against its video's truth.

    Args:
      captions: The camera's caption records, in order (``start_frame``, ``end_frame``, ``text``).
      events: Its closed event records, in order (``windows``).
      truth: The video's segments; frame indices are taken modulo its length (the loop).
      tolerance: How far (source frames) a boundary may sit from the true change it matches.
      span: Source frames from a window's first frame to its last when none was dropped.

    Returns:
      Counts, precision, recall and the breakdown (JSON-ready).
    """
    windows = sum(e["windows"] for e in events)
    if not captions or not events:
        return {"windows": len(captions), "events": len(events), "precision": None, "recall": None}
    starts = _event_starts(captions, events)
    true = _true_changes(truth, captions[0]["start_frame"], captions[-1]["end_frame"])
    matched = _match(starts, true, tolerance)
    offsets = [abs(p - t) for p, t in matched]
    return {
        "windows": len(captions),
        "windows_in_events": windows,
        "events": len(events),
        "true_changes": len(true),
        "boundaries": len(starts),
        "matched": len(matched),
        "precision": round(len(matched) / len(starts), 4) if starts else None,
        "recall": round(len(matched) / len(true), 4) if true else None,
        "false_boundaries": len(starts) - len(matched),
        "missed_changes": len(true) - len(matched),
        "mean_offset_frames": round(float(np.mean(offsets)), 2) if offsets else None,
        **_window_counts(captions, truth, span),
    }


def _event_starts(captions: List[Dict[str, Any]], events: List[Dict[str, Any]]) -> List[int]:
    """Where each event after the first starts: the first frame of its first window."""
    starts, n = [], 0
    for event in events[:-1]:
        n += event["windows"]
        if n < len(captions):
            starts.append(captions[n]["start_frame"])
    return starts


def _true_changes(truth: List[Segment], lo: int, hi: int) -> List[int]:
    """The frames in ``(lo, hi]`` where the looped video's caption changes."""
    length = truth[-1].end
    changes = [seg.start for seg in truth]  # segment 0 starts where the last one (another caption) ends
    return [loop * length + c for loop in range(lo // length, hi // length + 1) for c in changes
            if lo < loop * length + c <= hi]


def _window_counts(captions: List[Dict[str, Any]], truth: List[Segment], span: int) -> Dict[str, int]:
    """Wrong windows, and how many windows (and wrong ones) straddle a change, are shifted or have a gap."""
    length = truth[-1].end
    caption_of = np.empty(length, dtype=np.int32)
    for n, seg in enumerate(truth):
        caption_of[seg.start:seg.end] = n
    texts = [seg.caption for seg in truth]
    wrong = straddling = wrong_straddling = shifted = wrong_shifted = gapped = wrong_gapped = 0
    for c in captions:
        segs = Counter(int(caption_of[i % length]) for i in range(c["start_frame"], c["end_frame"] + 1))
        spans = len(segs) > 1
        # Dropped frames shift the windows off the seconds the segments were rendered in.
        off = c["start_frame"] % FRAMES != 0
        # A frame dropped inside the window: one step of its motion is twice as long.
        gap = c["end_frame"] - c["start_frame"] > span
        straddling += spans
        shifted += off
        gapped += gap
        if c["text"] != texts[segs.most_common(1)[0][0]] and not (spans and c["text"] in {texts[s] for s in segs}):
            wrong += 1
            wrong_straddling += spans
            wrong_shifted += off
            wrong_gapped += gap
    return {
        "windows_wrong": wrong,
        "windows_straddling": straddling,
        "windows_wrong_straddling": wrong_straddling,
        "windows_shifted": shifted,
        "windows_wrong_shifted": wrong_shifted,
        "windows_gapped": gapped,
        "windows_wrong_gapped": wrong_gapped,
    }


def replay(captions: List[Dict[str, Any]], camera: str, rule: EventRule) -> List[Dict[str, Any]]:
    """The closed events ``rule`` makes of a camera's recorded captions (``EventTracker`` offline)."""
    tracker = EventTracker(camera, rule)
    closed = []
    for r in captions:
        caption = Caption(text=r["text"], tokens=[], window=r["window"], start_frame=r["start_frame"],
                          end_frame=r["end_frame"], start_time=r["start_time"], end_time=r["end_time"],
                          confidence=r.get("confidence", 0.0))
        closed += [e.to_dict() for e, change in tracker.update(caption) if change == "closed"]
    return closed + [e.to_dict() for e, _ in tracker.close()]


# What the same captions would give under other rules: the service's own rule
# (a consistency check of the replay), and confirmation by 2 windows always,
# which is what the default rule does for captions below its confidence.
REPLAYED_RULES = {"service rule": EventRule(), "confirm 2 always": EventRule(confident=math.inf)}


def run_bench(minutes: float, segments: int = 30, seed: int = 18, tolerance_windows: float = 1.0,
              extra: Sequence[str] = ()) -> Dict[str, Any]:
    """Renders the videos, runs the service and scores its events; returns the JSON-ready result."""
    window = load_bundle(DEMO_DIR / "bundle").window
    frames_per_window = round(window.frames * FPS / window.sample_fps)  # source frames a window spans
    span = round((window.frames - 1) * FPS / window.sample_fps)  # its first frame to its last
    tolerance = round(tolerance_windows * frames_per_window)
    with tempfile.TemporaryDirectory(prefix="events-bench-") as tmp:
        directory = Path(tmp)
        videos = [directory / f"{name}.mp4" for name in CAMERAS]
        truths = [render_video(video, segments, seed + n) for n, video in enumerate(videos)]
        run = run_service(directory, videos, minutes * 60.0, extra)
    cameras = {name: _score_camera(name, run, truth, tolerance, span) for name, truth in zip(CAMERAS, truths)}
    total = {k: sum(c.get(k) or 0 for c in cameras.values())
             for k in ("boundaries", "true_changes", "matched", "windows", "windows_wrong", "windows_straddling",
                       "windows_shifted", "windows_wrong_shifted", "windows_gapped", "windows_wrong_gapped",
                       "false_boundaries", "missed_changes", "frames_dropped")}
    rss = run["rss_mb"]
    return {
        "host": "measured",
        "minutes": round(run["seconds"] / 60.0, 2),
        "exit_code": run["exit_code"],
        "tolerance_windows": tolerance_windows,
        "tolerance_frames": tolerance,
        "precision": _ratio(total["matched"], total["boundaries"]),
        "recall": _ratio(total["matched"], total["true_changes"]),
        "window_accuracy": round(1 - total["windows_wrong"] / total["windows"], 4) if total["windows"] else None,
        "totals": total,
        "replayed": _replayed_totals(cameras),
        "events_per_camera_hour": round(sum(c["events_per_camera_hour"] for c in cameras.values()) / len(cameras), 1),
        "rss_mb_peak": round(max(rss), 1) if rss else None,
        "rss_mb_last": round(rss[-1], 1) if rss else None,
        "history": _history_per_day(run["history"], cameras),
        "cameras": cameras,
        "segments_per_video": segments,
        "seed": seed,
        "config_extra": list(extra),
    }


def _ratio(part: int, whole: int) -> Optional[float]:
    return round(part / whole, 4) if whole else None


def _score_camera(name: str, run: Dict[str, Any], truth: List[Segment], tolerance: int,
                  span: int) -> Dict[str, Any]:
    """One camera's events scored, and the events the replayed rules make of its captions."""
    mine = [r for r in run["records"] if r["camera"] == name]
    captions = [r for r in mine if "change" not in r]
    events = [r for r in mine if r.get("change") == "closed"]
    camera = evaluate(captions, events, truth, tolerance, span)
    camera["frames_dropped"] = run["dropped"].get(name, 0.0)  # absent: none counted
    camera["replayed"] = {}
    for rule_name, rule in REPLAYED_RULES.items():
        replayed = replay(captions, name, rule)
        score = evaluate(captions, replayed, truth, tolerance, span)
        camera["replayed"][rule_name] = {
            k: score[k] for k in ("events", "boundaries", "matched", "true_changes", "precision", "recall")}
        if rule_name == "service rule":
            camera["replay_matches_service"] = [e["windows"] for e in replayed] == [e["windows"] for e in events]
    camera["events_per_camera_hour"] = round(len(events) / (run["seconds"] / 3600.0), 1)
    camera["true_segment_seconds_mean"] = round(float(np.mean([(s.end - s.start) / FPS for s in truth])), 2)
    return camera


def _replayed_totals(cameras: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Optional[float]]]:
    """Precision and recall of each replayed rule over every camera."""
    replayed = {}
    for rule_name in REPLAYED_RULES:
        scores = [c["replayed"][rule_name] for c in cameras.values()]
        matched, put, true = (sum(x[k] or 0 for x in scores) for k in ("matched", "boundaries", "true_changes"))
        replayed[rule_name] = {"precision": _ratio(matched, put), "recall": _ratio(matched, true)}
    return replayed


def _history_per_day(history: Optional[Dict[str, Any]], cameras: Dict[str, Dict[str, Any]]
                     ) -> Optional[Dict[str, Any]]:
    """The history's figures, extrapolated from this run: its bytes per event at its events per camera-hour."""
    if history is None or not history["events"]:
        return history
    per_event = history["bytes"] / history["events"]
    per_hour = sum(c["events_per_camera_hour"] for c in cameras.values()) / len(cameras)
    return dict(history, bytes_per_event=round(per_event), mb_per_camera_day=round(per_event * per_hour * 24 / 1e6, 1))


def format_table(result: Dict[str, Any]) -> str:
    """The result as the table the command prints."""
    head = ("camera", "windows", "frames dropped", "events", "true changes", "boundaries", "matched", "precision",
            "recall", "wrong windows", "with a drop (wrong)", "events/h")
    rows = [head]
    for name, c in result["cameras"].items():
        rows.append((name, str(c["windows"]), f"{c.get('frames_dropped') or 0:.0f}", str(c["events"]),
                     str(c.get("true_changes", "-")), str(c.get("boundaries", "-")), str(c.get("matched", "-")),
                     f"{c['precision']}", f"{c['recall']}", str(c.get("windows_wrong", "-")),
                     f"{c.get('windows_gapped', '-')} ({c.get('windows_wrong_gapped', '-')})",
                     f"{c['events_per_camera_hour']:.0f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    table = "\n".join("  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in rows)
    replays = "; ".join(f"{name}: precision {r['precision']} recall {r['recall']}"
                        for name, r in result["replayed"].items())
    return (f"{table}\nall: precision {result['precision']}  recall {result['recall']}  "
            f"(a boundary matches within {result['tolerance_windows']:g} window = "
            f"{result['tolerance_frames']} source frames)  window accuracy {result['window_accuracy']}\n"
            f"the same captions replayed: {replays}\n"
            f"service: {result['minutes']:.1f} min, RSS peak {result['rss_mb_peak']} MB, last "
            f"{result['rss_mb_last']} MB, exit {result['exit_code']}  (measured on this host)"
            + _history_line(result.get("history")))


def _history_line(history: Optional[Dict[str, Any]]) -> str:
    if not history:
        return "\nhistory: none kept"
    return (f"\nhistory: {history['events']} events, {history['bytes'] / 1e6:.1f} MB, "
            f"{history.get('bytes_per_event')} B/event, {history.get('mb_per_camera_day')} MB per "
            "camera-day extrapolated")


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the benchmark from the command line.

    Args:
      argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
      The exit code: 0, or 2 on bad input.
    """
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the service runs")
    parser.add_argument("--segments", type=int, default=30, help="caption segments per video")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--tolerance-windows", type=float, default=1.0,
                        help="how far a boundary may sit from the true change, in windows")
    parser.add_argument("--config-extra", nargs="*", default=[], metavar="LINE",
                        help="TOML lines put at the top of the service's config")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)

    def body() -> int:
        if not 0 < args.minutes <= 24 * 60:
            raise ConfigError(f"--minutes {args.minutes:g}: give a number of minutes in (0, 1440]")
        if not 2 <= args.segments <= 1000:
            raise ConfigError(f"--segments {args.segments}: give 2 to 1000")
        if not 0 <= args.tolerance_windows <= 10:
            raise ConfigError(f"--tolerance-windows {args.tolerance_windows:g}: give 0 to 10")
        if args.json is not None:
            check_output(args.json, "--json")  # before ten minutes of running, not after
        result = run_bench(args.minutes, args.segments, args.seed, args.tolerance_windows, args.config_extra)
        print(format_table(result))
        if args.json is not None:
            write_text(args.json, json.dumps(result, indent=1) + "\n")
        return 0

    return run_command(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
