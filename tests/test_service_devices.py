"""The status page's EdgeTPU rows: temperature and throttling from a fake sysfs, one warning per onset."""

from __future__ import annotations

import logging
from pathlib import Path

from edgecap.devices import DeviceInfo, ThrottleWatch
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
