"""Chrome trace-event JSON of a pipeline run: one track per device, one slice per invoke.

The file opens in Perfetto (ui.perfetto.dev) and chrome://tracing. Format:
https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import collections
import json
import os
import time
from typing import Any, Deque, Dict, Iterable, List

from edgecap.errors import ConfigError


class Tracer:
    """Collects slices from pipeline threads and writes them as trace-event JSON.

    Tracks are registered before the threads start; ``slice`` is then safe to
    call from any thread. The newest ``max_events`` slices are kept, so a
    service that traces forever holds bounded memory.
    """

    def __init__(self, max_events: int = 1_000_000) -> None:
        self._origin = time.perf_counter()
        self._tracks: Dict[str, int] = {}
        self._events: Deque[Dict[str, Any]] = collections.deque(maxlen=max_events)

    def add_tracks(self, names: Iterable[str]) -> None:
        """Registers tracks (one per device or thread), in display order."""
        for name in names:
            self._tracks.setdefault(name, len(self._tracks) + 1)

    def slice(self, track: str, name: str, frame: int, start: float, end: float) -> None:
        """Records one invoke.

        Args:
          track: A registered track, e.g. ``tpu:0``.
          name: What ran, e.g. the stage name.
          frame: The frame's index, shown in the slice's args.
          start: ``time.perf_counter()`` at the start.
          end: ``time.perf_counter()`` at the end.
        """
        self._events.append(
            {
                "ph": "X",
                "name": name,
                "pid": 1,
                "tid": self._tracks[track],
                "ts": (start - self._origin) * 1e6,
                "dur": (end - start) * 1e6,
                "args": {"frame": frame},
            }
        )

    def events(self) -> List[Dict[str, Any]]:
        """Returns the trace events: track names first, then the slices."""
        meta: List[Dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "edgecap"}}
        ]
        for name, tid in self._tracks.items():
            meta.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}})
            meta.append(
                {"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": tid, "args": {"sort_index": tid}}
            )
        return meta + list(self._events)

    def write(self, path: "str | os.PathLike[str]") -> None:
        """Writes the trace as JSON to ``path``.

        Raises:
          ConfigError: If ``path`` cannot be written.
        """
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"traceEvents": self.events(), "displayTimeUnit": "ms"}, f)
        except OSError as exc:
            raise ConfigError(f"trace {path}: cannot write it ({exc.strerror}); choose a writable path") from None


def load_slices(path: "str | os.PathLike[str]") -> Dict[str, List[Dict[str, Any]]]:
    """Reads a trace written by ``Tracer.write``.

    Returns:
      Track name -> its slices (dicts with ``name``, ``ts``, ``dur``, ``args``), in time order.
    """
    with open(path, encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks: Dict[str, List[Dict[str, Any]]] = {name: [] for name in names.values()}
    for e in events:
        if e["ph"] == "X":
            tracks[names[e["tid"]]].append(e)
    for slices in tracks.values():
        slices.sort(key=lambda e: e["ts"])
    return tracks
