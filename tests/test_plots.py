"""edgecap_lab.plots: the bench chart drawn from a result `edgecap bench --json` wrote (the one in docs/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from edgecap_lab.plots import plot_bench  # noqa: E402

# Not in the fast tier: matplotlib's first figure takes over 2 s (the full suite runs it).

REPO = Path(__file__).resolve().parent.parent


def test_the_bench_chart_of_a_saved_result_is_a_png(tmp_path):
    result = json.loads((REPO / "results" / "bench-results.json").read_text())
    assert len({r["profile"] for r in result["rows"]}) >= 2
    out = tmp_path / "bench.png"
    plot_bench(result, out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
