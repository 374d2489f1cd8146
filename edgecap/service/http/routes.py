"""The status server's routes: what each request gets, with the same security headers on every answer.

GET and HEAD reach read-only views — the page (``/``), ``/api/stats``,
``/api/captions``, ``/api/frame/<camera>.jpg``, ``/api/events`` and an event's
``/api/events/<id>/thumbnail.jpg``, ``/metrics`` and ``/healthz`` — and POST
only ``/login`` and ``/logout`` (``edgecap.service.http.sessions``). With a
token, every route but ``/login``, ``/logout``, the page's script, style and
icon and a bare ``/healthz`` needs it. An open loopback server refuses a
request naming a foreign Host, which is how a web page would reach it by DNS
rebinding.

``/healthz`` stays open so that probes which cannot carry a secret (a load
balancer, a container health check, an uptime pinger) can still tell up from
down; without the token it answers only the status code and ``{"ok": ...}``,
never a camera name, reason or frame. With the token (or on a server without
one) it carries the full detail.

``/api/events`` searches the event history (``edgecap.service.history``) and
``/api/events/<id>/thumbnail.jpg`` serves an event's thumbnail, under the
same token rules; without a history the list is empty.
"""

from __future__ import annotations

import html
import io
import logging
import math
import re
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler
from typing import Any, Dict, Iterable, List, Optional, Protocol, Tuple
from urllib.parse import parse_qs, quote, unquote, urlsplit

from edgecap.events import Event
from edgecap.service.config import NAME_PATTERN, is_loopback
from edgecap.service.history import iso_seconds
from edgecap.service.http.server import BODY_MAX, SECURITY_HEADERS, Request, json_bytes
from edgecap.service.http.sessions import COOKIE, LOGOUT_COOKIE

log = logging.getLogger(__name__)

EVENTS_LIMIT = 500  # the most events one /api/events answer lists
QUERY_MAX = 200  # characters of search text
PUBLIC_STATIC = {"/static/app.js": "text/javascript", "/static/style.css": "text/css",
                 "/static/icon.svg": "image/svg+xml"}
_FRAME = re.compile(r"^/api/frame/([A-Za-z0-9_-]+)\.jpg$")
_EVENT_THUMBNAIL = re.compile(r"^/api/events/([^/]+)/thumbnail\.jpg$")
_EVENT_ID = re.compile(r"^[A-Za-z0-9_-]{0,64}@-?[0-9]{1,16}$")  # CAMERA@START_MS (edgecap.events)
_CAMERA = re.compile(NAME_PATTERN)
_EVENTS_PARAMS = ("q", "camera", "since", "until", "limit")


class HistoryReader(Protocol):
    """What the server reads of the event history (``edgecap.service.history.History`` has it)."""

    def search(self, q: str = "", camera: str = "", since: Optional[float] = None,
               until: Optional[float] = None, limit: int = 50) -> List[Event]:
        """Events matching words and "quoted phrases" in ``q``, newest first, thumbnails not loaded."""

    def thumbnail(self, event_id: str) -> Optional[bytes]:
        """An event's JPEG thumbnail, or None."""


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
    given = _query_fields(query)
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


def _query_fields(query: str) -> Dict[str, str]:
    """The query's parameters, each known and given once (``events_query``'s first check)."""
    try:
        fields = parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=16)
    except ValueError:
        raise ValueError("too many query parameters; use q, camera, since, until and limit") from None
    for name, values in fields.items():
        if name not in _EVENTS_PARAMS:
            raise ValueError(f"unknown parameter {name!r}; use q, camera, since, until and limit")
        if len(values) > 1:
            raise ValueError(f"parameter {name!r} given {len(values)} times; give it once")
    return {name: values[0] for name, values in fields.items()}


def thumbnail_url(event_id: str) -> str:
    """The address of an event's thumbnail, relative to ``/api/events`` (so it works behind a proxy's prefix)."""
    return f"events/{quote(event_id, safe='@')}/thumbnail.jpg"


class Handler(BaseHTTPRequestHandler):
    """One request read whole by the server; routes GET/HEAD to read-only views, POST to login and logout.

    Args:
      request: The request, whole.
      client_address: (host, port) of the client.
      app: The ``StatusServer`` it is for (``BaseRequestHandler`` calls it ``server``).
    """

    server: Any  # the StatusServer, whose module imports this one
    request: Request
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
    def app(self) -> Any:
        return self.server

    # -- routing ---------------------------------------------------------

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def do_POST(self) -> None:
        if not self._host_ok():
            return
        path = urlsplit(self.path).path
        if path == "/login" and self.app.access.required:
            self._login()
        elif path == "/logout" and self.app.access.required:
            self._logout()
        else:
            self._send_json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "read-only: only POST /login and /logout"},
                            extra=[("Allow", "GET, HEAD")])

    def _route(self, head: bool) -> None:
        if not self._host_ok():
            return
        path = urlsplit(self.path).path
        app = self.app
        if path in PUBLIC_STATIC:
            return self._send(HTTPStatus.OK, app.static[path.rsplit("/", 1)[1]], PUBLIC_STATIC[path],
                              head=head, cache=True)
        if path == "/healthz":
            return self._healthz(head)
        if path == "/login":
            if not app.access.required:
                return self._send_json(HTTPStatus.NOT_FOUND, {"error": "no login on this server"}, head=head)
            return self._login_page(HTTPStatus.OK, "", head)
        wait = self._bearer_wait()
        if wait:
            return self._too_many(wait, head)
        if not self._authorized():
            if path == "/":
                return self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", head=head,
                                  extra=[("Location", "login")])  # relative: works behind a proxy's prefix
            return self._send_json(HTTPStatus.UNAUTHORIZED, {"error": "token required: log in at /login "
                                                             "or send Authorization: Bearer <token>"},
                                   head=head, extra=[("WWW-Authenticate", 'Bearer realm="edgecap"')])
        self._view(path, head)

    def _view(self, path: str, head: bool) -> None:
        """Answers an authorized GET or HEAD."""
        app = self.app
        if path == "/":
            return self._send(HTTPStatus.OK, app.static["index.html"], "text/html; charset=utf-8", head=head)
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
        if self.app.access.required or not self.app.loopback:
            return True
        host = self.headers.get("Host")
        if host is None:
            return True  # HTTP/1.0 tools; browsers, the only rebinding vector, always send one
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if is_loopback(name):  # an IP check: "127.evil.example" is a host name
            return True
        self._send_json(HTTPStatus.MISDIRECTED_REQUEST,
                        {"error": f"host {host!r} is not this loopback server; open {self.app.url}"})
        return False

    def _bearer(self) -> Optional[str]:
        auth = self.headers.get("Authorization", "")
        return auth[7:].strip() if auth[:7].lower() == "bearer " else None

    def _bearer_wait(self) -> float:
        return self.app.access.bearer_wait(self._bearer(), self.client_address[0])

    def _session(self) -> Optional[str]:
        try:
            morsel = SimpleCookie(self.headers.get("Cookie", "")).get(COOKIE)
        except CookieError:
            return None
        return None if morsel is None else morsel.value

    def _authorized(self) -> bool:
        return self.app.access.authorized(self._bearer(), self._session(), self.client_address[0])

    def _too_many(self, wait: float, head: bool = False, page: bool = False) -> None:
        seconds = math.ceil(wait)
        message = f"too many failed logins from this address; try again in {seconds} s"
        extra = [("Retry-After", str(seconds))]
        if page:
            return self._login_page(HTTPStatus.TOO_MANY_REQUESTS, message[0].upper() + message[1:] + ".",
                                    head, extra)
        self._send_json(HTTPStatus.TOO_MANY_REQUESTS, {"error": message}, head=head, extra=extra)

    def _login(self) -> None:
        access = self.app.access
        wait = access.attempts.retry_after(self.client_address[0])
        if wait:  # not even checked: a blocked address learns nothing from its guesses
            return self._too_many(wait, page=True)
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._send_json(HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length required"})
        if not 0 <= length <= BODY_MAX:
            return self._send_json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "login form too large"})
        form = parse_qs(self.rfile.read(length).decode("latin-1"), max_num_fields=4)
        session = access.login((form.get("token") or [""])[0], self._session(), self.client_address[0])
        if session is None:
            return self._login_page(HTTPStatus.UNAUTHORIZED, "Wrong token.", head=False)
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", head=False,
                   extra=[("Location", "./"), ("Set-Cookie", access.session_cookie(session))])

    def _logout(self) -> None:
        session = self._session()
        if session is not None:
            self.app.access.sessions.end(session)
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", head=False,
                   extra=[("Location", "login"), ("Set-Cookie", LOGOUT_COOKIE)])

    def _login_page(self, status: HTTPStatus, message: str, head: bool,
                    extra: Iterable[Tuple[str, str]] = ()) -> None:
        page = self.app.static["login.html"].replace(b"<!--message-->", html.escape(message).encode())
        self._send(status, page, "text/html; charset=utf-8", head=head, extra=extra)

    # -- views -----------------------------------------------------------

    def _healthz(self, head: bool) -> None:
        app = self.app
        ok, reason = app.state.health(app.max_caption_age_s)
        status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
        if self._bearer_wait() or not self._authorized():
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
        self._send(status, json_bytes(value), "application/json", head=head, extra=extra)
