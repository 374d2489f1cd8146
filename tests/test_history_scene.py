"""The history's captions carry their scene; a history an older edgecap wrote gains the column at open (issue #26)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from edgecap.captioner import Caption
from edgecap.errors import ConfigError
from edgecap.events import Event
from edgecap.service.history import History, HistorySink
from test_history_files import RECENT, legacy_history

pytestmark = pytest.mark.fast

def _older_history(path: Path, application_id: int) -> None:
    """A history as edgecap wrote it before captions had a scene (``application_id`` 0: before the id, too)."""
    legacy_history(path)  # its one event stamped RECENT - 60
    db = sqlite3.connect(path)
    db.execute("INSERT INTO captions(camera, time, start_time, end_time, text, confidence) "
               "VALUES ('front', ?, 0, 1, 'old', -0.1)", (RECENT - 60,))
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
    sink.event("front", Event(id=f"front@{int(RECENT * 1000)}", camera="front", text="a new event",
                              start_time=RECENT, end_time=RECENT + 1, confidence=-0.1, windows=1, closed=True), "closed")
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
