"""The history's SQLite file: its schema, the writer's connection, upserts, retention and what an error means.

Layout. ``events`` holds one row per event, its rowid ``START_MS * 1024 + n``
(n tells apart events of several cameras that open in the same millisecond),
so that rowid order is start-time order: newest first, ``--since`` and
``--until`` are rowid ranges, and the oldest rows are the lowest rowids. After
the wall clock stepped back under a running service, a new event's rowid is
the highest yet plus one instead, so that newest first stays newest first.
Its text and camera are indexed by an FTS5 table over the rows (external
content, kept in step by triggers). Thumbnails are BLOBs in their own table,
by the event's rowid; captions (optional) in theirs, each with its ``scene``
(``known``, ``unknown``, or NULL: not judged, or written before the column,
which an older history gets at open). The header carries edgecap's
application id (``ownership.APPLICATION_ID``).

Recovery. WAL makes each commit atomic; SQLite replays or drops the WAL on the
next open. At open the writer runs ``PRAGMA quick_check``; edgecap's own file
that fails it is moved aside as ``PATH.corrupt-TIMESTAMP`` with one warning
line and a fresh history starts. A file that is locked, busy, read-only or
on a full disk is never moved: the error says which (``error_kind``) and the
writer waits. Events a crash left open are closed.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Optional

from edgecap.errors import ConfigError
from edgecap.events import Event
from edgecap.service.history.ownership import APPLICATION_ID, create

log = logging.getLogger(__name__)

WAL_LIMIT_BYTES = 4 * 1024 * 1024
SLOTS = 1024  # rowids per start millisecond

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
    confidence REAL NOT NULL,
    scene TEXT
);
CREATE INDEX IF NOT EXISTS captions_time ON captions(time);
"""
# Columns added since a table was first written: (table, column, declaration). A history of an
# older edgecap gets them at open; its rows read NULL there (not recorded).
_ADDED_COLUMNS = (("captions", "scene", "TEXT"),)

# SQLite's primary result codes (sqlite3.h) and what each means to the writer.
_KIND_OF_CODE = {5: "busy", 6: "busy", 8: "readonly", 10: "io", 11: "corrupt", 13: "full", 14: "io", 26: "corrupt"}
_KIND_OF_TEXT = (("locked", "busy"), ("busy", "busy"), ("readonly", "readonly"), ("read-only", "readonly"),
                 ("full", "full"), ("malformed", "corrupt"), ("not a database", "corrupt"),
                 ("disk i/o", "io"), ("unable to open", "io"))
_KIND_OF_ERRNO = {errno.EROFS: "readonly", errno.EACCES: "readonly", errno.EPERM: "readonly",
                  errno.ENOSPC: "full", errno.EDQUOT: "full"}


def error_kind(exc: BaseException) -> str:
    """What an error of the history's file means: busy, readonly, full, io, corrupt or other.

    Only ``corrupt`` ever moves a file aside; the others make the writer wait and try again.
    """
    if isinstance(exc, OSError):
        return _KIND_OF_ERRNO.get(exc.errno or 0, "io")
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11 and later
    if code is not None and code & 0xFF in _KIND_OF_CODE:
        return _KIND_OF_CODE[code & 0xFF]
    text = str(exc).lower()
    return next((kind for words, kind in _KIND_OF_TEXT if words in text), "other")


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


def open_database(path: Path) -> sqlite3.Connection:
    """Opens (or creates, 0600) edgecap's history for writing: checks it, marks it, closes open events.

    The caller has made sure ``path`` is edgecap's (``ownership.check``): a
    file that fails SQLite's check is then moved aside with one warning.

    Args:
      path: The database file.

    Returns:
      The writer's connection (WAL, ``synchronous=NORMAL``, autocommit off).

    Raises:
      sqlite3.Error, OSError: The file cannot be opened now (locked, read-only,
        full: ``error_kind`` says which); nothing was moved.
    """
    create(path)
    try:
        db = _connect(path)
        problem = _check(db)
    except sqlite3.DatabaseError as exc:
        if error_kind(exc) != "corrupt":
            raise
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
        create(path)
        db = _connect(path)
    try:
        db.executescript(_SCHEMA)
        _add_columns(db)
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        with db:
            db.execute("UPDATE events SET closed = 1 WHERE closed = 0")  # left open by a crash
    except BaseException:
        db.close()
        raise
    return db


def _add_columns(db: sqlite3.Connection) -> None:
    """Adds the columns a history written by an older edgecap lacks (``_ADDED_COLUMNS``)."""
    for table, column, declaration in _ADDED_COLUMNS:
        if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
            with db:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(str(path), isolation_level="DEFERRED", check_same_thread=True)
    try:
        # page_size and auto_vacuum take effect only before the first table: a fresh file gets them.
        # 8 KiB pages hold three or four thumbnails where 4 KiB pages held one or two (-20 % bytes).
        db.execute("PRAGMA page_size = 8192")
        if os.path.getsize(path) == 0:
            # The write that creates the file's first page marks it edgecap's: a second service
            # looking at it meanwhile (ownership.check, before the lock) sees an empty file or
            # edgecap's, never an unmarked SQLite file it would call another program's. Once that
            # page exists, auto_vacuum takes effect through a VACUUM (of nothing yet: instant).
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            db.execute("PRAGMA auto_vacuum = INCREMENTAL")
            db.execute("VACUUM")
        else:
            db.execute("PRAGMA auto_vacuum = INCREMENTAL")
        db.execute("PRAGMA busy_timeout = 5000")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
        db.execute("PRAGMA cache_size = -2000")  # 2 MB: the board has 1 GB for everything
    except BaseException:
        db.close()
        raise
    return db


def _check(db: sqlite3.Connection) -> Optional[str]:
    """None if ``PRAGMA quick_check`` finds the file sound, else its first complaint."""
    rows = db.execute("PRAGMA quick_check(1)").fetchall()
    if rows == [("ok",)]:
        return None
    return " ".join(str(rows[0][0] if rows else "no answer").split())  # its report spans lines


def upsert(db: sqlite3.Connection, event: Event, thumbnail: Optional[bytes], rowid: Optional[int] = None,
           after: Optional[int] = None) -> int:
    """Writes an event's newest state (inside the caller's transaction).

    Args:
      db: The writer's connection.
      event: The event.
      thumbnail: Its JPEG to store, or None to keep the stored one.
      rowid: The event's row, when the caller knows it (written before in this run).
      after: A new row goes above this rowid (the highest before the wall
        clock stepped back), so that it lists as the newest.

    Returns:
      The event's rowid.
    """
    values = (event.camera, event.text, event.start_time, event.end_time, event.confidence, event.windows,
              int(event.closed))
    if rowid is None or not _update(db, rowid, values):  # not known, or deleted by the budget since
        base = start_ms(event.id, event.start_time) * SLOTS
        rows = db.execute("SELECT rowid, id FROM events WHERE rowid >= ? AND rowid < ?",
                          (base, base + SLOTS)).fetchall()
        rowid = next((r for r, i in rows if i == event.id), None)
        if rowid is not None:
            _update(db, rowid, values)
        else:
            rowid = base + len(rows)
            if after is not None and rowid <= after:
                rowid = max(after, db.execute("SELECT ifnull(max(rowid), 0) FROM events").fetchone()[0]) + 1
            db.execute("INSERT INTO events(rowid, id, camera, text, start_time, end_time, confidence, windows, "
                       "closed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (rowid, event.id) + values)
    if thumbnail:
        db.execute("INSERT OR REPLACE INTO thumbnails(rowid, jpeg) VALUES (?, ?)", (rowid, thumbnail))
    return int(rowid)


def _update(db: sqlite3.Connection, rowid: int, values: tuple) -> bool:
    return db.execute("UPDATE events SET camera = ?, text = ?, start_time = ?, end_time = ?, confidence = ?, "
                      "windows = ?, closed = ? WHERE rowid = ?", values + (rowid,)).rowcount > 0


def newest_end(db: sqlite3.Connection) -> Optional[float]:
    """The end time of the newest stored event (the highest rowid), or None for an empty history."""
    row = db.execute("SELECT end_time FROM events ORDER BY rowid DESC LIMIT 1").fetchone()
    return None if row is None else float(row[0])


def used_bytes(db: sqlite3.Connection) -> int:
    """The bytes of the pages in use (the file less its free pages)."""
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    free = db.execute("PRAGMA freelist_count").fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    return int((pages - free) * size)


def retain(db: sqlite3.Connection, oldest: Optional[float], max_bytes: int) -> int:
    """Deletes rows older than ``oldest``, then the oldest rows until the pages in use fit ``max_bytes``.

    Args:
      db: The writer's connection.
      oldest: Unix time; events that started and captions made before it go.
        None deletes nothing by age (the wall clock is not trusted now).
      max_bytes: The budget for the pages in use.

    Returns:
      How many rows were deleted.
    """
    deleted = 0
    if oldest is not None:
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
