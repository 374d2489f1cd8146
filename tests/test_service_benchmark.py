"""`python -m edgecap.service.benchmark`: one short measured run of `edgecap serve`, as systemd runs it."""

from __future__ import annotations

import pytest

from edgecap.service.benchmark import format_table, run_service

pytestmark = pytest.mark.fast


def test_a_short_run_measures_the_service_and_it_exits_0():
    run = run_service(seconds=1.0, cameras=1, scrapes=3)
    assert run["exit_code"] == 0 and run["cameras"] == 1
    assert 0 < run["ready_s"] < 60 and 0 <= run["stop_s"] < 10
    assert run["fps_processed"] > 0 and run["rss_mb_peak"] >= run["rss_mb_first"] > 0
    assert run["scrape_ms_p99"] >= run["scrape_ms_p50"] > 0
    table = format_table([run])
    assert table.splitlines()[0].split()[0] == "cameras" and len(table.splitlines()) == 2
