"""`python tools/service_bench.py`: one short measured run of `edgecap serve`, as systemd runs it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "service_bench.py"


def _load():
    spec = importlib.util.spec_from_file_location("service_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_short_run_measures_the_service_and_it_exits_0():
    bench = _load()
    run = bench.run_service(seconds=1.0, cameras=1, scrapes=3)
    assert run["exit_code"] == 0 and run["cameras"] == 1
    assert 0 < run["ready_s"] < 60 and 0 <= run["stop_s"] < 10
    assert run["fps_processed"] > 0 and run["rss_mb_peak"] >= run["rss_mb_first"] > 0
    assert run["scrape_ms_p99"] >= run["scrape_ms_p50"] > 0
    table = bench.format_table([run])
    assert table.splitlines()[0].split()[0] == "cameras" and len(table.splitlines()) == 2
