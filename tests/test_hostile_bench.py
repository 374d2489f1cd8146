"""`python tools/hostile_bench.py`: a few seconds with a few hostile clients, to check that it runs.

The goals (p99, fps, RSS) are not asserted here: a short run on a loaded
machine says nothing about them. results/hostile-bench.json holds a full run.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "hostile_bench.py"


def _load():
    spec = importlib.util.spec_from_file_location("hostile_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_short_run_measures_healthz_fps_and_rss(tmp_path, capsys) -> None:
    bench = _load()
    out = tmp_path / "hostile.json"
    assert bench.main(["--seconds", "3", "--baseline-seconds", "2", "--slow-clients", "5",
                       "--scrapers", "2", "--byte-interval", "1", "--scrape-interval", "0.2",
                       "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["host"] == "measured" and r["exit_code"] == 0
    assert r["healthz_requests"] > 10 and r["healthz_failed"] == 0
    assert r["healthz_ms_p99"] >= r["healthz_ms_p50"] > 0
    assert r["fps_alone"] > 0 and r["fps_attacked"] > 0 and r["rss_mb_peak"] > 0
    # Held, not refused; the server's 10 s head deadline is past the end (tests/test_http_hostile.py).
    assert r["slow_opened"] == 5 and r["slow_dropped"] == 0 and r["slow_refused"] == 0
    table = capsys.readouterr().out
    assert table.startswith("attack ") and "/healthz p50 / p99 / max" in table and "goal: " in table
