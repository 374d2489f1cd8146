"""The history's captions carry their scene; a history an older edgecap wrote gains the column at open (issue #26)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from edgecap.captioner import Caption
from edgecap.errors import ConfigError
from edgecap.events import Event
from edgecap.service.history import History, HistorySink

pytestmark = pytest.mark.fast

NOW = time.time() - 3600.0
OLD_SCHEMA = """
CREATE TABLE events (rowid INTEGER PRIMARY KEY, id TEXT NOT NULL, camera TEXT NOT NULL, text TEXT NOT NULL,
    start_time REAL NOT NULL, end_time REAL NOT NULL, confidence REAL NOT NULL, windows INTEGER NOT NULL,
    closed INTEGER NOT NULL);
CREATE VIRTUAL TABLE events_fts USING fts5(text, camera, content='events', content_rowid='rowid');
CREATE TABLE thumbnails (rowid INTEGER PRIMARY KEY, jpeg BLOB NOT NULL);
CREATE TABLE captions (rowid INTEGER PRIMARY KEY, camera TEXT NOT NULL, time REAL NOT NULL,
    start_time REAL NOT NULL, end_time REAL NOT NULL, text TEXT NOT NULL, confidence REAL NOT NULL);
INSERT INTO events VALUES ({ms} * 1024, 'front@{ms}', 'front', 'an old event', {s}, {s} + 1, -0.1, 1, 1);
INSERT INTO events_fts(rowid, text, camera) VALUES ({ms} * 1024, 'an old event', 'front');
INSERT INTO captions(camera, time, start_time, end_time, text, confidence) VALUES ('front', {s}, 0, 1, 'old', -0.1);
""".format(ms=int(NOW * 1000), s=NOW)


def _older_history(path: Path, application_id: int) -> None:
    """A history as edgecap wrote it before captions had a scene (``application_id`` 0: before the id, too)."""
    db = sqlite3.connect(path)
    db.executescript(OLD_SCHEMA)
    db.execute(f"PRAGMA application_id = {application_id}")
    db.commit()
    db.close()


def _caption(text: str, scene):
    return Caption(text=text, tokens=[], window=0, start_frame=0, end_frame=7, start_time=0.0, end_time=0.9,
                   confidence=-0.01, scene=scene)


def _rows(path: Path):
    return sqlite3.connect(path).execute("SELECT text, scene FROM captions ORDER BY rowid").fetchall()


def test_captions_are_written_with_their_scene(tmp_path: Path):
    path = tmp_path / "h.db"
    sink = HistorySink(path, captions=True)
    for text, scene in (("a", "known"), ("b", "unknown"), ("c", None)):
        sink.caption("front", _caption(text, scene))
    sink.close(timeout=10)
    assert _rows(path) == [("a", "known"), ("b", "unknown"), ("c", None)]


@pytest.mark.parametrize("application_id", [0x45434150, 0], ids=["marked", "before-the-id"])
def test_an_older_history_gains_the_column_and_keeps_every_row(tmp_path: Path, application_id: int):
    path = tmp_path / "h.db"
    _older_history(path, application_id)
    sink = HistorySink(path, captions=True)
    sink.caption("front", _caption("new", "unknown"))
    sink.event("front", Event(id=f"front@{int(NOW * 1000) + 5000}", camera="front", text="a new event",
                              start_time=NOW + 5, end_time=NOW + 6, confidence=-0.1, windows=1, closed=True), "closed")
    sink.close(timeout=10)
    assert _rows(path) == [("old", None), ("new", "unknown")]  # NULL: not recorded then
    assert [e.text for e in History(path).search(limit=10)] == ["a new event", "an old event"]
    assert not [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    # Opened again, the column is there already: nothing changes.
    HistorySink(path, captions=True).close(timeout=10)
    assert _rows(path) == [("old", None), ("new", "unknown")]


def test_another_applications_file_with_the_same_tables_is_refused_and_not_migrated(tmp_path: Path):
    path = tmp_path / "h.db"
    _older_history(path, 0x1234)
    before = path.read_bytes()
    with pytest.raises(ConfigError, match="another application's SQLite database"):
        HistorySink(path, captions=True)
    assert path.read_bytes() == before
