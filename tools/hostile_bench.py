"""The status server under hostile clients, measured: ``python tools/hostile_bench.py``.

Runs ``edgecap serve`` as systemd would (a notify socket, SIGTERM to stop) on
a looping file camera (the shipped sample clip), measures the camera's frame
rate with no client at all (``--baseline-seconds``), ``/healthz`` with the
scrapers alone (as long: on a busy host, the control), then holds for ``--seconds``:

* ``--slow-clients`` connections that send a partial request head and then one
  byte every ``--byte-interval`` seconds, and reconnect as soon as the server
  drops them (slowloris; no token needed),
* ``--scrapers`` clients that each fetch ``/healthz`` every ``--scrape-interval``
  seconds on a fresh connection,

and reports the ``/healthz`` latency (p50, p99, max, failures), the camera's
frames per second with and without the attack, the service's resident memory
and CPU, how many slow connections the server dropped and how long it let them
live, and the host's ``ListenOverflows`` (SYNs dropped for a full backlog)
during the attack. Goals: p99 at most 100 ms, frame rate unchanged (within 5 %),
RSS bounded (growth under 50 MB).

Prints a table and writes JSON (``--json``). Every figure is *measured* on this
host. The scrapers run in this process, the slow clients in a child of it at nice
10 (each on an asyncio loop): a real attacker's churn costs the board no CPU, and
here it must not delay the scrapers' clock. ``slow_opened`` and ``slow_dropped``
show whether the attackers kept their pace. Bad input exits 2 with one line,
Ctrl-C 130 and SIGTERM 143 (the service is killed on the way out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import psutil

from edgecap.bundle import DEMO_DIR
from edgecap.command import run_command
from edgecap.errors import ConfigError
from edgecap.outputs import check_output, write_text

PROG = "python tools/hostile_bench.py"
GOAL_P99_MS = 100.0
GOAL_FPS_RATIO = 0.95
GOAL_RSS_GROWTH_MB = 50.0
ATTACKER_NICE = 10
_PROCESSED = re.compile(r'^edgecap_frames_processed_total\{[^}]*\} (\S+)$', re.M)
_DROPPED = re.compile(r'^edgecap_http_connections_dropped_total\{reason="(\w+)"\} (\S+)$', re.M)


@dataclass
class Counts:
    """What the clients saw."""

    slow_opened: int = 0
    slow_dropped: int = 0  # closed or reset by the server
    slow_refused: int = 0  # could not connect
    slow_held_s: List[float] = field(default_factory=list)  # connect to drop, per dropped connection
    scrape_ms: List[float] = field(default_factory=list)
    scrape_status: Dict[str, int] = field(default_factory=dict)
    scrape_failed: int = 0  # no answer within 5 s, or a connection error


def _config(directory: Path, port: int) -> Path:
    path = directory / "edgecap.toml"
    path.write_text("\n".join([
        f'bundle = "{DEMO_DIR / "bundle"}"', "", "[http]", f"port = {port}", "",
        "[sinks.stdout]", "enabled = false", "",
        "[[cameras]]", 'name = "cam0"', f'source = "{DEMO_DIR / "sample.mp4"}"', "loop = true", ""]))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _get(port: int, path: str, timeout: float = 5.0) -> bytes:
    """One GET on a fresh connection; the whole answer (the server closes after it)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


async def _metrics(port: int) -> Tuple[float, Dict[str, int]]:
    """Frames processed, and connections the server dropped by reason, from ``/metrics``."""
    text = (await _get(port, "/metrics")).decode("latin-1")
    dropped = {reason: int(float(n)) for reason, n in _DROPPED.findall(text)}
    return sum(float(m) for m in _PROCESSED.findall(text)), dropped


async def _slow_client(port: int, byte_interval: float, stop: asyncio.Event, counts: Counts) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            counts.slow_refused += 1
            await asyncio.sleep(1.0)
            continue
        counts.slow_opened += 1
        opened = time.monotonic()
        try:
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # a head that never ends
            while not stop.is_set():
                try:
                    data = await asyncio.wait_for(reader.read(1024), byte_interval)
                except asyncio.TimeoutError:
                    writer.write(b"a")
                    continue
                if not data:  # an answer (a refusal) is followed by the close, counted then
                    counts.slow_dropped += 1
                    counts.slow_held_s.append(time.monotonic() - opened)
                    break
        except OSError:  # reset by the server
            counts.slow_dropped += 1
            counts.slow_held_s.append(time.monotonic() - opened)
        finally:
            writer.close()


async def _scraper(port: int, interval: float, stop: asyncio.Event, counts: Counts) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            answer = await _get(port, "/healthz")
            counts.scrape_ms.append((time.perf_counter() - t0) * 1e3)
            status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") else "none"
            counts.scrape_status[status] = counts.scrape_status.get(status, 0) + 1
        except (OSError, asyncio.TimeoutError):
            counts.scrape_failed += 1
        await asyncio.sleep(max(0.0, interval - (time.perf_counter() - t0)))


def _slow_clients(port: int, n: int, byte_interval: float, stop: Any, pipe: Any) -> None:
    """The slow clients, in a process of their own: their churn must not delay the scrapers' clock."""
    # A real attacker runs elsewhere; on this host it yields the CPU to the service and
    # the scrapers when they want it (slow_opened shows whether it kept its pace).
    os.nice(ATTACKER_NICE)

    async def attack() -> Counts:
        counts, done = Counts(), asyncio.Event()
        tasks = [asyncio.create_task(_slow_client(port, byte_interval, done, counts)) for _ in range(n)]
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        done.set()
        for task in tasks:  # a client waiting out its byte interval stops now, uncounted
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return counts

    pipe.send(asyncio.run(attack()))


async def _phase(port: int, ps: psutil.Process, seconds: float, slow: int, scrapers: int,
                 byte_interval: float, scrape_interval: float) -> Dict[str, Any]:
    """Runs the clients for ``seconds``; returns what they saw, the frame rate, RSS and CPU."""
    fork = multiprocessing.get_context("fork")  # before this process has threads of its own
    stop, (ours, theirs) = fork.Event(), fork.Pipe(duplex=False)
    attacker = fork.Process(target=_slow_clients, args=(port, slow, byte_interval, stop, theirs), daemon=True)
    if slow:
        attacker.start()
    counts, done = Counts(), asyncio.Event()
    tasks = [asyncio.create_task(_scraper(port, scrape_interval, done, counts)) for _ in range(scrapers)]
    (count0, dropped0), cpu0, t0 = await _metrics(port), sum(ps.cpu_times()[:2]), time.monotonic()
    rss = [ps.memory_info().rss]
    while time.monotonic() - t0 < seconds:
        await asyncio.sleep(min(1.0, max(0.0, seconds - (time.monotonic() - t0))))
        rss.append(ps.memory_info().rss)
    (count1, dropped1), cpu1, elapsed = await _metrics(port), sum(ps.cpu_times()[:2]), time.monotonic() - t0
    fds = ps.num_fds()
    done.set()
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    if slow:
        slow_counts: Counts = ours.recv()
        attacker.join()
        for name in ("slow_opened", "slow_dropped", "slow_refused", "slow_held_s"):
            setattr(counts, name, getattr(slow_counts, name))
    return {"counts": counts, "fps": (count1 - count0) / elapsed, "cpu": (cpu1 - cpu0) / elapsed,
            "rss": rss, "seconds": elapsed, "fds": fds,
            "server_dropped": {k: n - dropped0.get(k, 0) for k, n in dropped1.items()}}


def _listen_overflows() -> Optional[int]:
    """The host's TcpExt ListenOverflows (connections the kernel dropped for a full backlog)."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:]))
            return int(table["ListenOverflows"]) if "ListenOverflows" in table else None
    return None


def _pct(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(seconds: float = 60.0, baseline_seconds: float = 20.0, slow_clients: int = 500, scrapers: int = 20,
        byte_interval: float = 10.0, scrape_interval: float = 0.1) -> Dict[str, Any]:
    """Starts the service, measures it alone and under attack, stops it; returns the figures."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = slow_clients + scrapers + 256
    if soft < need:  # the clients' sockets are ours; the service keeps the limit it is given
        if hard != resource.RLIM_INFINITY and hard < need:
            raise ConfigError(f"--slow-clients {slow_clients} needs {need} open files and the hard "
                              f"limit is {hard}; use fewer or raise it (ulimit -Hn)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        port = _free_port()
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(directory / "notify.sock"))
        notify.settimeout(60)
        env = dict(os.environ, NOTIFY_SOCKET=str(directory / "notify.sock"))
        proc = subprocess.Popen([sys.executable, "-m", "edgecap.cli", "serve", "--config",
                                 str(_config(directory, port))],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
        try:
            while b"READY=1" not in notify.recv(4096):
                pass
            ps = psutil.Process(proc.pid)
            time.sleep(2.0)  # the first windows fill; the camera reaches its pace
            alone = asyncio.run(_phase(port, ps, baseline_seconds, 0, 0, byte_interval, scrape_interval))
            # The same scrapers without the attack: on a busy host, what the attack adds.
            scraped = asyncio.run(_phase(port, ps, baseline_seconds, 0, scrapers, byte_interval,
                                         scrape_interval))
            overflows = _listen_overflows()
            attacked = asyncio.run(_phase(port, ps, seconds, slow_clients, scrapers, byte_interval,
                                          scrape_interval))
            after = _listen_overflows()
            overflows = None if overflows is None or after is None else after - overflows
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        finally:
            proc.kill()
            proc.wait()
            notify.close()
    c: Counts = attacked["counts"]
    rss_before = alone["rss"][-1] / 2**20
    rss_peak = max(attacked["rss"]) / 2**20
    result = {
        "seconds": round(attacked["seconds"], 1),
        "slow_clients": slow_clients, "scrapers": scrapers,
        "byte_interval_s": byte_interval, "scrape_interval_s": scrape_interval,
        "service_nofile_soft": soft,
        "attacker_nice": ATTACKER_NICE,
        "healthz_requests": len(c.scrape_ms),
        "healthz_ms_p50": round(_pct(c.scrape_ms, 0.50), 2),
        "healthz_ms_p99": round(_pct(c.scrape_ms, 0.99), 2),
        "healthz_ms_max": round(max(c.scrape_ms, default=float("nan")), 2),
        "healthz_status": c.scrape_status,
        "healthz_ms_p50_without_attack": round(_pct(scraped["counts"].scrape_ms, 0.50), 2),
        "healthz_ms_p99_without_attack": round(_pct(scraped["counts"].scrape_ms, 0.99), 2),
        "healthz_failed": c.scrape_failed,
        "fps_alone": round(alone["fps"], 2),
        "fps_attacked": round(attacked["fps"], 2),
        "cpu_alone": round(alone["cpu"], 3),
        "cpu_attacked": round(attacked["cpu"], 3),
        "rss_mb_before": round(rss_before, 1),
        "rss_mb_peak": round(rss_peak, 1),
        "rss_mb_last": round(attacked["rss"][-1] / 2**20, 1),
        "fds_at_end_of_attack": attacked["fds"],
        "listen_overflows": overflows,
        "slow_opened": c.slow_opened,
        "slow_dropped": c.slow_dropped,
        "slow_refused": c.slow_refused,
        "server_dropped": attacked["server_dropped"],
        "slow_held_s_median": round(statistics.median(c.slow_held_s), 2) if c.slow_held_s else None,
        "slow_held_s_max": round(max(c.slow_held_s), 2) if c.slow_held_s else None,
        "exit_code": proc.returncode,
    }
    result["goals"] = {
        f"healthz p99 <= {GOAL_P99_MS:.0f} ms": result["healthz_ms_p99"] <= GOAL_P99_MS and c.scrape_failed == 0,
        f"fps attacked >= {GOAL_FPS_RATIO:.0%} of alone": attacked["fps"] >= GOAL_FPS_RATIO * alone["fps"] > 0,
        f"RSS growth < {GOAL_RSS_GROWTH_MB:.0f} MB": rss_peak - rss_before < GOAL_RSS_GROWTH_MB,
    }
    return result


def format_table(r: Dict[str, Any]) -> str:
    """The figures as the table the command prints (every one measured on this host)."""
    rows = [
        ("attack", f"{r['slow_clients']} slow clients (1 byte / {r['byte_interval_s']:g} s) + "
                   f"{r['scrapers']} scrapers (every {r['scrape_interval_s']:g} s), {r['seconds']:.0f} s"),
        ("/healthz p50 / p99 / max", f"{r['healthz_ms_p50']:.1f} / {r['healthz_ms_p99']:.1f} / "
                                     f"{r['healthz_ms_max']:.1f} ms over {r['healthz_requests']} requests"),
        ("/healthz status / failed", f"{r['healthz_status']} / {r['healthz_failed']}"),
        ("/healthz p50 / p99, scrapers alone", f"{r['healthz_ms_p50_without_attack']:.1f} / "
                                               f"{r['healthz_ms_p99_without_attack']:.1f} ms"),
        ("camera fps alone / attacked", f"{r['fps_alone']:.2f} / {r['fps_attacked']:.2f}"),
        ("service CPU alone / attacked", f"{100 * r['cpu_alone']:.0f}% / {100 * r['cpu_attacked']:.0f}%"),
        ("RSS MB before / peak / last", f"{r['rss_mb_before']:.0f} / {r['rss_mb_peak']:.0f} / "
                                        f"{r['rss_mb_last']:.0f}"),
        ("slow connections opened / dropped / refused",
         f"{r['slow_opened']} / {r['slow_dropped']} / {r['slow_refused']}"),
        ("server's drops by reason", ", ".join(f"{k} {n}" for k, n in r["server_dropped"].items())),
        ("slow connection life median / max", f"{r['slow_held_s_median']} / {r['slow_held_s_max']} s"),
        ("ListenOverflows during the attack (host)", str(r["listen_overflows"])),
        ("service exit code", str(r["exit_code"])),
    ] + [(f"goal: {goal}", "met" if met else "MISSED") for goal, met in r["goals"].items()]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the measurement from the command line.

    Args:
      argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
      The exit code: 0, or 2 on bad input.
    """
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the attack (1 to 3600)")
    parser.add_argument("--baseline-seconds", type=float, default=20.0,
                        help="length of the run without clients, and of the scrapers alone (1 to 3600)")
    parser.add_argument("--slow-clients", type=int, default=500, help="0 to 10000")
    parser.add_argument("--scrapers", type=int, default=20, help="0 to 1000")
    parser.add_argument("--byte-interval", type=float, default=10.0,
                        help="seconds between a slow client's bytes (0.1 to 600)")
    parser.add_argument("--scrape-interval", type=float, default=0.1,
                        help="seconds between a scraper's requests (0.001 to 60)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    def body() -> int:
        for name, lo, hi in (("seconds", 1, 3600), ("baseline_seconds", 1, 3600), ("slow_clients", 0, 10000),
                             ("scrapers", 0, 1000), ("byte_interval", 0.1, 600), ("scrape_interval", 0.001, 60)):
            value = getattr(args, name)
            if not lo <= value <= hi:
                raise ConfigError(f"--{name.replace('_', '-')} {value}: out of range; use {lo} to {hi}")
        if args.json is not None:
            check_output(args.json, "--json")  # before the run, not after it
        result = run(args.seconds, args.baseline_seconds, args.slow_clients, args.scrapers,
                     args.byte_interval, args.scrape_interval)
        print(format_table(result))
        if args.json is not None:
            write_text(args.json, json.dumps({"host": "measured", **result}, indent=1) + "\n")
        return 0

    return run_command(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
