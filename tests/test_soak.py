"""A bounded soak: a few hundred frames with a fault every hundred invokes (the real one is a command)."""

from __future__ import annotations

import json

import pytest

from edgecap.errors import ConfigError
from edgecap.soak import fault_plan, main, run_soak


def test_a_short_soak_accounts_for_every_window_and_leaks_nothing(shipped_bundle):
    r = run_soak(frames=480, every=100, back_s=0.2, warmup=100, bundle=str(shipped_bundle),
                 deadline_floor_s=0.3)
    assert r.captions == r.windows_expected == 60
    assert r.windows_in_order and r.captions_match_fault_free, r
    kinds = {f["kind"] for f in r.failovers}
    assert {"error", "hung"} <= kinds, r.failovers
    assert all(f["took_s"] is not None and f["took_s"] < 1.0 for f in r.failovers), r.failovers
    assert r.threads["after"] <= r.threads["before"] and r.fds["after"] <= r.fds["before"], r


def test_the_fault_plan_rotates_actions_and_devices():
    assert fault_plan(1000, 250, 2) == ["emu-tpu:0=fail@250+2s", "emu-tpu:1=hang@500+2s",
                                        "emu-tpu:0=vanish@750+2s"]


def test_the_command_refuses_a_soak_shorter_than_its_warm_up(tmp_path, capsys):
    assert main(["--frames", "100", "--warmup", "200", "--json", str(tmp_path / "s.json")]) == 2
    assert "warm-up" in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()
    with pytest.raises(ConfigError):
        run_soak(frames=0)


def test_the_command_writes_its_figures(tmp_path, shipped_bundle, capsys):
    out = tmp_path / "soak.json"
    main(["--frames", "240", "--fault-every", "100", "--back", "0.2", "--warmup", "50",
          "--bundle", str(shipped_bundle), "--json", str(out), "--md", str(tmp_path / "soak.md")])
    doc = json.loads(out.read_text())
    assert doc["captions"] == 30 and doc["command"].startswith("python -m edgecap.soak")
    assert "| windows expected / captioned | 30 / 30 |" in (tmp_path / "soak.md").read_text()
    assert "all goals met" in capsys.readouterr().out
