"""The status server's connections: one selector thread reads requests, a few workers answer.

The selector thread reads every connection's request (head and body) without
blocking, under a deadline, and hands complete requests to ``WORKERS``
threads that answer and close. An idle or slow client therefore costs a
socket and a buffer, never a thread, and is dropped when its deadline passes
(``header_timeout_s`` for the head, ``body_timeout_s`` for the body);
connections beyond the cap (``MAX_CONNECTIONS``, lower when the process may
open few files: ``connection_cap``) push out the oldest one still sending its
request, so probes get through a crowd of clients that never finish theirs.
Refusals made here, before any handler runs, carry the same security headers
as every other response (``SECURITY_HEADERS``).
"""

from __future__ import annotations

import collections
import errno
import heapq
import logging
import queue
import re
import resource
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Callable, List, Optional, Set, Tuple

import msgspec

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0  # from accept to the end of the request's head
BODY_TIMEOUT_S = 10.0  # from the end of the head to the end of the body
SEND_TIMEOUT_S = 10.0  # for each send of a response to a client that does not read
MAX_CONNECTIONS = 512  # pending ones cost a socket and at most HEAD_MAX of buffer, no thread
FD_RESERVE = 256  # file descriptors kept for cameras, sinks and files, whatever the cap
BACKLOG = 128  # the kernel's accept queue: connections wait there, not in SYN retries
WORKERS = 4
HEAD_MAX = 32 * 1024  # request line and headers; browsers send a few hundred bytes
BODY_MAX = 4096  # the largest body read (the login form); a larger one is refused unread
DROP_REASONS = ("timeout", "cap", "head_too_large")
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_CONTENT_LENGTH = re.compile(rb"\ncontent-length:[ \t]*([0-9]{1,9})[ \t]*\r?\n", re.I)
# The page and its script come from this server alone; the browser enforces it too.
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
# On every response, errors and refusals included.
SECURITY_HEADERS = (("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"),
                    ("X-Frame-Options", "DENY"), ("Content-Security-Policy", _CSP))


def connection_cap(wanted: int = MAX_CONNECTIONS) -> int:
    """The connection cap: ``wanted``, less when the open-files limit leaves no room.

    Args:
      wanted: The cap with files to spare.

    Returns:
      ``wanted``, or the soft ``RLIMIT_NOFILE`` less ``FD_RESERVE`` (at least
      8) if that is lower: a crowd of clients must not take the descriptors a
      camera needs to reopen its device or file.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(8, min(wanted, soft - FD_RESERVE))


def json_bytes(value: Any) -> bytes:
    """``value`` as JSON; msgspec writes NaN and infinity as null, so JSON.parse in the page never chokes."""
    return msgspec.json.encode(value)


def canned(status: HTTPStatus, message: str) -> bytes:
    """A whole JSON error response, for refusals made before any handler runs."""
    body = json_bytes({"error": message})
    lines = [f"HTTP/1.0 {status.value} {status.phrase}", "Content-Type: application/json",
             "Cache-Control: no-store", "Connection: close", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in SECURITY_HEADERS]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class Limits:
    """How many connections the server holds and how long a request may take to arrive.

    Attributes:
      max_connections: Connections pending or being answered, at most.
      header_timeout_s: Seconds from accept to the end of the request's head.
      body_timeout_s: Seconds from the end of the head to the end of the body.
    """

    max_connections: int = MAX_CONNECTIONS
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S


@dataclass
class Request:
    """A whole request read off a connection, for a handler."""

    sock: socket.socket
    data: bytes


# Answers one request: (request, client address); writes to request.sock, which the server closes.
Handle = Callable[[Request, Tuple[str, int]], None]


@dataclass
class _Pending:
    """A connection whose request is still arriving."""

    sock: socket.socket
    address: Tuple[str, int]
    deadline: float
    data: bytearray = field(default_factory=bytearray)
    need: Optional[int] = None  # bytes of head and body, once the head is in


class Server:
    """The listening socket, the selector thread that reads requests and the workers that answer.

    Args:
      address: (host, port) to bind.
      handle: Answers one complete request on a worker thread.
      limits: The connection cap and the request deadlines.
      dropped: Counts connections dropped before their request was in, by
        reason (``DROP_REASONS``); the caller's, so that it outlives a restart.

    Raises:
      OSError: The address cannot be bound.
    """

    def __init__(self, address: Tuple[str, int], handle: Handle, limits: Limits,
                 dropped: "collections.Counter[str]") -> None:
        self._handle = handle
        self._limits = limits
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(address)
            self.socket.listen(BACKLOG)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()[:2]
        self.dropped = dropped
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._pending: "collections.OrderedDict[socket.socket, _Pending]" = collections.OrderedDict()
        self._deadlines: List[Tuple[float, int, _Pending]] = []
        self._seq = 0
        self._accept_paused_until = 0.0
        self._jobs: "queue.Queue[Optional[Tuple[Request, Tuple[str, int]]]]" = queue.Queue()
        self._answering: Set[socket.socket] = set()  # handed to workers, not yet closed
        self._lock = threading.Lock()
        self._stopping = False
        self._threads = [threading.Thread(target=self._select, name="edgecap-http", daemon=True)]
        self._threads += [threading.Thread(target=self._work, name=f"edgecap-http-{i}", daemon=True)
                          for i in range(WORKERS)]

    def start(self) -> None:
        """Starts the selector thread and the workers."""
        self._selector.register(self.socket, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        for thread in self._threads:
            thread.start()

    def close(self, timeout: float) -> None:
        """Stops both kinds of thread, drops every connection and frees the port."""
        self._stopping = True
        self._wake_w.send(b"x")
        self._threads[0].join(timeout)
        with self._lock:
            answering = list(self._answering)
        for sock in answering:  # a worker blocked on a client that does not read
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for thread in self._threads[1:]:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._wake_w.close()

    # -- the selector thread -------------------------------------------------

    def _select(self) -> None:
        try:
            while not self._stopping:
                for key, _ in self._selector.select(self._timeout()):
                    try:
                        if key.fileobj is self.socket:
                            self._accept()
                        elif key.fileobj is self._wake_r:
                            self._wake_r.recv(64)
                        else:
                            self._receive(key.data)
                    except Exception:  # one connection's trouble must not stop the server
                        log.exception("http: unexpected error serving a connection")
                        if key.data is not None and self._pending.get(key.data.sock) is key.data:
                            self._drop(key.data, None)
                self._expire()
        finally:
            for pending in list(self._pending.values()):
                self._drop(pending, None)
            self._selector.close()
            self.socket.close()
            self._wake_r.close()
            for _ in range(WORKERS):
                self._jobs.put(None)

    def _timeout(self) -> Optional[float]:
        """Seconds until the next deadline (or the end of an accept pause), None for none."""
        now = time.monotonic()
        while self._deadlines and self._stale(self._deadlines[0]):  # no wake-up for a connection gone
            heapq.heappop(self._deadlines)
        times = [self._deadlines[0][0]] if self._deadlines else []
        if self._accept_paused_until:
            times.append(self._accept_paused_until)
        return max(0.0, min(times) - now) if times else None

    def _accept(self) -> None:
        for _ in range(64):  # then serve what arrived; the rest wait in the backlog
            try:
                sock, address = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # The backlog keeps them: stop polling the socket a moment instead of spinning on it.
                    log.warning("http: cannot accept a connection (%s); pausing for 100 ms", e.strerror)
                    self._selector.unregister(self.socket)
                    self._accept_paused_until = time.monotonic() + 0.1
                return
            sock.setblocking(False)
            if len(self._pending) + len(self._answering) >= self._limits.max_connections:
                if not self._pending:  # all of them are being answered: refuse this one
                    self.dropped["cap"] += 1
                    _send_now(sock, canned(HTTPStatus.SERVICE_UNAVAILABLE, "too many connections"))
                    _close(sock)
                    continue
                self._drop(next(iter(self._pending.values())), "cap")  # the one that has waited longest
            deadline = time.monotonic() + self._limits.header_timeout_s
            pending = _Pending(sock, address[:2], deadline)
            self._pending[sock] = pending
            self._push_deadline(pending)
            self._selector.register(sock, selectors.EVENT_READ, pending)

    def _push_deadline(self, pending: _Pending) -> None:
        self._seq += 1
        heapq.heappush(self._deadlines, (pending.deadline, self._seq, pending))

    def _expire(self) -> None:
        now = time.monotonic()
        if self._accept_paused_until and self._accept_paused_until <= now:
            self._accept_paused_until = 0.0
            self._selector.register(self.socket, selectors.EVENT_READ)
        # A few at a time: a crowd that connected together expires together, and the
        # probes that came in meanwhile are served between the batches (the select
        # timeout is 0 while some are overdue).
        for _ in range(64):
            if not (self._deadlines and self._deadlines[0][0] <= now):
                break
            entry = heapq.heappop(self._deadlines)
            if not self._stale(entry):
                self._drop(entry[2], "timeout")

    def _stale(self, entry: Tuple[float, int, _Pending]) -> bool:
        """Says whether a deadline is of a connection answered or dropped since, or since given a later one."""
        deadline, _, pending = entry
        return self._pending.get(pending.sock) is not pending or pending.deadline != deadline

    def _receive(self, pending: _Pending) -> None:
        try:
            chunk = pending.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client went away
            return self._drop(pending, None)
        seen = len(pending.data)
        pending.data += chunk
        if pending.need is None:
            end = _HEAD_END.search(pending.data, max(0, seen - 3))
            if end is None:
                if len(pending.data) > HEAD_MAX:
                    _send_now(pending.sock, canned(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                                                   f"request head over {HEAD_MAX} bytes"))
                    self._drop(pending, "head_too_large")
                return
            length = _CONTENT_LENGTH.search(pending.data, 0, end.end())
            body = int(length.group(1)) if length else 0
            # A body over the limit is not waited for: the handler refuses it unread.
            pending.need = end.end() + (body if body <= BODY_MAX else 0)
            if pending.need > len(pending.data):
                pending.deadline = time.monotonic() + self._limits.body_timeout_s
                self._push_deadline(pending)
        if len(pending.data) >= pending.need:
            self._dispatch(pending)

    def _dispatch(self, pending: _Pending) -> None:
        self._selector.unregister(pending.sock)
        del self._pending[pending.sock]
        pending.sock.settimeout(SEND_TIMEOUT_S)
        with self._lock:
            self._answering.add(pending.sock)
        self._jobs.put((Request(pending.sock, bytes(pending.data)), pending.address))

    def _drop(self, pending: _Pending, reason: Optional[str]) -> None:
        """Closes a connection whose request is still arriving; counts it under ``reason``."""
        if reason is not None:
            self.dropped[reason] += 1
        self._selector.unregister(pending.sock)
        del self._pending[pending.sock]
        if reason == "head_too_large":  # it has an answer to read
            _close(pending.sock)
        else:
            pending.sock.close()

    # -- the workers ---------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            request, address = job
            try:
                self._handle(request, address)
            except Exception:
                log.debug("http: request from %s failed", address[0], exc_info=True)
            finally:
                with self._lock:
                    self._answering.discard(request.sock)
                _close(request.sock)


def _send_now(sock: socket.socket, data: bytes) -> None:
    """Sends what the socket takes without waiting (a refusal; the client may not read)."""
    try:
        sock.send(data)
    except OSError:
        pass


def _close(sock: socket.socket) -> None:
    """Closes after the response: FIN first, and what the client sent unread is read away.

    Closing a socket with unread bytes makes the kernel send a reset, which can
    discard the response before the client reads it (a refusal of a too large request).
    """
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.setblocking(False)
        for _ in range(16):  # what has arrived, not what may still come
            if not sock.recv(65536):
                break
    except OSError:
        pass
    sock.close()
