"""``HistorySink``: the sink that keeps events (and optionally captions) in the history, one writer thread.

The sink hands every change to one writer thread, which owns the only writing
connection and commits at most once per ``COMMIT_PERIOD_S`` (to spare the SD
card; a kill -9 or a power cut loses at most the last period). Several changes
of one event in a period are one upsert.

Nothing is lost in silence. Changes the writer cannot write now — the file is
locked by another process, the disk is full, the file system is read-only,
the free space is below the reserve (``KEEP_FREE_FRACTION`` of the file
system, at most ``KEEP_FREE_MAX_BYTES``) — wait in memory, the newest state of
each event, within ``PENDING_MAX_BYTES`` (beyond it the oldest events' thumbnails
go first, then the oldest events, and each is counted), and are written when it
can again (tried after 1 s, 2 s ... up to ``RETRY_MAX_S``). One warning says
when the writing stopped and why, one line when it resumed. Events still
waiting at the end are counted as dropped and said in one line.

Retention, run at open and every ``RETENTION_PERIOD_S``: closed events older
than ``max_age_days`` go, then the oldest rows until the pages in use fit
``max_bytes`` (thumbnails included; the WAL adds at most ``WAL_LIMIT_BYTES``),
and ``PRAGMA incremental_vacuum`` gives the freed pages back to the file
system. Age is trusted only while the wall clock has not stepped since the
history opened (``clock.StepWatch``) and is not behind the newest stored
event: otherwise nothing is deleted by age (one line says so) until it is.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Union

from edgecap.errors import ConfigError
from edgecap.events import Event
from edgecap.service.history import ownership, store
from edgecap.service.history.clock import StepWatch
from edgecap.service.sinks.base import Sink

if TYPE_CHECKING:
    from edgecap.captioner import Caption
    from edgecap.events import Change
    from edgecap.service.config import HistoryConfig

log = logging.getLogger(__name__)

# Batches close this long after their first change: with the commit's own time, under a second.
COMMIT_PERIOD_S = 0.9
RETENTION_PERIOD_S = 60.0
QUEUE_CAPACITY = 10_000  # changes handed to the writer and not yet taken; beyond it they are dropped, counted
PENDING_MAX_BYTES = 16 * 1024 * 1024  # what waits in memory while the file cannot be written
PENDING_MAX = 10_000  # events and captions waiting, at most
RETRY_MAX_S = 30.0
KEEP_FREE_FRACTION = 0.02
KEEP_FREE_MAX_BYTES = 32 * 1024 * 1024
_DAY_S = 86_400.0
_STOP = object()
_WHY = {"busy": "another process holds it locked", "readonly": "its file system is read-only or not writable",
        "full": "the disk is full", "io": "an I/O error", "corrupt": "it is damaged", "other": "an error",
        "reserve": "the free space is below the reserve"}


@dataclass
class _Change:
    """The newest state of one event waiting to be written."""

    event: Event
    thumbnail: Optional[bytes]  # None: unchanged since the last write


@dataclass
class _Caption:
    """One caption waiting to be written (``captions = true``)."""

    camera: str
    time: float
    start_time: float
    end_time: float
    text: str
    confidence: float
    scene: Optional[str]


class _Waiting:
    """What the writer has taken and not yet written: each event's newest state, and captions; bounded."""

    def __init__(self) -> None:
        self.events: "collections.OrderedDict[str, _Change]" = collections.OrderedDict()
        self.captions: Deque[_Caption] = collections.deque()
        self.bytes = 0
        self.dropped = 0  # events and captions let go for room
        self.thumbnails_dropped = 0

    def __len__(self) -> int:
        return len(self.events) + len(self.captions)

    def add(self, item: Any) -> None:
        if isinstance(item, _Caption):
            self.captions.append(item)
        else:
            old = self.events.pop(item.event.id, None)
            if old is not None:
                self.bytes -= len(old.thumbnail or b"")
                if item.thumbnail is None:
                    item.thumbnail = old.thumbnail  # a thumbnail not written yet is still news
            self.events[item.event.id] = item
            self.bytes += len(item.thumbnail or b"")
        self._bound()

    def _bound(self) -> None:
        # Room first from the oldest events' pictures, then from the oldest events and captions.
        for change in self.events.values():
            if self.bytes <= PENDING_MAX_BYTES:
                break
            if change.thumbnail:
                self.bytes -= len(change.thumbnail)
                change.thumbnail = None
                self.thumbnails_dropped += 1
        while len(self) > PENDING_MAX:
            if self.captions:
                self.captions.popleft()
            else:
                self.events.popitem(last=False)
            self.dropped += 1

    def clear(self) -> None:
        self.events.clear()
        self.captions.clear()
        self.bytes = 0


class HistorySink(Sink):
    """Keeps events (and optionally captions) in edgecap's SQLite history, written by one thread.

    Args:
      path: The database file; its directory is created if missing. It must
        name nothing yet or edgecap's own history (``ownership``).
      max_age_days: Rows older than this are deleted.
      max_bytes: The pages in use are kept within this many bytes, thumbnails included.
      captions: Keep every caption too.
      retention_period_s: Seconds between runs of the retention (the first is
        at open); default ``RETENTION_PERIOD_S``.
      wall: The wall clock (``time.time``; tests step it).

    Raises:
      ConfigError: If the path is not edgecap's history (a device, a FIFO, a
        symbolic link, another program's file), another service holds it, its
        directory cannot be made or written for want of permission, or SQLite
        lacks FTS5. A read-only file system is no error: the history waits.
    """

    name = "history"

    def __init__(self, path: Union[str, "os.PathLike[str]"], max_age_days: float = 30.0,
                 max_bytes: int = 500_000_000, captions: bool = False,
                 retention_period_s: Optional[float] = None, wall: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._wall = wall
        self._max_age_s = max_age_days * _DAY_S
        self._max_bytes = max_bytes
        self._keep_captions = captions
        self._retention_period_s = RETENTION_PERIOD_S if retention_period_s is None else retention_period_s
        store.check_fts5()
        self._lock_file = ownership.Lock(self.path)
        _prepare(self.path, self._lock_file)
        self._queue: "queue.Queue[Any]" = queue.Queue(QUEUE_CAPACITY)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("written", "dropped", "deleted", "commits", "errors"), 0)
        self._waiting = _Waiting()
        self._thumbs: Dict[str, int] = {}  # open event id -> hash of the thumbnail last queued
        self._closed = False
        self.opened = threading.Event()  # set once the first open was tried
        self._thread = threading.Thread(target=self._run, name="history-writer", daemon=True)
        self._thread.start()

    # --- the service's side ----------------------------------------------------------------

    def event(self, camera: str, event: Event, change: "Change") -> None:
        """Queues the event's newest state for the next commit (a full queue drops it, counted)."""
        digest = hash(event.thumbnail) if event.thumbnail else 0
        thumb = event.thumbnail if event.thumbnail and self._thumbs.get(event.id) != digest else None
        if change == "closed":
            self._thumbs.pop(event.id, None)
        elif thumb is not None:
            self._thumbs[event.id] = digest
        # A copy: the tracker goes on changing its event while this one waits for the writer.
        if not self._put(_Change(dataclasses.replace(event, thumbnail=b""), thumb)) and thumb is not None:
            self._thumbs.pop(event.id, None)  # dropped: the next change carries the thumbnail again

    def caption(self, camera: str, caption: "Caption") -> None:
        """Queues the caption when ``captions`` is on."""
        if self._keep_captions:
            self._put(_Caption(camera, self._wall(), caption.start_time, caption.end_time, caption.text,
                               caption.confidence, caption.scene))

    def _put(self, item: Any) -> bool:
        """Queues ``item`` for the writer; False if it was dropped."""
        if self._closed:
            return False
        try:
            self._queue.put_nowait(item)
        except queue.Full:  # the writer is behind the cameras: the service must not wait for it
            self._count("dropped")
            return False
        return True

    def counters(self) -> Dict[str, Any]:
        """Returns sent (events and captions written), dropped, errors, waiting, deleted (by retention), commits."""
        with self._lock:
            counts = dict(self._counts)
        counts["dropped"] += self._waiting.dropped
        counts["thumbnails_dropped"] = self._waiting.thumbnails_dropped
        counts["waiting"] = len(self._waiting) + self._queue.qsize()
        counts["sent"] = counts["written"]
        return counts

    def close(self, timeout: float = 2.0) -> None:
        """Writes what waits and closes the file within ``timeout`` seconds; what cannot be written is counted."""
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

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    # --- the writer thread ----------------------------------------------------------------

    def _run(self) -> None:
        writer = _Writer(self)
        try:
            writer.loop()
        finally:
            writer.finish()


class _Writer:
    """The writer thread's state: the connection, what waits, when to try again."""

    def __init__(self, sink: HistorySink) -> None:
        self.sink = sink
        self.db: Optional[sqlite3.Connection] = None
        self.clock = StepWatch(wall=sink._wall)
        self.rowids: Dict[str, int] = {}  # events written in this run: id -> rowid
        self.after: Optional[int] = None  # the highest rowid when the clock stepped back
        self.outage = ""  # why writing stopped ("" while it works)
        self.retry_at = 0.0
        self.retry_s = 1.0
        self.retain_at = 0.0
        self.said: set = set()

    def loop(self) -> None:
        self._open()
        self.sink.opened.set()
        commit_by: Optional[float] = None  # when what waits is written (unless writing is stopped)
        while True:
            try:
                item = self.sink._queue.get(timeout=self._timeout(commit_by))
            except queue.Empty:
                item = None
            if item is _STOP:
                self._take_all()
                self._write()
                return
            if item is not None:
                self.sink._waiting.add(item)
                commit_by = commit_by or time.monotonic() + COMMIT_PERIOD_S
            now = time.monotonic()
            if self.outage and now >= self.retry_at:
                self._retry()
            elif commit_by is not None and now >= commit_by:
                self._write()
            if not len(self.sink._waiting):
                commit_by = None
            if self.db is not None and not self.outage and now >= self.retain_at:
                self._retain()

    def _timeout(self, commit_by: Optional[float]) -> Optional[float]:
        """Seconds until the next write, retry or retention is due; None when nothing is."""
        write_at = self.retry_at if self.outage else commit_by
        retain_at = self.retain_at if self.db is not None and not self.outage else None
        due = [t for t in (write_at, retain_at) if t is not None]
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _retry(self) -> None:
        """Tries the file again after an outage: opens it if need be, then writes what waits."""
        if self.db is None:
            self._open()
        if self.db is None:
            return
        if len(self.sink._waiting):
            self._write()
        else:
            self._resumed()

    def _take_all(self) -> None:
        while True:
            try:
                item = self.sink._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                self.sink._waiting.add(item)

    def _open(self) -> None:
        try:
            self.sink._lock_file.acquire()
            self.db = store.open_database(self.sink.path)
        except ConfigError as exc:  # another service took the history while it could not be opened
            self._failed("other", exc)
            return
        except (sqlite3.Error, OSError) as exc:
            self._failed(store.error_kind(exc), exc)
            return
        self.retain_at = time.monotonic()
        self.rowids.clear()  # a new connection, maybe a new file: rows are found again by their ids

    def _write(self) -> None:
        waiting = self.sink._waiting
        if not len(waiting):
            return
        if self.db is None:
            self._open()
            if self.db is None:
                return
        if self._below_reserve():
            return
        self._watch_clock()
        db, n = self.db, len(waiting)
        try:
            with db:
                for change in waiting.events.values():
                    rowid = store.upsert(db, change.event, change.thumbnail, self.rowids.get(change.event.id),
                                         self.after)
                    if change.event.closed:
                        self.rowids.pop(change.event.id, None)
                    else:
                        self.rowids[change.event.id] = rowid
                db.executemany("INSERT INTO captions(camera, time, start_time, end_time, text, confidence, scene) "
                               "VALUES (?, ?, ?, ?, ?, ?, ?)",
                               [(c.camera, c.time, c.start_time, c.end_time, c.text, c.confidence, c.scene)
                                for c in waiting.captions])
        except sqlite3.Error as exc:
            self._failed(store.error_kind(exc), exc)
            return
        waiting.clear()
        self.sink._count("written", n)
        self.sink._count("commits")
        self._resumed(n)

    def _below_reserve(self) -> bool:
        """True (and the writing waits) while the file system has less free space than the reserve."""
        try:
            fs = os.statvfs(self.sink.path.parent)
        except OSError:
            return False
        reserve = min(KEEP_FREE_FRACTION * fs.f_blocks * fs.f_frsize, KEEP_FREE_MAX_BYTES)
        if fs.f_bavail * fs.f_frsize >= reserve:
            return False
        self._failed("reserve", OSError(f"{fs.f_bavail * fs.f_frsize} bytes free, the reserve is {int(reserve)}"))
        return True

    def _failed(self, kind: str, exc: BaseException) -> None:
        """Keeps what waits and tries again later; one warning per outage."""
        db = self.db
        if db is not None:
            if db.in_transaction:
                try:
                    db.rollback()
                except sqlite3.Error:
                    pass
            if kind in ("readonly", "io", "corrupt", "other"):  # a fresh connection when it is back
                db.close()
                self.db = None
        self.sink._count("errors")
        if not self.outage:
            self.retry_s = 1.0
            log.warning("history: cannot write %s (%s: %s); events wait in memory (up to %d MB) and are written "
                        "when it can again; captions go on", self.sink.path, _WHY.get(kind, kind),
                        " ".join(str(exc).split())[:160], PENDING_MAX_BYTES // 2**20)
        else:
            self.retry_s = min(self.retry_s * 2, RETRY_MAX_S)
        self.outage = kind
        self.retry_at = time.monotonic() + self.retry_s

    def _resumed(self, written: int = 0) -> None:
        if self.outage:
            log.warning("history: writing %s again (%d events and captions that waited are written)",
                        self.sink.path, written)
            self.outage = ""

    def _watch_clock(self) -> None:
        step = self.clock.check()
        if step < 0 and self.after is None:
            row = self.db.execute("SELECT ifnull(max(rowid), 0) FROM events").fetchone() if self.db else (0,)
            self.after = int(row[0])  # new events list above every one stamped before the step
        if step and "step" not in self.said:
            self.said.add("step")
            log.warning("history: the wall clock stepped %+.0f s since the history opened; no event is deleted "
                        "by age until edgecap restarts with a clock that agrees", step)

    def _retain(self) -> None:
        sink, db = self.sink, self.db
        assert db is not None
        self.retain_at = time.monotonic() + sink._retention_period_s
        try:
            deleted = store.retain(db, self._oldest(db), sink._max_bytes)
            # With synchronous=NORMAL a commit reaches the disk at the next checkpoint (a kill
            # loses nothing committed, a power cut may): one a period bounds what a cut loses.
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            self._failed(store.error_kind(exc), exc)
            return
        sink._count("deleted", deleted)

    def _oldest(self, db: sqlite3.Connection) -> Optional[float]:
        """The age cut (Unix time), or None while the wall clock is not to be trusted with ages."""
        self._watch_clock()
        if self.clock.stepped:
            return None
        now, newest = self.sink._wall(), store.newest_end(db)
        if newest is not None and now < newest - 2.0:
            if "behind" not in self.said:
                self.said.add("behind")
                log.warning("history: the wall clock is %.0f s behind the newest event; no event is deleted by "
                            "age until it catches up", newest - now)
            return None
        return now - self.sink._max_age_s

    def finish(self) -> None:
        """Closes the connection and the lock; counts (and says) what could not be written."""
        left = len(self.sink._waiting)
        if left:
            self.sink._count("dropped", left)
            log.warning("history: %d events and captions not written to %s (%s)", left, self.sink.path,
                        _WHY.get(self.outage, "stopped"))
            self.sink._waiting.clear()
        if self.db is not None:
            self.db.close()
        self.sink._lock_file.release()


def _prepare(path: Path, lock: ownership.Lock) -> None:
    """Checks the history's path at start: edgecap's, its directory made, the lock taken (unless read-only).

    Raises:
      ConfigError: As ``HistorySink``.
    """
    fix = "give [history] path in a directory the service's user can write, or \"\" to keep no history"
    ownership.check(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if store.error_kind(exc) == "readonly" and _read_only(path.parent):
            return
        raise ConfigError(f"history: cannot create {path.parent} ({exc.strerror or exc}); {fix}") from None
    if _read_only(path.parent):
        return  # not an error: the writer waits for it to be writable, and says so
    if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.R_OK | os.W_OK)):
        raise ConfigError(f"history: cannot write {path} (permission denied); {fix}")
    try:
        lock.acquire()
    except OSError as exc:
        raise ConfigError(f"history: cannot create {lock.path} ({exc.strerror or exc}); {fix}") from None


def _read_only(directory: Path) -> bool:
    """Whether the nearest existing directory of ``directory`` is on a file system mounted read-only."""
    for folder in (directory, *directory.parents):
        try:
            return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return False


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
