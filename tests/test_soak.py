"""A bounded soak: a few hundred frames with a fault every hundred invokes (the real one is tools/soak.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from edgecap.errors import ConfigError
from edgecap import faults
from edgecap_lab.soak import _Injector, fault_schedule, run_soak
from tests.pipeline_boards import pipeline_board

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "soak.py"


def main(argv):
    # tools/ is scripts, not a package: load the soak's command line from its file.
    spec = importlib.util.spec_from_file_location("tools_soak", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script.main(argv)


def test_a_short_soak_accounts_for_every_window_and_leaks_nothing(shipped_bundle):
    # The refit devboard-usb's demo plan runs on emu-tpu:0 alone: every fault must strike it.
    # 500 frames apart (about 1 s here): time for a hang to be noticed (0.3 s) and the device to
    # come back (0.2 s, found by the 0.25 s probe) before the next fault is due.
    r = run_soak(frames=2000, every=500, back_s=0.2, warmup=200, bundle=str(shipped_bundle),
                 board=pipeline_board("devboard-usb"), deadline_floor_s=0.3)
    assert r.captions == r.windows_expected == 250
    assert r.windows_in_order and r.captions_match_fault_free, r
    assert r.faults_fired == len(r.faults_injected) == r.faults_planned == 3, r.faults_injected
    assert {e.split("=")[0] for e in r.faults_injected} == {"emu-tpu:0"}
    failures = [(f["device"], f["kind"]) for f in r.failovers if f["kind"] != "returned"]
    assert failures == [("emu-tpu:0", "error"), ("emu-tpu:0", "hung"), ("emu-tpu:0", "vanished")], r.failovers
    assert all(f["took_s"] is not None and f["took_s"] < 1.0 for f in r.failovers), r.failovers
    assert r.threads["after"] <= r.threads["before"] and r.fds["after"] <= r.fds["before"], r
    assert r.ok and r.missed == [], r.missed


def test_the_faults_rotate_actions_and_strike_each_tpu_of_the_plan(shipped_bundle, two_tpu_board):
    assert fault_schedule(1000, 250) == [(250, "fail"), (500, "hang"), (750, "vanish")]
    r = run_soak(frames=800, every=200, back_s=0.2, warmup=100, bundle=str(shipped_bundle),
                 board=two_tpu_board, deadline_floor_s=0.3)
    assert r.faults_fired == len(r.faults_injected) == 3 and r.captions_match_fault_free, r
    assert {e.split("=")[0] for e in r.faults_injected} == {"emu-tpu:0", "emu-tpu:1"}


def test_a_fault_is_not_held_back_while_the_device_before_is_still_away(shipped_bundle):
    # The devices stay away 30 s, far longer than the run: the second fault must strike the TPU
    # the plan failed over onto at its frame, not wait for the first device to answer again.
    r = run_soak(frames=600, every=200, back_s=30.0, warmup=100, bundle=str(shipped_bundle),
                 deadline_floor_s=0.3)
    assert r.faults_fired == len(r.faults_injected) == r.faults_planned == 2, r.faults_injected
    assert [e.split("=")[0] for e in r.faults_injected] == ["emu-tpu:0", "emu-tpu:1"]
    assert "every planned fault fired" not in r.missed
    assert r.captions == r.windows_expected and r.captions_match_fault_free, r


class _Choice:
    def __init__(self, *tpus: str) -> None:
        self.tpus = list(tpus)


def test_a_fault_whose_device_the_plan_left_before_it_fired_moves_to_the_running_tpu():
    faults.inject("")
    cap = type("Cap", (), {})()
    cap.choice = _Choice("emu-tpu:0")
    injector = _Injector(cap, [(1, "fail"), (3, "hang")], back_s=0.1)
    frames = injector.frames(list(range(4)), 4)
    try:
        next(frames), next(frames)  # frame 1: the first fault, on emu-tpu:0
        assert [f.device for f in faults.current().pending] == ["emu-tpu:0"]
        cap.choice = _Choice("emu-tpu:1")  # a device came back: the plan moved off emu-tpu:0
        next(frames)
        (moved,) = faults.current().pending
        assert moved.device == "emu-tpu:1" and faults.current().take("emu-tpu:1") == moved
        next(frames)  # frame 3: the second fault, now that the first fired
        assert injector.fired == 1 and len(injector.injected) == 2 and injector.moved == 1
        assert "-> emu-tpu:1" in injector.injected[0]
    finally:
        faults.inject("")


def test_the_command_refuses_a_soak_shorter_than_its_warm_up(tmp_path, capsys):
    assert main(["--frames", "100", "--warmup", "200", "--json", str(tmp_path / "s.json")]) == 2
    assert "warm-up" in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()
    with pytest.raises(ConfigError):
        run_soak(frames=0)


def test_the_command_writes_its_figures(tmp_path, shipped_bundle, capsys):
    out = tmp_path / "soak.json"
    code = main(["--frames", "240", "--fault-every", "100", "--back", "0.2", "--warmup", "50",
                 "--bundle", str(shipped_bundle), "--json", str(out), "--md", str(tmp_path / "soak.md")])
    doc = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert code == 0 and doc["ok"], (doc, printed)
    assert doc["captions"] == 30 and doc["command"].startswith("python tools/soak.py --frames 240 ")
    assert doc["processes"]["after"] <= doc["processes"]["before"]
    assert "| windows expected / captioned | 30 / 30 |" in (tmp_path / "soak.md").read_text()
    assert "soak: all goals met" in printed and "| goals | all met |" in printed


def test_the_command_refuses_an_output_it_cannot_write_before_the_run(tmp_path, capsys):
    code = main(["--frames", "240", "--warmup", "50", "--md", str(tmp_path)])  # a directory
    assert code == 2 and "--md" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
