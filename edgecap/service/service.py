"""``edgecap serve``: cameras into one pipeline, captions out to sinks, the page and systemd.

::

    camera feeds ─► mux ─► EdgeCaptioner.run_frames (one pipeline, shared devices) ─► this loop
                                                                                      ├─► sinks (stdout/journal, JSON lines, MQTT)
                                                                                      ├─► EventTracker per camera ─► sinks.event, state
                                                                                      ├─► ServiceState ─► HTTP page and API
                                                                                      ├─► Metrics ─► /metrics
                                                                                      └─► systemd: READY, WATCHDOG, STATUS

Cameras share the devices: every camera's sampled frames go, interleaved, into
one pipeline, whose RNN keeps each camera's windows apart. One set of
interpreters serves all cameras, so an EdgeTPU never swaps segments between
models, and the devices stay as busy as the frames allow.

systemd: ``READY=1`` once the bundle is loaded, the HTTP port is bound and a
first frame has gone through the pipeline (or, when no camera delivers one,
after the first camera's ``stall_seconds``: the service is up and reports the
camera offline rather than failing to start). ``WATCHDOG=1`` is sent from the
loop that receives the pipeline's results: heartbeats pass every worker while
no camera has frames, so a hung worker stops the pings. An EdgeTPU that fails, hangs or
vanishes is re-planned around without a restart (the captioner's failover,
docs/runtime.md), counted in ``edgecap_failovers_total``. SIGTERM (or SIGINT)
stops the cameras, lets the frames in flight finish, flushes the sinks and
returns within ``STOP_BUDGET_S``.

Events: each camera's captions go through its own ``EventTracker``
(docs/runtime.md, "Events"); every change (opened, extended, closed) goes to
the state and to ``sinks.event``, with Unix times. A camera that goes offline
closes its event at once; a stop closes every camera's event before the sinks
close.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any, Dict, List, Optional, TextIO

import cv2

from edgecap import devices
from edgecap.bundle import Bundle, WindowSpec, default_bundle, load_bundle
from edgecap.captioner import Caption, EdgeCaptioner, FrameResult
from edgecap.domain import notices
from edgecap.errors import EdgecapError, RunCancelled, RunFailure
from edgecap.events import Change, Event, EventTracker
from edgecap.options import CaptionerOptions
from edgecap.service.cameras import CameraFeed, CameraMux, CameraSpec
from edgecap.service.config import ServiceConfig
from edgecap.service.history import History, open_history
from edgecap.service.http import StatusServer
from edgecap.service.metrics import Metrics
from edgecap.service.notify import Notifier
from edgecap.service.sinks import SinkSet, open_sinks
from edgecap.service.state import ServiceState
from edgecap.stats import PipelineStats

_log = logging.getLogger("edgecap")

STOP_BUDGET_S = 4.0  # SIGTERM to exit; systemd's TimeoutStopSec leaves room above it
PAGE_FRAME_PERIOD_S = 1.0  # the page shows a frame a second per camera: JPEG costs CPU
STATS_PERIOD_S = 1.0


class Service:
    """One ``edgecap serve`` process.

    Everything that can refuse to start (bundle, plan, devices, sinks, the
    HTTP address) is opened in the constructor, before any camera starts.

    Args:
      config: The typed config (``edgecap.service.config.load_config``).
      notifier: The systemd notifier (default: from ``$NOTIFY_SOCKET``).
      stdout: Stream of the stdout sink (default ``sys.stdout``).
      sysfs: The sysfs root for TPU temperatures and throttling (tests pass a fake one).

    Raises:
      EdgecapError: A bad bundle, plan, sink path or HTTP address, or, with
        ``on_missing_tpu = "fail"``, missing EdgeTPUs; one line each.
    """

    def __init__(self, config: ServiceConfig, notifier: Optional[Notifier] = None,
                 stdout: Optional[TextIO] = None, sysfs: str = "/sys") -> None:
        self.config = config
        self.sinks: Optional[SinkSet] = None
        # SIGHUP (logrotate's postrotate, `systemctl reload`) reopens the JSON-lines file; by
        # default it would end the process at once, unflushed, as systemd's clean stop.
        self._old_hup = _on_signal(signal.SIGHUP, lambda *_: threading.Thread(
            target=self.reopen, name="edgecap-sighup", daemon=True).start())
        self.notifier = notifier or Notifier()
        names = [c.name for c in config.cameras]
        self.state = ServiceState(names)
        self.metrics = Metrics(sysfs=sysfs)
        self._sysfs = sysfs
        self._throttle = devices.ThrottleWatch(_log)
        try:
            bundle = load_bundle(config.bundle or default_bundle())
            options = CaptionerOptions(plan=config.plan or None, board=config.board,
                                       on_missing_tpu=config.on_missing_tpu, beam=config.beam)
            self.sinks = open_sinks(config, stdout, open_history(config.history))
        except BaseException:
            _on_signal(signal.SIGHUP, self._old_hup)
            raise
        self.metrics.watch_sinks(self.sinks.counters)
        # The history's read side: the page's /api/events.
        self.history = History(config.history.path) if config.history.path else None
        self._closers: List[Any] = [self.sinks]
        try:
            self.captioner = EdgeCaptioner(bundle, options)
            self._closers.append(self.captioner)
            info = model_info(bundle)
            self.state.model(info)
            choice = self.captioner.choice
            if choice.fallback:
                self.metrics.fallback(choice.fallback)
            self.windows: Dict[str, WindowSpec] = {
                c.name: CaptionerOptions(frames=c.frames, stride=c.stride,
                                         sample_fps=c.sample_fps).window(self.captioner.window)
                for c in config.cameras}
            longest = max(w.frames / (w.sample_fps or 30.0) for w in self.windows.values())
            self.http = StatusServer(self.state, self.metrics, config.http.address, config.http.port,
                                     config.http.token or None,
                                     max_caption_age_s=max(60.0, 4 * longest), history=self.history)
            self.http.start()  # a port in use fails here, before any camera opens
            self._closers.append(self.http)
            # Fed by the loop's thread, closed by a feed's (offline) or the stopping one.
            self._trackers = {name: EventTracker(name) for name in names}
            self._events_lock = threading.Lock()
            self.feeds = [CameraFeed(self._spec(c), on_state=self._on_state, on_frame=self._on_frame,
                                     on_drop=self._on_drop, on_reconnect=self._on_reconnect)
                          for c in config.cameras]
            self.mux = CameraMux(self.feeds)
            self._names = names
            self._stopping = threading.Event()
            self._stop_by: Optional[float] = None
            self._drain_timer: Optional[threading.Timer] = None
            self._processed: Dict[str, int] = dict.fromkeys(names, 0)
            self._counted: Dict[str, int] = dict.fromkeys(names, 0)  # at the last stats period
            self._read: Dict[str, int] = dict.fromkeys(names, 0)
            self._latency: Dict[str, List[float]] = {n: [] for n in names}
            self._last_jpeg: Dict[str, float] = dict.fromkeys(names, 0.0)
            self._last_stats = time.monotonic()
            self._failovers = 0  # failovers counted in the metrics so far
            # Enumerated once: the attached TPUs do not change under a running plan.
            self._tpus = devices.list_devices()[1:]
        except BaseException:  # a bad value, or SIGTERM while starting: close what opened
            self._close_all()
            raise
        for line in info["notices"]:  # once, when nothing can refuse the start any more
            _log.warning("%s", line)

    def _spec(self, c: Any) -> CameraSpec:
        return CameraSpec(name=c.name, source=c.source, width=c.width, height=c.height, fps=c.fps,
                          fourcc=c.fourcc, loop=c.loop, sample_fps=self.windows[c.name].sample_fps,
                          stall_seconds=c.stall_seconds, backoff_max_seconds=c.backoff_max_seconds)

    # Camera feed callbacks: called on the feeds' threads; state and metrics are thread-safe.
    def _on_state(self, camera: str, status: str, reason: str) -> None:
        self.state.set_camera(camera, status, reason)
        self.metrics.camera_up(camera, status == "online")
        if status == "offline":
            _log.warning("edgecap: camera %s offline: %s", camera, reason)
            self._end_event(camera)

    def _on_frame(self, camera: str) -> None:
        self.metrics.frames_captured(camera)

    def _on_drop(self, camera: str, n: int) -> None:
        self.metrics.frames_dropped(camera, n)

    def _on_reconnect(self, camera: str) -> None:
        self.metrics.camera_reconnect(camera)

    def reopen(self) -> None:
        """Reopens the sinks' files (SIGHUP, after logrotate moved them); re-reads nothing else."""
        sinks = self.sinks
        if sinks is None:
            _log.info("edgecap: SIGHUP before the sinks opened: nothing to reopen")
            return
        sinks.reopen()
        path = self.config.sinks.jsonl.path
        _log.info("edgecap: SIGHUP: %s; the config is not re-read (restart the service for that)",
                  f"reopened {path}" if path else "no file to reopen")

    def stop(self) -> None:
        """Starts a graceful stop; safe from a signal handler or another thread."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._stop_by = time.monotonic() + STOP_BUDGET_S
        self.mux.stop()
        for feed in self.feeds:
            feed.request_stop()
        # The drain gets most of the budget; a worker hung past it is cancelled.
        self._drain_timer = threading.Timer(STOP_BUDGET_S / 2, self.captioner.close)
        self._drain_timer.daemon = True
        self._drain_timer.start()

    def run(self) -> int:
        """Runs until ``stop()`` (SIGTERM, SIGINT); returns the exit code.

        Returns:
          0 after a stop; 1 when a stage failed at run time and could not fail
          over, or a CPU step raised (one error line is logged, the
          traceback at debug level), which systemd's
          ``Restart=on-failure`` restarts. An EdgeTPU that fails is re-planned
          around by the captioner (``edgecap_failovers_total``) and the service
          goes on. Exit code 2 stays for bad input found before the start,
          which a restart cannot fix.
        """
        old = {s: signal.signal(s, lambda *_: self.stop()) for s in (signal.SIGTERM, signal.SIGINT)}
        ready_by = time.monotonic() + min(c.stall_seconds for c in self.config.cameras)
        ready = False
        code = 0
        ping_every = self.notifier.watchdog_interval()
        last_ping = last_stats = 0.0
        try:
            for feed in self.feeds:
                feed.start()
            # Not live: each camera's feed keeps only its newest frame and counts its own
            # drops, and the mux takes the cameras in turn; a live head queue would let
            # any camera's frame replace another's, undoing the turns.
            for result in self.captioner.run_frames(iter(self.mux), self.windows, live=False):
                now = time.monotonic()
                if result.frame is not None:
                    self._frame(result, now)
                if not ready and (result.frame is not None or now >= ready_by):
                    ready = True
                    self.notifier.ready(self._status_line(self.captioner.stats()))
                if ping_every and now - last_ping >= ping_every:
                    self.notifier.watchdog()
                    last_ping = now
                if now - last_stats >= STATS_PERIOD_S:
                    self._publish_stats()
                    last_stats = now
        except RunCancelled:
            _log.warning("edgecap: a stage did not drain within %.0f s; stopped it", STOP_BUDGET_S)
        except (EdgecapError, RunFailure) as exc:
            # A CPU step that raised (RunFailure) fails every camera's run, not one camera's:
            # a fresh process is the restart that can help, so the service exits through its
            # drain (STOPPING=1, the captioner closed) and systemd restarts it.
            _log.debug("edgecap: the run failed", exc_info=True)
            _log.error("edgecap: error: %s; exiting for systemd to restart the service", exc)
            code = 1
        finally:
            self.notifier.stopping()
            # Closed before the handlers go back: a second SIGTERM while the sinks
            # flush only asks for the stop under way again.
            self.close()
            for s, handler in old.items():
                signal.signal(s, handler)
        return code

    def _frame(self, result: FrameResult, now: float) -> None:
        camera = str(result.key)
        self._processed[camera] += 1
        self.metrics.frames_processed(camera)
        for device, ms in result.device_ms.items():
            self.metrics.inference(device, ms / 1000.0)
        if now - self._last_jpeg[camera] >= PAGE_FRAME_PERIOD_S:
            self._last_jpeg[camera] = now
            try:
                ok, jpeg = cv2.imencode(".jpg", result.frame.image, [cv2.IMWRITE_JPEG_QUALITY, 70])
            except cv2.error:  # a frame OpenCV cannot encode costs the page one picture, no more
                ok = False
            if ok:
                self.state.frame(camera, jpeg.tobytes(), time.time())
        for caption in result.captions:
            self.state.caption(camera, caption)
            self.sinks.caption(camera, caption)
            self.metrics.caption_latency(camera, caption.latency_ms / 1000.0)
            self._latency[camera].append(caption.latency_ms)
            self._track(camera, caption, result.frame.image)

    def _track(self, camera: str, caption: Caption, image: Any) -> None:
        # On the wall clock: the window ended (its last frame left the camera's
        # feed) latency_ms ago, and began as long before that as it lasted.
        end = time.time() - caption.latency_ms / 1000.0
        start = end - (caption.end_time - caption.start_time)
        with self._events_lock:
            for event, change in self._trackers[camera].update(caption, image, start, end):
                self._event(camera, event, change)

    def _end_event(self, camera: str) -> None:
        with self._events_lock:
            for event, change in self._trackers[camera].close():
                self._event(camera, event, change)

    def _event(self, camera: str, event: Event, change: Change) -> None:
        self.state.event(camera, event, change)
        self.sinks.event(camera, event, change)

    def _publish_stats(self) -> None:
        stats = self.captioner.stats()
        busy = stats.worker_utilization() if stats is not None else {}
        # The RNN's and the decoder's workers are CPU threads the plan's devices do not list.
        kinds = {str(w): w.kind for w in self.captioner.choice.workers.values()}
        plan_device = {str(w): d for d, w in self.captioner.choice.workers.items()}
        learned = stats.corrections if stats is not None else {}
        rows = []
        for worker, share in busy.items():
            steps = [s for s in stats.stages if s.worker == worker] if stats is not None else []
            rows.append({"device": worker, "kind": kinds.get(worker, "cpu"), "busy": round(share, 3),
                         "temperature_c": None, "throttled": False,
                         "predicted_ms": _step_sum(steps, "predicted_ms"),
                         "measured_ms": _step_sum(steps, "measured_ms"),
                         "compute_scale": learned.get(plan_device.get(worker, ""), {}).get("compute_scale")})
        rows += tpu_rows(self._tpus, self._sysfs, self._throttle)
        self.state.devices(rows)
        self.state.sinks(self.sinks.counters())
        if stats is not None:
            for q in stats.queues:
                self.metrics.queue_depth(q.name, q.mean_depth)
            for record in stats.failovers[self._failovers:]:
                self.metrics.failover(record.device, record.kind, record.how)
            self._failovers = len(stats.failovers)
            self.metrics.stages([(s.name, s.worker, s.predicted_ms, s.measured_ms) for s in stats.stages],
                                stats.corrections)
        now = time.monotonic()
        period = max(now - self._last_stats, 1e-6)
        self._last_stats = now
        for name, feed in zip(self._names, self.feeds):
            done, self._counted[name] = self._processed[name] - self._counted[name], self._processed[name]
            read, self._read[name] = feed.captured - self._read[name], feed.captured
            latencies = sorted(self._latency[name][-50:])
            self.state.pipeline(name, {
                # Over the last stats period: frames the camera delivered, and sampled frames processed.
                "fps_in": round(read / period, 2),
                "fps_out": round(done / period, 2),
                "dropped": feed.dropped,
                "reconnects": feed.reconnects,
                "latency_ms": {"p50": latencies[len(latencies) // 2]} if latencies else {},
            })
            del self._latency[name][:-50]
        self.sinks.stats(self.state.snapshot())
        self.notifier.status(self._status_line(stats))

    def _status_line(self, stats: Optional[PipelineStats]) -> str:
        fps = stats.fps_out if stats is not None else 0.0
        cams = ", ".join(f"{name} {feed.status}" for name, feed in zip(self._names, self.feeds))
        return f"{fps:.1f} frames/s; cameras: {cams}; devices: {', '.join(sorted(set(self.captioner.devices.values())))}"

    def close(self) -> None:
        """Stops the cameras, flushes the sinks, closes the page and the pipeline; idempotent."""
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        self.mux.stop()
        for feed in self.feeds:
            feed.request_stop()  # all at once: a stalled camera must not hold up the others
        deadline = self._stop_by or time.monotonic() + STOP_BUDGET_S
        for feed in self.feeds:
            feed.stop(timeout=max(0.0, min(1.0, deadline - time.monotonic() - 1.0)))
        for name in self._names:  # the events in progress end with the run, before the sinks close
            self._end_event(name)
        self._close_all()

    def _close_all(self) -> None:
        _on_signal(signal.SIGHUP, self._old_hup)
        for thing in reversed(self._closers):
            try:
                if thing is self.sinks:
                    thing.close(timeout=1.0)  # within the stop budget, however the broker is
                else:
                    thing.close()
            except Exception as exc:  # closing must go on: the sinks hold unflushed captions
                _log.warning("edgecap: closing %s failed: %s", type(thing).__name__, exc)
        self._closers = []


def model_info(bundle: Bundle) -> Dict[str, Any]:
    """What the status page and ``/api/stats`` say of the model: its name, what it knows, how scenes are judged.

    Args:
      bundle: The running bundle.

    Returns:
      ``{"name", "domain": {"kind", "about"}, "calibration": {"unknown_below",
      "feature_unknown_below"} or None, "notices": [the lines the journal gets]}``.
    """
    c = bundle.calibration
    calibration = None if c is None else {
        "unknown_below": c.confidence.unknown_below,
        "feature_unknown_below": None if c.feature is None else c.feature.unknown_below}
    return {"name": bundle.name, "domain": {"kind": bundle.domain.kind, "about": bundle.domain.about},
            "calibration": calibration, "notices": notices(bundle.name, bundle.domain, c)}


def _on_signal(signum: int, handler: Any) -> Any:
    """Sets a signal's handler from the main thread (only it may); returns the one it replaced."""
    if threading.current_thread() is not threading.main_thread() or handler is None:
        return None
    return signal.signal(signum, handler)


def _step_sum(steps: List[Any], field: str) -> Optional[float]:
    """A worker's steps' milliseconds a frame, summed; None unless every step has the figure."""
    values = [getattr(s, field) for s in steps]
    return None if not values or any(v is None for v in values) else round(sum(values), 3)


def tpu_rows(tpus: List[devices.DeviceInfo], sysfs: str,
             watch: devices.ThrottleWatch) -> List[Dict[str, Any]]:
    """Returns the status page's rows of the attached EdgeTPUs, read now from sysfs.

    Args:
      tpus: The TPUs as ``edgecap.devices.list_devices`` found them.
      sysfs: The sysfs root.
      watch: Logs a warning when a TPU starts throttling.

    Returns:
      One row per TPU: ``temperature_c`` and ``throttled`` are None when the TPU
      reports no temperature (USB Accelerators).
    """
    rows = []
    for info in tpus:
        state = devices.thermal(info.path, sysfs)
        throttled = watch.update(info.device, state)
        rows.append({"device": info.device, "kind": info.kind, "busy": None,
                     "temperature_c": None if state is None else state.temperature_c,
                     "throttled": None if state is None else throttled})
    return rows
