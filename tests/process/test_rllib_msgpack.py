"""RLlib >= 2.49's msgpack flavour on a real daemon's RLlink port, beside JSON clients.

Frames recorded byte-exact from ray 2.49.0 and 2.60.0's own dummy client are replayed (CI has
no ray). With RLINKD_RAY_PYTHON naming the python of a ray venv, the real client side also
runs (bench/peers/rllib_msgpack_check.py): its module's logits must equal rlinkd's forward.
"""
from __future__ import annotations

import base64
import gzip
import json
import os
import pickletools
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from rlinkd.client_lib.protocol import codec, msgpack_flavour as mf
from tests.helpers import raw_connect, raw_recv, raw_recv_exactly, raw_send, wait_for

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "rllib_msgpack"
VERSIONS = ("ray-2.49.0", "ray-2.60.0")
OBS = [[0.01, -0.2, 0.03, 0.4], [1.5, 2.0, -0.2, -3.0], [0.0, 0.0, 0.0, 0.0]]


def recorded(version: str) -> list[tuple[str, bytes]]:
    return [(p.stem.split("-", 1)[1], p.read_bytes())
            for p in sorted((FIXTURES / version).glob("*.bin"))]


def recv_msgpack(sock: socket.socket) -> dict:
    size = codec.parse_header(raw_recv_exactly(sock, codec.HEADER_BYTES), 1 << 30)
    return mf.unpack(raw_recv_exactly(sock, size))


def onnx_logits(state: dict, obs) -> np.ndarray:
    onnx_bytes = gzip.decompress(base64.b64decode(state["onnx_file"]))
    session = ort.InferenceSession(onnx_bytes)
    return session.run(None, {"onnx::Gemm_0": np.asarray(obs, np.float32)})[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_recorded_client_trains_beside_a_json_client_on_one_port(shared_daemon, version):
    """(On the module's shared daemon: the steps count from ``before``, and each reply's
    version must be newer than the last one this client saw.)"""
    d = shared_daemon
    before = d.status()["env_steps"]
    module = json.loads((FIXTURES / version / "module.json").read_text())
    rllib = raw_connect(d.port)
    seed = raw_connect(d.port)  # a JSON client on the same port, at the same time
    raw_send(seed, {"type": "PING"})
    assert raw_recv(seed) == {"type": "PONG"}
    seq = -1
    for kind, frame in recorded(version):
        rllib.sendall(frame)
        reply = recv_msgpack(rllib)
        if kind == "PING":
            assert reply == {"type": "PONG"}
        elif kind == "GET_CONFIG":
            assert reply["type"] == "SET_CONFIG" and isinstance(reply["config"], bytes)
            assert "ray.rllib.algorithms.ppo.ppo PPOConfig" in {
                arg for op, arg, _ in pickletools.genops(reply["config"]) if op.name == "GLOBAL"}
        else:  # GET_STATE, then on-policy EPISODES_AND_GET_STATE: weights trained on our steps
            assert reply["type"] == "SET_STATE", reply
            state = reply["state"]["rl_module"]
            assert {k: list(v.shape) for k, v in state.items()} == module["params"]
            assert reply["state"]["weights_seq_no"] > seq
            seq = reply["state"]["weights_seq_no"]
    raw_send(seed, {"type": "GET_CONFIG"})
    assert raw_recv(seed)["type"] == "SET_CONFIG"
    steps = 32 * sum(1 for k, _ in recorded(version) if k.startswith("EPISODES"))
    assert d.status()["env_steps"] == before + steps
    rllib.close()
    seed.close()


def test_hostile_msgpack_gets_a_msgpack_error_and_costs_only_its_connection(shared_daemon):
    """(Counts from ``before``: the module's daemon is shared with the next test, which
    sends no steps.)"""
    d = shared_daemon
    before = d.status()["protocol_errors"]
    hostile = mf.encode({"type": "EPISODES", "episodes": [{"observations": {
        b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [1], b"data": b"cos\nsystem\n."}}]})
    sock = raw_connect(d.port)
    sock.sendall(hostile)
    reply = recv_msgpack(sock)
    assert reply["type"] == "ERROR" and "kind b'O' refused" in reply["message"]
    assert sock.recv(1) == b""  # closed
    json_client = raw_connect(d.port)
    raw_send(json_client, {"type": "PING"})
    assert raw_recv(json_client) == {"type": "PONG"}
    wait_for(lambda: d.status()["protocol_errors"] == before + 1, 10, what="the error counted")


def test_msgpack_state_equals_the_json_models_forward(shared_daemon):
    """Without ray: rlinkd's RLlib-named weights, run as RLlib's module would, give the
    logits of the ONNX model JSON clients get for the same weights version. (On the
    module's shared daemon: no client of it sends steps, so no update comes between the
    two GET_STATEs.)"""
    d = shared_daemon
    rllib, seed = raw_connect(d.port), raw_connect(d.port)
    rllib.sendall(mf.encode({"type": "GET_STATE"}))
    state = recv_msgpack(rllib)["state"]
    raw_send(seed, {"type": "GET_STATE"})
    json_state = raw_recv(seed)
    assert json_state["weights_seq_no"] == state["weights_seq_no"]
    w = state["rl_module"]
    x = np.asarray(OBS, np.float64)
    for i in (0, 2):
        x = np.tanh(x @ w[f"encoder.actor_encoder.net.mlp.{i}.weight"].T
                    + w[f"encoder.actor_encoder.net.mlp.{i}.bias"])
    logits = x @ w["pi.net.mlp.0.weight"].T + w["pi.net.mlp.0.bias"]
    np.testing.assert_allclose(logits, onnx_logits(json_state, OBS), rtol=1e-4, atol=1e-5)


RAY_PYTHONS = [p for p in os.environ.get("RLINKD_RAY_PYTHON", "").split(os.pathsep) if p]


@pytest.mark.skipif(not RAY_PYTHONS, reason="RLINKD_RAY_PYTHON names no ray venv (CI has no ray)")
@pytest.mark.parametrize("ray_python", RAY_PYTHONS)
def test_real_rllib_clients_logits_equal_rlinkds_forward(daemon, ray_python):
    d = daemon
    trainer = raw_connect(d.port)  # trained weights first: a non-trivial observation normaliser
    for _kind, frame in recorded("ray-2.60.0"):
        trainer.sendall(frame)
        seq = recv_msgpack(trainer).get("state", {}).get("weights_seq_no", 0)
    assert seq > 0
    out = subprocess.run([ray_python, str(REPO / "bench/peers/rllib_msgpack_check.py"), "--port",
                          str(d.port), "--obs", json.dumps(OBS)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["module"] == "DefaultPPOTorchRLModule" and not got["missing"] and not got["unexpected"]
    seed = raw_connect(d.port)
    raw_send(seed, {"type": "GET_STATE"})
    json_state = raw_recv(seed)
    assert json_state["weights_seq_no"] == got["weights_seq_no"] == seq
    np.testing.assert_allclose(got["logits"], onnx_logits(json_state, OBS), rtol=1e-4, atol=1e-5)
    print(f"ray {got['ray']}: logits max |diff| "
          f"{np.abs(np.asarray(got['logits']) - onnx_logits(json_state, OBS)).max():.2e}",
          file=sys.stderr)
