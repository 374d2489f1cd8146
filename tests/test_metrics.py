"""Metrics: names, labels and values as Prometheus parses them; TPU temperatures from a fake sysfs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, Optional, Tuple

import psutil
import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from edgecap.service.metrics import Metrics  # noqa: E402

Samples = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def scrape(metrics: Metrics) -> Tuple[Dict[str, object], Samples]:
    """Renders and parses back: families by name, and every sample by (name, sorted labels)."""
    body, ctype = metrics.render()
    assert ctype.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    return families, samples


def fake_apex(root: Path, temps: Dict[str, Optional[str]]) -> Path:
    for name, text in temps.items():
        (root / "class" / "apex" / name).mkdir(parents=True)
        if text is not None:
            (root / "class" / "apex" / name / "temp").write_text(text)
    return root


def test_every_metric_has_its_name_type_and_labels(tmp_path: Path) -> None:
    m = Metrics(sysfs=tmp_path)
    m.frames_captured("front", 3)
    m.frames_captured("front", 2)
    m.frames_processed("front")
    m.frames_dropped("back", 4)
    m.inference("tpu:0", 0.004)
    m.inference("cpu", 0.03)
    m.caption_latency("front", 0.3)
    m.queue_depth("front:cnn", 2)
    m.camera_up("front", True)
    m.camera_up("back", False)
    m.camera_reconnect("back")
    m.fallback("missing_tpu")
    m.failover("tpu:1")

    families, samples = scrape(m)

    # prometheus_client adds a `<name>_created` gauge per counter and histogram (start time): not ours.
    types = {name: f.type for name, f in families.items() if not name.endswith("_created")}
    assert types == {
        "edgecap_frames_captured": "counter", "edgecap_frames_processed": "counter",
        "edgecap_frames_dropped": "counter", "edgecap_inference_seconds": "histogram",
        "edgecap_caption_latency_seconds": "histogram", "edgecap_queue_depth": "gauge",
        "edgecap_camera_up": "gauge", "edgecap_camera_reconnects": "counter",
        "edgecap_fallbacks": "counter", "edgecap_failovers": "counter",
        "process_cpu_seconds": "counter", "process_resident_memory_bytes": "gauge",
        "edgecap_tpu_temperature_celsius": "gauge", "edgecap_tpu_throttled": "gauge",
        "edgecap_stage_predicted_seconds": "gauge", "edgecap_stage_measured_seconds": "gauge",
        "edgecap_device_compute_scale": "gauge", "edgecap_device_link_bytes_per_second": "gauge",
    }
    assert samples[("edgecap_frames_captured_total", (("camera", "front"),))] == 5
    assert samples[("edgecap_frames_processed_total", (("camera", "front"),))] == 1
    assert samples[("edgecap_frames_dropped_total", (("camera", "back"),))] == 4
    assert samples[("edgecap_queue_depth", (("queue", "front:cnn"),))] == 2
    assert samples[("edgecap_camera_up", (("camera", "front"),))] == 1
    assert samples[("edgecap_camera_up", (("camera", "back"),))] == 0
    assert samples[("edgecap_camera_reconnects_total", (("camera", "back"),))] == 1
    assert samples[("edgecap_fallbacks_total", (("reason", "missing_tpu"),))] == 1
    assert samples[("edgecap_failovers_total", (("device", "tpu:1"), ("how", "cpu"), ("kind", "error")))] == 1
    # A 4 ms invoke lands in the 5 ms bucket and not the 2 ms one.
    assert samples[("edgecap_inference_seconds_bucket", (("device", "tpu:0"), ("le", "0.002")))] == 0
    assert samples[("edgecap_inference_seconds_bucket", (("device", "tpu:0"), ("le", "0.005")))] == 1
    assert samples[("edgecap_inference_seconds_count", (("device", "cpu"),))] == 1
    assert samples[("edgecap_inference_seconds_sum", (("device", "cpu"),))] == pytest.approx(0.03)
    assert samples[("edgecap_caption_latency_seconds_bucket", (("camera", "front"), ("le", "+Inf")))] == 1


def test_each_step_shows_predicted_and_measured_and_each_device_its_correction(tmp_path: Path) -> None:
    m = Metrics(sysfs=tmp_path)
    m.stages([("stage 0 (pci:0)", "emu-tpu:0", 1.4, 2.8), ("decode", "decode", None, 3.0)],
             {"pci:0": {"compute_scale": 2.0, "link_bytes_per_s": None}})
    _, samples = scrape(m)
    stage = (("device", "emu-tpu:0"), ("stage", "stage 0 (pci:0)"))
    assert samples[("edgecap_stage_predicted_seconds", stage)] == pytest.approx(0.0014)
    assert samples[("edgecap_stage_measured_seconds", stage)] == pytest.approx(0.0028)
    assert ("edgecap_stage_predicted_seconds", (("device", "decode"), ("stage", "decode"))) not in samples
    assert samples[("edgecap_device_compute_scale", (("device", "pci:0"),))] == 2.0
    # After a switch the new plan's steps replace the old ones.
    m.stages([("stage 0 (usb:0)", "emu-tpu:1", 1.6, 1.6)], {})
    _, samples = scrape(m)
    assert ("edgecap_stage_measured_seconds", stage) not in samples
    assert samples[("edgecap_stage_measured_seconds", (("device", "emu-tpu:1"), ("stage", "stage 0 (usb:0)")))] \
        == pytest.approx(0.0016)


def test_tpu_temperatures_are_read_from_sysfs_at_each_scrape(tmp_path: Path) -> None:
    root = fake_apex(tmp_path, {"apex_0": "45300\n", "apex_1": "51000\n",
                                "apex_2": None, "apex_3": "garbage", "not_apex": "1000"})
    m = Metrics(sysfs=root)
    _, samples = scrape(m)
    temps = {dict(k[1])["device"]: v for k, v in samples.items() if k[0] == "edgecap_tpu_temperature_celsius"}
    # A TPU without a readable temp (mid-reset, old driver) is left out, not reported as 0.
    assert temps == {"apex_0": 45.3, "apex_1": 51.0}

    (root / "class" / "apex" / "apex_0" / "temp").write_text("60125\n")
    _, samples = scrape(m)
    assert samples[("edgecap_tpu_temperature_celsius", (("device", "apex_0"),))] == pytest.approx(60.125)


def test_no_apex_driver_means_no_temperature_samples(tmp_path: Path) -> None:
    families, _ = scrape(Metrics(sysfs=tmp_path / "nothing-here"))
    assert families["edgecap_tpu_temperature_celsius"].samples == []
    assert families["edgecap_tpu_throttled"].samples == []


def test_throttling_is_the_trip_points_reached_at_each_scrape(tmp_path: Path) -> None:
    # Default trip points 85/90/95 C (apex driver); apex_1's driver shows lowered ones.
    root = fake_apex(tmp_path, {"apex_0": "84000\n", "apex_1": "70500\n", "apex_2": None})
    for i, milli in enumerate((65000, 70000, 75000)):
        (root / "class" / "apex" / "apex_1" / f"trip_point{i}_temp").write_text(f"{milli}\n")
    m = Metrics(sysfs=root)

    def throttled() -> dict:
        _, samples = scrape(m)
        return {dict(k[1])["device"]: v for k, v in samples.items() if k[0] == "edgecap_tpu_throttled"}

    assert throttled() == {"apex_0": 0, "apex_1": 2}
    (root / "class" / "apex" / "apex_0" / "temp").write_text("95500\n")
    assert throttled() == {"apex_0": 3, "apex_1": 2}


def test_process_cpu_and_memory_come_from_this_process(tmp_path: Path) -> None:
    m = Metrics(sysfs=tmp_path)
    _, before = scrape(m)
    # Burn CPU by the process's own clock, not by a fixed amount of work: the kernel counts
    # it in 10 ms ticks, and a fixed loop may finish inside one tick on a fast core.
    start = time.process_time()
    while time.process_time() - start < 0.05:
        sum(i * i for i in range(10_000))
    _, after = scrape(m)
    rss = psutil.Process().memory_info().rss
    assert 0.5 * rss < after[("process_resident_memory_bytes", ())] < 2 * rss
    assert after[("process_cpu_seconds_total", ())] > before[("process_cpu_seconds_total", ())] > 0


def test_each_metrics_has_its_own_registry(tmp_path: Path) -> None:
    a, b = Metrics(sysfs=tmp_path), Metrics(sysfs=tmp_path)  # a second set would raise on a shared registry
    a.frames_captured("front")
    _, samples = scrape(b)
    assert ("edgecap_frames_captured_total", (("camera", "front"),)) not in samples
    assert "edgecap_frames_captured_total" not in prometheus_client.generate_latest().decode()
