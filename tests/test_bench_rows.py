"""`edgecap bench` keeps each row as it finishes, and marks a row a failover or fallback ran through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import write_noise_clip
from edgecap import faults
from edgecap_lab import bench
from edgecap_lab.bench import OFF_PLAN, format_table, run_bench
from edgecap.cli import main
from edgecap.errors import RunFailure


@pytest.fixture(autouse=True)
def plan_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg"))


pytestmark = pytest.mark.usefixtures("no_faults")


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return write_noise_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", 24, 80)


def test_a_failure_at_the_last_row_keeps_the_rows_done_in_the_json(clip, shipped_bundle, tmp_path,
                                                                   monkeypatch, capsys):
    measure = bench._measure

    def last_row_fails(profile, schedule, *args, **kwargs):
        if schedule == "d timing-only":  # the board's last row
            raise RunFailure("injected: the last row failed")  # as a stage that raised
        return measure(profile, schedule, *args, **kwargs)

    monkeypatch.setattr(bench, "_measure", last_row_fails)
    out = tmp_path / "bench.json"
    code = main(["bench", "--bundle", str(shipped_bundle), "--clips", str(clip), "--frames", "32",
                 "--profiles", "board", "--json", str(out)])
    assert code == 1
    captured = capsys.readouterr()
    assert "injected: the last row failed" in captured.err
    doc = json.loads(out.read_text())
    assert doc["complete"] is False
    assert [r["schedule"] for r in doc["rows"]] == ["a", "b", "e", "c", "d"]
    assert all(r["fps"] > 0 and r["plan_held"] for r in doc["rows"])
    assert doc["rows"][0]["speedup"] == 1.0
    # Each was printed as it finished, too.
    printed = [line for line in captured.out.splitlines() if line.startswith("[devboard-usb")]
    assert [line.split("]")[1].split()[0] for line in printed] == ["a", "b", "e", "c", "d"]


def test_a_complete_run_says_so(clip, shipped_bundle, tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "--bundle", str(shipped_bundle), "--clips", str(clip), "--frames", "16",
                 "--profiles", "board", "--timing-only", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and len(doc["rows"]) == 5 and "goals" in doc


def test_a_row_a_failover_ran_through_says_so_instead_of_passing_for_the_plan(clip, shipped_bundle):
    def fail_after_row_a(row):
        # Rows b, e, c and d run on the board's PCIe TPU; it fails once, somewhere in them.
        # (Row a, CPU only, would refuse a fault on a TPU it lacks.)
        if row.schedule == "a":
            faults.inject("emu-tpu:0=fail@60")

    result = run_bench(shipped_bundle, [str(clip)], 32, "devboard-usb", ["board"], timing_only=True,
                       on_row=fail_after_row_a)
    (off,) = [r for r in result.rows if not r.plan_held]
    assert off.schedule in ("b", "e", "c", "d")
    assert "emu-tpu:0" not in off.placement.values()  # where its stage ran at the end: elsewhere
    assert len(off.incidents) == 1 and off.incidents[0].startswith("failover")
    assert all(r.incidents == [] for r in result.rows if r is not off)
    table = format_table(result.rows, result.overhead)
    marked = [line for line in table.splitlines() if line.startswith(f"{off.schedule} ")]
    assert len(marked) == 1 and f" {OFF_PLAN} " in marked[0]
    assert f"{OFF_PLAN} devboard-usb (emulated) {off.schedule}: not the plan's fps: failover" in table
    assert result.to_json()["rows"][result.rows.index(off)]["plan_held"] is False


def test_host_loops_run_the_rounds_asked_for_interleaved_and_keep_their_median(clip, shipped_bundle):
    seen = []
    result = run_bench(shipped_bundle, [str(clip)], 16, profiles=["host"], host_seconds=1.0, host_rounds=2,
                       on_round=seen.append)
    host = [r for r in result.rows if r.profile == "host"]
    assert [r.schedule for r in host] == list(bench.host_bench.LOOPS)
    assert all(len(r.fps_rounds) == 2 and r.same_captions for r in host)
    # The median of two rounds is their mean.
    assert all(r.fps == pytest.approx(sum(r.fps_rounds) / 2) for r in host)
    assert [r.round for r in seen] == [0, 1] and all(len(r.load) == 3 for r in seen)
    doc = result.to_json()["host_bench"]
    assert doc["goals"]["same_captions"] and len(doc["rounds"]) == 2 and doc["frames"] >= 32


@pytest.mark.parametrize("rounds", ["0", "101", "two"])
def test_out_of_range_host_rounds_are_a_one_line_error(shipped_bundle, capsys, rounds):
    assert main(["bench", "--bundle", str(shipped_bundle), "--host-rounds", rounds]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
