"""The event history: the SQLite sink (batched writes, FTS5 search, retention, recovery), its config and its CLI."""

from __future__ import annotations

import datetime
import importlib.util
import json
import logging
import os
import queue
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from edgecap.errors import ConfigError
from edgecap.events import Event
from edgecap.service import history
from edgecap.service.config import load_config, state_directory
from edgecap.service.history import History, HistorySink, fts_query, open_history, parse_time, writer
from edgecap.service.sinks import open_sinks

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "tools" / "history_bench.py"
JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8


def make_event(camera: str = "front", start: float = 1_700_000_000.0, text: str = "a red star moves right",
               windows: int = 1, closed: bool = False, thumbnail: bytes = JPEG, confidence: float = -0.2) -> Event:
    return Event(id=f"{camera}@{int(start * 1000)}", camera=camera, text=text, start_time=start,
                 end_time=start + windows / 8, confidence=confidence, windows=windows, thumbnail=thumbnail,
                 closed=closed)


def write(path: Path, events, **kwargs) -> HistorySink:
    """Writes each event's changes as the service would (opened, extended, closed), then closes the sink."""
    sink = HistorySink(path, **kwargs)
    for e in events:
        sink.event(e.camera, e, "opened")
        e.windows += 2
        e.end_time += 0.25
        sink.event(e.camera, e, "extended")
        e.closed = True
        sink.event(e.camera, e, "closed")
    sink.close(timeout=10)
    return sink


def test_events_are_written_once_per_batch_and_found_newest_first(tmp_path):
    path = tmp_path / "h.db"
    sink = write(path, [make_event(start=1_700_000_000.0 + i, text=t)
                        for i, t in enumerate(["a red star moves right", "a white square moves up"] * 5)])
    assert sink.counters()["commits"] == 1  # 30 changes, one commit: close flushes without waiting
    assert sink.counters()["written"] == 10  # three changes of one event are one upsert
    found = History(path).search("red star")
    assert [e.start_time for e in found] == [1_700_000_000.0 + i for i in (8, 6, 4, 2, 0)]
    first = found[0]
    assert (first.camera, first.text, first.windows, first.closed, first.thumbnail) == \
        ("front", "a red star moves right", 3, True, b"")
    assert first.end_time == pytest.approx(first.start_time + 3 / 8)
    assert History(path).thumbnail(first.id) == JPEG
    assert History(path).thumbnail("front@1") is None
    assert History(path).thumbnail("no id at all") is None


def test_a_search_says_which_events_have_a_thumbnail_without_loading_them(tmp_path):
    path = tmp_path / "h.db"
    write(path, [make_event(start=1_700_000_000.0, text="a red star moves right"),
                 make_event(start=1_700_000_001.0, text="a red star moves up", thumbnail=b"")])
    found = {e.text: e for e in History(path).search("red star")}
    assert found["a red star moves right"].thumbnail == b""  # not loaded...
    assert found["a red star moves right"].to_dict()["has_thumbnail"] is True  # ...but there
    assert found["a red star moves up"].to_dict()["has_thumbnail"] is False


def test_commits_come_at_most_about_once_a_second(tmp_path):
    path = tmp_path / "h.db"
    sink = HistorySink(path)
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < 2.5:
        e = make_event(start=1_700_000_000.0 + i)
        sink.event("front", e, "opened")
        i += 1
        time.sleep(0.02)
    commits = sink.counters()["commits"]
    sink.close(timeout=10)
    assert 1 <= commits <= 4  # 2.5 s of changes: two or three commits, never one per change
    assert len(History(path).search(limit=10_000)) == i


def test_phrases_keep_word_order_and_words_do_not(tmp_path):
    path = tmp_path / "h.db"
    write(path, [make_event(text="a red star moves right")])
    reader = History(path)
    assert len(reader.search("right red")) == 1
    assert len(reader.search('"star moves"')) == 1
    assert reader.search('"moves star"') == []
    assert reader.search("mov*") == []  # no prefixes: "*" separates like any other sign
    assert reader.search("front") == []  # the camera's name is not caption text


@pytest.mark.parametrize("q", [
    '"', '""', '"unclosed phrase', "AND", "OR NOT", "NEAR(red star, 2)", "red AND", "*", "red*star", "^red",
    "-red", "+red", "text:red", "{text camera}: red", "col:", "'; DROP TABLE events; --",
    "red\x00star", "\u00e9t\u00e9 \u2603", "red " * 5000, "()", "(red", "red)", "a:b:c", '"red" "star',
])
def test_hostile_queries_are_never_an_error(tmp_path, q):
    path = tmp_path / "h.db"
    write(path, [make_event(text="a red star moves right")])
    reader = History(path)
    found = reader.search(q)
    assert all(e.text == "a red star moves right" for e in found)
    assert len(reader.search("red star")) == 1  # nothing was dropped or changed


def test_the_query_is_quoted_words_of_the_text_column():
    assert fts_query('red "moves right" rot* NEAR(x)') == \
        'text : "red" AND text : "moves right" AND text : "rot" AND text : "NEAR x"'
    assert fts_query('" * ^ -') == ""
    assert fts_query("a " * 100).count("AND") == history.MAX_TERMS - 1


def test_camera_and_time_filters(tmp_path):
    path = tmp_path / "h.db"
    t = 1_700_000_000.0
    write(path, [make_event("front", t), make_event("front-door", t + 10), make_event("front", t + 20),
                 make_event("door", t + 30, text="a blue circle grows")])
    reader = History(path)
    assert [e.start_time for e in reader.search(camera="front")] == [t + 20, t]
    assert [e.start_time for e in reader.search("red", camera="front-door")] == [t + 10]
    assert [e.camera for e in reader.search("red", camera="door")] == []
    assert [e.start_time for e in reader.search(since=t + 10, until=t + 20)] == [t + 20, t + 10]
    assert [e.start_time for e in reader.search("red", since=t + 5)] == [t + 20, t + 10]
    assert [e.start_time for e in reader.search(until=t + 9.999)] == [t]
    assert reader.search(since=t + 40) == [] and reader.search(since=t + 20, until=t) == []
    assert len(reader.search(limit=2)) == 2 and reader.search(limit=0) == []


def test_a_changed_text_is_found_by_its_new_words_only(tmp_path):
    path = tmp_path / "h.db"
    sink = HistorySink(path)
    e = make_event(text="a red star moves right")
    sink.event("front", e, "opened")
    sink.close(timeout=10)
    sink = HistorySink(path)
    e.text, e.windows = "a red star moves left", 5
    sink.event("front", e, "extended")
    sink.close(timeout=10)
    reader = History(path)
    assert [x.windows for x in reader.search("left")] == [5]
    assert reader.search("right") == []


def test_events_of_two_cameras_that_open_in_the_same_millisecond_are_both_kept(tmp_path):
    path = tmp_path / "h.db"
    write(path, [make_event("front"), make_event("door")])
    reader = History(path)
    assert sorted(e.camera for e in reader.search()) == ["door", "front"]
    assert reader.thumbnail("door@1700000000000") == JPEG


def test_the_state_queued_is_the_state_at_the_call(tmp_path):
    path = tmp_path / "h.db"
    sink = HistorySink(path)
    e = make_event(windows=1)
    sink.event("front", e, "opened")
    e.windows, e.text = 99, "changed after the call"  # the tracker's next window, before the writer ran
    sink.close(timeout=10)
    assert [(x.windows, x.text) for x in History(path).search()] == [(1, "a red star moves right")]


def test_close_commits_what_is_queued_and_later_changes_are_ignored(tmp_path):
    path = tmp_path / "h.db"
    sink = HistorySink(path)
    sink.event("front", make_event(), "opened")
    sink.close(timeout=10)
    sink.event("front", make_event(start=1_800_000_000.0), "opened")
    sink.close()
    assert len(History(path).search()) == 1


def test_an_event_left_open_by_a_crash_is_closed_at_the_next_start(tmp_path):
    path = tmp_path / "h.db"
    sink = HistorySink(path)
    sink.event("front", make_event(start=time.time()), "opened")
    sink.close(timeout=10)
    assert History(path).search()[0].closed is False
    HistorySink(path).close(timeout=10)
    assert History(path).search()[0].closed is True


def test_age_retention_deletes_old_closed_events_and_their_thumbnails(tmp_path):
    path = tmp_path / "h.db"
    now = time.time()
    old = [make_event(start=now - 40 * 86_400 + i, closed=True) for i in range(5)]
    write(path, old + [make_event(start=now - 86_400)])
    sink = HistorySink(path, max_age_days=30)  # retention runs at open
    sink.opened.wait(10)
    sink.close(timeout=10)
    assert [e.start_time for e in History(path).search()] == [now - 86_400]
    assert sink.counters()["deleted"] == 5
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM thumbnails").fetchone()[0] == 1
    db.close()


def test_the_disk_budget_deletes_the_oldest_first_and_shrinks_the_file(tmp_path):
    path = tmp_path / "h.db"
    thumb = os.urandom(6000)  # JPEGs do not compress
    write(path, [make_event(start=1_700_000_000.0 + i, thumbnail=thumb + bytes([i % 256])) for i in range(800)])
    before = path.stat().st_size
    assert before > 5_000_000
    db = history.open_database(path)
    deleted = history.retain(db, 0.0, 2_000_000)
    assert history.used_bytes(db) <= 2_000_000
    db.close()
    assert path.stat().st_size < before / 2  # incremental_vacuum gave the pages back
    kept = History(path).search(limit=1000)
    assert len(kept) == 800 - deleted and 0 < len(kept) < 800
    assert kept[0].start_time == 1_700_000_000.0 + 799  # the newest stay
    assert min(e.start_time for e in kept) == 1_700_000_000.0 + deleted
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_captions_are_kept_only_when_asked(tmp_path):
    from edgecap.captioner import Caption

    caption = Caption(text="a red star moves right", tokens=[1], window=0, start_frame=0, end_frame=7,
                      start_time=0.0, end_time=0.9, stage_ms={}, latency_ms=1.0)
    for keep, expected in ((False, 0), (True, 2)):
        path = tmp_path / f"{keep}.db"
        sink = HistorySink(path, captions=keep)
        sink.caption("front", caption)
        sink.caption("front", caption)
        sink.close(timeout=10)
        assert sqlite3.connect(path).execute("SELECT count(*) FROM captions").fetchone()[0] == expected


def _corrupt_pages(path: Path) -> None:
    """Overwrites the pages after the first (the schema) with junk, as a torn SD card write might."""
    with open(path, "r+b") as f:
        f.seek(8192 * 2)
        f.write(b"\xa5" * 8192 * 3)


def test_a_corrupt_file_is_moved_aside_with_one_warning_and_a_new_history_starts(tmp_path, caplog):
    # Only edgecap's own history (its application id in the header) is ever moved aside:
    # a file that is no database at all is refused untouched (tests/test_history_files.py).
    path = tmp_path / "h.db"
    write(path, [make_event(start=1_700_000_000.0 + i, thumbnail=os.urandom(3000)) for i in range(50)])
    _corrupt_pages(path)
    with caplog.at_level(logging.WARNING, logger="edgecap.service.history"):
        write(path, [make_event(start=1_800_000_000.0)])
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "moved it to" in warnings[0] and "\n" not in warnings[0]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("h.db.corrupt-")]
    assert len(aside) == 1 and aside[0].stat().st_size > 0
    assert [e.start_time for e in History(path).search()] == [1_800_000_000.0]


def test_a_reader_of_a_missing_or_unset_history_finds_nothing(tmp_path):
    assert History(tmp_path / "none.db").search("red") == []
    sqlite3.connect(tmp_path / "empty.db").close()
    assert History(tmp_path / "empty.db").search("red") == []
    assert not (tmp_path / "none.db").exists()  # read-only: never created


def test_a_reader_of_a_file_that_is_no_database_says_so_in_one_line(tmp_path):
    (tmp_path / "junk.db").write_bytes(b"junk" * 1000)
    with pytest.raises(ConfigError, match="not a readable history") as info:
        History(tmp_path / "junk.db").search("red")
    assert "\n" not in str(info.value)


def test_an_unwritable_place_is_a_one_line_config_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"cannot create .*file.*\[history\] path") as info:
        HistorySink(tmp_path / "file" / "h.db")
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="is a directory"):
        HistorySink(tmp_path)


def test_an_sqlite_without_fts5_is_a_one_line_config_error(tmp_path, monkeypatch):
    real = sqlite3.connect

    class NoFts5:
        def __init__(self, *args, **kwargs):
            self.db = real(*args, **kwargs)

        def execute(self, sql, *args):
            if "fts5" in sql:
                raise sqlite3.OperationalError("no such module: fts5")
            return self.db.execute(sql, *args)

        def close(self):
            self.db.close()

    monkeypatch.setattr(sqlite3, "connect", NoFts5)
    with pytest.raises(ConfigError, match=r'no FTS5 full-text search \(no such module: fts5\).*path = ""') as info:
        HistorySink(tmp_path / "h.db")
    assert "\n" not in str(info.value) and not (tmp_path / "h.db").exists()


def test_a_full_queue_drops_changes_and_counts_them(tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "QUEUE_CAPACITY", 1)
    sink = HistorySink(tmp_path / "h.db")
    for i in range(50):
        sink.event("front", make_event(start=1_700_000_000.0 + i), "opened")
    sink.close(timeout=10)
    counters = sink.counters()
    assert counters["dropped"] > 0 and counters["written"] + counters["dropped"] == 50


def test_a_thumbnail_dropped_with_a_full_queue_comes_with_the_next_change(tmp_path, monkeypatch):
    sink = HistorySink(tmp_path / "h.db")
    sink.opened.wait(10)
    monkeypatch.setattr(sink, "_queue", queue.Queue(1))
    sink._queue.put("blocks the queue")  # the writer is waiting on the old queue: this one stays full
    e = make_event()
    sink.event("front", e, "opened")  # dropped, with its thumbnail
    monkeypatch.undo()
    e.windows = 2
    sink.event("front", e, "extended")
    sink.close(timeout=10)
    assert History(tmp_path / "h.db").thumbnail(e.id) == JPEG


# --- config --------------------------------------------------------------------------------

MINIMAL = """\
[[cameras]]
name = "cam"
source = "/dev/video0"
"""


def config_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "edgecap.toml"
    path.write_text(MINIMAL + textwrap.dedent(extra))
    path.chmod(0o640)
    return path


def test_the_history_is_on_by_default_in_the_state_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    assert state_directory() == tmp_path / "state"
    config = load_config(config_file(tmp_path))
    h = config.history
    assert (h.path, h.max_age_days, h.max_bytes, h.captions) == \
        (str(tmp_path / "state" / "history.db"), 30.0, 500_000_000, False)
    monkeypatch.delenv("STATE_DIRECTORY")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert load_config(config_file(tmp_path)).history.path == str(tmp_path / "xdg" / "edgecap" / "history.db")
    absolute = load_config(config_file(tmp_path, f'[history]\npath = "{tmp_path}/h.db"\n'))
    assert absolute.history.path == f"{tmp_path}/h.db"


def test_the_service_opens_the_history_last_among_its_sinks_unless_its_path_is_empty(tmp_path):
    config = load_config(config_file(tmp_path, f'[history]\npath = "{tmp_path}/h.db"\ncaptions = true\n'))
    sinks = open_sinks(config, extra=open_history(config.history))  # as Service does
    assert [s.name for s in sinks.sinks] == ["stdout", "history"]
    sinks.event("cam", make_event(), "opened")
    sinks.close()
    assert len(History(tmp_path / "h.db").search()) == 1
    assert open_history(load_config(config_file(tmp_path, '[history]\npath = ""\n')).history) == []


def test_a_sink_that_cannot_start_closes_the_history_opened_before_it(tmp_path):
    config = load_config(config_file(tmp_path, f'[history]\npath = "{tmp_path}/h.db"\n'
                                               '[sinks.jsonl]\npath = "no/such/dir/c.jsonl"\n'))
    extra = open_history(config.history)
    with pytest.raises(ConfigError, match="sinks.jsonl.path"):
        open_sinks(config, extra=extra)
    assert not extra[0]._thread.is_alive()


@pytest.mark.parametrize("extra, expected", [
    ("max_age_days = 0", r"history.max_age_days: must be float > 0.0; use the days events are kept"),
    ("max_bytes = 10", r"history.max_bytes: must be int >= 1000000; use the disk budget of the history"),
    ('captions = "yes"', r"history.captions: must be bool, got str; use true"),
    ("path = 3", r"history.path: must be str, got int; give the history database file"),
    ("size = 3", r"history.size: unknown key; see deploy/edgecap.toml"),
])
def test_bad_history_keys_are_one_line_errors_naming_the_key(tmp_path, extra, expected):
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(config_file(tmp_path, "[history]\n" + extra + "\n"))
    assert "\n" not in str(info.value) and "edgecap.toml:5:" in str(info.value)


# --- the CLI -------------------------------------------------------------------------------

def edgecap(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgecap.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_history_search_prints_a_table_or_json_beside_a_running_writer(tmp_path):
    path = tmp_path / "h.db"
    now = time.time()
    write(path, [make_event("front", now - 7200, confidence=-0.25),
                 make_event("door", now - 60, text="a blue circle grows")])
    sink = HistorySink(path)  # a writer holds the file open, as the service does
    sink.opened.wait(10)
    try:
        out = edgecap("history", "search", "--db", str(path))
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0].split() == ["time", "camera", "duration", "confidence", "text"]
        assert "door" in lines[1] and lines[1].endswith("a blue circle grows")
        assert "front" in lines[2] and "0.4s" in lines[2] and "-0.250" in lines[2]
        assert lines[-1] == "2 events"
        out = edgecap("history", "search", "red", "--db", str(path), "--json", "--since", "3h", "--until", "1h")
        assert out.returncode == 0, out.stderr
        events = json.loads(out.stdout)["events"]
        assert [e["camera"] for e in events] == ["front"] and events[0]["text"] == "a red star moves right"
        assert edgecap("history", "search", "red", "--db", str(path), "--since", "1h").stdout.splitlines()[-1] == \
            "0 events"
    finally:
        sink.close(timeout=10)


def test_history_search_reads_the_path_from_the_config(tmp_path):
    path = tmp_path / "h.db"
    write(path, [make_event()])
    out = edgecap("history", "search", "star", "--config",
                  str(config_file(tmp_path, f'[history]\npath = "{path}"\n')))
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "1 event", out.stderr


@pytest.mark.parametrize("args, expected", [
    (["--db", "{tmp}/none.db"], "no history database at"),
    (["--db", "{tmp}/junk.db"], "is not a readable history"),
    (["--db", "{tmp}/h.db", "--since", "yesterday"], "argument --since: 'yesterday' is not a time"),
    (["--db", "{tmp}/h.db", "--limit", "0"], "argument --limit"),
    ([], "one of the arguments --db --config is required"),
    (["--db", "{tmp}/h.db", "--config", "{tmp}/c.toml"], "not allowed with argument"),
    (["--config", "{tmp}/off.toml"], '[history] path is "": this service keeps no history'),
])
def test_history_search_bad_input_is_one_line_and_exit_2(tmp_path, args, expected):
    (tmp_path / "junk.db").write_bytes(b"junk" * 1000)
    write(tmp_path / "h.db", [make_event()])
    (tmp_path / "off.toml").write_text(MINIMAL + '[history]\npath = ""\n')
    out = edgecap("history", "search", "red", *[a.format(tmp=tmp_path) for a in args])
    assert out.returncode == 2
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1 and expected in out.stderr, out.stderr


def test_times_are_iso_8601_or_how_long_ago():
    now = 1_800_000_000.0
    assert parse_time("90s", now) == now - 90
    assert parse_time("1.5h", now) == now - 5400
    assert parse_time("2d", now) == now - 2 * 86_400
    assert parse_time("1w", now) == now - 7 * 86_400
    utc = datetime.timezone.utc
    assert parse_time("2026-12-01T08:00:00Z") == datetime.datetime(2026, 12, 1, 8, tzinfo=utc).timestamp()
    assert parse_time("2026-12-01T09:00:00+01:00") == parse_time("2026-12-01T08:00:00Z")
    assert parse_time("2026-12-01") == datetime.datetime(2026, 12, 1).timestamp()  # local midnight
    for bad in ("yesterday", "", "1y", "-1h", "2026-13-01"):
        with pytest.raises(ValueError, match="is not a time"):
            parse_time(bad, now)


# --- the benchmark, short -------------------------------------------------------------------

def _bench():
    spec = importlib.util.spec_from_file_location("history_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_searches_a_small_generated_history(tmp_path):
    bench = _bench()
    now = time.time()
    bench.build(tmp_path / "s.db", 3000, 3, 3600.0, [JPEG], 10, now)
    result = bench.search_bench(tmp_path / "s.db", now, 1000.0, repeats=2)
    by_query = {q["query"]: q for q in result["by_query"]}
    assert by_query["word: red"]["hits"] == 50 and by_query["no match"]["hits"] == 0
    assert by_query["word + last hour"]["hits"] == 50  # 3 cameras x 3600 events an hour
    assert result["searches"] == 2 * len(by_query) and result["p99_ms"] > 0
    growth = bench.growth(tmp_path / "g.db", 300, 3600.0, [JPEG])
    assert growth["bytes_per_event"] > len(JPEG)


def _kill_trials(tmp_path, trials):
    bench = _bench()
    # 2 s for a loaded CI machine; the benchmark's own run holds it to the goal, 1 s.
    result = bench.kill_trials(trials, tmp_path / "k.db", 2_000_000, limit=2.0)
    assert result["integrity_ok"] == trials, result
    assert result["within_limit"] == trials, result
    assert result["reported_changes_mean"] > 0


def test_kill_9_during_writes_loses_at_most_the_last_second_short(tmp_path):
    _kill_trials(tmp_path, 2)


@pytest.mark.slow
def test_kill_9_during_writes_loses_at_most_the_last_second_ten_trials(tmp_path):
    _kill_trials(tmp_path, 10)


# --- in the service -------------------------------------------------------------------------

def test_the_service_writes_events_to_the_history_and_its_page_searches_it(tmp_path, shipped_bundle):
    import io
    import urllib.parse
    import urllib.request

    from edgecap.service.notify import Notifier
    from edgecap.service.service import Service

    config = tmp_path / "edgecap.toml"
    config.write_text("\n".join([
        f'bundle = "{shipped_bundle}"', "[http]", 'address = "127.0.0.1"', "port = 0",
        "[[cameras]]", 'name = "front"', f'source = "{ROOT / "models" / "demo" / "sample.mp4"}"',
        "[history]", f'path = "{tmp_path / "h.db"}"', ""]))
    service = Service(load_config(config), notifier=Notifier({}), stdout=io.StringIO())
    try:
        assert service.http.history is service.history and isinstance(service.history, History)
        event = make_event(start=time.time())
        service.sinks.event("front", event, "opened")
        event.closed = True
        service.sinks.event("front", event, "closed")
        deadline = time.monotonic() + 10
        while not History(tmp_path / "h.db").search() and time.monotonic() < deadline:
            time.sleep(0.1)  # the writer commits within a second
        url = f"http://127.0.0.1:{service.http.port}/api/events?q=red+star"
        with urllib.request.urlopen(url, timeout=10) as response:
            found = json.loads(response.read())["events"]
        assert [(e["id"], e["closed"]) for e in found] == [(event.id, True)]
        with urllib.request.urlopen(urllib.parse.urljoin(url, found[0]["thumbnail"]), timeout=10) as response:
            assert response.read() == JPEG
    finally:
        service.close()
