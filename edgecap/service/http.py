"""The service's HTTP server: health, metrics, a JSON API and the status page.

Standard library only (``http.server``): one daemon thread per connection,
read-only routes, nothing fetched from elsewhere.

Bound to a loopback address it needs no login (and refuses requests naming a
foreign Host, which is how a web page would reach it by DNS rebinding); bound
to any other address it refuses to start without an access token, and then
every route but ``/login``, the page's script and style and a bare
``/healthz`` needs ``Authorization: Bearer <token>`` or the login cookie.

``/healthz`` stays open so that probes which cannot carry a secret (a load
balancer, a container health check, an uptime pinger) can still tell up from
down; without the token it answers only the status code and ``{"ok": ...}``,
never a camera name, reason or frame. With the token (or on a server without
one) it carries the full detail.

The page polls ``/api/stats`` once a second rather than holding a
server-sent-events stream: on a thread-per-connection server a stream holds a
thread for as long as a tab stays open, where a poll holds one for a
millisecond; a poll passes any proxy and resumes by itself after a restart.
Whatever needs pushed events (home automation, a fleet) has the MQTT sink.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import html
import ipaddress
import logging
import re
import socket
import socketserver
import threading
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Set, Tuple
from urllib.parse import parse_qs, urlsplit

import msgspec

from edgecap.errors import ConfigError
from edgecap.service.state import ServiceState

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
COOKIE = "edgecap_session"
COOKIE_MAX_AGE_S = 30 * 24 * 3600
MIN_TOKEN_CHARS = 16
_LOGIN_BODY_MAX = 4096
_FRAME = re.compile(r"^/api/frame/([A-Za-z0-9_-]+)\.jpg$")
_TOKEN = re.compile(r"^[\x21-\x7e]+$")  # visible ASCII: fits a header and a form unchanged
# The page and its script come from this server alone; the browser enforces it too.
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
_PUBLIC_STATIC = {"/static/app.js": "text/javascript", "/static/style.css": "text/css"}


class StatusServer:
    """Serves the status page and API over one ``ServiceState`` and ``Metrics``.

    Args:
      state: The state the service writes.
      metrics: The service's ``Metrics`` (None: ``/metrics`` answers 404).
      address: The address to listen on; a non-loopback one requires ``token``.
      port: The TCP port; 0 picks a free one (``.port`` tells which).
      token: The access token; None or "" for none.
      max_caption_age_s: ``/healthz`` turns 503 when a camera is silent longer.

    Raises:
      ConfigError: A non-loopback address without a token, or a token that is
        too short or not visible ASCII.
    """

    def __init__(self, state: ServiceState, metrics: Any = None, address: str = "127.0.0.1",
                 port: int = 8080, token: Optional[str] = None,
                 max_caption_age_s: float = 60.0) -> None:
        token = token or None
        self.loopback = is_loopback(address)
        if token is None and not self.loopback:
            raise ConfigError(
                f"http: address {address!r} would serve camera frames beyond this machine without a "
                f"login; set [http] token (or token_file), or bind 127.0.0.1")
        if token is not None and (len(token) < MIN_TOKEN_CHARS or not _TOKEN.match(token)):
            raise ConfigError(
                f"http: the token must be at least {MIN_TOKEN_CHARS} visible ASCII characters "
                f"without spaces; make one with `python3 -c 'import secrets; "
                f"print(secrets.token_urlsafe(24))'`")
        self.state = state
        self.metrics = metrics
        self.address = address
        self.max_caption_age_s = max_caption_age_s
        self._requested_port = port
        self._token = None if token is None else token.encode("ascii")
        # The cookie holds a MAC of the token, not the token: a leaked cookie
        # does not reveal a secret that may be reused elsewhere (MQTT, scripts).
        self._session = None if token is None else hmac.new(
            self._token, b"edgecap status page session", hashlib.sha256).hexdigest().encode("ascii")
        self._static = {name: (STATIC / name).read_bytes()
                        for name in ("index.html", "login.html", "app.js", "style.css")}
        self._httpd: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        """The bound port (the requested one before ``start``)."""
        return self._httpd.server_address[1] if self._httpd else self._requested_port

    @property
    def url(self) -> str:
        """The page's address, e.g. ``http://127.0.0.1:8080/``."""
        host = f"[{self.address}]" if ":" in self.address else (self.address or "0.0.0.0")
        return f"http://{host}:{self.port}/"

    def start(self) -> "StatusServer":
        """Binds and serves on a daemon thread; returns self.

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
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="edgecap-http", daemon=True)
        self._thread.start()
        log.info("status page on %s", self.url)
        return self

    def close(self, timeout: float = 1.0) -> None:
        """Stops serving: drops open connections and frees the port."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()  # returns within one poll interval (50 ms)
        httpd.close_connections()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> "StatusServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_loopback(address: str) -> bool:
    """Says whether an address reaches only this machine (127.0.0.0/8, ::1, localhost)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name or "": may resolve anywhere, so treat it as exposed


def _json(value: Any) -> bytes:
    # msgspec writes NaN and infinity as null: JSON.parse in the page never chokes.
    return msgspec.json.encode(value)


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its StatusServer and can drop its live connections."""

    daemon_threads = True

    def __init__(self, address: Tuple[str, int], app: StatusServer) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.app = app
        self._connections: Set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, a DNS round trip that
        # can stall start-up on a board without a resolver; nothing here needs it.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._connections_lock:
            (self._connections.add if add else self._connections.discard)(conn)

    def close_connections(self) -> None:
        with self._connections_lock:
            conns = list(self._connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("http: request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    """One connection; routes GET/HEAD to read-only views and POST to /login only."""

    server: _Server
    server_version = "edgecap"
    sys_version = ""
    timeout = 30  # a client that sends nothing gives its thread back

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

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
        if urlsplit(self.path).path == "/login" and self.app._token is not None:
            self._login()
        else:
            self._send_json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "read-only: only POST /login"},
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
        if path == "/metrics" and app.metrics is not None:
            body, ctype = app.metrics.render()
            return self._send(HTTPStatus.OK, body, ctype, head=head)
        m = _FRAME.match(path)
        if m:
            return self._frame(m.group(1), head)
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

    def _authorized(self) -> bool:
        token = self.app._token
        if token is None:
            return True
        auth = self.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            return hmac.compare_digest(auth[7:].strip().encode("latin-1", "replace"), token)
        try:
            morsel = SimpleCookie(self.headers.get("Cookie", "")).get(COOKIE)
        except CookieError:
            return False
        return morsel is not None and hmac.compare_digest(
            morsel.value.encode("latin-1", "replace"), self.app._session)

    def _login(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._send_json(HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length required"})
        if not 0 <= length <= _LOGIN_BODY_MAX:
            return self._send_json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "login form too large"})
        form = parse_qs(self.rfile.read(length).decode("latin-1"), max_num_fields=4)
        given = (form.get("token") or [""])[0].strip().encode("latin-1", "replace")
        if not hmac.compare_digest(given, self.app._token):
            return self._login_page(HTTPStatus.UNAUTHORIZED, "Wrong token.", head=False)
        cookie = (f"{COOKIE}={self.app._session.decode('ascii')}; Path=/; Max-Age={COOKIE_MAX_AGE_S}; "
                  f"HttpOnly; SameSite=Strict")
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", head=False,
                   extra=[("Location", "./"), ("Set-Cookie", cookie)])

    def _login_page(self, status: HTTPStatus, message: str, head: bool) -> None:
        page = self.app._static["login.html"].replace(b"<!--message-->", html.escape(message).encode())
        self._send(status, page, "text/html; charset=utf-8", head=head)

    # -- views -----------------------------------------------------------

    def _healthz(self, head: bool) -> None:
        app = self.app
        ok, reason = app.state.health(app.max_caption_age_s)
        status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
        if not self._authorized():
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

    # -- responses -------------------------------------------------------

    def _headers(self, ctype: str, cache: bool, extra: Iterable[Tuple[str, str]] = ()) -> None:
        self.send_header("Content-Type", ctype)
        self.send_header("Cache-Control", "max-age=300" if cache else "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Security-Policy", _CSP)
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
