"""``History``: the history's read side, on read-only connections that run beside the writer.

The page's ``/api/events`` and ``edgecap history search`` read through it:
events newest first (by rowid: see ``store``), filtered by words, camera and
start time, and an event's thumbnail.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from typing import Any, List, Optional, Tuple, Union

from edgecap.errors import ConfigError
from edgecap.events import Event
from edgecap.service.history.query import fts_query
from edgecap.service.history.store import SLOTS, start_ms


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
        if not rows:  # an event written after the wall clock stepped back sits above its start (store)
            rows = self._query("SELECT t.jpeg FROM events e JOIN thumbnails t ON t.rowid = e.rowid "
                               "WHERE e.rowid >= ? AND e.id = ?", [base + SLOTS, event_id])
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
