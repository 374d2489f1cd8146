"""The event history's goals, measured on this host: ``python tools/history_bench.py --json results/history-bench.json``.

(a) search latency (p50, p99; goal p99 <= 50 ms) over a generated history of
``--events`` events (texts from the demo's grammar, ``--cameras`` cameras,
one event per ``3600 / --events-per-hour`` seconds per camera, a thumbnail on
every ``--thumbnail-every``-th event), for words, phrases, camera and time
filters, limit 50, through ``History.search`` (a fresh read-only
connection per search, as the page and the CLI do); (b) database bytes per
event, written as the service writes them (every event with its thumbnail,
upserted when it opens and when it closes, committed in batches), and the
growth per camera-day at ``--events-per-hour`` (default 3600: the synthetic
clips' true caption changes, one a second; 8 windows a second make each 8
windows long) against the default disk budget; (c) the resident memory of a
process writing events through ``HistorySink`` (two cameras, 9 changes an
event), paced at ten times the service's rate and flat out, and the sink's
share (peak less the RSS before it opened); (d) ``--trials`` kill -9 trials: a child writes events as
the service does (two cameras, each event opened, extended and closed) and
reports each change with its time through a pipe; SIGKILL at a random moment;
then ``PRAGMA integrity_check`` must be ok and no event the child reported
more than ``--loss-limit`` seconds (1) before the kill may be missing or
behind. One file serves every trial, so each also opens (checks,
recovers) the one the last kill left.

Thumbnails are the demo clip's frames as the event tracker makes them (JPEG,
at most 160 pixels wide, quality 70). Every figure is *measured* on this host.
Prints a table and writes JSON (``--json``); bad input exits 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgecap.command import run_command  # noqa: E402
from edgecap.errors import EdgecapError  # noqa: E402
from edgecap.events import Event  # noqa: E402
from edgecap.service import history  # noqa: E402
from edgecap.service.config import HistoryConfig  # noqa: E402

PROG = "history_bench"
ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "models" / "demo" / "sample.mp4"
WINDOWS_PER_S = 8.0


def texts() -> List[str]:
    """Every caption the demo's grammar makes: ``a COLOR SHAPE MOTION``."""
    from models.dataset import COLORS, MOTIONS, ROTATIONS, SHAPES

    return [f"a {c} {s} {m}" for c in COLORS for s in SHAPES for m in MOTIONS
            if s != "circle" or m not in ROTATIONS]


def thumbnails(width: int = 160, quality: int = 70) -> List[bytes]:
    """The demo clip's frames as JPEG thumbnails, the way the event tracker encodes them."""
    import cv2

    out = []
    cap = cv2.VideoCapture(str(SAMPLE))
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        h, w = frame.shape[:2]
        if w > width:
            frame = cv2.resize(frame, (width, max(1, round(h * width / w))), interpolation=cv2.INTER_AREA)
        out.append(cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])[1].tobytes())
    cap.release()
    if not out:
        raise EdgecapError(f"{SAMPLE}: no frames read; the demo clip is needed for the thumbnails")
    return out


# --- (a) search ------------------------------------------------------------------------------

def build(path: Path, n: int, cameras: int, per_hour: float, thumbs: List[bytes], thumb_every: int,
          now: float, seed: int = 1) -> float:
    """Writes ``n`` closed events ending at ``now`` in one transaction; returns the seconds it took."""
    rng = random.Random(seed)
    words = texts()
    interval = 3600.0 / per_hour
    per_camera = -(-n // cameras)
    db = history.open_database(path)
    t0 = time.perf_counter()

    def rows(table: str):
        for i in range(n):
            cam, j = i % cameras, i // cameras
            start = now - (per_camera - j) * interval + cam * 0.1
            rowid = int(start * 1000) * history.SLOTS + cam
            if table == "events":
                yield (rowid, f"cam{cam}@{int(start * 1000)}", f"cam{cam}", rng.choice(words), start,
                       start + interval, -rng.random(), max(1, int(interval * WINDOWS_PER_S)), 1)
            elif thumb_every and i % thumb_every == 0:
                yield (rowid, thumbs[i % len(thumbs)])

    with db:
        db.executemany("INSERT INTO events(rowid, id, camera, text, start_time, end_time, confidence, windows, "
                       "closed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows("events"))
        db.executemany("INSERT INTO thumbnails(rowid, jpeg) VALUES (?, ?)", rows("thumbnails"))
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return time.perf_counter() - t0


def queries(now: float, span: float) -> List[Tuple[str, Dict[str, Any]]]:
    """The searches timed over a history of ``span`` seconds up to ``now``: (label, ``History.search`` arguments)."""
    return [
        ("word: red", {"q": "red"}),
        ("word: star", {"q": "star"}),
        ("words: red star", {"q": "red star"}),
        ('phrase: "moves right"', {"q": '"moves right"'}),
        ('phrase: "white square moves up"', {"q": '"white square moves up"'}),
        ("words + camera", {"q": "purple circle", "camera": "cam1"}),
        ("camera only", {"camera": "cam2"}),
        ("word + last hour", {"q": "yellow", "since": now - 3600}),
        ("words + an hour, mid-history", {"q": "green triangle", "since": now - span / 2 - 3600,
                                          "until": now - span / 2}),
        ("word + until a tenth in", {"q": "blue", "until": now - span * 0.9}),
        ("everything", {}),
        ("no match", {"q": "zebra"}),
        ("hostile text", {"q": '"a" OR NEAR(x, y) AND {camera}: * ^ -"'}),
    ]


def search_bench(path: Path, now: float, span: float, repeats: int) -> Dict[str, Any]:
    """Times every query ``repeats`` times (in turns); returns the latencies' summary."""
    reader = history.History(path)
    qs = queries(now, span)
    times: Dict[str, List[float]] = {label: [] for label, _ in qs}
    hits: Dict[str, int] = {}
    for _ in range(repeats):
        for label, kwargs in qs:
            t = time.perf_counter()
            found = reader.search(limit=50, **kwargs)
            times[label].append((time.perf_counter() - t) * 1000.0)
            hits[label] = len(found)
    every = sorted(ms for v in times.values() for ms in v)
    return {"searches": len(every), "p50_ms": round(_pct(every, 50), 2), "p99_ms": round(_pct(every, 99), 2),
            "max_ms": round(every[-1], 2),
            "by_query": [{"query": label, "args": {k: v for k, v in kwargs.items()}, "hits": hits[label],
                          "p50_ms": round(_pct(sorted(times[label]), 50), 2),
                          "p99_ms": round(_pct(sorted(times[label]), 99), 2)} for label, kwargs in qs]}


def _pct(sorted_values: List[float], p: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, int(round(p / 100.0 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


# --- (b) growth ------------------------------------------------------------------------------

def growth(path: Path, n: int, per_hour: float, thumbs: List[bytes]) -> Dict[str, Any]:
    """Writes ``n`` events of one camera as the sink does; returns bytes per event and growth per camera-day."""
    words = texts()
    rng = random.Random(2)
    interval = 3600.0 / per_hour
    windows = max(1, int(round(interval * WINDOWS_PER_S)))
    db = history.open_database(path)
    now = time.time() - n * interval
    for i in range(n):
        start = now + i * interval
        event = Event(id=f"front@{int(start * 1000)}", camera="front", text=rng.choice(words), start_time=start,
                      end_time=start + 1 / WINDOWS_PER_S, confidence=-rng.random(), windows=1,
                      thumbnail=thumbs[i % len(thumbs)])
        with db:  # the commit that holds its opening
            history.upsert(db, event, event.thumbnail)
        event.end_time, event.windows, event.closed = start + interval, windows, True
        with db:  # the commit that holds its end
            history.upsert(db, event, None)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    used = history.used_bytes(db)
    thumb_bytes = db.execute("SELECT sum(length(jpeg)) FROM thumbnails").fetchone()[0]
    db.close()
    per_event = used / n
    per_day = per_event * per_hour * 24
    budget = HistoryConfig().max_bytes
    return {"events": n, "events_per_hour": per_hour, "windows_per_event": windows,
            "thumbnail_mean_bytes": round(thumb_bytes / n), "file_bytes": path.stat().st_size,
            "bytes_per_event": round(per_event),
            "bytes_per_event_without_thumbnail": round(per_event - thumb_bytes / n),
            "mb_per_camera_day": round(per_day / 1e6, 1), "default_max_bytes": budget,
            "camera_days_in_default_budget": round(budget / per_day, 2),
            "fits_default_budget_one_camera_day": per_day <= budget}


# --- (c) memory ------------------------------------------------------------------------------

def _rss_kb(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def rss_child(path: str, n: int, rate: float) -> Dict[str, Any]:
    """In a fresh process: RSS before the sink, then peak RSS while it writes ``n`` events with thumbnails.

    Each event is 9 changes (opened, 7 extended, closed) of one of two cameras,
    at ``rate`` changes a second (0: as fast as the sink takes them).
    """
    thumbs = thumbnails()
    words = texts()
    before = _rss_kb()
    sink = history.HistorySink(path)
    sink.opened.wait()
    peak = _rss_kb()
    start = time.time()
    t = time.perf_counter()
    sent = 0
    for i in range(n):
        s = start + i
        e = Event(id=f"cam{i % 2}@{int(s * 1000)}", camera=f"cam{i % 2}", text=words[i % len(words)],
                  start_time=s, end_time=s + 0.125, confidence=-0.5, windows=1, thumbnail=thumbs[i % len(thumbs)])
        for w in range(1, 10):
            e.windows, e.end_time, e.closed = min(w, 8), s + min(w, 8) / WINDOWS_PER_S, w == 9
            sink.event(e.camera, e, "opened" if w == 1 else "closed" if w == 9 else "extended")
            sent += 1
            if rate:
                time.sleep(max(0.0, t + sent / rate - time.perf_counter()))
        while sink._queue.qsize() > history.QUEUE_CAPACITY // 2:  # a real camera waits for frames
            time.sleep(0.01)
        if i % 50 == 0:
            peak = max(peak, _rss_kb())
    sink.close(timeout=60)
    seconds = time.perf_counter() - t
    peak = max(peak, _rss_kb(), 0)
    return {"events": n, "changes": n * 9, "rate_asked": rate, "seconds": round(seconds, 2),
            "changes_per_s": round(n * 9 / seconds), "rss_mb_before_sink": round(before / 1024, 1),
            "rss_mb_peak": round(peak / 1024, 1), "sink_share_mb": round((peak - before) / 1024, 1),
            "counters": sink.counters()}


# --- (d) kill -9 -----------------------------------------------------------------------------

def writer_child(path: str, max_bytes: int) -> None:
    """Writes events as the service does, reporting each change as ``CHANGE ID WINDOWS TIME`` on stdout."""
    sink = history.HistorySink(path, max_bytes=max_bytes, retention_period_s=0.5)
    sink.opened.wait()
    os.write(1, b"ready\n")
    words = texts()
    thumb = bytes(random.getrandbits(8) for _ in range(3000))
    rng = random.Random()
    events: Dict[str, Event] = {}
    while True:
        for cam in ("front", "door"):
            e = events.get(cam)
            now = time.time()
            if e is None or rng.random() < 0.15:
                if e is not None:
                    e.closed = True
                    sink.event(cam, e, "closed")
                    os.write(1, f"closed {e.id} {e.windows} {time.time():.6f}\n".encode())
                e = events[cam] = Event(id=f"{cam}@{int(now * 1000)}", camera=cam, text=rng.choice(words),
                                        start_time=now, end_time=now, confidence=-rng.random(), windows=1,
                                        thumbnail=thumb)
                sink.event(cam, e, "opened")
                os.write(1, f"opened {e.id} 1 {time.time():.6f}\n".encode())
            else:
                e.windows += 1
                e.end_time = now
                sink.event(cam, e, "extended")
                os.write(1, f"extended {e.id} {e.windows} {time.time():.6f}\n".encode())
        time.sleep(1 / 200)  # 100 windows a second per camera: a fast service


def kill_trials(trials: int, path: Path, max_bytes: int, limit: float, seed: int = 3) -> Dict[str, Any]:
    """Runs the kill -9 trials on one file; returns per-trial results and the summary."""
    rng = random.Random(seed)
    results = []
    for trial in range(trials):
        child = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--writer-child", str(path),
                                  "--writer-max-bytes", str(max_bytes)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert child.stdout is not None
        lines: List[bytes] = []
        ready = child.stdout.readline()
        if ready != b"ready\n":
            child.kill()
            raise RuntimeError(f"writer child did not start: {ready!r} {child.stderr.read()[-500:]!r}")
        reader = threading.Thread(target=lambda: lines.extend(child.stdout), daemon=True)
        reader.start()
        time.sleep(rng.uniform(0.2, 2.5))
        killed_at = time.time()
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        reader.join()
        child.stderr.close()
        results.append(_check_trial(path, lines, killed_at, limit))
    lost_ages = [r["oldest_lost_age_s"] for r in results if r["oldest_lost_age_s"] is not None]
    return {"trials": trials, "integrity_ok": sum(r["integrity"] == "ok" for r in results),
            "within_limit": sum(r["ok"] for r in results),
            "limit_s": limit, "commit_period_s": history.COMMIT_PERIOD_S,
            "reported_changes_mean": round(statistics.mean(r["reported"] for r in results)),
            "lost_changes_max": max(r["lost"] for r in results),
            "oldest_lost_age_s_max": round(max(lost_ages), 3) if lost_ages else 0.0,
            "oldest_lost_age_s_p50": round(statistics.median(lost_ages), 3) if lost_ages else 0.0,
            "failed": [r for r in results if not r["ok"]][:10]}


def _check_trial(path: Path, lines: List[bytes], killed_at: float, limit: float) -> Dict[str, Any]:
    """Checks the file a kill left against what the child reported before the kill."""
    latest: Dict[str, Tuple[str, int, float]] = {}
    reported = 0
    for raw in lines:
        parts = raw.decode().split()
        if len(parts) != 4:
            continue  # a line the kill cut
        change, event_id, windows, at = parts
        reported += 1
        latest[event_id] = (change, int(windows), float(at))
    db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    try:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        stored = {i: (w, c) for i, w, c in db.execute("SELECT id, windows, closed FROM events")}
    finally:
        db.close()
    lost = []
    for event_id, (change, windows, at) in latest.items():
        got = stored.get(event_id)
        # Behind: missing, fewer windows, or open when its close was reported.
        if got is None or got[0] < windows or (change == "closed" and not got[1]):
            lost.append(killed_at - at)
    oldest = max(lost) if lost else None
    return {"integrity": integrity, "reported": reported, "lost": len(lost),
            "oldest_lost_age_s": None if oldest is None else round(oldest, 3),
            "ok": integrity == "ok" and (oldest is None or oldest <= limit)}


# --- the command ------------------------------------------------------------------------------

def main(argv: Optional[List[str]] = None) -> int:
    """Runs the benchmark; returns the exit code (0 when every goal is met, 1 when one is not)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the searched history")
    parser.add_argument("--cameras", type=int, default=4)
    parser.add_argument("--events-per-hour", type=float, default=3600.0,
                        help="per camera (default: the synthetic clips' true caption changes, one a second)")
    parser.add_argument("--thumbnail-every", type=int, default=10,
                        help="in the searched history, every Nth event has a thumbnail (0: none)")
    parser.add_argument("--repeats", type=int, default=30, help="times each search is timed")
    parser.add_argument("--growth-events", type=int, default=20_000)
    parser.add_argument("--rss-events", type=int, default=20_000, help="events written flat out for (c)")
    parser.add_argument("--rss-paced-seconds", type=float, default=30.0,
                        help="seconds of (c) at 10x the service's rate (2 cameras x 8 windows/s)")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--trial-max-bytes", type=int, default=2_000_000,
                        help="the writer child's budget: small, so that retention deletes during the trials")
    parser.add_argument("--loss-limit", type=float, default=1.0,
                        help="seconds: a change reported longer before the kill must be in the file (the goal: 1)")
    parser.add_argument("--dir", type=Path, help="where the databases go (default: a temp dir, removed)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--writer-child", help=argparse.SUPPRESS)
    parser.add_argument("--writer-max-bytes", type=int, default=2_000_000, help=argparse.SUPPRESS)
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    parser.add_argument("--rss-rate", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.writer_child:
        writer_child(args.writer_child, args.writer_max_bytes)
        return 0
    if args.rss_child:
        print(json.dumps(rss_child(args.rss_child, args.rss_events, args.rss_rate)))
        return 0

    def body() -> int:
        if args.json is not None and not os.access(args.json.parent.absolute(), os.W_OK):
            raise EdgecapError(f"--json {args.json}: its directory is not writable; give another path")
        if args.events < args.cameras or args.cameras < 1:
            raise EdgecapError("--events must be at least --cameras, and --cameras at least 1")
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            return _run(args, Path(tmp))

    return run_command(PROG, body)


def _rss_run(path: Path, n: int, rate: float) -> Dict[str, Any]:
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--rss-child", str(path),
                          "--rss-events", str(n), "--rss-rate", str(rate)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _run(args: argparse.Namespace, tmp: Path) -> int:
    thumbs = thumbnails()
    now = time.time()
    result: Dict[str, Any] = {"host": {"python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version,
                                       "cpus": os.cpu_count()},
                              "measured": "on this host", "commit_period_s": history.COMMIT_PERIOD_S,
                              "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    big = tmp / "search.db"
    span = -(-args.events // args.cameras) * 3600.0 / args.events_per_hour
    build_s = build(big, args.events, args.cameras, args.events_per_hour, thumbs, args.thumbnail_every, now)
    t = time.perf_counter()
    history.open_database(big).close()  # what a start costs: quick_check over the whole file
    open_s = time.perf_counter() - t
    result["search"] = {"events": args.events, "cameras": args.cameras, "thumbnail_every": args.thumbnail_every,
                        "file_mb": round(big.stat().st_size / 1e6, 1), "build_s": round(build_s, 1),
                        "open_with_quick_check_s": round(open_s, 2), "limit": 50,
                        "span_hours": round(span / 3600, 1), **search_bench(big, now, span, args.repeats)}
    big.unlink()
    result["growth"] = growth(tmp / "growth.db", args.growth_events, args.events_per_hour, thumbs)
    paced_rate = 10 * 2 * WINDOWS_PER_S
    result["rss"] = {"flat_out": _rss_run(tmp / "rss.db", args.rss_events, 0.0),
                     "paced": _rss_run(tmp / "rss-paced.db", max(1, int(args.rss_paced_seconds * paced_rate / 9)),
                                       paced_rate)}
    result["kill9"] = kill_trials(args.trials, tmp / "kill.db", args.trial_max_bytes, args.loss_limit)
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    s, g, r, k = result["search"], result["growth"], result["rss"], result["kill9"]
    result["goals"] = {"search_p99_le_50ms": s["p99_ms"] <= 50.0,
                       "growth_fits_default_budget": g["fits_default_budget_one_camera_day"],
                       "kill9_all_ok": k["within_limit"] == k["trials"] and k["integrity_ok"] == k["trials"]}
    rows = [
        ("search p50 / p99 / max", f"{s['p50_ms']} / {s['p99_ms']} / {s['max_ms']} ms over {s['events']:,} events "
                                   f"({s['searches']} searches, limit 50)"),
        ("history file, build, open", f"{s['file_mb']} MB (thumbnail on 1 in {s['thumbnail_every']}), built in "
                                      f"{s['build_s']} s, quick_check at open {s['open_with_quick_check_s']} s"),
        ("bytes per event", f"{g['bytes_per_event']} ({g['bytes_per_event_without_thumbnail']} without its "
                            f"{g['thumbnail_mean_bytes']} B thumbnail)"),
        ("growth per camera-day", f"{g['mb_per_camera_day']} MB at {g['events_per_hour']:.0f} events/h; the default "
                                  f"budget ({g['default_max_bytes'] / 1e6:.0f} MB) holds "
                                  f"{g['camera_days_in_default_budget']} camera-days"),
        ("writer RSS, paced", f"{r['paced']['rss_mb_peak']} MB peak, the sink's share "
                              f"{r['paced']['sink_share_mb']} MB ({r['paced']['changes_per_s']:,} changes/s, "
                              f"{r['paced']['seconds']} s)"),
        ("writer RSS, flat out", f"{r['flat_out']['rss_mb_peak']} MB peak, the sink's share "
                                 f"{r['flat_out']['sink_share_mb']} MB ({r['flat_out']['changes_per_s']:,} changes/s)"),
        ("kill -9 trials", f"{k['integrity_ok']}/{k['trials']} integrity ok, {k['within_limit']}/{k['trials']} lost "
                           f"only changes younger than {k['limit_s']} s (oldest lost: max "
                           f"{k['oldest_lost_age_s_max']} s, "
                           f"median {k['oldest_lost_age_s_p50']} s)"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(result["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
