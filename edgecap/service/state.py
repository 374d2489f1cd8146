"""The service's shared state: what the pipelines write and the HTTP server reads.

One lock guards everything; writers hold it for a dict update, readers for a
copy. Ages are measured on the monotonic clock (a board without a real-time
clock steps its wall clock when NTP syncs); wall-clock times are recorded only
for display.

Events (``edgecap.events``): each camera's event in progress and its last
``recent_events`` closed ones, as ``Event.to_dict()`` records (``id``,
``camera``, ``text``, ``start_time`` and ``end_time`` in Unix seconds,
``confidence``, ``windows``, ``has_thumbnail``, ``closed``), under
``snapshot()["events"][camera]`` as ``{"current": record or None, "recent":
[records, newest first]}``; ``event_thumbnail(id)`` returns the JPEG of any of
them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

STATUSES = ("starting", "online", "offline")
DEVICE_KEYS = ("device", "kind", "busy", "temperature_c", "throttled", "predicted_ms", "measured_ms",
               "compute_scale")


@dataclass
class _Camera:
    """One camera's latest everything (guarded by ServiceState's lock)."""

    status: str
    reason: str
    since: float  # monotonic time of the last status change
    recent: Deque[Dict[str, Any]]
    jpeg: Optional[bytes] = None
    frame_seq: int = 0
    frame_t: float = 0.0  # source timestamp of the latest frame
    frame_at: Optional[float] = None  # monotonic arrival time of the latest frame
    caption_at: Optional[float] = None  # monotonic arrival time of the latest caption
    captions: int = 0
    pipeline: Dict[str, Any] = field(default_factory=dict)
    event: Optional[Dict[str, Any]] = None  # the event in progress, to_dict()
    closed_events: Deque[Dict[str, Any]] = field(default_factory=deque)  # newest first


class ServiceState:
    """Thread-safe state of a running service: cameras, frames, captions, devices.

    Args:
      cameras: The camera names, in display order.
      recent: How many captions per camera to keep (the latest included).
      recent_events: How many closed events per camera to keep.
      clock: Monotonic clock in seconds (a parameter so tests can move time).

    Raises:
      ValueError: No camera, a repeated name, or ``recent`` < 1 (the config
        layer refuses these first; here they are programming errors).
    """

    def __init__(self, cameras: Sequence[str], recent: int = 10, recent_events: int = 10,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not cameras:
            raise ValueError("service state: no camera; name at least one")
        if len(set(cameras)) != len(cameras):
            raise ValueError(f"service state: camera names repeat in {list(cameras)}")
        if recent < 1:
            raise ValueError(f"service state: recent={recent}; keep at least 1 caption")
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        self._started = now
        self._started_wall = time.time()
        self._cameras: Dict[str, _Camera] = {
            name: _Camera("starting", "", now, deque(maxlen=recent), closed_events=deque(maxlen=recent_events))
            for name in cameras
        }
        self._thumbnails: Dict[str, bytes] = {}  # event id -> JPEG, for the events the cameras keep
        self._devices: List[Dict[str, Any]] = []
        self._sinks: Dict[str, Dict[str, Any]] = {}
        self._model: Optional[Dict[str, Any]] = None
        self._version = 0  # bumped on every write: lets a reader skip an unchanged snapshot

    @property
    def cameras(self) -> List[str]:
        """The camera names, in display order."""
        return list(self._cameras)

    @property
    def version(self) -> int:
        """A counter that changes whenever anything in the state does."""
        with self._lock:
            return self._version

    def _camera(self, camera: str) -> _Camera:
        try:
            return self._cameras[camera]
        except KeyError:
            raise KeyError(f"unknown camera {camera!r}; known: {', '.join(self._cameras)}") from None

    def set_camera(self, camera: str, status: str, reason: str = "") -> None:
        """Records a camera's status.

        Args:
          camera: The camera's name.
          status: ``"starting"``, ``"online"`` or ``"offline"``.
          reason: Why, in a few words (shown by /healthz and the page).

        Raises:
          KeyError: An unknown camera.
          ValueError: An unknown status.
        """
        if status not in STATUSES:
            raise ValueError(f"camera status {status!r}; use one of {', '.join(STATUSES)}")
        with self._lock:
            cam = self._camera(camera)
            if cam.status != status:
                cam.since = self._clock()
            cam.status, cam.reason = status, reason
            self._version += 1

    def frame(self, camera: str, jpeg: bytes, t: float) -> None:
        """Keeps a camera's latest frame.

        Args:
          camera: The camera's name.
          jpeg: The frame, JPEG-encoded.
          t: Its source timestamp in seconds.
        """
        with self._lock:
            cam = self._camera(camera)
            cam.jpeg, cam.frame_t, cam.frame_at = bytes(jpeg), float(t), self._clock()
            cam.frame_seq += 1
            self._version += 1

    def caption(self, camera: str, caption: Any) -> None:
        """Keeps a camera's latest caption and its last ``recent`` ones.

        Args:
          camera: The camera's name.
          caption: An ``edgecap.captioner.Caption`` (anything with ``to_dict()``).
        """
        record = dict(caption.to_dict())
        record["camera"] = camera
        record["at"] = time.time()
        with self._lock:
            cam = self._camera(camera)
            cam.recent.append(record)
            cam.caption_at = self._clock()
            cam.captions += 1
            self._version += 1

    def event(self, camera: str, event: Any, change: str) -> None:
        """Records a change of one of a camera's events.

        Args:
          camera: The camera's name.
          event: An ``edgecap.events.Event``.
          change: ``"opened"``, ``"extended"`` or ``"closed"``.

        Raises:
          KeyError: An unknown camera.
        """
        record = event.to_dict()
        with self._lock:
            cam = self._camera(camera)
            if change == "closed":
                if cam.event is not None and cam.event["id"] == record["id"]:
                    cam.event = None
                if len(cam.closed_events) == cam.closed_events.maxlen:
                    self._thumbnails.pop(cam.closed_events[-1]["id"], None)
                cam.closed_events.appendleft(record)
            else:
                if cam.event is not None and cam.event["id"] != record["id"]:
                    self._thumbnails.pop(cam.event["id"], None)  # ended without a close (not by the tracker)
                cam.event = record
            if event.thumbnail:
                self._thumbnails[record["id"]] = event.thumbnail
            self._version += 1

    def event_thumbnail(self, event_id: str) -> Optional[bytes]:
        """Returns the JPEG thumbnail of an event the state keeps (in progress or recent), or None."""
        with self._lock:
            return self._thumbnails.get(event_id)

    def devices(self, rows: Sequence[Dict[str, Any]]) -> None:
        """Replaces the device table.

        Args:
          rows: One dict per device with keys ``device``, ``kind``, ``busy``
            (0..1 share of time busy), ``temperature_c`` (None when unknown),
            ``throttled``, ``predicted_ms`` and ``measured_ms`` (the plan's
            and the measured time of its steps a frame), ``compute_scale``
            (the correction learned for it); missing keys read as None.
        """
        table = [{k: row.get(k) for k in DEVICE_KEYS} for row in rows]
        with self._lock:
            self._devices = table
            self._version += 1

    def sinks(self, counters: Dict[str, Dict[str, Any]]) -> None:
        """Replaces the sinks' counters (``SinkSet.counters()``: by sink, ``sent``, ``dropped``, ``errors``, ...).

        Args:
          counters: JSON-ready dicts by sink name.
        """
        with self._lock:
            self._sinks = {name: dict(c) for name, c in counters.items()}
            self._version += 1

    def model(self, info: Dict[str, Any]) -> None:
        """Records what the running model knows (``name``, ``domain``, ``calibration``, ``notices``), for the page.

        Args:
          info: A JSON-ready dict (``edgecap.service.service.model_info``).
        """
        with self._lock:
            self._model = dict(info)
            self._version += 1

    def pipeline(self, camera: str, stats: Dict[str, Any]) -> None:
        """Replaces a camera's pipeline figures (fps_in, fps_out, dropped, latency_ms, ...).

        Args:
          camera: The camera's name.
          stats: A JSON-ready dict.
        """
        with self._lock:
            self._camera(camera).pipeline = dict(stats)
            self._version += 1

    def latest_jpeg(self, camera: str) -> Optional[bytes]:
        """Returns a camera's latest frame as JPEG bytes, or None before the first.

        Raises:
          KeyError: An unknown camera.
        """
        with self._lock:
            return self._camera(camera).jpeg

    def captions(self) -> Dict[str, Optional[Dict[str, Any]]]:
        """Returns the latest caption of each camera (None before its first), JSON-ready."""
        with self._lock:
            return {name: (dict(cam.recent[-1]) if cam.recent else None)
                    for name, cam in self._cameras.items()}

    def snapshot(self) -> Dict[str, Any]:
        """Returns everything but the frames' pixels as JSON-ready plain types.

        Returns:
          ``{"version", "started", "uptime_s", "cameras": {name: {...}},
          "captions": {name: [newest first]}, "events": {name: {"current":
          event or None, "recent": [closed events, newest first]}},
          "devices": [...], "sinks": {name: {"sent", "dropped", "errors", ...}},
          "model": {"name", "domain", "calibration", "notices"} or None}``
          (events as the module docstring says; the model as ``model`` set it). Each camera
          has ``status``, ``reason``, ``status_age_s``, ``frame_seq`` (bumped
          per frame: a page reloads the image when it changes), ``frame_t``,
          ``frame_age_s``, ``caption_age_s``, ``captions`` (count) and
          ``pipeline``. Ages are None before the first frame or caption.
        """
        with self._lock:
            now = self._clock()
            cameras = {}
            captions = {}
            events = {}
            for name, cam in self._cameras.items():
                cameras[name] = {
                    "status": cam.status,
                    "reason": cam.reason,
                    "status_age_s": now - cam.since,
                    "frame_seq": cam.frame_seq,
                    "frame_t": cam.frame_t,
                    "frame_age_s": None if cam.frame_at is None else now - cam.frame_at,
                    "caption_age_s": None if cam.caption_at is None else now - cam.caption_at,
                    "captions": cam.captions,
                    "pipeline": dict(cam.pipeline),
                }
                captions[name] = [dict(c) for c in reversed(cam.recent)]
                events[name] = {"current": None if cam.event is None else dict(cam.event),
                                "recent": [dict(e) for e in cam.closed_events]}
            return {
                "version": self._version,
                "started": self._started_wall,
                "uptime_s": now - self._started,
                "cameras": cameras,
                "captions": captions,
                "events": events,
                "devices": [dict(d) for d in self._devices],
                "sinks": {name: dict(c) for name, c in self._sinks.items()},
                "model": None if self._model is None else dict(self._model),
            }

    def health(self, max_caption_age_s: float) -> Tuple[bool, str]:
        """Says whether the service is doing its job.

        Not ok when a camera is not online, or when an online camera has given
        no caption for longer than ``max_caption_age_s``, counted from its last
        caption or from when it (re)came online, whichever is later: a camera
        that just reconnected gets the time to fill a window.

        Args:
          max_caption_age_s: The longest acceptable silence per camera.

        Returns:
          ``(ok, reason)``; the reason names every failing camera, or says
          ``"ok"``.
        """
        problems = []
        with self._lock:
            now = self._clock()
            for name, cam in self._cameras.items():
                if cam.status != "online":
                    why = f": {cam.reason}" if cam.reason else ""
                    problems.append(f"camera {name} {cam.status}{why}")
                    continue
                last = cam.since if cam.caption_at is None else max(cam.caption_at, cam.since)
                if now - last > max_caption_age_s:
                    problems.append(f"camera {name}: no caption for {now - last:.0f} s "
                                    f"(limit {max_caption_age_s:g} s)")
        return (not problems, "; ".join(problems) or "ok")
