"""The service's goals, measured from outside: ``python tools/service_bench.py``.

Runs ``edgecap serve`` as systemd would (a notify socket, SIGTERM to stop) on
looping file cameras (the shipped sample clip) and measures, all on this host:

* start to READY=1 (a plan cache already warm: the demo's CPU plan needs none),
* resident memory every few seconds over the run, and its growth after the
  first minute,
* the latency of a ``/metrics`` scrape over HTTP,
* frames processed per second with one camera and with two sharing the devices,
* SIGTERM to exit, and that the process exits 0.

Prints a table and writes JSON (``--json``). Every figure is *measured* here.
Bad input (an unwritable ``--json``, checked before the runs) exits 2 with one
line, Ctrl-C 130 and SIGTERM 143 (the service it started is killed on the way out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

import psutil

from edgecap.bundle import DEMO_DIR
from edgecap.command import run_command
from edgecap.outputs import check_output, write_text

PROG = "python tools/service_bench.py"


def _config(directory: Path, port: int, cameras: int) -> Path:
    lines = [f'bundle = "{DEMO_DIR / "bundle"}"', "", "[http]", f"port = {port}", "",
             "[sinks.stdout]", "enabled = false", "",
             "[sinks.jsonl]", f'path = "{directory / "captions.jsonl"}"', ""]
    for n in range(cameras):
        lines += ["[[cameras]]", f'name = "cam{n}"', f'source = "{DEMO_DIR / "sample.mp4"}"',
                  "loop = true", ""]
    path = directory / "edgecap.toml"
    path.write_text("\n".join(lines))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processed(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(m) for m in re.findall(r'^edgecap_frames_processed_total\{[^}]*\} (\S+)$', text, re.M))


def run_service(seconds: float, cameras: int, scrapes: int = 200) -> Dict[str, Any]:
    """Runs the service for ``seconds`` on ``cameras`` looping cameras; returns the measurements."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        port = _free_port()
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(directory / "notify.sock"))
        notify.settimeout(30)
        env = dict(os.environ, NOTIFY_SOCKET=str(directory / "notify.sock"))
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "edgecap.cli", "serve", "--config",
                                 str(_config(directory, port, cameras))],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            while b"READY=1" not in notify.recv(4096):
                pass
            ready_s = time.monotonic() - started
            ps = psutil.Process(proc.pid)
            rss: List[tuple] = []
            t0 = time.monotonic()
            count0 = _processed(port)
            while time.monotonic() - t0 < seconds:
                rss.append((round(time.monotonic() - t0, 1), ps.memory_info().rss))
                time.sleep(min(5.0, max(0.5, seconds / 60)))
            elapsed = time.monotonic() - t0
            fps = (_processed(port) - count0) / elapsed
            scrape_ms = []
            for _ in range(scrapes):
                s0 = time.perf_counter()
                _processed(port)
                scrape_ms.append((time.perf_counter() - s0) * 1e3)
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            stop_s = time.monotonic() - sent
        finally:
            proc.kill()
            notify.close()
        captions = (directory / "captions.jsonl").read_text().splitlines()
    after_minute = [r for t, r in rss if t >= 60.0] or [r for _, r in rss]
    return {
        "cameras": cameras,
        "seconds": round(elapsed, 1),
        "ready_s": round(ready_s, 3),
        "stop_s": round(stop_s, 3),
        "exit_code": proc.returncode,
        "fps_processed": round(fps, 2),
        "captions": len(captions),
        "rss_mb_first": round(rss[0][1] / 2**20, 1),
        "rss_mb_peak": round(max(r for _, r in rss) / 2**20, 1),
        "rss_mb_last": round(rss[-1][1] / 2**20, 1),
        "rss_growth_after_first_minute": round(after_minute[-1] / after_minute[0] - 1.0, 4),
        "scrape_ms_p50": round(statistics.median(scrape_ms), 2),
        "scrape_ms_p99": round(sorted(scrape_ms)[int(0.99 * (len(scrape_ms) - 1))], 2),
        "rss_samples": [(t, round(r / 2**20, 2)) for t, r in rss],
    }


def format_table(runs: List[Dict[str, Any]]) -> str:
    """The runs as the table the command prints (every figure measured on this host)."""
    head = ("cameras", "s", "READY s", "frames/s", "captions", "RSS MB first/peak/last",
            "growth >1 min", "scrape p50/p99 ms", "SIGTERM->exit s", "exit")
    rows = [head] + [(
        str(r["cameras"]), f"{r['seconds']:.0f}", f"{r['ready_s']:.2f}", f"{r['fps_processed']:.1f}",
        str(r["captions"]), f"{r['rss_mb_first']:.0f}/{r['rss_mb_peak']:.0f}/{r['rss_mb_last']:.0f}",
        f"{100 * r['rss_growth_after_first_minute']:+.1f}%",
        f"{r['scrape_ms_p50']:.1f}/{r['scrape_ms_p99']:.1f}", f"{r['stop_s']:.2f}",
        str(r["exit_code"])) for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows)


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the measurements from the command line.

    Args:
      argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
      The exit code: 0, or 2 on bad input.
    """
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="length of the one-camera run")
    parser.add_argument("--two-camera-seconds", type=float, default=60.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    def body() -> int:
        if args.json is not None:
            check_output(args.json, "--json")  # before ten minutes of runs, not after them
        runs = [run_service(args.seconds, 1)]
        if args.two_camera_seconds > 0:
            runs.append(run_service(args.two_camera_seconds, 2))
        print(format_table(runs))
        if args.json is not None:
            write_text(args.json, json.dumps({"host": "measured", "runs": runs}, indent=1) + "\n")
        return 0

    return run_command(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
