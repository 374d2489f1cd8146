"""StatusServer against hostile clients on 127.0.0.1: slow heads and bodies, crowds, bad requests.

Deadlines here are short (tenths of a second) and the bounds asserted generous:
they prove a bound exists, not how tight it is on a loaded machine. The
figures under load come from ``python tools/hostile_bench.py``.
"""

from __future__ import annotations

import http.client
import shutil
import socket
import subprocess
import threading
import time
from typing import Dict, Iterator, List, Tuple

import pytest

from edgecap.service.http import server as http_server
from edgecap.service.http import StatusServer
from edgecap.service.metrics import Metrics
from edgecap.service.state import ServiceState

pytestmark = pytest.mark.fast


@pytest.fixture
def state() -> ServiceState:
    s = ServiceState(["front"])
    s.set_camera("front", "online")
    return s


@pytest.fixture
def server(state: ServiceState) -> Iterator[StatusServer]:
    with StatusServer(state, None, port=0, header_timeout_s=0.5, body_timeout_s=0.5) as srv:
        yield srv


def healthz(server: StatusServer, timeout: float = 5.0) -> Tuple[int, Dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}
    finally:
        conn.close()


def raw(server: StatusServer, data: bytes) -> Tuple[str, Dict[str, str], bytes]:
    """Sends ``data`` as it is; returns the status line, headers and body of the answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(data)
        answer = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return lines[0], headers, body


def closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> bool:
    """Sends ``trickle`` a byte every 50 ms until the server closes ``sock``; True if it did in time."""
    sock.settimeout(0.05)
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        try:
            if trickle:
                sock.send(trickle[i % len(trickle):i % len(trickle) + 1])
                i += 1
            if sock.recv(1024) == b"":
                return True
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


def test_a_client_trickling_its_head_is_dropped_at_the_deadline(server: StatusServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        t0 = time.monotonic()
        # One byte every 50 ms, for ever: each arrives well inside any per-read timeout.
        assert closed_within(s, 10.0, trickle=b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 10_000)
        assert time.monotonic() - t0 < 10.0
    assert server.dropped["timeout"] == 1
    assert healthz(server)[0] == 200


def test_drops_are_counted_in_the_metrics(state: ServiceState) -> None:
    with StatusServer(state, Metrics(), port=0, header_timeout_s=0.2) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            assert closed_within(s, 10.0)
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    assert 'edgecap_http_connections_dropped_total{reason="timeout"} 1.0' in text
    assert 'edgecap_http_connections_dropped_total{reason="cap"} 0.0' in text


def test_a_client_trickling_its_body_is_dropped_at_the_deadline(state: ServiceState) -> None:
    token = "s3cret-token-for-tests-0123"
    with StatusServer(state, None, port=0, token=token, body_timeout_s=0.5) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(b"POST /login HTTP/1.1\r\nContent-Length: 4000\r\n\r\ntoken=")
            assert closed_within(s, 10.0, trickle=b"x")
        assert srv.dropped["timeout"] == 1


def test_idle_connections_hold_no_thread_and_do_not_starve_healthz(server: StatusServer) -> None:
    threads = threading.active_count()
    idle: List[socket.socket] = []
    try:
        for _ in range(200):
            idle.append(socket.create_connection(("127.0.0.1", server.port)))
            idle[-1].send(b"G")
        time.sleep(0.1)
        assert threading.active_count() - threads < 5  # a thread per connection would be 200
        assert healthz(server)[0] == 200
    finally:
        for s in idle:
            s.close()


def test_past_the_cap_the_oldest_unfinished_connection_makes_room(state: ServiceState) -> None:
    with StatusServer(state, None, port=0, max_connections=8) as srv:
        assert srv.max_connections == 8
        idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(20)]
        try:
            assert healthz(srv)[0] == 200  # never refused for the crowd that came first
            # The first 13 made room for the later 7 and the probe; the last 7 are still open.
            assert [closed_within(s, 2.0) for s in idle[:13]] == [True] * 13
            for s in idle[13:]:
                s.setblocking(False)
                with pytest.raises(BlockingIOError):
                    s.recv(1)
            assert srv.dropped["cap"] == 13
        finally:
            for s in idle:
                s.close()


def test_the_cap_leaves_descriptors_for_the_cameras(monkeypatch) -> None:
    monkeypatch.setattr(http_server.resource, "getrlimit", lambda _: (600, 524288))
    assert http_server.connection_cap() == 600 - http_server.FD_RESERVE
    monkeypatch.setattr(http_server.resource, "getrlimit", lambda _: (65536, 65536))
    assert http_server.connection_cap() == http_server.MAX_CONNECTIONS
    monkeypatch.setattr(http_server.resource, "getrlimit", lambda _: (100, 100))
    assert http_server.connection_cap() == 8


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_the_listen_backlog_holds_a_crowd_of_scrapers(server: StatusServer) -> None:
    out = subprocess.run(["ss", "-ltnH", f"sport = :{server.port}"], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "LISTEN" and int(out[2]) == http_server.BACKLOG >= 128  # Send-Q: the backlog


def test_a_head_over_the_limit_is_refused_with_the_security_headers(server: StatusServer) -> None:
    status, headers, _ = raw(server, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (http_server.HEAD_MAX + 10))
    assert status.startswith("HTTP/1.0 431") and headers["x-content-type-options"] == "nosniff"
    assert server.dropped["head_too_large"] == 1


@pytest.mark.parametrize("request_bytes, code", [
    (b"NONSENSE\r\n\r\n", 400),
    (b"GET / HTTP/9.9\r\n\r\n", 505),
    (b"BREW /pot HTTP/1.1\r\n\r\n", 501),
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 431),  # over HEAD_MAX: refused before parsing
    (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", 431),  # too many header lines
    (b"GET /nowhere HTTP/1.1\r\n\r\n", 404),
    (b"POST /api/stats HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
])
def test_every_error_carries_the_security_headers(server: StatusServer, request_bytes: bytes,
                                                  code: int) -> None:
    _, page_headers, _ = raw(server, b"GET / HTTP/1.1\r\n\r\n")
    status, headers, body = raw(server, request_bytes)
    assert status.split()[1] == str(code), status
    for name, value in http_server.SECURITY_HEADERS:
        assert headers[name.lower()] == page_headers[name.lower()] == value, name
    assert headers["content-type"] == "application/json" and b"<html" not in body.lower()


def test_close_drops_clients_that_never_finish(state: ServiceState) -> None:
    srv = StatusServer(state, None, port=0).start()
    idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(50)]
    time.sleep(0.05)
    t0 = time.perf_counter()
    srv.close()
    try:
        assert time.perf_counter() - t0 < 1.0
        assert all(closed_within(s, 2.0) for s in idle)
    finally:
        for s in idle:
            s.close()
