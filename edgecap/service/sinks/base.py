"""What every sink shares: the ``Sink`` calls, the records sinks write, and ``SinkSet``, which fans out.

Every sink has the same calls — ``caption``, ``event``, ``stats``,
``counters`` and ``close`` — and ``SinkSet`` fans them out so that one failing
sink never stops the others.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:  # the captioner pulls in the interpreters; sinks only need to_dict()
    from edgecap.captioner import Caption
    from edgecap.events import Change, Event

log = logging.getLogger(__name__)


def caption_record(camera: str, caption: "Caption") -> Dict[str, Any]:
    """The JSON object a sink writes for one caption.

    Args:
      camera: The camera's name.
      caption: The caption.

    Returns:
      ``camera``, the caption's fields (``Caption.to_dict()``) and ``time``,
      the wall-clock time it was emitted (Unix seconds).
    """
    record: Dict[str, Any] = {"camera": camera}
    record.update(caption.to_dict())
    record["time"] = round(time.time(), 3)
    return record


def event_record(event: "Event", change: "Change") -> Dict[str, Any]:
    """The JSON object the MQTT sink publishes, and the JSON-lines sink writes, for an event's change.

    Args:
      event: The event.
      change: What happened to it (``opened`` or ``closed``).

    Returns:
      The event's fields (``Event.to_dict()``, no thumbnail bytes) and ``change``.
    """
    record = event.to_dict()
    record["change"] = change
    return record


class Sink:
    """One destination for captions. Each sink owns its resources.

    Attributes:
      name: Short name for logs and counters.
    """

    name = "sink"

    def caption(self, camera: str, caption: "Caption") -> None:
        """Delivers one caption of ``camera``."""

    def event(self, camera: str, event: "Event", change: "Change") -> None:
        """Delivers a change of one of ``camera``'s events (opened, extended, closed)."""

    def stats(self, snapshot: Dict[str, Any]) -> None:
        """Delivers the service's stats (a JSON-ready dict), called every few seconds."""

    def counters(self) -> Dict[str, Any]:
        """Returns what the sink has done, JSON-ready: at least ``sent``, ``dropped`` and ``errors``."""
        return {"sent": 0, "dropped": 0, "errors": 0}

    def reopen(self) -> None:
        """Reopens what the sink writes to (SIGHUP, after logrotate moved a file); never raises."""

    def close(self, timeout: float = 2.0) -> None:
        """Flushes and releases everything within ``timeout`` seconds; never raises."""



class SinkSet(Sink):
    """Fans calls out to several sinks; a sink that raises is logged once, counted, and skipped.

    Thread-safe: calls are serialized, so cameras may deliver from their own threads.
    """

    name = "sinks"

    def __init__(self, sinks: List[Sink]) -> None:
        """Takes ownership of ``sinks`` (``close`` closes them)."""
        self.sinks = list(sinks)
        self._failures: Dict[str, int] = {sink.name: 0 for sink in self.sinks}
        self._lock = threading.Lock()

    def caption(self, camera: str, caption: "Caption") -> None:
        """Delivers the caption to every sink."""
        with self._lock:
            for sink in self.sinks:
                try:
                    sink.caption(camera, caption)
                except Exception as exc:
                    self._failed(sink, "caption", exc)

    def event(self, camera: str, event: "Event", change: "Change") -> None:
        """Delivers the event's change to every sink."""
        with self._lock:
            for sink in self.sinks:
                try:
                    sink.event(camera, event, change)
                except Exception as exc:
                    self._failed(sink, "event", exc)

    def stats(self, snapshot: Dict[str, Any]) -> None:
        """Delivers the stats snapshot to every sink."""
        with self._lock:
            for sink in self.sinks:
                try:
                    sink.stats(snapshot)
                except Exception as exc:
                    self._failed(sink, "stats", exc)

    def _failed(self, sink: Sink, what: str, exc: BaseException) -> None:
        self._failures[sink.name] = self._failures.get(sink.name, 0) + 1
        if self._failures[sink.name] == 1:
            log.warning("%s sink failed (%s): %s: %s; the other sinks go on, further failures are counted",
                        sink.name, what, type(exc).__name__, exc)

    def counters(self) -> Dict[str, Any]:
        """Returns each sink's counters by sink name; ``errors`` includes the calls that raised (``failures``)."""
        with self._lock:
            out = {}
            for sink in self.sinks:
                counts = {"sent": 0, "dropped": 0, "errors": 0, **sink.counters()}
                failures = self._failures.get(sink.name, 0)
                counts["failures"] = failures
                counts["errors"] += failures
                out[sink.name] = counts
            return out

    def reopen(self) -> None:
        """Reopens every sink's files (SIGHUP)."""
        with self._lock:
            for sink in self.sinks:
                try:
                    sink.reopen()
                except Exception as exc:
                    self._failed(sink, "reopen", exc)

    def close(self, timeout: float = 2.0) -> None:
        """Closes every sink within ``timeout`` seconds overall."""
        deadline = time.monotonic() + timeout
        with self._lock:
            sinks, self.sinks = self.sinks, []
        for sink in sinks:
            try:
                sink.close(max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                log.warning("%s sink: close failed: %s", sink.name, exc)
