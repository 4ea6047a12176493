"""daemon.sdnotify against a real AF_UNIX datagram socket (path and abstract), no systemd."""
from __future__ import annotations

import os
import secrets
import socket
import time

import pytest

from rlinkd.daemon.sdnotify import Notifier, watchdog_interval_s


@pytest.fixture
def listener(tmp_path):
    """A bound datagram socket standing in for $NOTIFY_SOCKET; yields (address, socket)."""
    path = tmp_path / "notify"
    if len(str(path)) >= 100:  # sun_path limit (108 bytes): use a shorter name
        path = tmp_path.parent / f"n{secrets.token_hex(3)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5.0)
    yield str(path), sock
    sock.close()
    path.unlink(missing_ok=True)


def recv_fields(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().split("\n")


def test_ready_status_stopping_watchdog(listener):
    address, sock = listener
    n = Notifier(address)
    assert n.enabled and n.address == address
    assert n.ready() and recv_fields(sock) == ["READY=1"]
    assert n.ready("listening on 127.0.0.1:5555") and recv_fields(sock) == [
        "READY=1", "STATUS=listening on 127.0.0.1:5555"]
    assert n.status("training: 12 clients") and recv_fields(sock) == ["STATUS=training: 12 clients"]
    assert n.stopping() and recv_fields(sock) == ["STOPPING=1"]
    assert n.watchdog() and recv_fields(sock) == ["WATCHDOG=1"]
    assert n.send(ERRNO=5, BUSERROR="x") and recv_fields(sock) == ["ERRNO=5", "BUSERROR=x"]
    assert n.failures == 0
    n.close()
    assert not n.enabled and n.watchdog() is False


def test_reloading_carries_monotonic_usec(listener):
    address, sock = listener
    n = Notifier(address)
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert n.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    fields = recv_fields(sock)
    assert fields[0] == "RELOADING=1" and fields[1].startswith("MONOTONIC_USEC=")
    assert before <= int(fields[1].split("=", 1)[1]) <= after
    n.close()


def test_address_from_environment(listener, monkeypatch):
    address, sock = listener
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    n = Notifier()
    assert n.enabled and n.ready() and recv_fields(sock) == ["READY=1"]
    n.close()


def test_abstract_address():
    name = f"rlinkd-test-{os.getpid()}-{secrets.token_hex(4)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5.0)
    try:
        n = Notifier("@" + name)
        assert n.address == "\0" + name
        assert n.stopping() and recv_fields(sock) == ["STOPPING=1"]
        n.close()
    finally:
        sock.close()


def test_disabled_without_address(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    for n in (Notifier(), Notifier("")):
        assert not n.enabled
        assert n.ready("x") is False and n.reloading() is False and n.watchdog() is False
        assert n.failures == 0
        n.close()


def test_explicit_empty_address_overrides_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "ignored"))
    assert not Notifier("").enabled


def test_send_failures_are_counted_not_raised(tmp_path):
    n = Notifier(str(tmp_path / "nobody-listens"))
    assert n.enabled
    assert n.ready() is False and n.watchdog() is False
    assert n.failures == 2
    n.close()


# ---------------------------------------------------------------- watchdog interval
@pytest.mark.parametrize("usec, pid, expected", [
    ("4000000", None, 2.0),
    ("4000000", "self", 2.0),
    ("4000000", "other", None),
    ("1000", None, 0.0005),
    (None, None, None),
    ("", None, None),
    ("garbage", None, None),
    ("0", None, None),
    ("-5", None, None),
])
def test_watchdog_interval_from_environment(monkeypatch, usec, pid, expected):
    for key, value in (("WATCHDOG_USEC", usec),
                       ("WATCHDOG_PID", {"self": str(os.getpid()), "other": str(os.getpid() + 1),
                                         None: None}[pid])):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    assert watchdog_interval_s() == expected
