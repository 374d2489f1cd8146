"""Latency percentiles: each one is its own figure, worked out by hand, through every layer."""

from __future__ import annotations

import time

import pytest

from edgecap.scheduler import Pipeline, Step
from edgecap.stats import RunRecorder, summarize


def test_summarize_gives_each_percentile_by_linear_interpolation() -> None:
    # numpy's linear method: the q-th percentile of n sorted values sits at
    # position q/100 * (n - 1). For 1..100: 49.5 -> 50.5, 89.1 -> 90.1, 98.01 -> 99.01.
    got = summarize([float(v) for v in reversed(range(1, 101))])
    assert got == pytest.approx({"p50": 50.5, "p90": 90.1, "p99": 99.01, "mean": 50.5})


def test_summarize_of_a_tail_keeps_the_tail() -> None:
    # 95 fast windows and 5 slow ones: the median is fast, p99 is slow.
    # p90 sits at position 89.1 (fast); p99 at 98.01, between the 1st and 2nd slow ones.
    got = summarize([2.0] * 95 + [100.0, 200.0, 300.0, 400.0, 500.0])
    assert got["p50"] == got["p90"] == 2.0
    assert got["p99"] == pytest.approx(400.0 + 0.01 * 100.0)
    assert got["mean"] == pytest.approx((2.0 * 95 + 1500.0) / 100)


def test_summarize_of_nothing_is_empty() -> None:
    assert summarize([]) == {}


def test_run_statistics_report_each_percentile() -> None:
    rec = RunRecorder(steps=[("s", "cpu")], queues=[])
    for ms in range(1, 101):
        t_in = float(ms)
        rec.item_in(t_in)
        rec.item_out(t_in, t_in + ms / 1000.0)
    rec.finish()
    lat = rec.snapshot().latency_ms
    assert lat == pytest.approx({"p50": 50.5, "p90": 90.1, "p99": 99.01, "mean": 50.5})


def test_a_pipeline_with_slow_items_reports_them_in_its_tail() -> None:
    # Sequential schedule: an item's latency is its own work. One item in four
    # sleeps 30 ms, the rest nothing, so p50 is fast and p90 and p99 are slow.
    def work(i):
        if i % 4 == 3:
            time.sleep(0.03)
        return i

    with Pipeline([Step("work", "cpu", lambda: work)], pipelined=False) as pipe:
        assert list(pipe.run(range(40))) == list(range(40))
        lat = pipe.stats().latency_ms
    assert lat["p50"] < 15.0
    assert lat["p90"] >= 29.0 and lat["p99"] >= 29.0
    assert lat["p50"] <= lat["p90"] <= lat["p99"]
