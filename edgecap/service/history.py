"""The event history on the board: SQLite (stdlib ``sqlite3``) with full-text search, kept within a budget.

``HistorySink`` is a sink (``Sink.event``, and ``Sink.caption`` with
``[history] captions = true``): it hands every change to one writer thread,
which owns the only writing connection and commits at most once per
``COMMIT_PERIOD_S`` (to spare the SD card; a kill -9 or a power cut loses at
most the last period). Several changes of one event in a period are one
upsert. ``History`` is the read side (the page's ``/api/events``, ``edgecap
history search``): read-only connections, which WAL lets run beside the writer.

Layout. ``events`` holds one row per event, its rowid ``START_MS * 1024 + n``
(n tells apart events of several cameras that open in the same millisecond),
so that rowid order is start-time order: newest first, ``--since`` and
``--until`` are rowid ranges, and the oldest rows are the lowest rowids. Its
text and camera are indexed by an FTS5 table over the rows (external content,
kept in step by triggers). Thumbnails are BLOBs in their own table, by the
event's rowid; captions (optional) in theirs.

Retention, run by the writer at open and every ``RETENTION_PERIOD_S``: rows
older than ``max_age_days`` go, then the oldest rows go until the pages in use
fit ``max_bytes`` (thumbnails included; the WAL adds at most
``WAL_LIMIT_BYTES``), and ``PRAGMA incremental_vacuum`` gives the freed pages
back to the file system.

Recovery. WAL makes each commit atomic; SQLite replays or drops the WAL on
the next open. A kill loses what was not committed (at most the last
``COMMIT_PERIOD_S``); with ``synchronous=NORMAL`` a power cut may also lose
commits since the last checkpoint, which the writer makes every
``RETENTION_PERIOD_S`` (and SQLite every 1000 pages). At open the writer runs ``PRAGMA quick_check``; a file that
fails it (or is no database) is moved aside as ``PATH.corrupt-TIMESTAMP`` with
one warning line and a fresh history starts. Events a crash left open are
closed.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import queue
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from edgecap.errors import ConfigError
from edgecap.events import Event
from edgecap.service.sinks import Sink

if TYPE_CHECKING:
    from edgecap.captioner import Caption
    from edgecap.events import Change
    from edgecap.service.config import HistoryConfig

log = logging.getLogger(__name__)

# Batches close this long after their first change: with the commit's own time, under a second.
COMMIT_PERIOD_S = 0.9
RETENTION_PERIOD_S = 60.0
WAL_LIMIT_BYTES = 4 * 1024 * 1024
QUEUE_CAPACITY = 10_000  # changes waiting for the writer; beyond it they are dropped and counted
SLOTS = 1024  # rowids per start millisecond
MAX_TERMS = 16  # words and phrases of a query that count
_DAY_S = 86_400.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    rowid INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    camera TEXT NOT NULL,
    text TEXT NOT NULL,
    start_time REAL NOT NULL,
    end_time REAL NOT NULL,
    confidence REAL NOT NULL,
    windows INTEGER NOT NULL,
    closed INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS events_camera ON events(camera);
CREATE VIRTUAL TABLE IF NOT EXISTS events_fts USING fts5(
    text, camera, content='events', content_rowid='rowid');
CREATE TRIGGER IF NOT EXISTS events_ai AFTER INSERT ON events BEGIN
    INSERT INTO events_fts(rowid, text, camera) VALUES (new.rowid, new.text, new.camera);
END;
CREATE TRIGGER IF NOT EXISTS events_ad AFTER DELETE ON events BEGIN
    INSERT INTO events_fts(events_fts, rowid, text, camera) VALUES ('delete', old.rowid, old.text, old.camera);
    DELETE FROM thumbnails WHERE rowid = old.rowid;
END;
CREATE TRIGGER IF NOT EXISTS events_au AFTER UPDATE OF text ON events WHEN old.text != new.text BEGIN
    INSERT INTO events_fts(events_fts, rowid, text, camera) VALUES ('delete', old.rowid, old.text, old.camera);
    INSERT INTO events_fts(rowid, text, camera) VALUES (new.rowid, new.text, new.camera);
END;
CREATE TABLE IF NOT EXISTS thumbnails (rowid INTEGER PRIMARY KEY, jpeg BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS captions (
    rowid INTEGER PRIMARY KEY,
    camera TEXT NOT NULL,
    time REAL NOT NULL,
    start_time REAL NOT NULL,
    end_time REAL NOT NULL,
    text TEXT NOT NULL,
    confidence REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS captions_time ON captions(time);
"""


def start_ms(event_id: str, start_time: float) -> int:
    """The start millisecond an event's rowid is made of: its id's ``START_MS``, else its start time.

    Args:
      event_id: ``CAMERA@START_MS``.
      start_time: The event's start (seconds), used when the id has no number.

    Returns:
      Milliseconds, at least 0.
    """
    _, _, tail = event_id.rpartition("@")
    ms = int(tail) if tail.isdigit() else int(round(start_time * 1000.0))
    return max(0, ms)


def fts_query(text: str) -> str:
    """Turns what a user typed into an FTS5 query that cannot be a syntax error.

    Words and ``"quoted phrases"`` must all match (AND) in the event's text;
    terms beyond ``MAX_TERMS`` are ignored. There are no prefix queries: over
    a large history FTS5 answers one in tens of milliseconds, a word in one. Everything but letters and digits is a
    separator, as for the index's tokenizer, so FTS5's operators and quotes
    in the text are plain words or nothing.

    Args:
      text: The user's query.

    Returns:
      The FTS5 query, or "" when the text holds no word.
    """
    terms = []
    for phrase, word in re.findall(r'"([^"]*)"?|(\S+)', text):
        words = re.findall(r"\w+", phrase if phrase else word, flags=re.UNICODE)
        words = [w.replace("_", " ") for w in words]  # "_" separates for unicode61 too
        if not words or not "".join(words).strip():
            continue
        terms.append('text : "' + " ".join(words) + '"')  # the text only: a camera's name is no match
    return " AND ".join(terms[:MAX_TERMS])


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": _DAY_S, "w": 7 * _DAY_S}


def iso_seconds(text: str) -> float:
    """Reads an ISO-8601 time (local unless it ends in ``Z`` or an offset) as Unix seconds.

    Raises:
      ValueError: Not ISO-8601, or a time the platform cannot convert.
    """
    text = text.strip()
    try:
        # Python before 3.11 does not read "Z"; it is UTC.
        when = datetime.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
        return when.timestamp()  # a naive time is local, as timestamp() takes it
    except (OverflowError, OSError) as exc:
        raise ValueError(str(exc)) from None


def parse_time(text: str, now: Optional[float] = None) -> float:
    """Reads a time a user gives: ISO-8601, or how long ago (``90s``, ``15m``, ``1h``, ``2d``, ``1w``).

    Args:
      text: ``2026-12-01T08:00``, ``2026-12-01 08:00:00+01:00``, ``2026-12-01``
        (local time unless it has an offset or ``Z``), or a number and a unit.
      now: The Unix time relative forms count back from (default: now).

    Returns:
      Unix seconds.

    Raises:
      ValueError: With the fix, if the text is neither.
    """
    text = text.strip()
    relative = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", text)
    if relative:
        return (time.time() if now is None else now) - float(relative.group(1)) * _UNITS[relative.group(2)]
    try:
        return iso_seconds(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: give ISO-8601 (2026-12-01T08:00, local time unless it "
                         "ends in Z or an offset) or how long ago (30m, 1h, 2d)") from None


@dataclass
class _Pending:
    """The newest state of one event waiting for the next commit."""

    event: Event
    thumbnail: Optional[bytes]  # None: unchanged since the last write


@dataclass
class _Caption:
    """One caption waiting for the next commit (``captions = true``)."""

    camera: str
    time: float
    start_time: float
    end_time: float
    text: str
    confidence: float


_STOP = object()


class HistorySink(Sink):
    """Keeps events (and optionally captions) in an SQLite file, written by one thread in batches.

    Args:
      path: The database file; its directory is created if missing.
      max_age_days: Rows older than this are deleted.
      max_bytes: The pages in use are kept within this many bytes, thumbnails included.
      captions: Keep every caption too.
      retention_period_s: Seconds between runs of the retention (the first is at open).

    Raises:
      ConfigError: If the file or its directory cannot be written, or SQLite lacks FTS5.
    """

    name = "history"

    def __init__(self, path: Union[str, "os.PathLike[str]"], max_age_days: float = 30.0,
                 max_bytes: int = 500_000_000, captions: bool = False,
                 retention_period_s: float = RETENTION_PERIOD_S) -> None:
        self.path = Path(path)
        self._max_age_s = max_age_days * _DAY_S
        self._max_bytes = max_bytes
        self._keep_captions = captions
        self._retention_period_s = retention_period_s
        check_fts5()
        _check_writable(self.path)
        self._queue: "queue.Queue[Any]" = queue.Queue(QUEUE_CAPACITY)
        self._lock = threading.Lock()
        self._written = 0
        self._dropped = 0
        self._deleted = 0
        self._commits = 0
        self._errors = 0
        self._thumbs: Dict[str, int] = {}  # open event id -> hash of the thumbnail last queued
        self._closed = False
        self.opened = threading.Event()  # set once the file is checked and ready
        self._thread = threading.Thread(target=self._run, name="history-writer", daemon=True)
        self._thread.start()

    def event(self, camera: str, event: Event, change: "Change") -> None:
        """Queues the event's newest state for the next commit (a full queue drops it, counted)."""
        digest = hash(event.thumbnail) if event.thumbnail else 0
        thumb = event.thumbnail if event.thumbnail and self._thumbs.get(event.id) != digest else None
        if change == "closed":
            self._thumbs.pop(event.id, None)
        elif thumb is not None:
            self._thumbs[event.id] = digest
        # A copy: the tracker goes on changing its event while this one waits for the writer.
        if not self._put(_Pending(dataclasses.replace(event, thumbnail=b""), thumb)) and thumb is not None:
            self._thumbs.pop(event.id, None)  # dropped: the next change carries the thumbnail again

    def caption(self, camera: str, caption: "Caption") -> None:
        """Queues the caption when ``captions`` is on."""
        if self._keep_captions:
            self._put(_Caption(camera, time.time(), caption.start_time, caption.end_time, caption.text,
                               caption.confidence))

    def _put(self, item: Any) -> bool:
        """Queues ``item`` for the writer; False if it was dropped."""
        if self._closed:
            return False
        try:
            self._queue.put_nowait(item)
        except queue.Full:  # the disk is slower than the cameras: the service must not wait for it
            with self._lock:
                self._dropped += 1
            return False
        return True

    def counters(self) -> Dict[str, Any]:
        """Returns written (events and captions committed), dropped, deleted (by retention), commits, errors."""
        with self._lock:
            return {"written": self._written, "dropped": self._dropped, "deleted": self._deleted,
                    "commits": self._commits, "errors": self._errors}

    def close(self, timeout: float = 2.0) -> None:
        """Commits what is queued and closes the file within ``timeout`` seconds."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_STOP, timeout=max(0.0, timeout))
        except queue.Full:
            log.warning("history: the writer did not take the stop within %.1f s", timeout)
            return
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            log.warning("history: the last changes were not committed within %.1f s", timeout)

    # --- the writer thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            db = open_database(self.path)
        except sqlite3.Error as exc:
            log.warning("history: %s cannot be opened (%s); events are not kept", self.path, exc)
            self._closed = True
            self.opened.set()
            return
        self.opened.set()
        try:
            self._loop(db)
        finally:
            db.close()

    def _loop(self, db: sqlite3.Connection) -> None:
        next_retention = 0.0
        stopping = False
        while not stopping:
            now = time.monotonic()
            if now >= next_retention:
                self._guard(db, "retention", lambda: self._retain(db))
                next_retention = time.monotonic() + self._retention_period_s
            try:
                item = self._queue.get(timeout=max(0.0, next_retention - time.monotonic()))
            except queue.Empty:
                continue
            batch: List[Any] = []
            commit_by = time.monotonic() + COMMIT_PERIOD_S
            while True:
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)
                wait = commit_by - time.monotonic()
                try:
                    item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._guard(db, "write", lambda: self._write(db, batch))

    def _guard(self, db: sqlite3.Connection, what: str, work: Any) -> None:
        """Runs ``work``; an SQLite error (a full disk) rolls back, is counted, and logged the first time."""
        try:
            work()
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.rollback()
            with self._lock:
                self._errors += 1
                first = self._errors == 1
            if first:
                log.warning("history: %s failed: %s; further failures are counted", what, exc)

    def _write(self, db: sqlite3.Connection, batch: List[Any]) -> None:
        latest: Dict[str, _Pending] = {}
        captions = []
        for item in batch:
            if isinstance(item, _Caption):
                captions.append(item)
                continue
            old = latest.get(item.event.id)
            if old is not None and item.thumbnail is None:
                item.thumbnail = old.thumbnail  # a thumbnail queued earlier in the batch is still news
            latest[item.event.id] = item
        with db:
            for pending in latest.values():
                upsert(db, pending.event, pending.thumbnail)
            db.executemany("INSERT INTO captions(camera, time, start_time, end_time, text, confidence) "
                           "VALUES (?, ?, ?, ?, ?, ?)",
                           [(c.camera, c.time, c.start_time, c.end_time, c.text, c.confidence) for c in captions])
        with self._lock:
            self._written += len(latest) + len(captions)
            self._commits += 1

    def _retain(self, db: sqlite3.Connection) -> None:
        deleted = retain(db, time.time() - self._max_age_s, self._max_bytes)
        # With synchronous=NORMAL a commit reaches the disk at the next checkpoint (a kill
        # loses nothing committed, a power cut may): one a period bounds what a cut loses.
        db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        with self._lock:
            self._deleted += deleted


def open_history(config: "HistoryConfig") -> List[HistorySink]:
    """Opens the history sink the ``[history]`` table asks for.

    Args:
      config: The table; an empty ``path`` keeps no history.

    Returns:
      The sink, or nothing.

    Raises:
      ConfigError: As ``HistorySink``.
    """
    if not config.path:
        return []
    return [HistorySink(config.path, config.max_age_days, config.max_bytes, config.captions)]


def check_fts5() -> None:
    """Refuses an SQLite without FTS5, which the history's search needs.

    Raises:
      ConfigError: If ``CREATE VIRTUAL TABLE ... USING fts5`` fails.
    """
    db = sqlite3.connect(":memory:")
    try:
        db.execute("CREATE VIRTUAL TABLE probe USING fts5(text)")
    except sqlite3.OperationalError as exc:
        raise ConfigError(f"history: this Python's SQLite {sqlite3.sqlite_version} has no FTS5 full-text search "
                          f"({exc}); use a Python whose sqlite3 module has it, or set [history] path = \"\" to "
                          "keep no history") from None
    finally:
        db.close()


def _check_writable(path: Path) -> None:
    """Creates the directory; refuses one (or a file) the service cannot write."""
    fix = "give [history] path in a directory the service's user can write, or \"\" to keep no history"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"history: cannot create {path.parent} ({exc.strerror or exc}); {fix}") from None
    if path.is_dir():
        raise ConfigError(f"history: {path} is a directory; {fix}")
    if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.R_OK | os.W_OK)):
        raise ConfigError(f"history: cannot write {path} (permission denied); {fix}")


def open_database(path: Path) -> sqlite3.Connection:
    """Opens (or creates) the history for writing: checks it, moves a corrupt file aside, closes open events.

    Args:
      path: The database file.

    Returns:
      The writer's connection (WAL, ``synchronous=NORMAL``, autocommit off).

    Raises:
      sqlite3.Error: If even a fresh file cannot be made (a full or read-only disk).
    """
    try:
        db = _connect(path)
        problem = _check(db)
    except sqlite3.DatabaseError as exc:  # "file is not a database", and the like
        db, problem = None, str(exc)
    if problem is not None:
        if db is not None:
            db.close()
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(path) + suffix)
            if src.exists():
                os.replace(src, Path(str(aside) + suffix))
        log.warning("history: %s failed its check (%s); moved it to %s and started a new history",
                    path, problem[:200], aside)
        db = _connect(path)
    db.executescript(_SCHEMA)
    with db:
        db.execute("UPDATE events SET closed = 1 WHERE closed = 0")  # left open by a crash
    return db


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(str(path), isolation_level="DEFERRED", check_same_thread=True)
    # page_size and auto_vacuum take effect only before the first table: a fresh file gets them.
    # 8 KiB pages hold three or four thumbnails where 4 KiB pages held one or two (-20 % bytes).
    db.execute("PRAGMA page_size = 8192")
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
    db.execute("PRAGMA busy_timeout = 5000")
    db.execute("PRAGMA cache_size = -2000")  # 2 MB: the board has 1 GB for everything
    return db


def _check(db: sqlite3.Connection) -> Optional[str]:
    """None if ``PRAGMA quick_check`` finds the file sound, else its first complaint."""
    rows = db.execute("PRAGMA quick_check(1)").fetchall()
    if rows == [("ok",)]:
        return None
    return " ".join(str(rows[0][0] if rows else "no answer").split())  # its report spans lines


def upsert(db: sqlite3.Connection, event: Event, thumbnail: Optional[bytes]) -> int:
    """Writes an event's newest state (inside the caller's transaction).

    Args:
      db: The writer's connection.
      event: The event.
      thumbnail: Its JPEG to store, or None to keep the stored one.

    Returns:
      The event's rowid.
    """
    base = start_ms(event.id, event.start_time) * SLOTS
    rows = db.execute("SELECT rowid, id FROM events WHERE rowid >= ? AND rowid < ?",
                      (base, base + SLOTS)).fetchall()
    rowid = next((r for r, i in rows if i == event.id), None)
    values = (event.camera, event.text, event.start_time, event.end_time, event.confidence, event.windows,
              int(event.closed))
    if rowid is None:
        rowid = base + len(rows)
        db.execute("INSERT INTO events(rowid, id, camera, text, start_time, end_time, confidence, windows, closed) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (rowid, event.id) + values)
    else:
        db.execute("UPDATE events SET camera = ?, text = ?, start_time = ?, end_time = ?, confidence = ?, "
                   "windows = ?, closed = ? WHERE rowid = ?", values + (rowid,))
    if thumbnail:
        db.execute("INSERT OR REPLACE INTO thumbnails(rowid, jpeg) VALUES (?, ?)", (rowid, thumbnail))
    return rowid


def used_bytes(db: sqlite3.Connection) -> int:
    """The bytes of the pages in use (the file less its free pages)."""
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    free = db.execute("PRAGMA freelist_count").fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    return int((pages - free) * size)


def retain(db: sqlite3.Connection, oldest: float, max_bytes: int) -> int:
    """Deletes rows older than ``oldest``, then the oldest rows until the pages in use fit ``max_bytes``.

    Args:
      db: The writer's connection.
      oldest: Unix time; events that started and captions made before it go.
      max_bytes: The budget for the pages in use.

    Returns:
      How many rows were deleted.
    """
    deleted = 0
    with db:
        # An event that started before the cut but is still open stays: it is news.
        deleted += db.execute("DELETE FROM events WHERE rowid < ? AND closed = 1",
                              (start_ms("", oldest) * SLOTS,)).rowcount
        deleted += db.execute("DELETE FROM captions WHERE time < ?", (oldest,)).rowcount
    _vacuum(db)
    # Over budget: delete a share of the oldest rows at a time, sized by how far over it is.
    for _ in range(100):
        used = used_bytes(db)
        if used <= max_bytes:
            break
        share = min(1.0, (used - max_bytes) / used + 0.01)
        with db:
            for table in ("events", "captions"):
                n = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                k = max(1, int(n * share))
                if n:
                    deleted += db.execute(f"DELETE FROM {table} WHERE rowid <= (SELECT rowid FROM {table} "
                                          f"ORDER BY rowid LIMIT 1 OFFSET ?)", (min(k, n) - 1,)).rowcount
            # FTS5 keeps a deleted row's tokens as markers until its segments merge: merge now.
            db.execute("INSERT INTO events_fts(events_fts, rank) VALUES ('merge', 500)")
        _vacuum(db)
    return deleted


def _vacuum(db: sqlite3.Connection) -> None:
    """Gives the free pages back to the file system."""
    if not db.execute("PRAGMA freelist_count").fetchone()[0]:
        return
    # One page per step, and sqlite3.execute steps a statement without result columns once:
    # executescript steps it to the end.
    db.executescript("PRAGMA incremental_vacuum")
    db.commit()
    # In WAL mode the file shrinks when the WAL is copied back into it.
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


class History:
    """Reads the history: search and thumbnails, on read-only connections that run beside the writer.

    Args:
      path: The database file (need not exist yet: then every search is empty).
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None:
        self.path = Path(path)

    def _connect(self) -> Optional[sqlite3.Connection]:
        if not self.path.exists():
            return None
        # mode=ro: never creates or writes the file; the WAL's -shm is shared with the writer.
        db = sqlite3.connect(f"{self.path.absolute().as_uri()}?mode=ro", uri=True, check_same_thread=False)
        db.execute("PRAGMA busy_timeout = 2000")
        return db

    def search(self, q: str = "", camera: str = "", since: Optional[float] = None,
               until: Optional[float] = None, limit: int = 50) -> List[Event]:
        """Finds events, newest first.

        Args:
          q: What the user typed: words and ``"quoted phrases"`` that must all
            be in the text; never a syntax error.
          camera: Only this camera's events ("" for all).
          since: Only events that started at or after this Unix time.
          until: Only events that started at or before this Unix time.
          limit: At most this many.

        Returns:
          The events, without thumbnails (``thumbnail=b""``).

        Raises:
          ConfigError: If the file is not a readable history.
        """
        match = fts_query(q)
        if q.strip() and not match:
            return []  # only separators: nothing can match
        lo = 0 if since is None else start_ms("", since) * SLOTS
        hi = (1 << 62) if until is None else (start_ms("", until) + 1) * SLOTS - 1
        if hi < lo or limit <= 0:
            return []
        params: List[Any] = []
        if match:
            if camera:
                words = re.findall(r"\w+", camera)
                match = '{camera} : "' + " ".join(w.replace("_", " ") for w in words) + '" AND ' + match \
                    if words else match
            sql = ("SELECT e.rowid, e.id, e.camera, e.text, e.start_time, e.end_time, e.confidence, e.windows, "
                   "e.closed, EXISTS (SELECT 1 FROM thumbnails t WHERE t.rowid = e.rowid) "
                   "FROM events_fts JOIN events e ON e.rowid = events_fts.rowid "
                   "WHERE events_fts MATCH ? AND events_fts.rowid BETWEEN ? AND ?")
            params += [match, lo, hi]
            order = "events_fts.rowid"
        else:
            sql = ("SELECT e.rowid, e.id, e.camera, e.text, e.start_time, e.end_time, e.confidence, e.windows, "
                   "e.closed, EXISTS (SELECT 1 FROM thumbnails t WHERE t.rowid = e.rowid) "
                   "FROM events e WHERE e.rowid BETWEEN ? AND ?")
            params += [lo, hi]
            order = "e.rowid"
        if camera:
            sql += " AND e.camera = ?"
            params.append(camera)
        sql += f" ORDER BY {order} DESC LIMIT ?"
        params.append(int(limit))
        rows = self._query(sql, params)
        return [Event(id=r[1], camera=r[2], text=r[3], start_time=r[4], end_time=r[5], confidence=r[6],
                      windows=r[7], closed=bool(r[8]), thumbnail_stored=bool(r[9])) for r in rows]

    def thumbnail(self, event_id: str) -> Optional[bytes]:
        """The event's JPEG thumbnail, or None if it has none or is not in the history."""
        _, sep, tail = event_id.rpartition("@")
        if not sep or not tail.isdigit():
            return None
        base = int(tail) * SLOTS
        rows = self._query("SELECT t.jpeg FROM events e JOIN thumbnails t ON t.rowid = e.rowid "
                           "WHERE e.rowid >= ? AND e.rowid < ? AND e.id = ?", [base, base + SLOTS, event_id])
        return bytes(rows[0][0]) if rows else None

    def _query(self, sql: str, params: List[Any]) -> List[Tuple[Any, ...]]:
        try:
            db = self._connect()
            if db is None:
                return []
            try:
                return db.execute(sql, params).fetchall()
            finally:
                db.close()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # a history the writer has not set up yet
                return []
            raise ConfigError(f"history: cannot read {self.path} ({exc}); give the path of edgecap's "
                              "history database") from None
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"history: {self.path} is not a readable history ({exc}); give the path of "
                              "edgecap's history database") from None
