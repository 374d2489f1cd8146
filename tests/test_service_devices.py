"""The status page's EdgeTPU rows: temperature and throttling from a fake sysfs, one warning per onset."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np

from edgecap.devices import DeviceInfo, ThrottleWatch, parse_device
from edgecap.service.service import tpu_rows


def test_rows_carry_temperature_and_throttling(tmp_path: Path, caplog) -> None:
    apex = tmp_path / "class" / "apex" / "apex_0"
    apex.mkdir(parents=True)
    tpus = [DeviceInfo("tpu:0", "pci", "/dev/apex_0", "rt"),
            DeviceInfo("tpu:1", "usb", "/sys/bus/usb/devices/2-1", "rt")]
    watch = ThrottleWatch(logging.getLogger("edgecap"))
    rows = []
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        for milli in (60000, 88000, 88500):
            (apex / "temp").write_text(f"{milli}\n")
            rows.append(tpu_rows(tpus, str(tmp_path), watch))
    assert [(r[0]["temperature_c"], r[0]["throttled"]) for r in rows] == [
        (60.0, False), (88.0, True), (88.5, True)]
    assert rows[0][1] == {"device": "tpu:1", "kind": "usb", "busy": None,
                          "temperature_c": None, "throttled": None}
    assert sum("tpu:0 (apex_0) is throttling" in r.getMessage() for r in caplog.records) == 1


def test_stats_carry_the_tpus_throttle_state_when_the_run_uses_real_tpus(shipped_bundle, monkeypatch):
    # A run on a real EdgeTPU reports its temperature and throttling in stats();
    # the TPU is stood in for by a CPU worker and a fake sysfs reading.
    from edgecap import devices as devices_module
    from edgecap.captioner import EdgeCaptioner
    from edgecap.devices import TpuThermal

    hot = TpuThermal("apex_0", 91.0, (85.0, 90.0, 95.0), 2)
    monkeypatch.setattr(devices_module, "tpu_thermals", lambda sysfs="/sys": [hot])
    with EdgeCaptioner(shipped_bundle, num_threads=1) as cap:
        cap.caption_frames(np.zeros((8, 64, 64, 3), np.uint8))
        assert cap.stats().thermal == ()  # a CPU run reads no TPU
        # As a run placed on a real TPU would be.
        cap._supervisor.choice = dataclasses.replace(cap.choice, workers={"cpu": parse_device("tpu:0")})
        assert cap.stats().thermal == (hot,)
