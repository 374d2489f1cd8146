"""The event history on the board: edgecap's own SQLite file (WAL, FTS5), kept within a budget, never lost in silence.

``HistorySink`` (``writer``) is a sink (``Sink.event``, and ``Sink.caption``
with ``[history] captions = true``) whose one writer thread batches changes
into commits, keeps what it cannot write yet in memory and writes it when it
can, and runs the retention. ``History`` (``reader``) is the read side (the
page's ``/api/events``, ``edgecap history search``): read-only connections,
which WAL lets run beside the writer. ``store`` is the file's schema and
statements, ``ownership`` what makes a path edgecap's history to write (and
the lock that keeps it one service's), ``clock`` whether the wall clock may be
trusted with ages, ``query`` what a user types into a search.
"""

from edgecap.service.history.query import MAX_TERMS, fts_query, iso_seconds, parse_time
from edgecap.service.history.reader import History
from edgecap.service.history.store import (
    SLOTS, WAL_LIMIT_BYTES, check_fts5, error_kind, open_database, retain, start_ms, upsert, used_bytes)
from edgecap.service.history.writer import COMMIT_PERIOD_S, QUEUE_CAPACITY, RETENTION_PERIOD_S, HistorySink, open_history

__all__ = ["COMMIT_PERIOD_S", "MAX_TERMS", "QUEUE_CAPACITY", "RETENTION_PERIOD_S", "SLOTS", "WAL_LIMIT_BYTES", "History",
           "HistorySink", "check_fts5", "error_kind", "fts_query", "iso_seconds", "open_database", "open_history",
           "parse_time", "retain", "start_ms", "upsert", "used_bytes"]
