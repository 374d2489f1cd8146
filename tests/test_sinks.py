"""Caption sinks: stdout/journal lines, JSON lines with rotation, and the fan-out that outlives a failing sink."""

from __future__ import annotations

import io
import json
import logging
import os
import stat
from pathlib import Path

import pytest

from edgecap.captioner import Caption
from edgecap.errors import ConfigError
from edgecap.service.config import load_config
from edgecap.service.sinks import (
    JournalFormatter, JsonlSink, MqttSink, Sink, SinkSet, StdoutSink, caption_record, is_journal, open_sinks,
)


def make_caption(window: int = 0, text: str = "a red star moves right") -> Caption:
    return Caption(text=text, tokens=[4, 5, 6], window=window, start_frame=window * 8,
                   end_frame=window * 8 + 7, start_time=window * 1.0, end_time=window * 1.0 + 0.88,
                   stage_ms={"cnn": 1.5}, latency_ms=12.5)


@pytest.fixture
def journal_file(tmp_path, monkeypatch):
    """A file that JOURNAL_STREAM names, as systemd names the journal's socket."""
    path = tmp_path / "journal"
    stream = open(path, "w")
    st = os.fstat(stream.fileno())
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    yield path, stream
    stream.close()


def test_stdout_writes_one_plain_line_per_caption(monkeypatch):
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    out = io.StringIO()
    sink = StdoutSink(out)
    sink.caption("front", make_caption(1))
    sink.caption("back", make_caption(2, text="two\nlines"))
    sink.close()
    assert out.getvalue().splitlines() == [
        "front [   1.00s -    1.88s] a red star moves right",
        "back [   2.00s -    2.88s] two lines",
    ]
    assert sink.counters() == {"sent": 2, "dropped": 0, "errors": 0, "written": 2}


def test_stdout_to_the_journal_carries_priority_prefixes(journal_file):
    path, stream = journal_file
    assert is_journal(stream)
    sink = StdoutSink(stream)
    sink.caption("front", make_caption())
    assert path.read_text() == "<6>front [   0.00s -    0.88s] a red star moves right\n"  # flushed at once


def test_a_redirected_stdout_is_not_the_journal(journal_file, tmp_path):
    _, _ = journal_file
    with open(tmp_path / "elsewhere", "w") as other:
        assert not is_journal(other)
        StdoutSink(other).caption("front", make_caption())
    assert (tmp_path / "elsewhere").read_text().startswith("front [")
    assert not is_journal(io.StringIO())


def test_journal_formatter_marks_warnings_and_info(journal_file):
    path, stream = journal_file
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JournalFormatter("%(message)s"))
    logger = logging.getLogger("edgecap.test.journal")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    try:
        logger.warning("fewer TPUs than planned: using the CPU")
        logger.info("ready")
        logger.error("camera gone\nsecond line")
        logger.debug("detail")
    finally:
        logger.removeHandler(handler)
    assert path.read_text().splitlines() == [
        "<4>fewer TPUs than planned: using the CPU", "<6>ready", "<3>camera gone", "<3>second line", "<7>detail",
    ]


def test_caption_record_is_the_caption_plus_camera_and_time():
    record = caption_record("front", make_caption(3))
    assert record["camera"] == "front"
    assert {k: v for k, v in record.items() if k not in ("camera", "time")} == make_caption(3).to_dict()
    assert record["time"] > 1.6e9
    json.dumps(record)


def test_jsonl_appends_flushed_lines(tmp_path):
    path = tmp_path / "captions.jsonl"
    path.write_text('{"old": true}\n')
    sink = JsonlSink(path)
    sink.caption("front", make_caption(0))
    # Readable before close: each line is flushed.
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"old": True}
    assert json.loads(lines[1])["text"] == "a red star moves right"
    sink.caption("back", make_caption(1))
    sink.close()
    sink.caption("late", make_caption(2))  # after close: ignored, the file stays closed
    assert [json.loads(line).get("camera") for line in path.read_text().splitlines()] == [None, "front", "back"]


def test_jsonl_file_is_not_world_readable(tmp_path):
    path = tmp_path / "captions.jsonl"
    old = os.umask(0)
    try:
        JsonlSink(path).close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_jsonl_rotates_by_size_and_keeps_backups(tmp_path):
    path = tmp_path / "captions.jsonl"
    line = len(json.dumps(caption_record("front", make_caption(0)), ensure_ascii=False)) + 1
    max_bytes = int(3.5 * line)  # three lines a file (lines differ by a few bytes)
    sink = JsonlSink(path, max_bytes=max_bytes, backups=2)
    for window in range(10):  # [0-2] [3-5] [6-8] [9]
        sink.caption("front", make_caption(window))
    sink.close()

    def windows(p: Path):
        return [json.loads(x)["window"] for x in p.read_text().splitlines()]

    assert windows(path) == [9]
    assert windows(tmp_path / "captions.jsonl.1") == [6, 7, 8]
    assert windows(tmp_path / "captions.jsonl.2") == [3, 4, 5]
    assert not (tmp_path / "captions.jsonl.3").exists()  # [0-2] rotated away
    assert sink.counters() == {"sent": 10, "dropped": 0, "errors": 0, "written": 10, "rotations": 3, "reopens": 0}
    assert all(p.stat().st_size <= max_bytes for p in tmp_path.glob("captions.jsonl*"))


def test_jsonl_without_backups_starts_over(tmp_path):
    path = tmp_path / "captions.jsonl"
    sink = JsonlSink(path, max_bytes=1024, backups=0)
    for window in range(20):
        sink.caption("front", make_caption(window))
    sink.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["captions.jsonl"]
    assert 0 < path.stat().st_size <= 1024
    assert json.loads(path.read_text().splitlines()[-1])["window"] == 19


def test_jsonl_a_line_larger_than_max_bytes_gets_a_file_of_its_own(tmp_path):
    path = tmp_path / "captions.jsonl"
    sink = JsonlSink(path, max_bytes=1024, backups=1)
    sink.caption("front", make_caption(0, text="x" * 2000))
    sink.caption("front", make_caption(1))
    sink.close()
    assert json.loads(path.read_text())["window"] == 1
    assert json.loads((tmp_path / "captions.jsonl.1").read_text())["window"] == 0


@pytest.mark.parametrize("where, problem", [
    ("missing/dir/captions.jsonl", "No such file or directory"),
    ("", "Is a directory"),
])
def test_jsonl_unwritable_path_is_a_config_error_at_open(tmp_path, where, problem):
    path = tmp_path / where if where else tmp_path
    with pytest.raises(ConfigError) as info:
        JsonlSink(path)
    message = str(info.value)
    assert message.startswith(f"sinks.jsonl.path: cannot write {path} ({problem}); ")
    assert "\n" not in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes files whatever their mode")
def test_jsonl_read_only_directory_is_a_config_error(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match="Permission denied"):
            JsonlSink(tmp_path / "captions.jsonl")
    finally:
        tmp_path.chmod(0o700)


class Broken(Sink):
    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def caption(self, camera, caption):
        self.calls += 1
        raise OSError(28, "No space left on device")

    def stats(self, snapshot):
        raise TypeError("not JSON")

    def close(self, timeout=2.0):
        raise RuntimeError("close failed")


class Recorder(Sink):
    name = "recorder"

    def __init__(self) -> None:
        self.captions, self.snapshots, self.closed = [], [], None

    def caption(self, camera, caption):
        self.captions.append((camera, caption.window))

    def stats(self, snapshot):
        self.snapshots.append(snapshot)

    def close(self, timeout=2.0):
        self.closed = timeout


def test_a_failing_sink_is_logged_once_counted_and_the_others_go_on(caplog):
    broken, recorder = Broken(), Recorder()
    sinks = SinkSet([broken, recorder])
    with caplog.at_level(logging.WARNING, logger="edgecap.service.sinks"):
        for window in range(3):
            sinks.caption("front", make_caption(window))
        sinks.stats({"fps": 1.0})
    assert recorder.captions == [("front", 0), ("front", 1), ("front", 2)]
    assert recorder.snapshots == [{"fps": 1.0}]
    assert broken.calls == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "broken sink failed (caption)" in warnings[0]
    assert "No space left on device" in warnings[0]
    assert sinks.counters() == {"broken": {"sent": 0, "dropped": 0, "errors": 4, "failures": 4},
                                "recorder": {"sent": 0, "dropped": 0, "errors": 0, "failures": 0}}
    sinks.close(timeout=1.5)  # a close that raises does not stop the others' close
    assert recorder.closed is not None and 0 < recorder.closed <= 1.5
    sinks.caption("front", make_caption(9))  # closed: nothing left to deliver to
    assert len(recorder.captions) == 3


def test_open_sinks_opens_what_the_config_enables(tmp_path):
    path = tmp_path / "edgecap.toml"
    path.write_text('[[cameras]]\nname = "front"\nsource = "0"\n'
                    '[sinks.jsonl]\npath = "captions.jsonl"\n')
    out = io.StringIO()
    sinks = open_sinks(load_config(path), stdout=out)
    assert [type(s) for s in sinks.sinks] == [JsonlSink, StdoutSink]
    sinks.caption("front", make_caption())
    sinks.close()
    assert json.loads((tmp_path / "captions.jsonl").read_text())["camera"] == "front"
    assert out.getvalue().startswith("front [")

    path.write_text('[[cameras]]\nname = "front"\nsource = "0"\n[sinks.stdout]\nenabled = false\n'
                    '[sinks.mqtt]\nhost = "127.0.0.1"\nport = 9\n')
    sinks = open_sinks(load_config(path))
    assert [type(s) for s in sinks.sinks] == [MqttSink]  # a broker that is not there is not fatal
    sinks.close(timeout=1.0)


def test_open_sinks_refuses_an_unwritable_jsonl_path_before_starting_anything(tmp_path):
    path = tmp_path / "edgecap.toml"
    path.write_text('[[cameras]]\nname = "front"\nsource = "0"\n'
                    '[sinks.jsonl]\npath = "no/such/dir/captions.jsonl"\n'
                    '[sinks.mqtt]\nhost = "127.0.0.1"\nport = 9\n')
    with pytest.raises(ConfigError, match="sinks.jsonl.path: cannot write"):
        open_sinks(load_config(path))


def test_mqtt_sink_never_blocks_on_a_broker_that_does_not_answer(caplog):
    # A socket that completes TCP handshakes (the kernel does) but never speaks MQTT.
    import socket
    import time

    from edgecap.service.config import MqttSinkConfig

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    try:
        with caplog.at_level(logging.WARNING, logger="edgecap.service.sinks"):
            for port in (silent.getsockname()[1], refused.getsockname()[1]):
                sink = MqttSink(MqttSinkConfig(host="127.0.0.1", port=port, buffer=2),
                                reconnect_delay=(0.05, 0.1))
                started = time.monotonic()
                for window in range(4):
                    sink.caption("front", make_caption(window))
                sink.stats({"fps": 1.0})
                assert time.monotonic() - started < 0.2
                counters = sink.counters()
                assert (counters["connected"], counters["buffered"], counters["dropped"]) == (False, 2, 2)
                time.sleep(0.5)  # several reconnect attempts
                started = time.monotonic()
                sink.close(timeout=1.0)
                assert time.monotonic() - started < 1.5
        unreachable = [r for r in caplog.records if "not reachable" in r.getMessage()]
        assert len(unreachable) == 1  # the refusing port: said once, however many attempts
    finally:
        silent.close()
        refused.close()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_fails_the_jsonl_sink_alone(caplog):
    full, recorder = JsonlSink("/dev/full"), Recorder()  # every write: ENOSPC
    sinks = SinkSet([full, recorder])
    with caplog.at_level(logging.WARNING, logger="edgecap.service.sinks"):
        for window in range(3):
            sinks.caption("front", make_caption(window))
    assert [w for _, w in recorder.captions] == [0, 1, 2]
    assert sinks.counters()["jsonl"]["failures"] == 3
    assert sum("jsonl sink failed" in r.getMessage() for r in caplog.records) == 1
    assert "No space left on device" in caplog.text
    sinks.close()


@pytest.mark.fast
def test_jsonl_rotates_only_when_a_line_would_pass_max_bytes(tmp_path, monkeypatch):
    import types

    from edgecap.service.sinks import base

    # A still wall clock: every record is then exactly as long as the one measured.
    monkeypatch.setattr(base, "time", types.SimpleNamespace(time=lambda: 1_700_000_000.125,
                                                            monotonic=base.time.monotonic))
    line = len((json.dumps(caption_record("front", make_caption(0)), ensure_ascii=False) + "\n").encode())

    def files_after(max_bytes: int, lines: int) -> dict:
        folder = tmp_path / str(max_bytes)
        folder.mkdir()
        sink = JsonlSink(folder / "captions.jsonl", max_bytes=max_bytes, backups=3)
        for _ in range(lines):
            sink.caption("front", make_caption(0))
        sink.close()
        assert sink.counters()["written"] == lines
        return {p.name: p.stat().st_size for p in sorted(folder.iterdir())}

    # Two lines fill the file to the byte: they stay together; a third starts a new file.
    assert files_after(2 * line, 2) == {"captions.jsonl": 2 * line}
    assert files_after(2 * line + 1, 3) == {"captions.jsonl": line, "captions.jsonl.1": 2 * line}
    # One byte short of two lines: the second one rotates.
    assert files_after(2 * line - 1, 2) == {"captions.jsonl": line, "captions.jsonl.1": line}
