"""Prometheus metrics of the service, on a registry of their own.

Rates (fps) are not exported as gauges: counters of frames captured,
processed and dropped give them as ``rate(...[1m])`` in Prometheus, exact over
any window, where a gauge would be sampled. Process CPU and memory and the
EdgeTPU temperatures and throttle states are read when a scrape asks, not on a timer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from edgecap.devices import tpu_thermals

# Seconds. An EdgeTPU segment takes ~1-20 ms, a CPU tail 10-200 ms; a caption
# arrives a window (seconds) after its first frame, so latency needs the long tail.
INFERENCE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """The service's metrics; the service calls the methods, ``/metrics`` calls ``render``.

    Args:
      registry: Where to register (tests pass their own); default a new
        ``CollectorRegistry``, never prometheus_client's global one, so two
        services in one process (tests) do not collide.
      sysfs: The sysfs root (``/sys``); TPU temperatures and trip points are
        read from ``<sysfs>/class/apex/apex_N/`` (``edgecap.devices.tpu_thermals``).
    """

    def __init__(self, registry: Optional[CollectorRegistry] = None,
                 sysfs: Union[str, Path] = "/sys") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._captured = Counter("edgecap_frames_captured", "Frames read from the camera.",
                                 ["camera"], registry=r)
        self._processed = Counter("edgecap_frames_processed",
                                  "Sampled frames that went through the CNN.", ["camera"], registry=r)
        self._dropped = Counter("edgecap_frames_dropped",
                                "Frames dropped because the pipeline was behind.", ["camera"], registry=r)
        self._inference = Histogram("edgecap_inference_seconds", "Time of one invoke on a device.",
                                    ["device"], buckets=INFERENCE_BUCKETS, registry=r)
        self._latency = Histogram("edgecap_caption_latency_seconds",
                                  "From a window's last frame leaving the camera to its caption.",
                                  ["camera"], buckets=LATENCY_BUCKETS, registry=r)
        self._queue = Gauge("edgecap_queue_depth", "Items waiting in a pipeline queue.",
                            ["queue"], registry=r)
        self._camera_up = Gauge("edgecap_camera_up", "1 while the camera delivers frames, else 0.",
                                ["camera"], registry=r)
        self._reconnects = Counter("edgecap_camera_reconnects",
                                   "Times the camera was reopened after a drop-out.", ["camera"], registry=r)
        self._fallbacks = Counter("edgecap_fallbacks",
                                  "Times the service ran on less hardware than planned.",
                                  ["reason"], registry=r)
        self._failovers = Counter("edgecap_failovers",
                                  "Times the plan changed at run time: a device failed (kind: error, "
                                  "hung, crashed, vanished) and its work moved (how: bundle, compiler, "
                                  "cpu), it came back (kind: returned, how: original), or the board "
                                  "measured it off the model (kind and how: measured).",
                                  ["device", "kind", "how"], registry=r)
        self._predicted = Gauge("edgecap_stage_predicted_seconds",
                                "The running plan's predicted time of a pipeline step a frame.",
                                ["stage", "device"], registry=r)
        self._measured = Gauge("edgecap_stage_measured_seconds",
                               "Median of the step's last invokes (an emulated device's: its paced, "
                               "modelled time).", ["stage", "device"], registry=r)
        self._scale = Gauge("edgecap_device_compute_scale",
                            "Learned correction: the device's compute time over its board profile's.",
                            ["device"], registry=r)
        self._link = Gauge("edgecap_device_link_bytes_per_second",
                           "Learned correction: the rate the device's link was measured to carry.",
                           ["device"], registry=r)
        r.register(_ScrapeCollector(Path(sysfs)))

    def frames_captured(self, camera: str, n: int = 1) -> None:
        """Counts frames read from a camera."""
        self._captured.labels(camera).inc(n)

    def frames_processed(self, camera: str, n: int = 1) -> None:
        """Counts sampled frames that went through the CNN."""
        self._processed.labels(camera).inc(n)

    def frames_dropped(self, camera: str, n: int = 1) -> None:
        """Counts frames dropped because the pipeline was behind."""
        self._dropped.labels(camera).inc(n)

    def inference(self, device: str, seconds: float) -> None:
        """Records one invoke's time on a device (``cpu``, ``tpu:0``, ...)."""
        self._inference.labels(device).observe(seconds)

    def caption_latency(self, camera: str, seconds: float) -> None:
        """Records one caption's latency."""
        self._latency.labels(camera).observe(seconds)

    def queue_depth(self, queue: str, depth: int) -> None:
        """Sets a queue's current depth."""
        self._queue.labels(queue).set(depth)

    def camera_up(self, camera: str, up: bool) -> None:
        """Marks a camera online (True) or offline (False)."""
        self._camera_up.labels(camera).set(1 if up else 0)

    def camera_reconnect(self, camera: str) -> None:
        """Counts a reopen of a camera after a drop-out."""
        self._reconnects.labels(camera).inc()

    def fallback(self, reason: str) -> None:
        """Counts a start on less hardware than planned (``reason``: e.g. ``missing_tpu``)."""
        self._fallbacks.labels(reason).inc()

    def failover(self, device: str, kind: str = "error", how: str = "cpu") -> None:
        """Counts a change of plan at run time (see ``edgecap.stats.FailoverRecord``)."""
        self._failovers.labels(device, kind, how).inc()

    def stages(self, steps: Sequence[Tuple[str, str, Optional[float], Optional[float]]],
               corrections: Mapping[str, Mapping[str, Optional[float]]]) -> None:
        """Sets each step's predicted and measured time and each device's learned correction.

        The running plan's steps replace the previous plan's (a switch drops their series).

        Args:
          steps: ``(stage, device, predicted_ms, measured_ms)``; None leaves that series out.
          corrections: Plan device -> ``{"compute_scale", "link_bytes_per_s"}`` (``PipelineStats.corrections``).
        """
        for gauge in (self._predicted, self._measured, self._scale, self._link):
            gauge.clear()
        for stage, device, predicted, measured in steps:
            if predicted is not None:
                self._predicted.labels(stage, device).set(predicted / 1e3)
            if measured is not None:
                self._measured.labels(stage, device).set(measured / 1e3)
        for device, c in corrections.items():
            if c.get("compute_scale") is not None:
                self._scale.labels(device).set(c["compute_scale"])
            if c.get("link_bytes_per_s") is not None:
                self._link.labels(device).set(c["link_bytes_per_s"])

    def watch_sinks(self, counters: Callable[[], Dict[str, Dict[str, Any]]]) -> None:
        """Exports the sinks' counters, read at each scrape.

        Args:
          counters: Returns ``SinkSet.counters()``: by sink, ``sent``,
            ``dropped``, ``errors`` and, for a sink that buffers, ``waiting``.
        """
        self.registry.register(_SinkCollector(counters))

    def render(self) -> Tuple[bytes, str]:
        """Returns the exposition text of every metric and its Content-Type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _ScrapeCollector:
    """Process CPU and memory (psutil) and EdgeTPU temperatures and throttling (sysfs), read per scrape."""

    def __init__(self, sysfs: Path) -> None:
        self._sysfs = sysfs
        self._process = psutil.Process()

    def collect(self) -> Iterator[object]:
        times = self._process.cpu_times()
        cpu = CounterMetricFamily("process_cpu_seconds", "User and system CPU time of the service.")
        cpu.add_metric([], times.user + times.system)
        yield cpu
        yield GaugeMetricFamily("process_resident_memory_bytes", "Resident memory of the service.",
                                value=self._process.memory_info().rss)
        temp = GaugeMetricFamily("edgecap_tpu_temperature_celsius",
                                 "EdgeTPU die temperature (PCIe apex driver).", labels=["device"])
        throttled = GaugeMetricFamily(
            "edgecap_tpu_throttled",
            "Apex driver trip points the EdgeTPU has reached: 0 full clock, 1-3 clock cut to "
            "1/2, 1/4, 1/8.", labels=["device"])
        for state in tpu_thermals(self._sysfs):
            temp.add_metric([state.name], state.temperature_c)
            throttled.add_metric([state.name], state.level)
        yield temp
        yield throttled


class _SinkCollector:
    """``edgecap_sink_{sent,dropped,errors}_total{sink}`` and ``edgecap_sink_waiting{sink}``, read per scrape."""

    def __init__(self, counters: Callable[[], Dict[str, Dict[str, Any]]]) -> None:
        self._counters = counters

    def collect(self) -> Iterator[object]:
        families = {
            "sent": CounterMetricFamily("edgecap_sink_sent", "Captions, events and messages a sink delivered "
                                        "(journal lines, JSON lines, MQTT messages, history rows).", labels=["sink"]),
            "dropped": CounterMetricFamily("edgecap_sink_dropped", "What a sink let go undelivered (a full "
                                           "buffer, a disk that stayed full), counted.", labels=["sink"]),
            "errors": CounterMetricFamily("edgecap_sink_errors", "Failed deliveries and writes of a sink (each "
                                          "retried or counted as dropped).", labels=["sink"]),
        }
        waiting = GaugeMetricFamily("edgecap_sink_waiting", "Messages or events a sink holds until it can "
                                    "deliver them (a broker away, a history that cannot be written).",
                                    labels=["sink"])
        for sink, counts in sorted(self._counters().items()):
            for key, family in families.items():
                family.add_metric([sink], counts.get(key, 0))
            if "waiting" in counts:
                waiting.add_metric([sink], counts["waiting"])
        yield from families.values()
        yield waiting
