"""Connection limits and shutdown, against a real daemon over real sockets.

max_connections (the excess gets ERROR and is closed, the others are unaffected),
idle_timeout_s (a silent connection is dropped; a talking one is not), and SIGTERM
(every connected client gets ERROR naming the reason before the close).
"""
from __future__ import annotations

import signal
import socket
import time

import pytest

from rlinkd.client_lib.protocol import codec, msgpack_flavour as mf
from tests.helpers import peer_closed, raw_connect, raw_recv, raw_recv_exactly, raw_send


def ping(sock) -> dict:
    raw_send(sock, {"type": "PING"})
    return raw_recv(sock)


def test_excess_connection_gets_error_and_the_others_keep_working(daemon_factory):
    d = daemon_factory("--set", "server.max_connections=2")
    first, second = raw_connect(d.port), raw_connect(d.port)
    assert ping(first)["type"] == "PONG" and ping(second)["type"] == "PONG"
    third = raw_connect(d.port)
    reply = raw_recv(third)
    assert reply["type"] == "ERROR" and "too many connections" in reply["message"]
    assert peer_closed(third)
    assert ping(first)["type"] == "PONG" and ping(second)["type"] == "PONG"
    first.close()
    deadline = time.monotonic() + 10  # a freed place is usable again (the close is seen asynchronously)
    while True:
        again = raw_connect(d.port)
        raw_send(again, {"type": "PING"})
        if raw_recv(again)["type"] == "PONG":
            break
        assert time.monotonic() < deadline, "a closed connection's place was never freed"
        again.close()
        time.sleep(0.05)
    for sock in (second, third, again):
        sock.close()


def test_idle_connection_is_dropped_and_a_talking_one_is_not(daemon_factory):
    d = daemon_factory("--set", "server.idle_timeout_s=1.0")
    idle, talking = raw_connect(d.port), raw_connect(d.port)
    assert ping(idle)["type"] == "PONG"
    assert not peer_closed(idle, timeout_s=0.4)  # not before its second of silence
    for _ in range(6):  # 1.8 s of traffic, never silent for a whole second
        assert ping(talking)["type"] == "PONG"
        time.sleep(0.3)
    assert peer_closed(idle, timeout_s=5.0)
    assert ping(talking)["type"] == "PONG"
    idle.close()
    talking.close()


def recv_msgpack(sock: socket.socket) -> dict:
    size = codec.parse_header(raw_recv_exactly(sock, codec.HEADER_BYTES), 1 << 30)
    return mf.unpack(raw_recv_exactly(sock, size))


def test_sigterm_sends_every_client_an_error_with_the_reason(daemon_factory):
    """Each in its connection's flavour: JSON clients and an RLlib msgpack client."""
    d = daemon_factory()
    clients = [raw_connect(d.port) for _ in range(3)]
    for sock in clients:
        assert ping(sock)["type"] == "PONG"
    rllib = raw_connect(d.port)
    rllib.sendall(mf.encode({"type": "PING"}))
    assert recv_msgpack(rllib) == {"type": "PONG"}
    d.signal(signal.SIGTERM)
    for sock in clients:
        reply = raw_recv(sock)
        assert reply["type"] == "ERROR" and reply["message"].startswith("daemon shutting down"), reply
        assert peer_closed(sock)
        sock.close()
    reply = recv_msgpack(rllib)
    assert reply["type"] == "ERROR" and reply["message"].startswith("daemon shutting down"), reply
    rllib.close()
    assert d.proc.wait(60) == 0


def stalled_client(port: int, requests: int = 10) -> socket.socket:
    """Handshakes, then asks for the weights again and again and never reads a reply: the
    daemon's SET_STATE frames pile up until its writes to this client block."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    assert ping(sock)["type"] == "PONG"
    for _ in range(requests):
        raw_send(sock, {"type": "GET_STATE"})
    return sock


@pytest.mark.serial
def test_sigterm_with_100_stalled_clients_stays_within_the_shutdown_budget(daemon_factory):
    budget_s = 5.0
    d = daemon_factory("--set", f"daemon.shutdown_timeout_s={budget_s}",
                       "--set", "server.read_timeout_s=300")  # the stalled sends outlive the test
    stalled = [stalled_client(d.port) for _ in range(100)]
    polite = raw_connect(d.port)
    assert ping(polite)["type"] == "PONG"
    started = time.monotonic()
    d.signal(signal.SIGTERM)
    reply = raw_recv(polite)
    assert reply["type"] == "ERROR" and reply["message"].startswith("daemon shutting down"), reply
    assert d.proc.wait(60) == 0
    assert time.monotonic() - started < budget_s + 5.0  # the supervisor's own exit steps
    assert "child_killed_at_deadline" not in d.log()
    for sock in [*stalled, polite]:
        sock.close()
