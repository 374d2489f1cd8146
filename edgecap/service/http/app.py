"""``StatusServer``: what the service's HTTP server serves, to whom, on which address."""

from __future__ import annotations

import collections
import errno
import logging
import re
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Tuple

from prometheus_client.core import CounterMetricFamily

from edgecap.errors import ConfigError
from edgecap.service.config import TOKEN_FIX, is_loopback, token_weakness
from edgecap.service.http.routes import Handler, HistoryReader
from edgecap.service.http.server import (
    BODY_TIMEOUT_S, DROP_REASONS, HEADER_TIMEOUT_S, MAX_CONNECTIONS, Limits, Request, Server, connection_cap)
from edgecap.service.http.sessions import Access, Attempts, Sessions
from edgecap.service.state import ServiceState

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent.parent / "static"
_SEARCH_BLOCK = re.compile(rb"<!--search-->.*?<!--/search-->", re.S)
_LOGOUT = b'<form class="logout" method="post" action="logout"><button type="submit">Log out</button></form>'


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
        if address.startswith("[") and address.endswith("]"):  # an IPv6 address as URLs write it
            address = address[1:-1]
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
        self.access = Access(token)
        self.static = {name: (STATIC / name).read_bytes()
                       for name in ("index.html", "login.html", "app.js", "style.css", "icon.svg")}
        if token is not None:  # a page without a login has nothing to log out of
            self.static["index.html"] = self.static["index.html"].replace(b"<!--logout-->", _LOGOUT)
        if history is None:  # nothing to search
            self.static["index.html"] = _SEARCH_BLOCK.sub(b"", self.static["index.html"])
        self._dropped: "collections.Counter[str]" = collections.Counter()  # kept across restarts
        self._httpd: Optional[Server] = None
        self._collecting = False

    @property
    def sessions(self) -> Sessions:
        """The login sessions."""
        return self.access.sessions

    @property
    def attempts(self) -> Attempts:
        """The failed logins, by client address."""
        return self.access.attempts

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
        limits = Limits(self.max_connections, self.header_timeout_s, self.body_timeout_s)
        try:
            self._httpd = Server((self.address, self._requested_port), self._handle, limits, self._dropped)
        except OSError as e:
            raise ConfigError(_bind_error(where, e)) from None
        self._httpd.start()
        if self.metrics is not None and not self._collecting:
            self.metrics.registry.register(_DroppedCollector(self))
            self._collecting = True
        log.info("status page on %s (at most %d connections)", self.url, self.max_connections)
        return self

    def _handle(self, request: Request, address: Tuple[str, int]) -> None:
        Handler(request, address, self)  # type: ignore[arg-type]

    def close(self, timeout: float = 1.0) -> None:
        """Stops serving: drops open connections and frees the port."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.close(timeout)

    def __enter__(self) -> "StatusServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _bind_error(where: str, e: OSError) -> str:
    """Why ``where`` cannot be listened on, and the fix, in one line."""
    if e.errno == errno.EADDRINUSE:
        return f"http: {where} is already in use; stop what holds it or set [http] port to a free one"
    if e.errno == errno.EACCES:
        return f"http: {where}: permission denied; use a port of 1024 or more"
    if e.errno == errno.EADDRNOTAVAIL:
        return (f"http: {where}: no such address on this machine; use 127.0.0.1, "
                f"0.0.0.0 or one of its addresses")
    return f"http: cannot listen on {where}: {e.strerror or e}; check [http] address and port"


class _DroppedCollector:
    """``edgecap_http_connections_dropped_total{reason}`` for ``/metrics``, read at each scrape."""

    def __init__(self, app: StatusServer) -> None:
        self._app = app

    def collect(self) -> Iterable[CounterMetricFamily]:
        family = CounterMetricFamily("edgecap_http_connections_dropped",
                                     "Connections the status server closed before their request was in.",
                                     labels=["reason"])
        dropped = self._app.dropped
        for reason in DROP_REASONS:
            family.add_metric([reason], dropped.get(reason, 0))
        yield family
