"""sd_notify: datagrams read back from a real Unix socket, as systemd would receive them."""

from __future__ import annotations

import logging
import os
import socket
import uuid

import pytest

from edgecap.service.notify import Notifier


@pytest.fixture
def listener(tmp_path):
    """A datagram socket bound in tmp_path, as systemd binds its notify socket."""
    path = tmp_path / "notify"
    assert len(str(path)) < 100, "Unix socket paths are limited to 107 bytes"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2.0)
    yield str(path), sock
    sock.close()


@pytest.fixture
def abstract_listener():
    """A datagram socket in the abstract namespace (NOTIFY_SOCKET=@name)."""
    name = f"edgecap-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2.0)
    yield "@" + name, sock
    sock.close()


def received(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_each_message_is_one_datagram(listener):
    path, sock = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready("2 cameras, 10.0 fps")
    assert received(sock) == "READY=1\nSTATUS=2 cameras, 10.0 fps"
    assert notifier.watchdog()
    assert received(sock) == "WATCHDOG=1"
    assert notifier.status("front: 9.8 fps;\ndevices: emu-tpu:0")
    assert received(sock) == "STATUS=front: 9.8 fps; devices: emu-tpu:0"  # the protocol is line-based
    assert notifier.stopping()
    assert received(sock) == "STOPPING=1"
    assert notifier.ready()
    assert received(sock) == "READY=1"
    notifier.close()
    assert not notifier.watchdog()


def test_abstract_socket(abstract_listener):
    name, sock = abstract_listener
    notifier = Notifier({"NOTIFY_SOCKET": name})
    assert notifier.ready()
    assert received(sock) == "READY=1"
    notifier.close()


def test_reads_the_process_environment_by_default(listener, monkeypatch):
    path, sock = listener
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    notifier = Notifier()
    assert notifier.stopping()
    assert received(sock) == "STOPPING=1"
    assert notifier.watchdog_interval() == 2.0
    notifier.close()


def test_without_systemd_every_call_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = Notifier()
    assert not notifier.enabled
    assert (notifier.ready("x"), notifier.watchdog(), notifier.status("x"), notifier.stopping()) == \
        (False, False, False, False)
    assert Notifier({"NOTIFY_SOCKET": ""}).notify("READY=1") is False


def test_a_relative_notify_socket_is_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="edgecap.service.notify"):
        notifier = Notifier({"NOTIFY_SOCKET": "relative/path"})
    assert not notifier.enabled
    assert "neither a path nor an abstract socket" in caplog.text


def test_a_failing_send_is_logged_once_and_never_raised(tmp_path, caplog):
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    with caplog.at_level(logging.WARNING, logger="edgecap.service.notify"):
        assert notifier.watchdog() is False
        assert notifier.watchdog() is False
    warnings = [r for r in caplog.records if "cannot notify systemd" in r.getMessage()]
    assert len(warnings) == 1
    notifier.close()


@pytest.mark.parametrize("env, interval", [
    ({"WATCHDOG_USEC": "30000000"}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
    ({}, None),
])
def test_watchdog_interval_is_half_the_period(env, interval):
    assert Notifier(env).watchdog_interval() == interval


def test_a_receiver_that_stops_reading_never_blocks_the_sender(tmp_path):
    # systemd always reads; a stuck reader (a test harness, a wedged manager) must
    # cost dropped datagrams, not a frame loop blocked in sendto.
    import socket as _socket
    import threading as _threading

    from edgecap.service.notify import Notifier as _Notifier

    path = tmp_path / "full.sock"
    receiver = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
    receiver.bind(str(path))
    try:
        notifier = _Notifier({"NOTIFY_SOCKET": str(path)})
        done = _threading.Event()

        def flood():
            for _ in range(5000):  # far more than a datagram queue holds
                notifier.status("x" * 200)
            done.set()

        _threading.Thread(target=flood, daemon=True).start()
        assert done.wait(10), "sendto blocked on a full receiver"
        notifier.close()
    finally:
        receiver.close()
