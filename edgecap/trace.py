"""Chrome trace-event JSON of a pipeline run: one track per device, one slice per invoke.

The file opens in Perfetto (ui.perfetto.dev) and chrome://tracing. Format:
https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU

Memory is bounded in bytes: slices are kept as fixed-size records
(``SLICE_BYTES`` each: track and name as interned 16-bit ids, the frame index,
start and end times) in a ring buffer of ``max_bytes`` (default 32 MiB, about
1.2 million slices); when it is full the newest slices overwrite the oldest.
The buffer is reserved zeroed when the tracer is made, so the operating system
backs its pages only as slices fill them. Instant events (a failover) are
kept apart, the newest ``MAX_INSTANTS``.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import threading
import time
from typing import Any, Deque, Dict, Iterable, Iterator, List, Tuple

import numpy as np

from edgecap import files
from edgecap.errors import ConfigError
from edgecap.outputs import atomic_path

DEFAULT_MAX_BYTES = 32 * 2**20
MAX_INSTANTS = 1000

# Packed: 28 bytes a slice, where a dict per slice took 544.
_SLICE = np.dtype([("track", "<u2"), ("name", "<u2"), ("frame", "<i8"), ("start", "<f8"), ("end", "<f8")])
SLICE_BYTES = _SLICE.itemsize
_MAX_IDS = 2**16 - 1  # ids are 16-bit; 0 marks a record not yet written
_WRITE_CHUNK = 2048  # slices formatted at once when writing


class Tracer:
    """Collects slices from pipeline threads and writes them as trace-event JSON.

    Tracks are registered before the threads start; ``slice`` is then safe to
    call from any thread. The newest slices that fit in ``max_bytes`` are kept,
    so a service that traces forever holds bounded memory.

    Args:
      max_bytes: Memory for slice records; the tracer keeps
        ``max_bytes // SLICE_BYTES`` slices.

    Raises:
      ConfigError: If ``max_bytes`` cannot hold one slice.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < SLICE_BYTES:
            raise ConfigError(
                f"trace max_bytes {max_bytes}: too small for one slice ({SLICE_BYTES} bytes); "
                f"use at least {SLICE_BYTES}, e.g. the default {DEFAULT_MAX_BYTES}"
            )
        self._origin = time.perf_counter()
        self._tracks: Dict[str, int] = {}
        self._names: Dict[str, int] = {}
        self._intern_lock = threading.Lock()
        self._ring = np.zeros(max_bytes // SLICE_BYTES, dtype=_SLICE)
        # next() on a count is atomic, so writers need no lock for their slot.
        self._counter = itertools.count()
        # Instant events (a failover): rare, so plain dicts, the newest kept.
        self._instants: Deque[Dict[str, Any]] = collections.deque(maxlen=MAX_INSTANTS)

    @property
    def capacity(self) -> int:
        """How many slices the tracer keeps (the newest)."""
        return len(self._ring)

    @property
    def nbytes(self) -> int:
        """Bytes held by slice records: at most ``max_bytes``."""
        return self._ring.nbytes

    def add_tracks(self, names: Iterable[str]) -> None:
        """Registers tracks (one per device or thread), in display order."""
        with self._intern_lock:
            for name in names:
                if name not in self._tracks:
                    self._check_room(self._tracks, "tracks")
                    self._tracks[name] = len(self._tracks) + 1

    def slice(self, track: str, name: str, frame: int, start: float, end: float) -> None:
        """Records one invoke.

        Args:
          track: A registered track, e.g. ``tpu:0``.
          name: What ran, e.g. the stage name.
          frame: The frame's index, shown in the slice's args.
          start: ``time.perf_counter()`` at the start.
          end: ``time.perf_counter()`` at the end.
        """
        name_id = self._names.get(name)
        if name_id is None:
            name_id = self._intern(name)
        # One C call under the GIL: a reader never sees half a record.
        self._ring[next(self._counter) % len(self._ring)] = (self._tracks[track], name_id, frame, start, end)

    def instant(self, name: str, t: float, args: Dict[str, Any]) -> None:
        """Records a moment of the whole run (e.g. a failover), shown as a line across every track.

        Args:
          name: What happened, e.g. ``failover``.
          t: ``time.perf_counter()`` when it happened.
          args: JSON-ready details shown with it.
        """
        self._instants.append({"ph": "i", "s": "g", "name": name, "pid": 1, "tid": 0,
                               "ts": (t - self._origin) * 1e6, "args": dict(args)})

    def _intern(self, name: str) -> int:
        with self._intern_lock:
            if name not in self._names:
                self._check_room(self._names, "slice names")
                self._names[name] = len(self._names) + 1
            return self._names[name]

    @staticmethod
    def _check_room(ids: Dict[str, int], what: str) -> None:
        if len(ids) >= _MAX_IDS:
            raise ConfigError(f"trace: more than {_MAX_IDS} {what}; trace fewer distinct {what}")

    def _chunks(self) -> Iterator[np.ndarray]:
        """Yields the kept records oldest first, as copies of a chunk at a time.

        Slots are written in the order slices are recorded, so the oldest
        follows the one that ended last; no sorted copy of the whole ring is made.
        """
        ring = self._ring
        ends = ring["end"]  # unwritten slots are zeros
        newest, last = 0, -np.inf
        for lo in range(0, len(ring), _WRITE_CHUNK):  # a chunk at a time: argmax would copy the column
            i = lo + int(np.argmax(ends[lo:lo + _WRITE_CHUNK]))
            if ends[i] > last:
                newest, last = i, ends[i]
        first = newest + 1
        for lo in range(0, len(ring), _WRITE_CHUNK):
            rec = ring.take(np.arange(first + lo, first + min(lo + _WRITE_CHUNK, len(ring))), mode="wrap")
            yield rec[rec["track"] != 0]  # track 0: a slot not written yet

    def _columns(self, rec: np.ndarray) -> Iterator[Tuple[int, int, int, float, float]]:
        """(track id, name id, frame, ts us, dur us) of each record."""
        ts = ((rec["start"] - self._origin) * 1e6).tolist()
        dur = ((rec["end"] - rec["start"]) * 1e6).tolist()
        return zip(rec["track"].tolist(), rec["name"].tolist(), rec["frame"].tolist(), ts, dur)

    def _meta(self) -> List[Dict[str, Any]]:
        meta: List[Dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "edgecap"}}
        ]
        for name, tid in self._tracks.items():
            meta.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}})
            meta.append(
                {"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": tid, "args": {"sort_index": tid}}
            )
        return meta

    def events(self) -> List[Dict[str, Any]]:
        """Returns the trace events: track names first, then the kept slices, oldest first."""
        names = {i: name for name, i in self._names.items()}
        events = self._meta() + list(self._instants)
        for rec in self._chunks():
            events += [
                {"ph": "X", "name": names[n], "pid": 1, "tid": t, "ts": ts, "dur": dur, "args": {"frame": f}}
                for t, n, f, ts, dur in self._columns(rec)
            ]
        return events

    def write(self, path: "str | os.PathLike[str]") -> None:
        """Writes the trace as JSON to ``path``.

        Slices are formatted a chunk at a time, so writing needs little memory
        beyond the ring buffer itself.

        Raises:
          ConfigError: If ``path`` cannot be written.
        """
        names = {i: json.dumps(name) for name, i in self._names.items()}
        try:
            # Whole or not at all: a run stopped mid-write leaves no half trace.
            with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
                f.write('{"displayTimeUnit": "ms", "traceEvents": [')
                f.write(json.dumps(self._meta() + list(self._instants))[1:-1])
                for rec in self._chunks():
                    f.writelines(
                        f',\n{{"ph": "X", "name": {names[n]}, "pid": 1, "tid": {t}, "ts": {ts!r}, '
                        f'"dur": {dur!r}, "args": {{"frame": {fr}}}}}'
                        for t, n, fr, ts, dur in self._columns(rec)
                    )
                f.write("]}\n")
        except OSError as exc:
            raise ConfigError(f"trace {path}: cannot write it ({exc.strerror}); choose a writable path") from None


def load_slices(path: "str | os.PathLike[str]") -> Dict[str, List[Dict[str, Any]]]:
    """Reads a trace written by ``Tracer.write``.

    Returns:
      Track name -> its slices (dicts with ``name``, ``ts``, ``dur``, ``args``), in time order.

    Raises:
      EdgecapError: If the file is missing, not a regular file or over ``edgecap.files``' bound.
    """
    data = files.read_bytes(path, what="trace", fix="write it again with --trace", kind="trace")
    events = json.loads(data)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks: Dict[str, List[Dict[str, Any]]] = {name: [] for name in names.values()}
    for e in events:
        if e["ph"] == "X":
            tracks[names[e["tid"]]].append(e)
    for slices in tracks.values():
        slices.sort(key=lambda e: e["ts"])
    return tracks
