"""StatusServer over real sockets on 127.0.0.1: routes, the token, binding errors, a prompt close."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Dict, Iterator, Optional, Tuple

import pytest

from edgecap.captioner import Caption
from edgecap.errors import ConfigError
from edgecap.service.config import is_loopback
from edgecap.service.http import StatusServer
from edgecap.service.http import server as http_server
from edgecap.service.http import sessions as http_sessions
from edgecap.service.state import ServiceState

TOKEN = "s3cret-token-for-tests-0123"
JPEG = b"\xff\xd8\xff\xe0fake-jpeg-bytes\xff\xd9"


def caption(text: str, window: int = 0) -> Caption:
    return Caption(text=text, tokens=[1], window=window, start_frame=0, end_frame=7,
                   start_time=0.0, end_time=0.5, stage_ms={}, latency_ms=float("nan"))


def request(server: StatusServer, path: str, method: str = "GET", body: Optional[bytes] = None,
            headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, str], bytes]:
    """One request on a fresh connection to 127.0.0.1: (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


@pytest.fixture
def state() -> ServiceState:
    s = ServiceState(["front", "back"])
    s.set_camera("front", "online")
    s.frame("front", JPEG, 2.0)
    s.caption("front", caption("a man is playing a guitar"))
    s.devices([{"device": "tpu:0", "kind": "pci", "busy": 0.5, "temperature_c": 44.0, "throttled": False}])
    return s


@pytest.fixture
def server(state: ServiceState) -> Iterator[StatusServer]:
    with StatusServer(state, None, port=0) as srv:
        yield srv


@pytest.fixture
def guarded(state: ServiceState) -> Iterator[StatusServer]:
    with StatusServer(state, None, port=0, token=TOKEN) as srv:
        yield srv


def test_healthz_is_503_with_the_reason_until_every_camera_is_online(server: StatusServer,
                                                                     state: ServiceState) -> None:
    status, headers, body = request(server, "/healthz")
    health = json.loads(body)
    assert status == 503 and headers["content-type"] == "application/json"
    assert health["ok"] is False and health["reason"] == "camera back starting"
    assert health["cameras"]["back"]["status"] == "starting"
    assert health["devices"][0]["device"] == "tpu:0"
    assert 0 <= health["last_caption_age_s"] < 5

    state.set_camera("back", "online")
    status, _, body = request(server, "/healthz")
    assert status == 200 and json.loads(body)["reason"] == "ok"


def test_api_routes_serve_the_state_as_json(server: StatusServer, state: ServiceState) -> None:
    status, _, body = request(server, "/api/captions")
    captions = json.loads(body)  # NaN latency came out as null, so a browser's JSON.parse takes it
    assert status == 200 and captions["front"]["text"] == "a man is playing a guitar"
    assert captions["front"]["latency_ms"] is None and captions["back"] is None

    status, headers, body = request(server, "/api/stats")
    stats = json.loads(body)
    assert status == 200 and headers["cache-control"] == "no-store"
    assert stats["cameras"]["front"]["frame_seq"] == 1 and stats["captions"]["front"][0]["camera"] == "front"


def test_frames_are_served_as_jpeg_and_unknown_cameras_are_404(server: StatusServer) -> None:
    status, headers, body = request(server, "/api/frame/front.jpg")
    assert status == 200 and headers["content-type"] == "image/jpeg" and body == JPEG
    assert request(server, "/api/frame/back.jpg")[0] == 503  # known camera, no frame yet
    assert request(server, "/api/frame/side.jpg")[0] == 404
    assert request(server, "/api/frame/..%2Fetc%2Fpasswd.jpg")[0] == 404


def test_the_page_and_its_assets(server: StatusServer) -> None:
    status, headers, body = request(server, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b'src="static/app.js"' in body
    assert "default-src 'none'" in headers["content-security-policy"]  # the browser fetches nothing else
    status, headers, body = request(server, "/static/app.js")
    assert status == 200 and headers["content-type"] == "text/javascript" and b"api/stats" in body
    status, headers, body = request(server, "/static/style.css", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    assert request(server, "/static/../http.py")[0] == 404
    assert request(server, "/nope")[0] == 404


def test_metrics_route_renders_prometheus_text(state: ServiceState) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client.exposition import CONTENT_TYPE_LATEST
    from prometheus_client.parser import text_string_to_metric_families

    from edgecap.service.metrics import Metrics

    metrics = Metrics()
    metrics.frames_captured("front", 7)
    with StatusServer(state, metrics, port=0) as srv:
        status, headers, body = request(srv, "/metrics")
    assert status == 200 and headers["content-type"] == CONTENT_TYPE_LATEST
    samples = {s.name: s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    assert samples["edgecap_frames_captured_total"] == 7


def test_no_request_changes_state(server: StatusServer, state: ServiceState) -> None:
    before = state.version
    for path in ("/", "/healthz", "/api/stats", "/api/captions", "/api/frame/front.jpg", "/metrics"):
        request(server, path)
    status, headers, _ = request(server, "/api/stats", method="POST", body=b"x=1")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert request(server, "/api/stats", method="DELETE")[0] == 501
    assert request(server, "/login")[0] == 404  # no token, no login
    assert state.version == before


def test_an_open_loopback_server_refuses_foreign_host_headers(server: StatusServer) -> None:
    # A web page that rebinds its own name to 127.0.0.1 would send its name as Host.
    assert request(server, "/api/stats", headers={"Host": "evil.example"})[0] == 421
    assert request(server, "/api/stats", headers={"Host": f"127.evil.example:{server.port}"})[0] == 421
    assert request(server, "/api/stats", headers={"Host": f"127.0.0.2:{server.port}"})[0] == 200
    assert request(server, "/api/stats", headers={"Host": f"localhost:{server.port}"})[0] == 200
    assert request(server, "/api/stats", headers={"Host": f"[::1]:{server.port}"})[0] == 200


def test_off_loopback_without_a_token_refuses_to_start(state: ServiceState) -> None:
    with pytest.raises(ConfigError) as e:
        StatusServer(state, None, address="0.0.0.0", port=0)
    msg = str(e.value)
    assert "\n" not in msg and "'0.0.0.0'" in msg and "token" in msg
    with pytest.raises(ConfigError, match="at least 16"):
        StatusServer(state, None, address="0.0.0.0", port=0, token="short")
    with pytest.raises(ConfigError, match="visible ASCII"):
        StatusServer(state, None, port=0, token="has spaces in the middle of it")
    with pytest.raises(ConfigError, match=r"too easy to guess .*secrets\.token_urlsafe\(32\)"):
        StatusServer(state, None, address="0.0.0.0", port=0, token="a" * 16)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("board.local")


@pytest.mark.parametrize("address", ["LOCALHOST", "[::1]"])
def test_what_the_config_calls_loopback_the_server_serves_without_a_token(tmp_path, state, address) -> None:
    # There were two is_loopback: the config's took any case and brackets, the server's
    # neither, so `address = "LOCALHOST"` (host names ignore case) or "[::1]" passed the
    # config's check and then failed to start "without a login". One rule now.
    from edgecap.service.config import load_config

    config = tmp_path / "edgecap.toml"
    config.write_text(f'[http]\naddress = "{address}"\nport = 0\n[[cameras]]\nname = "front"\nsource = "0"\n')
    http = load_config(config).http
    assert http.token == "" and is_loopback(address)
    with StatusServer(state, None, address=http.address, port=0) as srv:
        assert srv.loopback
        family = socket.AF_INET6 if "::" in address else socket.AF_INET
        with socket.create_connection(("::1" if family == socket.AF_INET6 else "127.0.0.1", srv.port), 5) as sock:
            sock.sendall(f"GET /api/stats HTTP/1.1\r\nHost: {address}:{srv.port}\r\n\r\n".encode())
            assert sock.recv(64).startswith(b"HTTP/1.0 200")


def test_with_a_token_every_route_needs_it_but_a_bare_healthz(guarded: StatusServer) -> None:
    for path in ("/api/stats", "/api/captions", "/api/frame/front.jpg", "/metrics"):
        status, headers, body = request(guarded, path)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer"), path
        assert b"guitar" not in body and JPEG not in body
    status, headers, _ = request(guarded, "/")
    assert status == 303 and headers["location"] == "login"
    # Probes without the secret still tell up from down, and learn nothing else.
    status, _, body = request(guarded, "/healthz")
    assert status == 503 and json.loads(body) == {"ok": False}
    assert request(guarded, "/static/style.css")[0] == 200  # the login form's style

    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert request(guarded, "/api/frame/front.jpg", headers=bearer)[2] == JPEG
    assert json.loads(request(guarded, "/healthz", headers=bearer)[2])["reason"] == "camera back starting"
    assert request(guarded, "/api/stats", headers={"Authorization": f"Bearer {TOKEN}x"})[0] == 401
    assert request(guarded, "/api/stats", headers={"Authorization": TOKEN})[0] == 401
    # Any Host will do once a token guards the server: rebinding gains nothing without it.
    assert request(guarded, "/api/stats", headers={**bearer, "Host": "board.lan"})[0] == 200


def test_tokens_are_compared_in_constant_time(guarded: StatusServer, monkeypatch) -> None:
    calls = []
    real = http_sessions.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(http_sessions.hmac, "compare_digest", spy)
    request(guarded, "/api/stats", headers={"Authorization": "Bearer wrong"})
    assert calls == [(b"wrong", TOKEN.encode())]


FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def login(server: StatusServer, token: str = TOKEN, cookie: Optional[str] = None
          ) -> Tuple[int, Dict[str, str], bytes]:
    headers = dict(FORM, **({"Cookie": cookie} if cookie else {}))
    return request(server, "/login", "POST", f"token={token}".encode(), headers)


def session_cookie(headers: Dict[str, str]) -> str:
    """``edgecap_session=<id>`` out of a Set-Cookie header."""
    return headers["set-cookie"].split(";")[0].strip()


def test_login_sets_an_httponly_strict_cookie_that_is_not_the_token(guarded: StatusServer) -> None:
    status, headers, body = request(guarded, "/login")
    assert status == 200 and b'name="token"' in body and b'method="post"' in body

    status, headers, body = login(guarded, "wrong")
    assert status == 401 and b"Wrong token." in body and "set-cookie" not in headers

    status, headers, _ = login(guarded)
    assert status == 303 and headers["location"] == "./"
    cookie = headers["set-cookie"]
    attrs = [a.strip() for a in cookie.split(";")]
    assert "HttpOnly" in attrs and "SameSite=Strict" in attrs and "Path=/" in attrs
    assert f"Max-Age={http_sessions.SESSION_MAX_AGE_S}" in attrs
    name, value = attrs[0].split("=", 1)
    assert name == "edgecap_session" and TOKEN not in value and len(value) >= 43

    status, _, body = request(guarded, "/api/captions", headers={"Cookie": attrs[0]})
    assert status == 200 and json.loads(body)["front"]["text"] == "a man is playing a guitar"
    assert request(guarded, "/", headers={"Cookie": attrs[0]})[0] == 200
    other = value[:-1] + ("A" if value[-1] != "A" else "B")  # one character off
    assert request(guarded, "/api/stats", headers={"Cookie": f"edgecap_session={other}"})[0] == 401
    assert request(guarded, "/api/stats", headers={"Cookie": 'edgecap_session="\\'})[0] == 401

    status, _, _ = request(guarded, "/login", "POST", b"x" * 5000, FORM)
    assert status == 413


def test_each_login_makes_a_fresh_session_and_ends_the_one_it_replaces(guarded: StatusServer) -> None:
    first = session_cookie(login(guarded)[1])
    other = session_cookie(login(guarded)[1])  # another browser
    assert first != other
    again = session_cookie(login(guarded, cookie=first)[1])  # the first browser logs in again
    assert again not in (first, other)
    assert request(guarded, "/api/stats", headers={"Cookie": first})[0] == 401
    assert request(guarded, "/api/stats", headers={"Cookie": other})[0] == 200
    assert request(guarded, "/api/stats", headers={"Cookie": again})[0] == 200


def test_logout_ends_the_session_and_clears_the_cookie(guarded: StatusServer) -> None:
    cookie = session_cookie(login(guarded)[1])
    assert b'action="logout"' in request(guarded, "/", headers={"Cookie": cookie})[2]
    status, headers, _ = request(guarded, "/logout", "POST", b"", {"Cookie": cookie})
    assert status == 303 and headers["location"] == "login"
    assert "Max-Age=0" in headers["set-cookie"] and session_cookie(headers) == "edgecap_session="
    # The browser drops the cookie; one kept by someone else no longer works either.
    assert request(guarded, "/api/stats", headers={"Cookie": cookie})[0] == 401
    assert request(guarded, "/logout", "POST", b"")[0] == 303  # without a session: harmless


def test_sessions_expire(guarded: StatusServer, monkeypatch) -> None:
    cookie = session_cookie(login(guarded)[1])
    now = time.monotonic()
    monkeypatch.setattr(guarded.sessions, "clock", lambda: now + http_sessions.SESSION_MAX_AGE_S + 1)
    assert request(guarded, "/api/stats", headers={"Cookie": cookie})[0] == 401


def test_failed_logins_are_warned_and_limited_per_address(guarded: StatusServer, caplog) -> None:
    caplog.set_level("WARNING", logger="edgecap.service.http")
    for _ in range(http_sessions.LOGIN_ATTEMPTS):
        assert login(guarded, "wrong-guess-123")[0] == 401
    assert "failed login from 127.0.0.1" in caplog.text and "wrong-guess-123" not in caplog.text
    assert "refusing logins from 127.0.0.1" in caplog.text
    # Now even the right token is not checked until the window has passed.
    status, headers, body = login(guarded)
    assert status == 429 and b"Too many failed logins" in body and "set-cookie" not in headers
    assert 0 < int(headers["retry-after"]) <= http_sessions.LOGIN_WINDOW_S
    assert headers["content-security-policy"] == http_server._CSP
    # Bearer guesses count too, and are refused alike.
    status, headers, body = request(guarded, "/api/stats", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 429 and "retry-after" in headers and b"guitar" not in body
    # The window passes: the address may try again.
    later = time.monotonic() + http_sessions.LOGIN_WINDOW_S + 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(guarded.attempts, "clock", lambda: later)
        assert login(guarded)[0] == 303


def test_wrong_bearer_tokens_are_warned_and_limited(guarded: StatusServer, caplog) -> None:
    caplog.set_level("WARNING", logger="edgecap.service.http")
    for _ in range(http_sessions.LOGIN_ATTEMPTS):
        assert request(guarded, "/api/stats", headers={"Authorization": "Bearer guess-0123456789"})[0] == 401
    assert "wrong bearer token from 127.0.0.1" in caplog.text and "guess-0123456789" not in caplog.text
    assert request(guarded, "/api/stats", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 429
    assert json.loads(request(guarded, "/healthz", headers={"Authorization": f"Bearer {TOKEN}"})[2]) == {"ok": False}
    assert login(guarded)[0] == 429


def test_off_loopback_with_a_token_serves_and_guards(state: ServiceState) -> None:
    with StatusServer(state, None, address="0.0.0.0", port=0, token=TOKEN) as srv:
        assert srv.url == f"http://0.0.0.0:{srv.port}/"
        assert request(srv, "/api/stats")[0] == 401
        assert request(srv, "/api/stats", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200


def test_a_port_in_use_is_one_config_error_line(state: ServiceState) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with pytest.raises(ConfigError) as e:
            StatusServer(state, None, port=port).start()
    finally:
        holder.close()
    assert str(e.value) == (f"http: 127.0.0.1:{port} is already in use; stop what holds it or set "
                            f"[http] port to a free one")


def test_an_address_not_on_this_machine_is_a_config_error(state: ServiceState) -> None:
    with pytest.raises(ConfigError, match=r"^http: 192\.0\.2\.1:0: no such address on this machine"):
        StatusServer(state, None, address="192.0.2.1", port=0, token=TOKEN).start()


def test_close_returns_within_a_second_with_a_client_mid_request(state: ServiceState) -> None:
    srv = StatusServer(state, None, port=0).start()
    port = srv.port
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(b"GET /api/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finishes its headers
    time.sleep(0.05)  # let the server take the connection onto a handler thread
    t0 = time.perf_counter()
    srv.close()
    elapsed = time.perf_counter() - t0
    try:
        assert elapsed < 1.0
        stalled.settimeout(2)
        assert stalled.recv(100) == b""  # the server dropped it rather than leave it hanging
    finally:
        stalled.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    srv.close()  # a second close is harmless


def test_many_clients_while_the_state_is_written(server: StatusServer, state: ServiceState) -> None:
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.wait(0.001):  # a camera's pace, give or take: the GIL stays shared
            state.frame("front", JPEG, i / 15)
            state.caption("front", caption(f"caption {i}", i))
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    results = []

    def read() -> None:
        for _ in range(10):
            status, _, body = request(server, "/api/stats")
            results.append((status, json.loads(body)["cameras"]["front"]["status"]))

    readers = [threading.Thread(target=read) for _ in range(4)]
    try:
        for t in readers:
            t.start()
        for t in readers:
            t.join()
    finally:
        stop.set()
        writer.join()
    assert results == [(200, "online")] * 40
