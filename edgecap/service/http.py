"""The service's HTTP server: health, metrics, a JSON API and the status page.

Standard library only: one selector thread reads every connection's request
(head and body) without blocking, under a deadline, and hands complete
requests to a few worker threads (``http.server`` handlers) that answer and
close. An idle or slow client therefore costs a socket and a buffer, never a
thread, and is dropped when its deadline passes (``HEADER_TIMEOUT_S`` for the
head, ``BODY_TIMEOUT_S`` for the body); connections beyond the cap
(``MAX_CONNECTIONS``, lower when the process may open few files) push out the
oldest one still sending its request, so probes get through a crowd of
clients that never finish theirs. Every response, errors included, carries
the same security headers.

Bound to a loopback address it needs no login (and refuses requests naming a
foreign Host, which is how a web page would reach it by DNS rebinding); bound
to any other address it refuses to start without an access token, and then
every route but ``/login``, ``/logout``, the page's script, style and icon and a
bare ``/healthz`` needs ``Authorization: Bearer <token>`` or a session cookie.
A login makes a fresh random session (``SESSION_MAX_AGE_S``), ``POST /logout``
ends it; failed logins and wrong bearer tokens are logged as warnings and,
past ``LOGIN_ATTEMPTS`` in ``LOGIN_WINDOW_S`` from one address, answered 429
with ``Retry-After``.

``/healthz`` stays open so that probes which cannot carry a secret (a load
balancer, a container health check, an uptime pinger) can still tell up from
down; without the token it answers only the status code and ``{"ok": ...}``,
never a camera name, reason or frame. With the token (or on a server without
one) it carries the full detail.

``/api/events`` searches the event history (``edgecap.service.history``) and
``/api/events/<id>/thumbnail.jpg`` serves an event's thumbnail, under the
same token rules; without a history the list is empty and the page shows no
search box.

The page polls ``/api/stats`` once a second rather than holding a
server-sent-events stream: a poll holds a worker for a millisecond, passes any
proxy and resumes by itself after a restart. Whatever needs pushed events
(home automation, a fleet) has the MQTT sink.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import hmac
import heapq
import html
import io
import ipaddress
import logging
import math
import queue
import re
import resource
import secrets
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Deque, Dict, Iterable, List, Optional, Protocol, Set, Tuple
from urllib.parse import parse_qs, quote, unquote, urlsplit

import msgspec
from prometheus_client.core import CounterMetricFamily

from edgecap.errors import ConfigError
from edgecap.events import Event
from edgecap.service.config import NAME_PATTERN, TOKEN_FIX, token_weakness
from edgecap.service.history import iso_seconds
from edgecap.service.state import ServiceState

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
COOKIE = "edgecap_session"
SESSION_MAX_AGE_S = 7 * 24 * 3600
MAX_SESSIONS = 64  # the oldest session ends when a login would make one more
HEADER_TIMEOUT_S = 10.0  # from accept to the end of the request's head
BODY_TIMEOUT_S = 10.0  # from the end of the head to the end of the body
SEND_TIMEOUT_S = 10.0  # for each send of a response to a client that does not read
MAX_CONNECTIONS = 512  # pending ones cost a socket and at most HEAD_MAX of buffer, no thread
FD_RESERVE = 256  # file descriptors kept for cameras, sinks and files, whatever the cap
BACKLOG = 128  # the kernel's accept queue: connections wait there, not in SYN retries
WORKERS = 4
HEAD_MAX = 32 * 1024  # request line and headers; browsers send a few hundred bytes
LOGIN_ATTEMPTS = 5  # failed logins (or bearer tokens) from one address ...
LOGIN_WINDOW_S = 60.0  # ... in this long, then 429 until the oldest leaves the window
_LOGIN_BODY_MAX = 4096
_ADDRESSES_MAX = 4096  # addresses the login limiter remembers
_FRAME = re.compile(r"^/api/frame/([A-Za-z0-9_-]+)\.jpg$")
_EVENT_THUMBNAIL = re.compile(r"^/api/events/([^/]+)/thumbnail\.jpg$")
_EVENT_ID = re.compile(r"^[A-Za-z0-9_-]{0,64}@-?[0-9]{1,16}$")  # CAMERA@START_MS (edgecap.events)
_CAMERA = re.compile(NAME_PATTERN)
EVENTS_LIMIT = 500  # the most events one /api/events answer lists
QUERY_MAX = 200  # characters of search text
_EVENTS_PARAMS = ("q", "camera", "since", "until", "limit")
_SEARCH_BLOCK = re.compile(rb"<!--search-->.*?<!--/search-->", re.S)
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_CONTENT_LENGTH = re.compile(rb"\ncontent-length:[ \t]*([0-9]{1,9})[ \t]*\r?\n", re.I)
# The page and its script come from this server alone; the browser enforces it too.
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
# On every response, errors and refusals included.
SECURITY_HEADERS = (("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"),
                    ("X-Frame-Options", "DENY"), ("Content-Security-Policy", _CSP))
_LOGOUT = b'<form class="logout" method="post" action="logout"><button type="submit">Log out</button></form>'
_PUBLIC_STATIC = {"/static/app.js": "text/javascript", "/static/style.css": "text/css",
                  "/static/icon.svg": "image/svg+xml"}


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


class HistoryReader(Protocol):
    """What the server reads of the event history (``edgecap.service.history.History`` has it)."""

    def search(self, q: str = "", camera: str = "", since: Optional[float] = None,
               until: Optional[float] = None, limit: int = 50) -> List[Event]:
        """Events matching words and "quoted phrases" in ``q``, newest first, thumbnails not loaded."""

    def thumbnail(self, event_id: str) -> Optional[bytes]:
        """An event's JPEG thumbnail, or None."""


class StatusServer:
    """Serves the status page and API over one ``ServiceState`` and ``Metrics``.

    Args:
      state: The state the service writes.
      metrics: The service's ``Metrics`` (None: ``/metrics`` answers 404).
      address: The address to listen on; a non-loopback one requires ``token``.
      port: The TCP port; 0 picks a free one (``.port`` tells which).
      token: The access token; None or "" for none.
      max_caption_age_s: ``/healthz`` turns 503 when a camera is silent longer.
      max_connections: The connection cap before ``connection_cap`` lowers it.
      header_timeout_s: Seconds a client has to send a request's head.
      body_timeout_s: Seconds a client has to send a request's body after its head.
      history: The event history ``/api/events`` searches; None: no history
        (an empty list, and no search box on the page).

    Raises:
      ConfigError: A non-loopback address without a token, or a weak token
        (``config.token_weakness``).
    """

    def __init__(self, state: ServiceState, metrics: Any = None, address: str = "127.0.0.1",
                 port: int = 8080, token: Optional[str] = None,
                 max_caption_age_s: float = 60.0, max_connections: int = MAX_CONNECTIONS,
                 header_timeout_s: float = HEADER_TIMEOUT_S,
                 body_timeout_s: float = BODY_TIMEOUT_S, history: Optional[HistoryReader] = None) -> None:
        token = token or None
        self.loopback = is_loopback(address)
        if token is None and not self.loopback:
            raise ConfigError(
                f"http: address {address!r} would serve camera frames beyond this machine without a "
                f"login; set [http] token (or token_file), or bind 127.0.0.1")
        weakness = None if token is None else token_weakness(token)
        if weakness is not None:
            raise ConfigError(f"http: the token {weakness}; {TOKEN_FIX}")
        self.state = state
        self.metrics = metrics
        self.history = history
        self.address = address
        self.max_caption_age_s = max_caption_age_s
        self.max_connections = connection_cap(max_connections)
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self._requested_port = port
        self._token = None if token is None else token.encode("ascii")
        self.sessions = _Sessions()
        self.attempts = _Attempts()
        self._static = {name: (STATIC / name).read_bytes()
                        for name in ("index.html", "login.html", "app.js", "style.css", "icon.svg")}
        if token is not None:  # a page without a login has nothing to log out of
            self._static["index.html"] = self._static["index.html"].replace(b"<!--logout-->", _LOGOUT)
        if history is None:  # nothing to search
            self._static["index.html"] = _SEARCH_BLOCK.sub(b"", self._static["index.html"])
        self._dropped: "collections.Counter[str]" = collections.Counter()  # kept across restarts
        self._httpd: Optional[_Server] = None
        self._collecting = False

    @property
    def port(self) -> int:
        """The bound port (the requested one before ``start``)."""
        return self._httpd.server_address[1] if self._httpd else self._requested_port

    @property
    def url(self) -> str:
        """The page's address, e.g. ``http://127.0.0.1:8080/``."""
        host = f"[{self.address}]" if ":" in self.address else (self.address or "0.0.0.0")
        return f"http://{host}:{self.port}/"

    @property
    def dropped(self) -> Dict[str, int]:
        """Connections dropped before a request, by reason (timeout, cap, head_too_large)."""
        return dict(self._dropped)

    def start(self) -> "StatusServer":
        """Binds and serves on daemon threads; returns self.

        Raises:
          ConfigError: The address and port cannot be bound (in use, not on
            this machine, needs privileges).
        """
        if self._httpd is not None:
            raise RuntimeError("StatusServer.start() called twice")
        where = (f"[{self.address}]" if ":" in self.address else self.address) + f":{self._requested_port}"
        try:
            self._httpd = _Server((self.address, self._requested_port), self)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(f"http: {where} is already in use; stop what holds it or set "
                                  f"[http] port to a free one") from None
            if e.errno == errno.EACCES:
                raise ConfigError(f"http: {where}: permission denied; use a port of 1024 or more") from None
            if e.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(f"http: {where}: no such address on this machine; use 127.0.0.1, "
                                  f"0.0.0.0 or one of its addresses") from None
            raise ConfigError(f"http: cannot listen on {where}: {e.strerror or e}; "
                              f"check [http] address and port") from None
        self._httpd.start()
        if self.metrics is not None and not self._collecting:
            self.metrics.registry.register(_DroppedCollector(self))
            self._collecting = True
        log.info("status page on %s (at most %d connections)", self.url, self.max_connections)
        return self

    def close(self, timeout: float = 1.0) -> None:
        """Stops serving: drops open connections and frees the port."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.close(timeout)

    def __enter__(self) -> "StatusServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _DroppedCollector:
    """``edgecap_http_connections_dropped_total{reason}`` for ``/metrics``, read at each scrape."""

    def __init__(self, app: StatusServer) -> None:
        self._app = app

    def collect(self) -> Iterable[CounterMetricFamily]:
        family = CounterMetricFamily("edgecap_http_connections_dropped",
                                     "Connections the status server closed before their request was in.",
                                     labels=["reason"])
        dropped = self._app.dropped
        for reason in ("timeout", "cap", "head_too_large"):
            family.add_metric([reason], dropped.get(reason, 0))
        yield family


def is_loopback(address: str) -> bool:
    """Says whether an address reaches only this machine (127.0.0.0/8, ::1, localhost)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name or "": may resolve anywhere, so treat it as exposed


def parse_time(text: str) -> float:
    """Reads a time given as Unix seconds or ISO-8601.

    Args:
      text: ``1764640000``, ``1764640000.5``, ``2026-12-02``,
        ``2026-12-02T01:30:00``, ``2026-12-02T01:30:00Z`` or with an offset;
        without one, the machine's local time.

    Returns:
      Unix seconds.

    Raises:
      ValueError: Neither form, or not finite.
    """
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = iso_seconds(text)
        except ValueError:
            seconds = math.nan
    if not math.isfinite(seconds):
        raise ValueError(f"{text[:40]!r} is not a time; give Unix seconds or ISO-8601 (2026-12-02T01:30:00Z)")
    return seconds


def events_query(query: str) -> Dict[str, Any]:
    """Reads the query of ``/api/events`` into ``History.search`` arguments.

    Args:
      query: The URL's query string: ``q`` (words and "quoted phrases"),
        ``camera``, ``since`` and ``until`` (Unix seconds or ISO-8601),
        ``limit`` (1 to ``EVENTS_LIMIT``, default 50); each at most once.

    Returns:
      Keyword arguments for ``History.search``.

    Raises:
      ValueError: A parameter unknown, repeated, malformed or out of range;
        the message names it and what it takes.
    """
    try:
        fields = parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=16)
    except ValueError:
        raise ValueError("too many query parameters; use q, camera, since, until and limit") from None
    for name, values in fields.items():
        if name not in _EVENTS_PARAMS:
            raise ValueError(f"unknown parameter {name!r}; use q, camera, since, until and limit")
        if len(values) > 1:
            raise ValueError(f"parameter {name!r} given {len(values)} times; give it once")
    given = {name: values[0] for name, values in fields.items()}
    args: Dict[str, Any] = {"q": given.get("q", ""), "camera": given.get("camera", ""), "limit": 50}
    if len(args["q"]) > QUERY_MAX:
        raise ValueError(f"q is {len(args['q'])} characters; search with at most {QUERY_MAX}")
    if args["camera"] and not (len(args["camera"]) <= 64 and _CAMERA.match(args["camera"])):
        raise ValueError(f"camera {args['camera'][:70]!r} is not a camera name; use letters, digits, _ and -")
    if given.get("limit", "") != "":
        limit = given["limit"]
        if not (limit.isascii() and limit.isdigit() and 1 <= int(limit) <= EVENTS_LIMIT):
            raise ValueError(f"limit {limit[:20]!r}; give a whole number from 1 to {EVENTS_LIMIT}")
        args["limit"] = int(limit)
    for name in ("since", "until"):
        text = given.get(name, "")
        try:
            args[name] = parse_time(text) if text else None
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    if args["since"] is not None and args["until"] is not None and args["since"] > args["until"]:
        raise ValueError("since is after until; give since <= until")
    return args


def thumbnail_url(event_id: str) -> str:
    """The address of an event's thumbnail, relative to ``/api/events`` (so it works behind a proxy's prefix)."""
    return f"events/{quote(event_id, safe='@')}/thumbnail.jpg"


def _json(value: Any) -> bytes:
    # msgspec writes NaN and infinity as null: JSON.parse in the page never chokes.
    return msgspec.json.encode(value)


def _canned(status: HTTPStatus, message: str) -> bytes:
    """A whole JSON error response, for refusals made before any handler runs."""
    body = _json({"error": message})
    lines = [f"HTTP/1.0 {status.value} {status.phrase}", "Content-Type: application/json",
             "Cache-Control: no-store", "Connection: close", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in SECURITY_HEADERS]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Sessions:
    """Login sessions: random ids with an expiry, kept (hashed) in memory only."""

    def __init__(self, max_age_s: float = SESSION_MAX_AGE_S, limit: int = MAX_SESSIONS) -> None:
        self.max_age_s = max_age_s
        self.clock = time.monotonic  # replaceable: tests move time for this alone
        self._limit = limit
        self._expiry: "collections.OrderedDict[bytes, float]" = collections.OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(session: str) -> bytes:
        # Kept hashed: the lookup's timing depends on a hash of what the client sent, not on the ids.
        return hashlib.sha256(session.encode("latin-1", "replace")).digest()

    def new(self) -> str:
        """A fresh session id, valid for ``max_age_s``."""
        session = secrets.token_urlsafe(32)
        with self._lock:
            self._expiry[self._key(session)] = self.clock() + self.max_age_s
            while len(self._expiry) > self._limit:
                self._expiry.popitem(last=False)
        return session

    def valid(self, session: str) -> bool:
        """Says whether ``session`` was made here, has not expired and was not ended."""
        key = self._key(session)
        with self._lock:
            expiry = self._expiry.get(key)
            if expiry is not None and expiry <= self.clock():
                del self._expiry[key]
                expiry = None
        return expiry is not None

    def end(self, session: str) -> None:
        """Ends ``session`` (logout, or a new login from the same browser)."""
        with self._lock:
            self._expiry.pop(self._key(session), None)


class _Attempts:
    """Failed logins by client address, to refuse an address that keeps guessing."""

    def __init__(self, limit: int = LOGIN_ATTEMPTS, window_s: float = LOGIN_WINDOW_S) -> None:
        self.limit = limit
        self.window_s = window_s
        self.clock = time.monotonic  # replaceable: tests move time for this alone
        self._failures: "collections.OrderedDict[str, Deque[float]]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may try again; 0 when it may now."""
        now = self.clock()
        with self._lock:
            times = self._failures.get(address)
            if times is None:
                return 0.0
            while times and times[0] <= now - self.window_s:
                times.popleft()
            if not times:
                del self._failures[address]
                return 0.0
            return times[0] + self.window_s - now if len(times) >= self.limit else 0.0

    def failed(self, address: str) -> int:
        """Records a failure from ``address``; returns its failures in the window."""
        with self._lock:
            times = self._failures.pop(address, None) or collections.deque(maxlen=self.limit)
            times.append(self.clock())
            self._failures[address] = times  # most recent last: the oldest go first
            while len(self._failures) > _ADDRESSES_MAX:
                self._failures.popitem(last=False)
            return len(times)


@dataclass
class _Pending:
    """A connection whose request is still arriving."""

    sock: socket.socket
    address: Tuple[str, int]
    deadline: float
    data: bytearray = field(default_factory=bytearray)
    need: Optional[int] = None  # bytes of head and body, once the head is in


@dataclass
class _Request:
    """A whole request read off a connection, for a handler."""

    sock: socket.socket
    data: bytes


class _Server:
    """The listening socket, the selector thread that reads requests and the workers that answer.

    Args:
      address: (host, port) to bind.
      app: The StatusServer whose handlers answer.

    Raises:
      OSError: The address cannot be bound.
    """

    def __init__(self, address: Tuple[str, int], app: StatusServer) -> None:
        self.app = app
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
        self.dropped = app._dropped
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._pending: "collections.OrderedDict[socket.socket, _Pending]" = collections.OrderedDict()
        self._deadlines: List[Tuple[float, int, _Pending]] = []
        self._seq = 0
        self._accept_paused_until = 0.0
        self._jobs: "queue.Queue[Optional[Tuple[_Request, Tuple[str, int]]]]" = queue.Queue()
        self._answering: Set[socket.socket] = set()  # handed to workers, not yet closed
        self._lock = threading.Lock()
        self._stopping = False
        self._threads = [threading.Thread(target=self._select, name="edgecap-http", daemon=True)]
        self._threads += [threading.Thread(target=self._work, name=f"edgecap-http-{i}", daemon=True)
                          for i in range(WORKERS)]

    def start(self) -> None:
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
            if len(self._pending) + len(self._answering) >= self.app.max_connections:
                if not self._pending:  # all of them are being answered: refuse this one
                    self.dropped["cap"] += 1
                    _send_now(sock, _canned(HTTPStatus.SERVICE_UNAVAILABLE, "too many connections"))
                    _close(sock)
                    continue
                self._drop(next(iter(self._pending.values())), "cap")  # the one that has waited longest
            deadline = time.monotonic() + self.app.header_timeout_s
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
                    _send_now(pending.sock, _canned(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                                                    f"request head over {HEAD_MAX} bytes"))
                    self._drop(pending, "head_too_large")
                return
            length = _CONTENT_LENGTH.search(pending.data, 0, end.end())
            body = int(length.group(1)) if length else 0
            # A body over the limit is not waited for: the handler refuses it unread.
            pending.need = end.end() + (body if body <= _LOGIN_BODY_MAX else 0)
            if pending.need > len(pending.data):
                pending.deadline = time.monotonic() + self.app.body_timeout_s
                self._push_deadline(pending)
        if len(pending.data) >= pending.need:
            self._dispatch(pending)

    def _dispatch(self, pending: _Pending) -> None:
        self._selector.unregister(pending.sock)
        del self._pending[pending.sock]
        pending.sock.settimeout(SEND_TIMEOUT_S)
        with self._lock:
            self._answering.add(pending.sock)
        self._jobs.put((_Request(pending.sock, bytes(pending.data)), pending.address))

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
                _Handler(request, address, self)
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


class _Handler(BaseHTTPRequestHandler):
    """One request read whole by the selector; routes GET/HEAD to read-only views, POST to login and logout."""

    server: _Server  # type: ignore[assignment]
    request: _Request
    server_version = "edgecap"
    sys_version = ""
    # A request line without a version ("GET /") is answered as HTTP/1.0: with headers.
    default_request_version = "HTTP/1.0"

    def setup(self) -> None:
        self.connection = self.request.sock
        self.rfile = io.BytesIO(self.request.data)
        self.wfile = self.connection.makefile("wb")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        log.debug("http %s " + format, self.client_address[0], *args)

    @property
    def app(self) -> StatusServer:
        return self.server.app

    # -- routing ---------------------------------------------------------

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def do_POST(self) -> None:
        if not self._host_ok():
            return
        path = urlsplit(self.path).path
        if path == "/login" and self.app._token is not None:
            self._login()
        elif path == "/logout" and self.app._token is not None:
            self._logout()
        else:
            self._send_json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "read-only: only POST /login and /logout"},
                            extra=[("Allow", "GET, HEAD")])

    def _route(self, head: bool) -> None:
        if not self._host_ok():
            return
        path = urlsplit(self.path).path
        app = self.app
        if path in _PUBLIC_STATIC:
            return self._send(HTTPStatus.OK, app._static[path.rsplit("/", 1)[1]], _PUBLIC_STATIC[path],
                              head=head, cache=True)
        if path == "/healthz":
            return self._healthz(head)
        if path == "/login":
            if app._token is None:
                return self._send_json(HTTPStatus.NOT_FOUND, {"error": "no login on this server"}, head=head)
            return self._login_page(HTTPStatus.OK, "", head)
        wait = self._bearer_blocked()
        if wait:
            return self._too_many(wait, head)
        if not self._authorized():
            if path == "/":
                return self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", head=head,
                                  extra=[("Location", "login")])  # relative: works behind a proxy's prefix
            return self._send_json(HTTPStatus.UNAUTHORIZED, {"error": "token required: log in at /login "
                                                             "or send Authorization: Bearer <token>"},
                                   head=head, extra=[("WWW-Authenticate", 'Bearer realm="edgecap"')])
        if path == "/":
            return self._send(HTTPStatus.OK, app._static["index.html"], "text/html; charset=utf-8", head=head)
        if path == "/api/stats":
            return self._send_json(HTTPStatus.OK, app.state.snapshot(), head=head)
        if path == "/api/captions":
            return self._send_json(HTTPStatus.OK, app.state.captions(), head=head)
        if path == "/api/events":
            return self._events(head)
        if path == "/metrics" and app.metrics is not None:
            body, ctype = app.metrics.render()
            return self._send(HTTPStatus.OK, body, ctype, head=head)
        m = _FRAME.match(path)
        if m:
            return self._frame(m.group(1), head)
        m = _EVENT_THUMBNAIL.match(path)
        if m:
            return self._event_thumbnail(unquote(m.group(1)), head)
        self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {path}"}, head=head)

    # -- security --------------------------------------------------------

    def _host_ok(self) -> bool:
        """Refuses a foreign Host on an open loopback server (DNS rebinding from a web page)."""
        if self.app._token is not None or not self.app.loopback:
            return True
        host = self.headers.get("Host")
        if host is None:
            return True  # HTTP/1.0 tools; browsers, the only rebinding vector, always send one
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if is_loopback(name.strip("[]").lower()):  # an IP check: "127.evil.example" is a host name
            return True
        self._send_json(HTTPStatus.MISDIRECTED_REQUEST,
                        {"error": f"host {host!r} is not this loopback server; open {self.app.url}"})
        return False

    def _bearer(self) -> Optional[str]:
        auth = self.headers.get("Authorization", "")
        return auth[7:].strip() if auth[:7].lower() == "bearer " else None

    def _bearer_blocked(self) -> float:
        """Seconds a client that sends a bearer token must wait after too many wrong ones (0: none)."""
        if self.app._token is None or self._bearer() is None:
            return 0.0
        return self.app.attempts.retry_after(self.client_address[0])

    def _session(self) -> Optional[str]:
        try:
            morsel = SimpleCookie(self.headers.get("Cookie", "")).get(COOKIE)
        except CookieError:
            return None
        return None if morsel is None else morsel.value

    def _authorized(self) -> bool:
        token = self.app._token
        if token is None:
            return True
        bearer = self._bearer()
        if bearer is not None:
            if hmac.compare_digest(bearer.encode("latin-1", "replace"), token):
                return True
            self._failed("a wrong bearer token")
            return False
        session = self._session()
        return session is not None and self.app.sessions.valid(session)

    def _failed(self, what: str) -> None:
        """Logs a failed login (never what was sent) and counts it against the client's address."""
        address = self.client_address[0]
        count = self.app.attempts.failed(address)
        log.warning("http: %s from %s (%d in %.0f s)", what, address, count, self.app.attempts.window_s)
        if count == self.app.attempts.limit:
            log.warning("http: refusing logins from %s for %.0f s (%d failures)", address,
                        self.app.attempts.window_s, count)

    def _too_many(self, wait: float, head: bool = False, page: bool = False) -> None:
        seconds = math.ceil(wait)
        message = f"too many failed logins from this address; try again in {seconds} s"
        extra = [("Retry-After", str(seconds))]
        if page:
            return self._login_page(HTTPStatus.TOO_MANY_REQUESTS, message[0].upper() + message[1:] + ".",
                                    head, extra)
        self._send_json(HTTPStatus.TOO_MANY_REQUESTS, {"error": message}, head=head, extra=extra)

    def _login(self) -> None:
        wait = self.app.attempts.retry_after(self.client_address[0])
        if wait:  # not even checked: a blocked address learns nothing from its guesses
            return self._too_many(wait, page=True)
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._send_json(HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length required"})
        if not 0 <= length <= _LOGIN_BODY_MAX:
            return self._send_json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "login form too large"})
        form = parse_qs(self.rfile.read(length).decode("latin-1"), max_num_fields=4)
        given = (form.get("token") or [""])[0].strip().encode("latin-1", "replace")
        if not hmac.compare_digest(given, self.app._token):
            self._failed("a failed login")
            return self._login_page(HTTPStatus.UNAUTHORIZED, "Wrong token.", head=False)
        old = self._session()
        if old is not None:  # a fresh id on each login: one fixed before it is worthless
            self.app.sessions.end(old)
        sessions = self.app.sessions
        cookie = (f"{COOKIE}={sessions.new()}; Path=/; Max-Age={int(sessions.max_age_s)}; "
                  f"HttpOnly; SameSite=Strict")
        log.info("http: login from %s", self.client_address[0])
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", head=False,
                   extra=[("Location", "./"), ("Set-Cookie", cookie)])

    def _logout(self) -> None:
        session = self._session()
        if session is not None:
            self.app.sessions.end(session)
        cookie = f"{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", head=False,
                   extra=[("Location", "login"), ("Set-Cookie", cookie)])

    def _login_page(self, status: HTTPStatus, message: str, head: bool,
                    extra: Iterable[Tuple[str, str]] = ()) -> None:
        page = self.app._static["login.html"].replace(b"<!--message-->", html.escape(message).encode())
        self._send(status, page, "text/html; charset=utf-8", head=head, extra=extra)

    # -- views -----------------------------------------------------------

    def _healthz(self, head: bool) -> None:
        app = self.app
        ok, reason = app.state.health(app.max_caption_age_s)
        status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
        if self._bearer_blocked() or not self._authorized():
            return self._send_json(status, {"ok": ok}, head=head)
        snap = app.state.snapshot()
        ages = [c["caption_age_s"] for c in snap["cameras"].values() if c["caption_age_s"] is not None]
        body = {
            "ok": ok,
            "reason": reason,
            "cameras": {name: {k: c[k] for k in ("status", "reason", "frame_age_s", "caption_age_s")}
                        for name, c in snap["cameras"].items()},
            "devices": snap["devices"],
            "last_caption_age_s": min(ages) if ages else None,
        }
        self._send_json(status, body, head=head)

    def _frame(self, camera: str, head: bool) -> None:
        state = self.app.state
        if camera not in state.cameras:
            return self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no camera {camera!r}"}, head=head)
        jpeg = state.latest_jpeg(camera)
        if jpeg is None:
            return self._send_json(HTTPStatus.SERVICE_UNAVAILABLE,
                                   {"error": f"no frame from camera {camera!r} yet"}, head=head)
        self._send(HTTPStatus.OK, jpeg, "image/jpeg", head=head)

    def _events(self, head: bool) -> None:
        try:
            query = events_query(urlsplit(self.path).query)
        except ValueError as e:
            return self._send_json(HTTPStatus.BAD_REQUEST, {"error": str(e)}, head=head)
        history = self.app.history
        if history is None:
            return self._send_json(HTTPStatus.OK, {"events": []}, head=head)
        try:
            found = history.search(**query)
        except Exception as e:  # a disk or database fault: the page says so, the service goes on
            log.warning("http: the history search failed: %s", e)
            return self._send_json(HTTPStatus.SERVICE_UNAVAILABLE,
                                   {"error": f"the history cannot be searched now: {e}"}, head=head)
        events = []
        for event in found:
            record = event.to_dict()
            record["thumbnail"] = thumbnail_url(event.id) if record["has_thumbnail"] else None
            events.append(record)
        self._send_json(HTTPStatus.OK, {"events": events}, head=head)

    def _event_thumbnail(self, event_id: str, head: bool) -> None:
        if not _EVENT_ID.match(event_id):
            return self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no event {event_id[:80]!r}"}, head=head)
        jpeg = None
        history = self.app.history
        if history is not None:
            try:
                jpeg = history.thumbnail(event_id)
            except Exception as e:
                log.warning("http: the history cannot read a thumbnail: %s", e)
        if jpeg is None:
            # The event in progress and the last few closed ones, where the state keeps them.
            kept = getattr(self.app.state, "event_thumbnail", None)
            jpeg = kept(event_id) if kept is not None else None
        if not jpeg:
            return self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no thumbnail for event {event_id!r}"},
                                   head=head)
        self._send(HTTPStatus.OK, jpeg, "image/jpeg", head=head)

    # -- responses -------------------------------------------------------

    def send_error(self, code: int, message: Optional[str] = None, explain: Optional[str] = None) -> None:
        """Answers a malformed or unsupported request as JSON with the security headers.

        Replaces ``BaseHTTPRequestHandler.send_error``, whose HTML page lacks them.
        """
        status = HTTPStatus(code)
        self.close_connection = True
        self._send_json(status, {"error": message or status.phrase},
                        head=getattr(self, "command", None) == "HEAD")

    def _headers(self, ctype: str, cache: bool, extra: Iterable[Tuple[str, str]] = ()) -> None:
        self.send_header("Content-Type", ctype)
        self.send_header("Cache-Control", "max-age=300" if cache else "no-store")
        for name, value in SECURITY_HEADERS:
            self.send_header(name, value)
        for name, value in extra:
            self.send_header(name, value)

    def _send(self, status: HTTPStatus, body: bytes, ctype: str, head: bool = False, cache: bool = False,
              extra: Iterable[Tuple[str, str]] = ()) -> None:
        self.send_response(status)
        self._headers(ctype, cache, extra)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _send_json(self, status: HTTPStatus, value: Dict[str, Any], head: bool = False,
                   extra: Iterable[Tuple[str, str]] = ()) -> None:
        self._send(status, _json(value), "application/json", head=head, extra=extra)
