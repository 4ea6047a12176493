"""A client written only from the RLlink seed text (raw socket + json, no client_lib)."""
from __future__ import annotations

import base64
import gzip

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest

from tests.helpers import raw_connect, raw_recv, raw_send

pytestmark = pytest.mark.process


def decode_session(msg: dict) -> ort.InferenceSession:
    onnx_bytes = gzip.decompress(base64.b64decode(msg["onnx_file"].encode("utf-8")))
    return ort.InferenceSession(onnx_bytes)


def collect(env, session, obs, n_steps: int, rng) -> tuple[list, object]:
    """n_steps of CartPole with the ONNX policy, as RLlink episode dicts (seed format)."""
    episodes, observations, actions, rewards, logps = [], [obs.tolist()], [], [], []
    for t in range(n_steps):
        logits = session.run(None, {"onnx::Gemm_0": np.array([obs], np.float32)})[0][0]
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        action = int(rng.choice(len(probs), p=probs))
        obs, reward, terminated, truncated, _ = env.step(action)
        observations.append(obs.tolist())
        actions.append(action)
        rewards.append(float(reward))
        logps.append(float(np.log(probs[action])))
        if terminated or truncated or t == n_steps - 1:
            episodes.append({"obs": observations, "actions": actions, "rewards": rewards,
                             "action_logp": logps, "is_terminated": bool(terminated),
                             "is_truncated": bool(truncated)})
            if terminated or truncated:
                obs, _ = env.reset()
            observations, actions, rewards, logps = [obs.tolist()], [], [], []
    return episodes, obs


def test_seed_client_handshake_state_and_two_on_policy_exchanges(daemon):
    sock = raw_connect(daemon.port)
    raw_send(sock, {"type": "PING"})
    assert raw_recv(sock) == {"type": "PONG"}
    raw_send(sock, {"type": "GET_CONFIG"})
    config = raw_recv(sock)
    assert config["type"] == "SET_CONFIG"
    assert isinstance(config["env_steps_per_sample"], int) and config["force_on_policy"] is True
    raw_send(sock, {"type": "GET_STATE"})
    state = raw_recv(sock)
    assert state["type"] == "SET_STATE" and isinstance(state["weights_seq_no"], int)
    session = decode_session(state)
    env, rng = gym.make("CartPole-v1"), np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    seq_nos = [state["weights_seq_no"]]
    outputs = [session.run(None, {"onnx::Gemm_0": np.zeros((1, 4), np.float32)})[0]]
    for _ in range(2):
        episodes, obs = collect(env, session, obs, config["env_steps_per_sample"], rng)
        steps = sum(len(e["actions"]) for e in episodes)
        raw_send(sock, {"type": "EPISODES_AND_GET_STATE", "episodes": episodes, "timesteps": steps})
        reply = raw_recv(sock)
        assert reply["type"] == "SET_STATE"
        # on-policy: these weights were trained on a batch containing our episodes
        assert reply["weights_seq_no"] > seq_nos[-1]
        seq_nos.append(reply["weights_seq_no"])
        session = decode_session(reply)
        out = session.run(None, {"onnx::Gemm_0": np.zeros((1, 4), np.float32)})[0]
        assert out.shape == (1, 2) and np.all(np.isfinite(out))
        outputs.append(out)
    assert not np.allclose(outputs[0], outputs[-1]), "training did not change the policy"
    status = daemon.status()
    assert status["env_steps"] == 2 * config["env_steps_per_sample"]
    assert status["weights_seq_no"] == seq_nos[-1]
    sock.close()
