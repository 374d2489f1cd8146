"""Faults a board meets, replayed on a real ``edgecap serve``: ``python tools/faults_bench.py``.

Every case runs the service as a subprocess on a looping file camera (the
shipped sample clip: about one event closes a second), with the JSON-lines sink
writing captions and events outside the state directory, and then counts:

* events kept / events expected: the closed events of the run (its JSON-lines
  file) and of a seeding run before it, found closed in the history after it
  (goal 1.0; a full disk that never recovers may drop, but must count it);
* captions lost: caption lines on stdout (the journal) less those in the
  JSON-lines files (goal 0);
* unexpected exits: the service ending before the bench stops it, or not with
  0 after SIGTERM (goal 0; a refusal at start, exit 2, is expected where the
  case says so);
* foreign files touched: files that are not edgecap's own (the config, a
  device, a FIFO, another program's SQLite or text file, a symlink's target)
  renamed, replaced or changed (goal 0).

Faults: ``[history] path`` naming something that is not edgecap's history; a
write lock held on the history at start; the wall clock stepped 40 days
forward or back inside the service (``time.time`` replaced in the service
process, and the history's retention run every 3 s instead of 60 s so that
the run is short); a full state directory, recovered or not (a tmpfs in a
private mount namespace); a state directory read-only at start or during the
run (remounted); SIGHUP after the JSON-lines file was moved away (logrotate);
a broker that accepts TCP and never answers; a broker restarted without its
retained messages while the camera's event does not change; a stream that
stalls under ``edgecap camera URL`` (with and without ``--reconnect``); a
stream's password in a config error; two services on one history; the mode of
a fresh history under umask 022.

Run as root for the mounts and the device node (the bench re-runs itself in a
private mount namespace with ``unshare -m``); without root those cases are
skipped. Prints a table and the load average, writes JSON (``--json``). Every
figure is measured on this host; nothing is modelled. Self-contained: it needs
edgecap, paho-mqtt and a ``mosquitto`` binary (the MQTT cases are skipped
without one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "models" / "demo" / "sample.mp4"
BUNDLE = REPO / "models" / "demo" / "bundle"
PROG = "python tools/faults_bench.py"
_NS_ENV = "FAULTS_BENCH_IN_NAMESPACE"
_CAPTION_LINE = re.compile(r"^\S+ \[ *-?[0-9.]+s - +-?[0-9.]+s\] ")
DAY_S = 86_400.0

# Runs `edgecap serve` with time.time() stepped by FAULTS_CLOCK_STEP_S once
# FAULTS_CLOCK_STEP_AT_S seconds have passed, and the history's retention run every
# FAULTS_RETENTION_PERIOD_S: a fault injected in the service process, nowhere else.
_BOOT = r"""
import inspect, os, sys, time
step = float(os.environ.get("FAULTS_CLOCK_STEP_S") or 0)
if step:
    real, start, at = time.time, time.monotonic(), float(os.environ.get("FAULTS_CLOCK_STEP_AT_S") or 0)
    time.time = lambda: real() + (step if time.monotonic() - start >= at else 0.0)
period = os.environ.get("FAULTS_RETENTION_PERIOD_S")
if period:
    from edgecap.service import history
    for module in (history, getattr(history, "writer", None)):
        if module is not None:
            module.RETENTION_PERIOD_S = float(period)
    init = history.HistorySink.__init__
    names = [p for p in inspect.signature(init).parameters]
    if "retention_period_s" in names and init.__defaults__:
        defaults = list(init.__defaults__)
        defaults[names.index("retention_period_s") - (len(names) - len(defaults))] = float(period)
        init.__defaults__ = tuple(defaults)
from edgecap.cli import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Row:
    """One case's outcome."""

    case: str
    fault: str
    goal: str
    exit_code: Optional[int] = None  # of the run the case watches; None: still running when stopped
    unexpected_exits: int = 0
    events_expected: Optional[int] = None
    events_kept: Optional[int] = None
    captions_out: Optional[int] = None
    captions_lost: Optional[int] = None
    foreign_touched: int = 0
    dropped_counted: Optional[int] = None  # events the service said it could not write (None: it said nothing)
    note: str = ""
    skipped: str = ""
    seconds: float = 0.0


@dataclass
class Serve:
    """One ``edgecap serve`` process of a case."""

    proc: subprocess.Popen
    stdout: Path
    stderr: Path
    started: float = field(default_factory=time.monotonic)

    def exited(self) -> Optional[int]:
        return self.proc.poll()

    def stop(self, timeout: float = 15.0) -> Tuple[int, bool]:
        """SIGTERM unless it ended; returns (exit code, whether it had ended by itself)."""
        code = self.proc.poll()
        if code is not None:
            return code, True
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout), False
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(), False

    def stderr_text(self) -> str:
        return self.stderr.read_text(errors="replace") if self.stderr.exists() else ""


class Case:
    """A case's folder: config, state directory, outputs."""

    def __init__(self, base: Path, name: str) -> None:
        self.dir = base / name
        self.dir.mkdir(parents=True)
        self.state = self.dir / "state"
        self.state.mkdir()
        self.runs = 0

    def config(self, history: str = "history.db", jsonl: Optional[Path] = None, mqtt: Optional[int] = None,
               source: Any = SAMPLE, extra: str = "", name: str = "edgecap.toml") -> Path:
        jsonl = jsonl or self.dir / "captions.jsonl"
        lines = [f'bundle = "{BUNDLE}"', 'log_level = "info"', extra, "[http]", "port = 0", "",
                 "[sinks.stdout]", "enabled = true", "",
                 "[sinks.jsonl]", f'path = "{jsonl}"', "events = true", "",
                 "[history]", f'path = "{history}"', ""]
        if mqtt:
            lines += ["[sinks.mqtt]", 'host = "127.0.0.1"', f"port = {mqtt}", 'topic_prefix = "faults"',
                      'client_id = "faults-bench"', ""]
        lines += ["[[cameras]]", 'name = "front"', f'source = "{source}"', "loop = true",
                  "stall_seconds = 5.0", "backoff_max_seconds = 2.0", ""]
        path = self.dir / name
        path.write_text("\n".join(lines))
        path.chmod(0o640)
        return path

    def serve(self, config: Path, env: Optional[Dict[str, str]] = None, umask: Optional[int] = None) -> Serve:
        self.runs += 1
        out, err = self.dir / f"stdout-{self.runs}.txt", self.dir / f"stderr-{self.runs}.txt"
        full = dict(os.environ, STATE_DIRECTORY=str(self.state), PYTHONUNBUFFERED="1", **(env or {}))
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM"):
            full.pop(key, None)
        preexec = (lambda: os.umask(umask)) if umask is not None else None
        proc = subprocess.Popen([sys.executable, "-c", _BOOT, "serve", "--config", str(config)],
                                stdout=open(out, "w"), stderr=open(err, "w"), env=full, cwd=self.dir,
                                preexec_fn=preexec)
        return Serve(proc, out, err)


# --- what the files say ---------------------------------------------------------------------------------


def captions_on_stdout(serve: Serve) -> int:
    return sum(1 for line in serve.stdout.read_text(errors="replace").splitlines() if _CAPTION_LINE.match(line))


def jsonl_records(path: Path) -> List[Dict[str, Any]]:
    """Every record of a JSON-lines file and its rotations (path.N ... path), oldest first."""
    records: List[Dict[str, Any]] = []
    files = sorted(path.parent.glob(path.name + ".*"), reverse=True) + [path]
    for file in files:
        if not file.is_file():
            continue
        for line in file.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
    return records


def closed_events(records: List[Dict[str, Any]]) -> List[str]:
    return [r["id"] for r in records if r.get("change") == "closed"]


def caption_records(records: List[Dict[str, Any]]) -> int:
    return sum(1 for r in records if "change" not in r and "text" in r)


def history_rows(path: Path) -> List[Tuple[str, int, float]]:
    """(id, closed, start_time) of every event in a history, newest first as the API lists them."""
    if not path.is_file():
        return []
    try:
        db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            return db.execute("SELECT id, closed, start_time FROM events ORDER BY rowid DESC").fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return []


def kept(history: Path, expected: List[str]) -> int:
    closed = {row[0] for row in history_rows(history) if row[1]}
    return sum(1 for event in set(expected) if event in closed)


def snapshot(path: Path) -> Optional[Tuple[int, int, int, bytes]]:
    """(inode, mode, size, first 64 KiB) of what ``path`` names, not following a symlink."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    data = b""
    if stat.S_ISREG(st.st_mode):
        with open(path, "rb") as f:
            data = f.read(65536)
    elif stat.S_ISLNK(st.st_mode):
        data = os.readlink(path).encode()
    return st.st_ino, st.st_mode, st.st_size, data


def asides(path: Path) -> List[Path]:
    return sorted(path.parent.glob(path.name + ".corrupt-*"))


def api(serve: Serve, path: str) -> Optional[Dict[str, Any]]:
    """GETs the serve's API on the port it logged; None when it cannot."""
    match = re.search(r"status page on http://127\.0\.0\.1:(\d+)/", serve.stderr_text())
    if match is None:
        return None
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{match.group(1)}{path}", timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def wait_until(condition: Callable[[], Any], timeout: float, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step)
    return None


def events_closed_on(case: Case, jsonl: Path, minimum: int, timeout: float) -> bool:
    return bool(wait_until(lambda: len(closed_events(jsonl_records(jsonl))) >= minimum, timeout))


# --- mounts (in the bench's own mount namespace) -----------------------------------------------------------


_MOUNTS: List[Path] = []


def mount_tmpfs(path: Path, size: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True)
    _MOUNTS.append(path)


def unmount_all() -> None:
    while _MOUNTS:
        subprocess.run(["umount", "-l", str(_MOUNTS.pop())], check=False)


def remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True)


def fill(directory: Path) -> Path:
    """Fills the file system of ``directory`` to the last byte; returns the filler."""
    filler = directory / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


@contextlib.contextmanager
def ext4(path: Path, megabytes: int = 64) -> Any:
    """An ext4 file system on a loop device at ``path`` (errors=remount-ro, as a board's SD card)."""
    image = path.parent / (path.name + ".img")
    with open(image, "wb") as f:
        f.truncate(megabytes << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(image), str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        image.unlink()


def ext4_error(path: Path) -> None:
    """Makes the kernel take ``path``'s ext4 file system read-only at once, as after an SD card's write error."""
    source = subprocess.run(["findmnt", "-no", "SOURCE", str(path)], capture_output=True, text=True).stdout
    Path(f"/sys/fs/ext4/{Path(source.strip()).name}/trigger_fs_error").write_text("1")


# --- the cases ------------------------------------------------------------------------------------------


def _unchanged(before: Optional[Tuple[int, int, int, bytes]], after: Optional[Tuple[int, int, int, bytes]],
               appended: bool) -> bool:
    """Same inode and mode, and the same bytes (or, for a file edgecap may append to, the old bytes first)."""
    if before is None or after is None:
        return before == after
    if appended:
        return before[:2] == after[:2] and after[3].startswith(before[3])
    return before == after


def _ownership(base: Path, name: str, fault: str, make: Callable[[Case], Path],
               history: Callable[[Case, Path], str] = lambda case, target: str(target),
               appended: bool = False) -> Row:
    """``[history] path`` names something not edgecap's: refused at start, the thing untouched."""
    row = Row(name, fault, "exit 2 at start, one line; the file untouched")
    case = Case(base, name)
    target = make(case)
    config = case.config(history=history(case, target))
    before, listing = snapshot(target), sorted(p.name for p in target.parent.iterdir())
    serve = case.serve(config)
    ended = wait_until(serve.exited, 12.0) is not None
    code, _ = serve.stop()
    row.exit_code = code
    row.unexpected_exits = 0 if (ended and code == 2) else 1
    after = sorted(p.name for p in target.parent.iterdir())
    appeared = [n for n in after if n not in listing and not re.match(r"(stdout|stderr)-\d+\.txt$", n)]
    changed = not _unchanged(before, snapshot(target), appended)
    row.foreign_touched = int(changed) + len([n for n in appeared if ".corrupt-" in n])
    lines = [line for line in serve.stderr_text().splitlines() if line.strip()]
    row.note = (f"{'changed' if changed else 'untouched'}; new: {', '.join(appeared) or 'none'}; "
                f"said: {lines[-1][:120] if lines else '(nothing)'}")
    return row


def case_history_device(base: Path) -> Row:
    def make(case: Case) -> Path:
        node = case.state / "history.db"
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
        return node
    return _ownership(base, "history_is_a_device", "[history] path = a character device (1,3, as /dev/null)",
                      make)


def case_history_fifo(base: Path) -> Row:
    def make(case: Case) -> Path:
        fifo = case.state / "history.db"
        os.mkfifo(fifo)
        return fifo
    return _ownership(base, "history_is_a_fifo", "[history] path = a FIFO", make)


def case_history_config(base: Path) -> Row:
    return _ownership(base, "history_is_the_config", "[history] path = the config file itself",
                      lambda case: case.dir / "edgecap.toml",  # the file case.config() writes next
                      history=lambda case, target: str(target))


def case_history_jsonl(base: Path) -> Row:
    def make(case: Case) -> Path:
        path = case.dir / "captions.jsonl"
        path.write_text('{"camera": "front", "text": "a caption from yesterday"}\n')
        return path
    return _ownership(base, "history_is_the_jsonl_file", "[history] path = the JSON-lines captions file", make,
                      appended=True)


def case_history_text(base: Path) -> Row:
    def make(case: Case) -> Path:
        path = case.state / "notes.txt"
        path.write_text("my notes\n" * 100)
        return path
    return _ownership(base, "history_is_a_text_file", "[history] path = a text file", make)


def case_history_foreign_sqlite(base: Path) -> Row:
    def make(case: Case) -> Path:
        path = case.state / "app.db"
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        db.executemany("INSERT INTO notes(body) VALUES (?)", [(f"note {i}",) for i in range(100)])
        db.commit()
        db.close()
        return path
    return _ownership(base, "history_is_a_foreign_sqlite", "[history] path = another program's SQLite file", make)


def case_history_symlink(base: Path) -> Row:
    def make(case: Case) -> Path:
        elsewhere = case.dir / "elsewhere.txt"
        elsewhere.write_text("not edgecap's\n")
        link = case.state / "history.db"
        link.symlink_to(elsewhere)
        return elsewhere

    row = _ownership(base, "history_is_a_symlink", "[history] path = a symlink to a text file elsewhere", make,
                     history=lambda case, target: str(case.state / "history.db"))
    link = base / "history_is_a_symlink" / "state" / "history.db"
    if not link.is_symlink():
        row.foreign_touched += 1
        row.note = "the symlink was replaced; " + row.note
    return row


def _seed(case: Case, config: Path, seconds: float = 8.0) -> Tuple[List[str], int]:
    """A previous run that leaves events in the history; returns their ids and its unexpected exits."""
    serve = case.serve(config)
    time.sleep(seconds)
    code, ended = serve.stop()
    records = jsonl_records(case.dir / "captions-seed.jsonl")
    return closed_events(records), int(ended or code != 0)


def _count(row: Row, case: Case, serve: Serve, jsonl: Path, expected: List[str], history: Path) -> None:
    said = re.findall(r"history: (\d+) events and captions not written", serve.stderr_text())
    row.dropped_counted = sum(int(n) for n in said) if said else None
    records = jsonl_records(jsonl)
    row.events_expected = len(set(expected) | set(closed_events(records)))
    row.events_kept = kept(history, expected + closed_events(records))
    row.captions_out = captions_on_stdout(serve)
    row.captions_lost = max(0, row.captions_out - caption_records(records))


def _run(case: Case, config: Path, seconds: float, env: Optional[Dict[str, str]] = None,
         during: Optional[Callable[[Serve], None]] = None) -> Tuple[Serve, int, bool]:
    serve = case.serve(config, env)
    if during is not None:
        during(serve)
    remaining = seconds - (time.monotonic() - serve.started)
    if remaining > 0:
        wait_until(serve.exited, remaining)
    code, ended = serve.stop()
    return serve, code, ended


def case_locked_history(base: Path) -> Row:
    row = Row("history_locked_at_start", "another process holds a write transaction on the history for 9 s "
              "as the service starts", "nothing moved aside; every event kept")
    case = Case(base, row.case)
    history = case.state / "history.db"
    seeded, exits = _seed(case, case.config(jsonl=case.dir / "captions-seed.jsonl"))
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        f"db = sqlite3.connect({str(history)!r}, timeout=0, isolation_level=None)\n"
        "db.execute('BEGIN IMMEDIATE')\nprint('held', flush=True)\ntime.sleep(9)\ndb.execute('ROLLBACK')\n")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    holder.stdout.readline()
    serve, code, ended = _run(case, case.config(), 25.0)
    holder.wait(10)
    row.exit_code = code
    row.unexpected_exits = exits + int(ended or code != 0)
    _count(row, case, serve, case.dir / "captions.jsonl", seeded, history)
    moved = asides(history)
    row.foreign_touched = 0
    row.note = f"seeded {len(seeded)}; moved aside: {len(moved)}"
    return row


def _clock_case(base: Path, name: str, step_days: float) -> Row:
    row = Row(name, f"the wall clock steps {step_days:+g} days inside the service, 6 s into the run "
              "(retention every 3 s)", "nothing deleted; newest first stays newest first")
    case = Case(base, name)
    history = case.state / "history.db"
    seeded, exits = _seed(case, case.config(jsonl=case.dir / "captions-seed.jsonl"))
    env = {"FAULTS_CLOCK_STEP_S": str(step_days * DAY_S), "FAULTS_CLOCK_STEP_AT_S": "6",
           "FAULTS_RETENTION_PERIOD_S": "3"}
    serve, code, ended = _run(case, case.config(), 22.0, env)
    row.exit_code = code
    row.unexpected_exits = exits + int(ended or code != 0)
    _count(row, case, serve, case.dir / "captions.jsonl", seeded, history)
    rows = history_rows(history)
    last = closed_events(jsonl_records(case.dir / "captions.jsonl"))
    newest_ok = bool(rows and last and last[-1] in [r[0] for r in rows[:3]])
    row.note = (f"seeded {len(seeded)}; history holds {len(rows)}; the newest listed first: "
                f"{'yes' if newest_ok else 'no'}")
    return row


def case_clock_forward(base: Path) -> Row:
    return _clock_case(base, "clock_steps_forward_40_days", 40.0)


def case_clock_backward(base: Path) -> Row:
    return _clock_case(base, "clock_steps_back_40_days", -40.0)


def _disk_full(base: Path, name: str, free_at: Optional[float]) -> Row:
    fault = "the state directory's file system (a 16 MB tmpfs) fills up 6 s into the run" + (
        f", and is freed at {free_at:g} s" if free_at else " and stays full")
    goal = "every event kept" if free_at else "events kept, or dropped and counted"
    row = Row(name, fault, goal)
    case = Case(base, name)
    mount_tmpfs(case.state, "16m")
    history = case.state / "history.db"
    status: Dict[str, Any] = {}

    def during(serve: Serve) -> None:
        time.sleep(6.0)
        filler = fill(case.state)
        if free_at:
            time.sleep(free_at - 6.0)
            filler.unlink()
        else:
            time.sleep(18.0)
            status.update(api(serve, "/api/stats") or {})

    serve, code, ended = _run(case, case.config(), 30.0 if free_at else 25.0, during=during)
    row.exit_code = code
    row.unexpected_exits = int(ended or code != 0)
    _count(row, case, serve, case.dir / "captions.jsonl", [], history)
    row.note = _history_note(serve, status)
    return row


def _history_note(serve: Serve, status: Dict[str, Any]) -> str:
    """The history's counters as /api/stats showed them, and the service's last line about it."""
    counters = (status.get("sinks") or {}).get("history") if status else None
    said = [line for line in serve.stderr_text().splitlines() if "history" in line.lower()]
    return (f"history counters in /api/stats: {json.dumps(counters) if counters else 'none'}; "
            f"log: {said[-1][-140:] if said else '(nothing)'}")


def case_disk_full_recovers(base: Path) -> Row:
    return _disk_full(base, "disk_full_then_freed", 18.0)


def case_disk_full_forever(base: Path) -> Row:
    return _disk_full(base, "disk_full_for_good", None)


def case_read_only_at_start(base: Path) -> Row:
    row = Row("state_read_only_at_start", "the state directory is read-only at start (a tmpfs remounted ro), "
              "writable again at 10 s", "captions go on; every event kept")
    case = Case(base, row.case)
    mount_tmpfs(case.state, "64m")
    remount(case.state, "ro")

    def during(serve: Serve) -> None:
        time.sleep(10.0)
        remount(case.state, "rw")

    serve, code, ended = _run(case, case.config(), 24.0, during=during)
    row.exit_code = code
    row.unexpected_exits = int(ended or code != 0)
    _count(row, case, serve, case.dir / "captions.jsonl", [], case.state / "history.db")
    lines = [line for line in serve.stderr_text().splitlines() if line.strip()]
    row.note = f"said: {lines[-1][-140:] if ended and lines else 'ran on'}"
    return row


def case_read_only_mid_run(base: Path) -> Row:
    row = Row("state_read_only_mid_run", "the state directory's ext4 (a loop device, errors=remount-ro) fails "
              "6 s into the run and the kernel makes it read-only for good", "captions go on; what is not "
              "written is counted")
    case = Case(base, row.case)
    status: Dict[str, Any] = {}
    with ext4(case.state):
        def during(serve: Serve) -> None:
            time.sleep(6.0)
            ext4_error(case.state)
            time.sleep(12.0)
            status.update(api(serve, "/api/stats") or {})

        serve, code, ended = _run(case, case.config(), 20.0, during=during)
        _count(row, case, serve, case.dir / "captions.jsonl", [], case.state / "history.db")
    row.exit_code = code
    row.unexpected_exits = int(ended or code != 0)
    row.note = _history_note(serve, status)
    return row


def case_sighup(base: Path) -> Row:
    row = Row("sighup_after_logrotate", "captions.jsonl moved away (logrotate), then SIGHUP, 6 s into the run",
              "no exit; a new captions.jsonl; no caption lost")
    case = Case(base, row.case)
    jsonl = case.dir / "captions.jsonl"

    def during(serve: Serve) -> None:
        time.sleep(6.0)
        if jsonl.exists():
            jsonl.rename(case.dir / "captions.jsonl.1")
        serve.proc.send_signal(signal.SIGHUP)

    serve, code, ended = _run(case, case.config(), 16.0, during=during)
    row.exit_code = code
    row.unexpected_exits = int(ended or code != 0)
    _count(row, case, serve, jsonl, [], case.state / "history.db")
    lines = [line for line in serve.stderr_text().splitlines() if "HUP" in line or "reopen" in line.lower()]
    row.note = f"new file: {'yes' if jsonl.exists() else 'no'}; said: {lines[-1][-120:] if lines else '(nothing)'}"
    return row


def _silent_listener() -> Tuple[socket.socket, int, List[socket.socket]]:
    """A TCP port that accepts and never answers (a broker that hangs)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: List[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(sock.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    return sock, sock.getsockname()[1], held


def case_broker_stall(base: Path) -> Row:
    row = Row("broker_accepts_and_never_answers", "the MQTT broker accepts TCP and never sends CONNACK",
              "a warning within 10 s; captions go on")
    case = Case(base, row.case)
    listener, port, held = _silent_listener()
    serve = case.serve(case.config(mqtt=port))
    warned = wait_until(lambda: "MQTT" in serve.stderr_text() and re.search(
        r"(?i)mqtt.*(not answer|no answer|stall|did not|not accepted|lost|refused|closed|unreachable|not reach)",
        serve.stderr_text()), 20.0)
    after = time.monotonic() - serve.started
    code, ended = serve.stop()
    listener.close()
    for s in held:
        s.close()
    row.exit_code = code
    row.unexpected_exits = int(ended or code != 0)
    _count(row, case, serve, case.dir / "captions.jsonl", [], case.state / "history.db")
    row.note = f"warned after {after:.1f} s (from the start)" if warned else "no warning in 20 s"
    return row


def _static_clip(path: Path) -> Path:
    """The sample clip's first window looped: a camera whose caption (and event) never changes."""
    import cv2

    cap = cv2.VideoCapture(str(SAMPLE))
    frames = []
    while len(frames) < 16:
        ok, image = cap.read()
        if not ok:
            break
        frames.append(image)
    cap.release()
    height, width = frames[0].shape[:2]
    out = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 16.0, (width, height))
    for _ in range(4):
        for image in frames:
            out.write(image)
    out.release()
    return path


def _mosquitto(port: int, directory: Path) -> subprocess.Popen:
    conf = directory / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    proc = subprocess.Popen([_mosquitto_binary() or "mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_until(lambda: _connects(port), 5.0, 0.05)
    return proc


def _mosquitto_binary() -> Optional[str]:
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None)


def _connects(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


def _retained(port: int, topics: List[str], listen_s: float = 2.0) -> Dict[str, bytes]:
    """The retained messages of ``topics`` that a subscriber connecting now gets within ``listen_s``."""
    import paho.mqtt.client as mqtt

    got: Dict[str, bytes] = {}
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"faults-sub-{os.getpid()}-{time.time_ns()}")
    client.on_message = lambda c, u, m: got.__setitem__(m.topic, m.payload) if m.retain else None
    client.on_connect = lambda c, u, f, r, p: [c.subscribe(t, qos=1) for t in topics]
    try:
        client.connect("127.0.0.1", port)
    except OSError:
        return got
    client.loop_start()
    wait_until(lambda: all(t in got for t in topics), listen_s)
    client.loop_stop()
    client.disconnect()
    return got


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def case_broker_restart(base: Path) -> Row:
    row = Row("broker_restarts_without_retained", "the broker restarts and forgets its retained messages while "
              "the camera's event does not change", "the event and its thumbnail retained again within 10 s")
    case = Case(base, row.case)
    if _mosquitto_binary() is None:
        row.skipped = "no mosquitto"
        return row
    port = _free_port()
    broker = _mosquitto(port, case.dir)
    clip = _static_clip(case.dir / "still.mp4")
    serve = case.serve(case.config(mqtt=port, source=clip))
    topics = ["faults/front/event", "faults/front/event/thumbnail"]
    first = wait_until(lambda: len(_retained(port, topics)) == 2 and _retained(port, topics), 40.0, 1.0) or {}
    broker.terminate()
    broker.wait(5)
    broker = _mosquitto(port, case.dir)
    time.sleep(10.0)  # the sink reconnects (backoff up to 2 s here... 30 s at most) and may re-send
    again = _retained(port, topics, 3.0)
    code, ended = serve.stop()
    broker.terminate()
    broker.wait(5)
    row.exit_code = code
    row.unexpected_exits = int(ended or code != 0)
    _count(row, case, serve, case.dir / "captions.jsonl", [], case.state / "history.db")
    row.note = (f"before the restart: {', '.join(t.split('/', 2)[2] for t in first) or 'nothing'}; "
                f"after it: {', '.join(t.split('/', 2)[2] for t in again) or 'nothing'}")
    return row


class _Mjpeg:
    """An MJPEG stream over HTTP (the sample clip's frames) that stalls after ``play_s`` and may come back."""

    def __init__(self, play_s: float, stall_s: float) -> None:
        import cv2

        cap = cv2.VideoCapture(str(SAMPLE))
        self.jpegs: List[bytes] = []
        while True:
            ok, image = cap.read()
            if not ok:
                break
            self.jpegs.append(cv2.imencode(".jpg", image)[1].tobytes())
        cap.release()
        self.play_s, self.stall_s, self.connections = play_s, stall_s, 0
        mjpeg = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                mjpeg.connections += 1
                first = mjpeg.connections == 1
                self.send_response(200)
                self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
                self.end_headers()
                t0, i = time.monotonic(), 0
                with contextlib.suppress(OSError):
                    while time.monotonic() - t0 < (mjpeg.play_s if first else 3600):
                        jpeg = mjpeg.jpegs[i % len(mjpeg.jpegs)]
                        i += 1
                        self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n"
                                         % len(jpeg) + jpeg + b"\r\n")
                        time.sleep(1 / 16)
                    time.sleep(mjpeg.stall_s)  # the stream stalls: no byte, connection open

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/stream.mjpg"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _camera(case: Case, args: List[str], timeout: float) -> Tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "edgecap.cli", "camera", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=case.dir)
    return proc.returncode, proc.stdout, proc.stderr


def case_camera_stream_stalls(base: Path) -> Row:
    row = Row("camera_url_stream_stalls", "`edgecap camera URL`: the MJPEG stream stalls after 6 s",
              "one line and exit 1")
    case = Case(base, row.case)
    stream = _Mjpeg(6.0, 120.0)
    try:
        code, out, err = _camera(case, [stream.url], 60.0)
    finally:
        stream.close()
    row.exit_code = code
    row.unexpected_exits = 0 if code == 1 else 1
    row.captions_out = sum(1 for line in out.splitlines() if line.startswith("["))
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("BUNDLE")]
    row.note = f"said: {lines[-1][:140] if lines else '(nothing)'}"
    return row


def case_camera_stream_reconnects(base: Path) -> Row:
    row = Row("camera_url_reconnects", "`edgecap camera --reconnect URL`: the stream stalls after 6 s, the "
              "server answers the next connection", "captions again after the stall")
    case = Case(base, row.case)
    stream = _Mjpeg(6.0, 120.0)
    proc = subprocess.Popen([sys.executable, "-m", "edgecap.cli", "camera", "--reconnect", stream.url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=case.dir)
    time.sleep(40.0)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    stream.close()
    row.exit_code = proc.returncode
    row.unexpected_exits = 0 if proc.returncode == 130 else 1
    row.captions_out = sum(1 for line in out.splitlines() if line.startswith("["))
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("BUNDLE")]
    row.note = (f"connections: {stream.connections}; captions: {row.captions_out}; "
                f"said: {lines[-1][:120] if lines else '(nothing)'}")
    return row


def case_password_in_messages(base: Path) -> Row:
    row = Row("stream_password_in_messages", "a camera URL with a password: in a config error, and under "
              "`edgecap camera`", "the password nowhere")
    case = Case(base, row.case)
    secret = "S3cretPassw0rd"
    url = f"rtsp://viewer:{secret}@127.0.0.1:9/live"
    config = case.config(source=url)
    proc = subprocess.run([sys.executable, "-m", "edgecap.cli", "serve", "--config", str(config)],
                          capture_output=True, text=True, timeout=60, cwd=case.dir,
                          env=dict(os.environ, STATE_DIRECTORY=str(case.state)))
    code, out, err = _camera(case, [url], 60.0)
    leaks = (secret in proc.stderr) + (secret in proc.stdout) + (secret in err) + (secret in out)
    row.exit_code = proc.returncode
    row.foreign_touched = 0
    row.note = f"messages with the password: {leaks}; serve said: {proc.stderr.strip().splitlines()[-1][:120] if proc.stderr.strip() else ''}"
    row.unexpected_exits = 0
    return row


def case_two_services(base: Path) -> Row:
    row = Row("two_services_one_history", "a second `edgecap serve` (another port) names the same history",
              "the second refused in one line; the first goes on")
    case = Case(base, row.case)
    first = case.serve(case.config())
    time.sleep(6.0)
    second = case.serve(case.config(jsonl=case.dir / "captions-2.jsonl", name="second.toml"))
    ended = wait_until(second.exited, 12.0) is not None
    code2, _ = second.stop()
    code, first_ended = first.stop()
    row.exit_code = code2
    row.unexpected_exits = int(first_ended or code != 0) + (0 if ended and code2 == 2 else 1)
    _count(row, case, first, case.dir / "captions.jsonl", [], case.state / "history.db")
    lines = [line for line in second.stderr_text().splitlines() if line.strip()]
    row.note = f"second: exit {code2}; said: {lines[-1][:120] if lines else '(nothing)'}"
    return row


def case_umask(base: Path) -> Row:
    row = Row("fresh_history_under_umask_022", "a fresh history created with umask 022 (outside systemd)",
              "history.db 0600")
    case = Case(base, row.case)
    serve = case.serve(case.config(), umask=0o022)
    wait_until(lambda: (case.state / "history.db").exists(), 20.0)
    time.sleep(3.0)
    code, ended = serve.stop()
    row.exit_code = code
    row.unexpected_exits = int(ended or code != 0)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in sorted(case.state.iterdir()) if p.is_file()}
    row.note = f"modes: {json.dumps(modes)}"
    row.foreign_touched = 0
    return row


CASES: Dict[str, Tuple[Callable[[Path], Row], bool]] = {  # name: (run, needs root)
    "history_is_a_device": (case_history_device, True),
    "history_is_a_fifo": (case_history_fifo, False),
    "history_is_the_config": (case_history_config, False),
    "history_is_the_jsonl_file": (case_history_jsonl, False),
    "history_is_a_text_file": (case_history_text, False),
    "history_is_a_foreign_sqlite": (case_history_foreign_sqlite, False),
    "history_is_a_symlink": (case_history_symlink, False),
    "history_locked_at_start": (case_locked_history, False),
    "clock_steps_forward_40_days": (case_clock_forward, False),
    "clock_steps_back_40_days": (case_clock_backward, False),
    "disk_full_then_freed": (case_disk_full_recovers, True),
    "disk_full_for_good": (case_disk_full_forever, True),
    "state_read_only_at_start": (case_read_only_at_start, True),
    "state_read_only_mid_run": (case_read_only_mid_run, True),
    "sighup_after_logrotate": (case_sighup, False),
    "broker_accepts_and_never_answers": (case_broker_stall, False),
    "broker_restarts_without_retained": (case_broker_restart, False),
    "camera_url_stream_stalls": (case_camera_stream_stalls, False),
    "camera_url_reconnects": (case_camera_stream_reconnects, False),
    "stream_password_in_messages": (case_password_in_messages, False),
    "two_services_one_history": (case_two_services, False),
    "fresh_history_under_umask_022": (case_umask, False),
}


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def table(rows: List[Row]) -> str:
    head = ("case", "exit", "unexp. exits", "events kept/expected", "captions lost", "foreign touched", "note")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.skipped:
            lines.append(f"| {r.case} | skipped: {r.skipped} |" + " |" * (len(head) - 2))
            continue
        events = "-" if r.events_expected is None else f"{r.events_kept}/{r.events_expected}"
        if r.dropped_counted:
            events += f" (+{r.dropped_counted} counted as not written)"
        lines.append("| " + " | ".join([r.case, _cell(r.exit_code), str(r.unexpected_exits), events,
                                        _cell(r.captions_lost), str(r.foreign_touched),
                                        r.note.replace("|", "/")]) + " |")
    return "\n".join(lines)


def _in_namespace() -> bool:
    """Re-runs the bench in a private mount namespace when root; True when this process is in one."""
    if os.environ.get(_NS_ENV) == "1":
        return True
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    env = dict(os.environ, **{_NS_ENV: "1"})
    sys.stdout.flush()
    os.execvpe("unshare", ["unshare", "-m", "--propagation", "private", sys.executable, *sys.argv], env)
    return True  # not reached


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all): "
                                                    + ", ".join(CASES))
    parser.add_argument("--json", type=Path, help="also write the rows here as JSON")
    parser.add_argument("--label", default="", help="a label for this run in the JSON (e.g. before, after)")
    args = parser.parse_args(argv)
    names = [n for n in args.cases.split(",") if n] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"{PROG}: error: unknown case {unknown[0]!r}; the cases are {', '.join(CASES)}", file=sys.stderr)
        return 2
    if args.json is not None and not args.json.parent.is_dir():
        print(f"{PROG}: error: --json {args.json}: no such directory", file=sys.stderr)
        return 2
    root = os.geteuid() == 0 and _in_namespace()
    rows: List[Row] = []
    load_before = os.getloadavg()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="faults-bench-") as tmp:
        base = Path(tmp)
        for name in names:
            run, needs_root = CASES[name]
            if needs_root and not root:
                rows.append(Row(name, "", "", skipped="needs root (mounts, a device node)"))
                continue
            t0 = time.monotonic()
            try:
                row = run(base)
            except Exception as exc:  # one case's trouble is a row, not the end of the bench
                row = Row(name, "", "", note=f"bench error: {type(exc).__name__}: {exc}")
            finally:
                unmount_all()
            row.seconds = round(time.monotonic() - t0, 1)
            rows.append(row)
            print(f"{name}: {row.note}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    print(table(rows))
    print(f"\nload average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}; "
          f"after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; "
          f"{time.monotonic() - started:.0f} s; {os.cpu_count()} CPUs")
    if args.json is not None:
        doc = {"command": " ".join([PROG, *(argv if argv is not None else sys.argv[1:])]), "label": args.label,
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "measured": True,
               "load_average": {"before": load_before, "after": load_after}, "rows": [asdict(r) for r in rows]}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
