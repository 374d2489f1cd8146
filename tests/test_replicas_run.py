"""A plan whose CNN runs as copies, emulated end to end: captions, trace, failover of a copy's device."""

from __future__ import annotations

import json
from typing import List

import pytest

from edgecap import faults
from edgecap.captioner import EdgeCaptioner
from edgecap.trace import load_slices

from test_failover import FRAMES, clip  # noqa: F401 (a fixture: the demo clip, 160 frames)

pytestmark = pytest.mark.usefixtures("no_faults")


@pytest.fixture(scope="module")
def cpu_captions(shipped_bundle, clip) -> List[str]:
    with EdgeCaptioner(shipped_bundle, board="auto", emulate=False, num_threads=1, pipelined=False) as cap:
        assert set(cap.devices.values()) == {"cpu"}
        return [c.text for c in cap.caption_frames(clip)]


def test_copies_on_two_tpus_and_the_cpu_caption_as_the_cpu_path_does(shipped_bundle, clip, cpu_captions,
                                                                       tmp_path):
    trace = tmp_path / "trace.json"
    # rpi4-2usb: the CPU keeps time for a share of whole frames beside its RNN steps and its own work.
    with EdgeCaptioner(shipped_bundle, board="rpi4-2usb", num_threads=1, trace=trace) as cap:
        (stage,) = cap.plan.active_stages
        assert [str(d) for d in stage.devices] == ["usb:0", "usb:1", "cpu"]
        assert cap.devices == {"usb:0": "emu-tpu:0", "usb:1": "emu-tpu:1", "cpu": "cpu:1"}
        assert cap.choice.describe() == "usb:0@emu-tpu:0+usb:1@emu-tpu:1+cpu@cpu:1"
        assert [c.text for c in cap.caption_frames(clip)] == cpu_captions
        # Each copy took its share of the frames, dealt as the plan says.
        invokes = {s.worker: s.invokes for s in cap.stats().stages if s.name.startswith("stage 0")}
        shares = {"emu-tpu:0": stage.share, **{str(w): r.share for w, r in
                                               zip(("emu-tpu:1", "cpu:1"), stage.replicas)}}
        for worker, share in shares.items():
            assert invokes[worker] == pytest.approx(FRAMES * share, abs=1.01)
    slices = load_slices(trace)
    frames = sorted(s["args"]["frame"] for w in ("emu-tpu:0", "emu-tpu:1", "cpu:1") for s in slices[w])
    assert frames == list(range(FRAMES))  # every frame through exactly one copy, each copy a track


@pytest.mark.usefixtures("no_leaked_threads")
def test_a_copys_device_that_fails_is_replanned_without_losing_a_window(shipped_bundle, clip, cpu_captions):
    # The planner re-plans for the TPUs left (the copies of the whole model run on the
    # one left and the CPU); the frames of every window not yet captioned run again.
    with EdgeCaptioner(shipped_bundle, board="devboard-usb", num_threads=1, deadline_floor_s=0.3) as cap:
        faults.inject("emu-tpu:1=fail@50")
        assert [c.text for c in cap.caption_frames(clip)] == cpu_captions
        (record,) = cap.stats().failovers
        assert (record.device, record.kind, record.how) == ("emu-tpu:1", "error", "compiler")
        assert "emu-tpu:1" in record.plan_before and "emu-tpu:1" not in record.plan_after
        assert record.replayed > 0
        assert cap.plan.board_tpus == 1 and "emu-tpu:0" in cap.devices.values()


def test_validate_and_the_plan_file_show_the_copies(shipped_bundle, tmp_path, capsys):
    from edgecap.cli import main

    assert main(["compile", str(shipped_bundle), "--board", "rpi4-2usb", "-o", str(tmp_path / "p")]) == 0
    printed = capsys.readouterr().out
    assert "usb:0 x0.44 + usb:1 x0.44 + cpu x0.11 ops [0, 35)" in printed
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    first = doc["stages"][0]
    assert first["share"] + sum(r["share"] for r in first["replicas"]) == pytest.approx(1.0, abs=1e-6)
    assert [r["device"] for r in first["replicas"]] == ["usb:1", "cpu"]
    assert "share" not in doc["stages"][1] and "replicas" not in doc["stages"][1]
