"""Connection floods against a real daemon: silent sockets cannot lock a real client out.

Sockets that connect (TCP and the Unix socket: they share the places) and send nothing
hold only *pending* places; beyond ``max_pending_connections`` the oldest is evicted, and
each is closed after ``handshake_timeout_s`` anyway. Both are counted in status.
"""
from __future__ import annotations

import socket
import time

from tests.helpers import peer_closed, raw_connect, raw_recv, raw_send, wait_for

FLOOD = 40
PENDING_CAP = 4


def unix_connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30.0)
    sock.connect(path)
    return sock


def counters(d) -> dict | None:
    """The daemon's status, or None when this status connection was itself evicted by a
    flood socket the daemon accepted after it (wait_for then asks again)."""
    try:
        return d.status()
    except (KeyError, ConnectionError):
        return None


def request(sock: socket.socket, msg_type: str) -> dict:
    raw_send(sock, {"type": msg_type})
    return raw_recv(sock)


def test_a_flood_of_silent_sockets_does_not_lock_a_real_client_out(daemon_factory):
    d = daemon_factory("--set", "server.max_connections=16",
                       "--set", f"server.max_pending_connections={PENDING_CAP}",
                       "--set", "server.handshake_timeout_s=120")  # eviction alone must do it
    flood = [raw_connect(d.port) if i % 2 else unix_connect(d.unix_socket) for i in range(FLOOD)]
    wait_for(lambda: (counters(d) or {}).get("evicted_connections", 0) >= FLOOD - PENDING_CAP, 30.0,
             what="the flood accepted (and the oldest silent sockets evicted)")
    started = time.monotonic()
    real = raw_connect(d.port)
    assert request(real, "PING")["type"] == "PONG"
    assert request(real, "GET_CONFIG")["type"] == "SET_CONFIG"
    assert request(real, "GET_STATE")["type"] == "SET_STATE"
    took = time.monotonic() - started
    assert took < 10.0, took  # generous under a loaded test machine; the bench measures it
    status = d.status()
    assert status["pending_connections"] <= PENDING_CAP
    assert status["refused_connections"] == 0 and status["protocol_errors"] == 0
    closed = [s for s in flood if peer_closed(s, timeout_s=1.0)]
    assert len(closed) >= FLOOD - PENDING_CAP
    assert request(real, "PING")["type"] == "PONG"  # a handshaken client is never evicted
    for sock in [*flood, real]:
        sock.close()


def test_an_evicted_socket_is_told_why(daemon_factory):
    d = daemon_factory("--set", "server.max_pending_connections=1")
    first, second = raw_connect(d.port), raw_connect(d.port)  # one listener: accepted in order
    reply = raw_recv(first)
    assert reply["type"] == "ERROR" and "evicted" in reply["message"], reply
    assert peer_closed(first)
    assert request(second, "PING")["type"] == "PONG"
    assert d.status()["evicted_connections"] == 1
    for sock in (first, second):
        sock.close()


def test_a_silent_socket_is_closed_after_the_handshake_timeout(daemon_factory):
    d = daemon_factory("--set", "server.handshake_timeout_s=1.0")
    silent, talking = raw_connect(d.port), raw_connect(d.port)
    assert request(talking, "PING")["type"] == "PONG"
    assert not peer_closed(silent, timeout_s=0.5)  # not before its deadline
    silent.settimeout(10.0)
    reply = raw_recv(silent)
    assert reply["type"] == "ERROR" and "handshake_timeout_s" in reply["message"], reply
    assert peer_closed(silent)
    assert d.status()["handshake_timeouts"] == 1
    assert not peer_closed(talking, timeout_s=0.6)  # past its own 1 s: a handshaken one stays
    assert request(talking, "PING")["type"] == "PONG"
    for sock in (silent, talking):
        sock.close()
