"""Bad input never kills the daemon or disturbs other clients (real daemon, raw sockets)."""
from __future__ import annotations

import json

import pytest

from tests.helpers import peer_closed, raw_connect, raw_recv, raw_recv_exactly, raw_send

pytestmark = pytest.mark.process

GOOD_EPISODE = {"obs": [[0.0, 0.0, 0.0, 0.0], [0.01, 0.0, 0.0, 0.0]], "actions": [1],
                "rewards": [1.0], "is_terminated": False, "is_truncated": False}


def episode(**changes) -> dict:
    return dict(GOOD_EPISODE, **changes)


def frame(obj) -> bytes:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return str(len(body)).zfill(8).encode() + body


BAD_FRAMES = {
    "malformed header": b"12ab5678{}",
    "body not JSON": frame(b"{not json"),
    "body not an object": frame([1, 2, 3]),
    "unknown type": frame({"type": "TELEPORT"}),
    "missing type": frame({"hello": 1}),
    "missing field": frame({"type": "EPISODES_AND_GET_STATE"}),
    "mistyped field": frame({"type": "EPISODES", "episodes": [episode(is_terminated="no")]}),
    "episodes not a list": frame({"type": "EPISODES", "episodes": "lots"}),
    "obs wrong shape": frame({"type": "EPISODES",
                              "episodes": [episode(obs=[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])]}),
    "action out of space": frame({"type": "EPISODES", "episodes": [episode(actions=[7])]}),
    "fractional discrete action": frame({"type": "EPISODES", "episodes": [episode(actions=[0.5])]}),
    "NaN literal": b"%08d" % len(b'{"type":"EPISODES","episodes":[{"obs":[[NaN,0,0,0],[0,0,0,0]],'
                                 b'"actions":[1],"rewards":[1.0],"is_terminated":false,'
                                 b'"is_truncated":false}]}') +
                   b'{"type":"EPISODES","episodes":[{"obs":[[NaN,0,0,0],[0,0,0,0]],'
                   b'"actions":[1],"rewards":[1.0],"is_terminated":false,"is_truncated":false}]}',
    "overflow to Inf": frame(b'{"type":"EPISODES","episodes":[{"obs":[[1e999,0,0,0],[0,0,0,0]],'
                             b'"actions":[1],"rewards":[1.0],"is_terminated":false,'
                             b'"is_truncated":false}]}'),
    "reward Inf": frame(b'{"type":"EPISODES","episodes":[{"obs":[[0,0,0,0],[0,0,0,0]],'
                        b'"actions":[1],"rewards":[1e999],"is_terminated":false,'
                        b'"is_truncated":false}]}'),
    "length mismatch": frame({"type": "EPISODES", "episodes": [episode(rewards=[1.0, 1.0])]}),
    "obs count mismatch": frame({"type": "EPISODES", "episodes": [episode(obs=[[0, 0, 0, 0]])]}),
    "step count mismatch": frame({"type": "EPISODES", "episodes": [episode()], "env_steps": 5}),
    "ragged obs": frame({"type": "EPISODES", "episodes": [episode(obs=[[0, 0, 0, 0], [0, 0]])]}),
    "server-only message": frame({"type": "SET_STATE", "weights_seq_no": 1, "onnx_file": ""}),
}


@pytest.fixture
def healthy(shared_daemon):
    """A second, well-behaved client connected the whole time."""
    sock = raw_connect(shared_daemon.port)
    raw_send(sock, {"type": "PING"})
    assert raw_recv(sock)["type"] == "PONG"
    yield sock
    sock.close()


def assert_error_and_closed(sock) -> str:
    reply = raw_recv(sock)
    assert reply["type"] == "ERROR" and reply["message"], reply
    assert peer_closed(sock), "connection should be closed after ERROR"
    return reply["message"]


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_bad_input_gets_error_and_spares_others(shared_daemon, healthy, name):
    daemon = shared_daemon
    before = daemon.status()["protocol_errors"]
    bad = raw_connect(daemon.port)
    bad.sendall(BAD_FRAMES[name])
    assert_error_and_closed(bad)
    raw_send(healthy, {"type": "PING"})
    assert raw_recv(healthy)["type"] == "PONG"
    assert daemon.status()["protocol_errors"] == before + 1
    assert daemon.proc.poll() is None


def test_oversize_header_refused_before_body(shared_daemon, healthy):
    daemon = shared_daemon
    bad = raw_connect(daemon.port)
    bad.sendall(b"99999999")  # announces ~95 MiB > 64 MiB default; no body follows
    message = assert_error_and_closed(bad)
    assert "max_message_bytes" in message
    raw_send(healthy, {"type": "GET_CONFIG"})
    assert raw_recv(healthy)["type"] == "SET_CONFIG"


def test_valid_episode_after_errors_still_counts(shared_daemon, healthy):
    before = shared_daemon.status()
    raw_send(healthy, {"type": "EPISODES", "episodes": [episode(is_terminated=True)]})
    raw_send(healthy, {"type": "PING"})
    assert raw_recv(healthy)["type"] == "PONG"
    status = shared_daemon.status()
    assert status["env_steps"] == before["env_steps"] + 1
    assert status["episodes"] == before["episodes"] + 1


def test_truncated_frame_then_disconnect_is_harmless(shared_daemon, healthy):
    daemon = shared_daemon
    bad = raw_connect(daemon.port)
    bad.sendall(frame({"type": "PING"})[:12])
    bad.close()
    assert daemon.proc.poll() is None
    raw_send(healthy, {"type": "PING"})
    assert raw_recv_exactly(healthy, 8) == b"%08d" % len(b'{"type":"PONG"}')
