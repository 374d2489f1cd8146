"""systemd's notify protocol: READY, WATCHDOG, STATUS and STOPPING as datagrams to $NOTIFY_SOCKET.

Under ``Type=notify`` systemd passes the path of a Unix datagram socket in
``NOTIFY_SOCKET`` (a leading ``@`` names a socket in the abstract namespace)
and, with ``WatchdogSec=``, the watchdog period in ``WATCHDOG_USEC``. Each
message is one datagram of newline-separated ``KEY=VALUE`` lines; see
sd_notify(3). Outside systemd ``NOTIFY_SOCKET`` is unset and every call is a
no-op, so the service runs the same from a terminal.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Mapping, Optional

log = logging.getLogger(__name__)


class Notifier:
    """Sends state changes to systemd; does nothing when not started by it.

    Safe to call from several threads (one ``sendto`` per message). A send
    that fails is logged once and never raised: a service must not stop
    because its supervisor went away.
    """

    def __init__(self, environ: Optional[Mapping[str, str]] = None) -> None:
        """Reads the socket and watchdog period from the environment.

        Args:
          environ: The environment to read (default ``os.environ``).
        """
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address: Optional[str] = None
        if address.startswith("@"):
            self._address = "\0" + address[1:]
        elif address.startswith("/"):
            self._address = address
        elif address:
            log.warning("NOTIFY_SOCKET=%r is neither a path nor an abstract socket; not notifying", address)
        self._watchdog_usec = _watchdog_usec(env)
        self._socket: Optional[socket.socket] = None
        self._lock = threading.Lock()
        self._warned = False
        if self._address is not None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        """True when started by systemd with a notify socket."""
        return self._socket is not None

    def ready(self, status: Optional[str] = None) -> bool:
        """Tells systemd that start-up is complete (``READY=1``), with an optional status line."""
        return self.notify("READY=1", *([_status(status)] if status is not None else []))

    def watchdog(self) -> bool:
        """Pings the watchdog (``WATCHDOG=1``): call it from the loop whose hang should restart us."""
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        """Sets the one-line status ``systemctl status`` shows (``STATUS=...``)."""
        return self.notify(_status(text))

    def stopping(self) -> bool:
        """Tells systemd that shutdown has begun (``STOPPING=1``)."""
        return self.notify("STOPPING=1")

    def watchdog_interval(self) -> Optional[float]:
        """Seconds between watchdog pings: half of ``WATCHDOG_USEC``, as sd_watchdog_enabled(3) advises.

        Returns:
          The interval, or None when no watchdog is set for this process.
        """
        return self._watchdog_usec / 2e6 if self._watchdog_usec else None

    def notify(self, *fields: str) -> bool:
        """Sends ``KEY=VALUE`` fields as one datagram.

        Args:
          fields: The lines of the message.

        Returns:
          True if the datagram was sent; False when not under systemd or the
          send failed (logged once).
        """
        sock = self._socket
        if sock is None or self._address is None:
            return False
        try:
            # Never blocks: a receiver that stops reading (its queue full) must not
            # stall the frame loop that sends the watchdog pings; the datagram is dropped.
            sock.sendto("\n".join(fields).encode("utf-8"), socket.MSG_DONTWAIT, self._address)
            return True
        except OSError as exc:
            with self._lock:
                warned, self._warned = self._warned, True
            if not warned:
                log.warning("cannot notify systemd at %s: %s", self._address.replace("\0", "@"), exc)
            return False

    def close(self) -> None:
        """Closes the socket; later calls are no-ops."""
        sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()


def _status(text: str) -> str:
    """A STATUS field: one line, as the protocol is line-based."""
    return "STATUS=" + " ".join(str(text).split())


def _watchdog_usec(env: Mapping[str, str]) -> int:
    """WATCHDOG_USEC when it is meant for this process (WATCHDOG_PID absent or ours), else 0."""
    pid = env.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return 0
    try:
        usec = int(env.get("WATCHDOG_USEC", "0"))
    except ValueError:
        return 0
    return max(usec, 0)
