"""The stdout sink: one line per caption, with journald priorities when stdout is the journal."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Dict, Optional, TextIO

from edgecap.service.sinks.base import Sink

if TYPE_CHECKING:
    from edgecap.captioner import Caption

# syslog priorities that journald reads from a "<N>" line prefix (sd-daemon(3)).
PRIORITIES = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


def is_journal(stream: Any) -> bool:
    """True if ``stream`` is connected to the systemd journal.

    systemd sets ``JOURNAL_STREAM=DEV:INODE`` for a service whose stdout or
    stderr is the journal; the stream is the journal only when its file
    matches (a redirect in between makes it a plain file again).

    Args:
      stream: A file object (stdout, stderr).

    Returns:
      Whether lines written to it should carry ``<N>`` priority prefixes.
    """
    expected = os.environ.get("JOURNAL_STREAM", "")
    if not expected:
        return False
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return expected == f"{st.st_dev}:{st.st_ino}"


class JournalFormatter(logging.Formatter):
    """A logging formatter that prefixes each line with its journald priority (``<4>`` for warnings).

    Install it on the service's log handler when ``is_journal(handler.stream)``
    so that ``journalctl -p warning`` finds the service's warnings.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Returns the formatted record, every line prefixed with ``<N>``."""
        prefix = f"<{_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines() or [""])


def _priority(level: int) -> int:
    """The syslog priority of a logging level (levels between take the next more severe)."""
    for threshold in sorted(PRIORITIES, reverse=True):
        if level >= threshold:
            return PRIORITIES[threshold]
    return PRIORITIES[logging.DEBUG]


class StdoutSink(Sink):
    """One line per caption on stdout; with journald priority ``<6>`` when stdout is the journal."""

    name = "stdout"

    def __init__(self, stream: Optional[TextIO] = None) -> None:
        """Writes to ``stream``.

        Args:
          stream: Where to write (default: ``sys.stdout``).
        """
        self._stream = sys.stdout if stream is None else stream
        self._prefix = f"<{PRIORITIES[logging.INFO]}>" if is_journal(self._stream) else ""
        self._written = 0

    def caption(self, camera: str, caption: "Caption") -> None:
        """Writes ``camera [start - end] text`` (and ``(unknown scene)``) and flushes, so the journal has it at once."""
        text = " ".join(caption.text.split())  # one caption, one line
        mark = "   (unknown scene)" if getattr(caption, "scene", None) == "unknown" else ""
        self._stream.write(f"{self._prefix}{camera} [{caption.start_time:7.2f}s - "
                           f"{caption.end_time:7.2f}s] {text}{mark}\n")
        self._stream.flush()
        self._written += 1

    def counters(self) -> Dict[str, Any]:
        """Returns ``sent`` (lines written), ``dropped`` and ``errors`` (none: a failed write raises)."""
        return {"sent": self._written, "dropped": 0, "errors": 0, "written": self._written}

    def close(self, timeout: float = 2.0) -> None:
        """Flushes the stream (it is not ours to close)."""
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass
