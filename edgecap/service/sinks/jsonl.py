"""The JSON-lines sink: captions (and, if asked, events) as lines in a file rotated by size."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, TextIO

from edgecap.errors import ConfigError
from edgecap.service.sinks.base import Sink, caption_record, event_record

if TYPE_CHECKING:
    from edgecap.captioner import Caption
    from edgecap.events import Change, Event

log = logging.getLogger(__name__)


class JsonlSink(Sink):
    """Captions as JSON lines in a file, rotated by size like logrotate's ``size``.

    ``path`` grows until the next line would pass ``max_bytes``; then ``path.1``
    becomes ``path.2`` and so on (``backups`` kept), ``path`` becomes ``path.1``
    and a new ``path`` starts. Each line is flushed to the OS (not fsynced: a
    power cut may lose the last lines, a crash of the service does not).

    One ``caption_record`` line per caption and, with ``events`` (``[sinks.jsonl]
    events = true``), one ``event_record`` line when an event opens and when it
    closes (not per window: the caption lines are those); an event line is told
    apart by its ``change`` key.
    """

    name = "jsonl"

    def __init__(self, path: "str | os.PathLike[str]", max_bytes: int = 10_000_000, backups: int = 3,
                 events: bool = False) -> None:
        """Opens (or creates, mode 0640) the file for appending.

        Args:
          path: The file.
          max_bytes: Size past which the file is rotated.
          backups: Rotated files kept.
          events: Also write events as they open and close.

        Raises:
          ConfigError: If the file cannot be opened for writing (missing
            directory, permissions, a directory in its place).
        """
        self._path = Path(path)
        self._max_bytes = max_bytes
        self._backups = backups
        self._events = events
        self._written = 0
        self._rotations = 0
        self._reopens = 0
        self._closed = False
        try:
            self._file: Optional[TextIO] = self._open()
        except OSError as exc:
            raise ConfigError(f"sinks.jsonl.path: cannot write {self._path} ({exc.strerror or exc}); "
                              f"create its directory, writable by the service's user, "
                              f"or change sinks.jsonl.path") from None
        self._size = self._file.tell()

    def reopen(self) -> None:
        """Closes the file and opens ``path`` again (created if logrotate moved it away); appends go there.

        Raises:
          OSError: It cannot be opened now (``SinkSet`` counts it; the next line tries again).
        """
        if self._closed:
            return
        self._close_file()
        self._file = self._open()
        self._size = self._file.tell()
        self._reopens += 1

    def _open(self, truncate: bool = False) -> TextIO:
        # Captions say what the camera saw: not for every user's eyes (0640).
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self._path, flags | (os.O_TRUNC if truncate else 0), 0o640)
        return os.fdopen(fd, "a", encoding="utf-8")

    def caption(self, camera: str, caption: "Caption") -> None:
        """Appends one JSON line, rotating first if it would pass ``max_bytes``.

        Raises:
          OSError: The disk is full or the file went away (``SinkSet`` counts it).
        """
        self._write(caption_record(camera, caption))

    def event(self, camera: str, event: "Event", change: "Change") -> None:
        """Appends the event's line when it opens or closes, if the sink writes events.

        Raises:
          OSError: As ``caption``.
        """
        if self._events and change != "extended":
            self._write(event_record(event, change))

    def _write(self, record: Dict[str, Any]) -> None:
        if self._closed:
            return
        line = json.dumps(record, ensure_ascii=False) + "\n"
        size = len(line.encode("utf-8"))
        if self._file is None:  # a rotation or a reopen that failed: open the file again
            self._file = self._open()
            self._size = self._file.tell()
        if self._size and self._size + size > self._max_bytes and self._is_regular():
            self._rotate()
        assert self._file is not None
        self._file.write(line)
        self._file.flush()
        self._size += size
        self._written += 1

    def _is_regular(self) -> bool:
        """Whether ``path`` is a plain file: a FIFO or a device the user named is written, never renamed."""
        try:
            return self._path.is_file()
        except OSError:
            return False

    def _rotate(self) -> None:
        """Shifts path.N-1 -> path.N ... path -> path.1 and starts an empty path."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._backups > 0:
            for n in range(self._backups - 1, 0, -1):
                older = self._path.with_name(f"{self._path.name}.{n}")
                if older.exists():
                    os.replace(older, self._path.with_name(f"{self._path.name}.{n + 1}"))
            if self._path.exists():
                os.replace(self._path, self._path.with_name(f"{self._path.name}.1"))
        self._file = self._open(truncate=True)
        self._size = 0
        self._rotations += 1

    def counters(self) -> Dict[str, Any]:
        """Returns ``sent`` (lines written), ``dropped``, ``errors`` (a failed write raises), ``rotations``, ``reopens``."""
        return {"sent": self._written, "dropped": 0, "errors": 0, "written": self._written,
                "rotations": self._rotations, "reopens": self._reopens}

    def close(self, timeout: float = 2.0) -> None:
        """Flushes and closes the file; later captions are ignored."""
        self._closed = True
        self._close_file()

    def _close_file(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError as exc:
                log.warning("closing %s: %s", self._path, exc)
