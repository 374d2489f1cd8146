"""The history takes only its own file, loses nothing in silence, and ages nothing by a clock that jumped (issue 28)."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Callable, List, Tuple

import pytest

from edgecap.errors import ConfigError
from edgecap.events import Event
from edgecap.service.history import History, HistorySink

JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4
DAY_S = 86_400.0
RECENT = time.time() - 3600.0  # within any retention
ROOT = Path(__file__).resolve().parent.parent


def event(start: float, camera: str = "front", text: str = "a red star moves right", closed: bool = True,
          thumbnail: bytes = JPEG) -> Event:
    return Event(id=f"{camera}@{int(start * 1000)}", camera=camera, text=text, start_time=start,
                 end_time=start + 1.0, confidence=-0.2, windows=1, thumbnail=thumbnail, closed=closed)


def write(sink: HistorySink, events: List[Event]) -> None:
    for e in events:
        sink.event(e.camera, e, "closed" if e.closed else "opened")


def snapshot(path: Path) -> Tuple[int, int, bytes]:
    st = os.lstat(path)
    data = path.read_bytes() if stat.S_ISREG(st.st_mode) else (os.readlink(path).encode() if
                                                               stat.S_ISLNK(st.st_mode) else b"")
    return st.st_ino, st.st_mode, data


def foreign_sqlite(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    db.execute("INSERT INTO notes(body) VALUES ('mine')")
    db.commit()
    db.close()


def legacy_history(path: Path) -> None:
    """A history as edgecap wrote it before the application id: its tables, no id in the header."""
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE events (rowid INTEGER PRIMARY KEY, id TEXT NOT NULL, camera TEXT NOT NULL, text TEXT NOT NULL,
            start_time REAL NOT NULL, end_time REAL NOT NULL, confidence REAL NOT NULL, windows INTEGER NOT NULL,
            closed INTEGER NOT NULL);
        CREATE VIRTUAL TABLE events_fts USING fts5(text, camera, content='events', content_rowid='rowid');
        CREATE TABLE thumbnails (rowid INTEGER PRIMARY KEY, jpeg BLOB NOT NULL);
        CREATE TABLE captions (rowid INTEGER PRIMARY KEY, camera TEXT NOT NULL, time REAL NOT NULL,
            start_time REAL NOT NULL, end_time REAL NOT NULL, text TEXT NOT NULL, confidence REAL NOT NULL);
        INSERT INTO events VALUES ({ms} * 1024, 'front@{ms}', 'front', 'an old event', {s}, {s} + 1, -0.1, 1, 1);
        INSERT INTO events_fts(rowid, text, camera) VALUES ({ms} * 1024, 'an old event', 'front');
    """.format(ms=int((RECENT - 60) * 1000), s=RECENT - 60))
    db.commit()
    db.close()


def _text(path: Path) -> Path:
    path.write_text("my notes\n" * 50)
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _device(path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    return path


def _foreign(path: Path) -> Path:
    foreign_sqlite(path)
    return path


def _symlink(path: Path) -> Path:
    target = path.parent / "elsewhere.db"
    legacy_history(target)  # even an edgecap history: not written through a link
    path.symlink_to(target)
    return path


def _directory(path: Path) -> Path:
    path.mkdir()
    return path


def _config(path: Path) -> Path:
    path.write_text('[[cameras]]\nname = "front"\nsource = "/dev/video0"\n')
    return path


@pytest.mark.parametrize("make, kind", [
    (_device, "a character device"), (_fifo, "a FIFO"), (_text, "not an SQLite database"),
    (_config, "not an SQLite database"), (_foreign, "another program's SQLite database (tables: notes)"),
    (_symlink, "a symbolic link"), (_directory, "a directory"),
], ids=["device", "fifo", "text", "the-config", "foreign-sqlite", "symlink", "directory"])
def test_a_path_that_is_not_edgecaps_history_is_refused_untouched(tmp_path, make, kind):
    # Before: each was renamed *.corrupt-<time> and replaced by a new SQLite file (a foreign
    # SQLite file got edgecap's tables and WAL), and the service went on with one warning.
    path = make(tmp_path / "h.db")
    before, listing = snapshot(path), sorted(os.listdir(tmp_path))
    with pytest.raises(ConfigError) as info:
        HistorySink(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and kind in message, message
    assert "edgecap takes only its own files" in message
    assert snapshot(path) == before and sorted(os.listdir(tmp_path)) == listing  # same inode, same bytes


def test_companions_that_are_not_plain_files_are_refused(tmp_path):
    os.mkfifo(tmp_path / "h.db-wal")
    with pytest.raises(ConfigError, match=r"companion h\.db-wal that is a FIFO"):
        HistorySink(tmp_path / "h.db")
    assert not (tmp_path / "h.db").exists()


def test_a_history_written_before_the_application_id_is_still_edgecaps(tmp_path):
    path = tmp_path / "h.db"
    legacy_history(path)
    sink = HistorySink(path)
    write(sink, [event(RECENT)])
    sink.close(timeout=10)
    assert [e.text for e in History(path).search(limit=10)] == ["a red star moves right", "an old event"]
    assert int.from_bytes(path.read_bytes()[68:72], "big") == 0x45434150  # marked as edgecap's now


def test_an_empty_file_holds_nothing_to_lose_and_becomes_the_history(tmp_path):
    path = tmp_path / "h.db"
    path.touch()
    sink = HistorySink(path)
    write(sink, [event(RECENT)])
    sink.close(timeout=10)
    assert len(History(path).search()) == 1


def test_a_second_writer_of_one_history_is_refused_in_one_line(tmp_path):
    # Before: two services on one history wrote it together, their events merged.
    path = tmp_path / "h.db"
    first = HistorySink(path)
    try:
        with pytest.raises(ConfigError, match=r"in use by another edgecap serve \(pid \d+\); give each") as info:
            HistorySink(path)
        assert "\n" not in str(info.value)
    finally:
        first.close(timeout=10)
    HistorySink(path).close(timeout=10)  # the lock goes with the sink that held it


def test_a_fresh_history_is_marked_edgecaps_by_the_write_that_creates_it(tmp_path):
    # Before: WAL mode wrote the first page unmarked, the schema and the mark came later; a second
    # service checking the file in between (before the lock) called it another program's SQLite
    # (test_a_second_writer_of_one_history_is_refused_in_one_line failed so under load).
    from edgecap.service.history import ownership, store

    path = tmp_path / "h.db"
    ownership.create(path)
    db = store._connect(path)  # page size, WAL: the file's first write, no table yet
    try:
        assert path.stat().st_size > 0
        assert ownership.why_not_ours(path) is None
    finally:
        db.close()


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_a_fresh_history_is_private_whatever_the_umask(tmp_path, umask):
    # Before: history.db followed the umask (0644 under 022; docs/deploy.md says 0600).
    path = tmp_path / "h.db"
    old = os.umask(umask)
    try:
        sink = HistorySink(path)
        write(sink, [event(RECENT)])
        _wait_for(lambda: sink.counters()["commits"] >= 1)  # the -wal and -shm exist
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        sink.close(timeout=10)
    finally:
        os.umask(old)
    assert modes["h.db"] == 0o600 and modes["h.db.lock"] == 0o600
    assert all(mode == 0o600 for name, mode in modes.items() if name.startswith("h.db-")), modes


def test_a_history_locked_by_another_process_is_waited_for_not_moved_aside(tmp_path, caplog):
    # Before: "database is locked" at start was taken for damage: the file was moved aside and
    # its events vanished from /api/events.
    path = tmp_path / "h.db"
    sink = HistorySink(path)
    write(sink, [event(RECENT + i) for i in range(8)])
    sink.close(timeout=10)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sqlite3, sys, time
        db = sqlite3.connect({str(path)!r}, timeout=0, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        print("held", flush=True)
        time.sleep(6.5)
        db.execute("ROLLBACK")
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with caplog.at_level(logging.WARNING, logger="edgecap.service.history"):
            sink = HistorySink(path)
            write(sink, [event(RECENT + 100 + i) for i in range(3)])
            deadline = time.monotonic() + 30
            while sink.counters()["written"] < 3 and time.monotonic() < deadline:
                time.sleep(0.2)
            sink.close(timeout=10)
    finally:
        holder.wait(30)
    assert not [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert len(History(path).search(limit=100)) == 11
    said = [r.getMessage() for r in caplog.records]
    assert any("another process holds it locked" in m for m in said), said
    assert any("again" in m for m in said), said


def test_events_that_cannot_be_written_wait_and_are_written_when_they_can(tmp_path, monkeypatch, caplog):
    # Before: a commit that failed (a full disk) rolled back, and its events were gone: one
    # warning, no counter.
    from edgecap.service.history import store

    real, full = store.upsert, threading.Event()
    full.set()

    def upsert(*args, **kwargs):
        if full.is_set():
            raise sqlite3.OperationalError("database or disk is full")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "upsert", upsert)
    path = tmp_path / "h.db"
    with caplog.at_level(logging.WARNING, logger="edgecap.service.history"):
        sink = HistorySink(path)
        write(sink, [event(RECENT + i) for i in range(20)])
        deadline = time.monotonic() + 10
        while sink.counters()["errors"] < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        counters = sink.counters()
        assert counters["written"] == 0 and counters["waiting"] == 20 and counters["dropped"] == 0
        full.clear()
        deadline = time.monotonic() + 40
        while sink.counters()["written"] < 20 and time.monotonic() < deadline:
            time.sleep(0.2)
        sink.close(timeout=10)
    assert sink.counters()["written"] == 20 and len(History(path).search(limit=100)) == 20
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "cannot write" in m]) == 1 and "the disk is full" in said[0], said


def test_what_is_still_waiting_at_the_end_is_counted_and_said(tmp_path, monkeypatch, caplog):
    from edgecap.service.history import store

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "upsert", full)
    with caplog.at_level(logging.WARNING, logger="edgecap.service.history"):
        sink = HistorySink(tmp_path / "h.db")
        write(sink, [event(RECENT + i) for i in range(5)])
        sink.close(timeout=10)
    assert sink.counters()["dropped"] == 5
    assert any("5 events and captions not written" in r.getMessage() for r in caplog.records)


def test_waiting_events_shed_thumbnails_before_events(tmp_path, monkeypatch):
    from edgecap.service.history import writer

    monkeypatch.setattr(writer, "PENDING_MAX_BYTES", 3 * len(JPEG))
    monkeypatch.setattr(writer, "PENDING_MAX", 5)
    waiting = writer._Waiting()
    for i in range(7):
        waiting.add(writer._Change(event(RECENT + i), JPEG))
    assert len(waiting) == 5 and waiting.dropped == 2  # the two oldest events
    assert waiting.bytes <= 3 * len(JPEG) and waiting.thumbnails_dropped >= 2
    assert [c.thumbnail is not None for c in waiting.events.values()][-3:] == [True, True, True]


class SteppedClock:
    """A wall clock that the test steps."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_forward_step_of_the_wall_clock_deletes_nothing_by_age(tmp_path, caplog):
    # Before: retention by age against time.time(): a +40-day step deleted every closed event.
    path, clock = tmp_path / "h.db", SteppedClock()
    now = time.time()
    with caplog.at_level(logging.WARNING, logger="edgecap.service.history"):
        sink = HistorySink(path, max_age_days=30, retention_period_s=0.1, wall=clock)
        write(sink, [event(now - DAY_S + i) for i in range(5)])
        _wait_for(lambda: sink.counters()["written"] == 5)
        clock.offset = 40 * DAY_S
        time.sleep(1.0)  # ten retention runs
        sink.close(timeout=10)
    assert sink.counters()["deleted"] == 0 and len(History(path).search()) == 5
    said = [r.getMessage() for r in caplog.records if "stepped" in r.getMessage()]
    assert len(said) == 1 and "+3456000 s" in said[0]


def test_a_clock_behind_the_newest_event_deletes_nothing_by_age(tmp_path, caplog):
    path = tmp_path / "h.db"
    now = time.time()
    sink = HistorySink(path)
    write(sink, [event(now - 40 * DAY_S), event(now + 40 * DAY_S)])  # the newest: stamped by a clock set ahead
    sink.close(timeout=10)
    with caplog.at_level(logging.WARNING, logger="edgecap.service.history"):
        sink = HistorySink(path, max_age_days=30)
        sink.opened.wait(10)
        sink.close(timeout=10)
    assert sink.counters()["deleted"] == 0 and len(History(path).search()) == 2
    assert any("behind the newest event" in r.getMessage() for r in caplog.records)


def test_without_a_step_old_events_still_go(tmp_path):
    path, clock = tmp_path / "h.db", SteppedClock()
    now = time.time()
    sink = HistorySink(path)
    write(sink, [event(now - 40 * DAY_S), event(now - DAY_S)])
    sink.close(timeout=10)
    sink = HistorySink(path, max_age_days=30, wall=clock)
    sink.opened.wait(10)
    sink.close(timeout=10)
    assert sink.counters()["deleted"] == 1 and len(History(path).search()) == 1


def test_after_a_backward_step_new_events_still_list_first(tmp_path):
    # Before: rowids follow start times, so an event stamped after the clock went back 40 days
    # listed below every older one ("newest first" put it last).
    path, clock = tmp_path / "h.db", SteppedClock()
    now = time.time()
    sink = HistorySink(path, wall=clock)
    write(sink, [event(now - 60 + i, text=f"before {i}") for i in range(3)])
    _wait_for(lambda: sink.counters()["written"] == 3)
    clock.offset = -40 * DAY_S
    late = event(clock(), text="after the step", closed=False)
    sink.event("front", late, "opened")
    late.closed = True
    late.windows = 2
    sink.event("front", late, "closed")
    sink.close(timeout=10)
    found = History(path).search()
    assert [e.text for e in found] == ["after the step", "before 2", "before 1", "before 0"]
    assert found[0].windows == 2 and found[0].closed  # one row, updated in place
    assert History(path).thumbnail(late.id) == JPEG


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare for a read-only mount")
def test_a_read_only_state_directory_turns_the_history_off_and_it_resumes(tmp_path):
    # Before: HistorySink raised "cannot write ... (permission denied)": exit 2, not restarted,
    # and the whole service stopped captioning.
    script = textwrap.dedent(f"""
        import logging, os, subprocess, sys, time
        from pathlib import Path
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        from edgecap.events import Event
        from edgecap.service.history import History, HistorySink
        state = Path({str(tmp_path / 'state')!r})
        state.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(state)], check=True)
        subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
        sink = HistorySink(state / "h.db")
        now = time.time()
        e = Event(id=f"front@{{int(now * 1000)}}", camera="front", text="kept", start_time=now,
                  end_time=now + 1, confidence=-0.1, windows=1, thumbnail=b"", closed=True)
        sink.event("front", e, "closed")
        time.sleep(1.5)
        assert sink.counters()["written"] == 0, sink.counters()
        subprocess.run(["mount", "-o", "remount,rw", str(state)], check=True)
        deadline = time.monotonic() + 20
        while sink.counters()["written"] < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        sink.close(timeout=10)
        print("found", [x.text for x in History(state / "h.db").search()])
        """)
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "found ['kept']" in proc.stdout
    assert "its file system is read-only" in proc.stderr and "again" in proc.stderr, proc.stderr


def test_step_watch_follows_a_slew_and_tells_a_step() -> None:
    from edgecap.service.history.clock import StepWatch

    wall, steady = [1000.0], [50.0]
    watch = StepWatch(wall=lambda: wall[0], steady=lambda: steady[0])
    for _ in range(100):  # an hour and a half, slewed 0.5 ms a second (NTP's most)
        wall[0] += 60.03
        steady[0] += 60.0
        assert watch.check() == 0.0
    wall[0] += 3600.0 + 60.0
    steady[0] += 60.0
    assert watch.check() == pytest.approx(3600.0)
    wall[0] -= 3600.0  # set right again
    assert watch.check() == 0.0


@pytest.mark.parametrize("other", ["jsonl", "config"])
def test_a_history_that_is_the_jsonl_file_or_the_config_is_a_config_error(tmp_path, other):
    # The JSON-lines file may not exist yet, when the history's own check cannot tell: two
    # writers of one file would make it neither.
    from edgecap.service.config import load_config

    config = tmp_path / "edgecap.toml"
    target = tmp_path / ("captions.jsonl" if other == "jsonl" else "edgecap.toml")
    config.write_text(f'[sinks.jsonl]\npath = "{tmp_path / "captions.jsonl"}"\n[history]\npath = "{target}"\n'
                      '[[cameras]]\nname = "front"\nsource = "/dev/video0"\n')
    with pytest.raises(ConfigError) as info:
        load_config(config)
    message = str(info.value)
    assert message.startswith(f"{config}:4: history.path: {target} is ") and "give the history a file of its own" in message
    assert not (tmp_path / "captions.jsonl").exists()

