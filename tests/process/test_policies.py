"""Tier 3: several policies in a real daemon — raw RLlink clients with agent ids train two
policies at once (own seq_nos, own checkpoint files, both resumed after a restart), and a
frozen opponent policy never changes."""
from __future__ import annotations

import base64
import gzip
import hashlib

import numpy as np

from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.export import checkpoint_policies, export_policy
from tests.helpers import raw_connect, raw_recv, raw_send, wait_for

TWO_POLICIES = ["--set", "sampling.train_batch_size=128", "--set", "ppo.minibatch_size=64",
                "--set", "ppo.num_epochs=2", "--set", "sampling.env_steps_per_sample=64",
                "--set", "policies.red.trainable=true",
                "--set", "policy_mapping.red_*=red"]


def cartpole_fragment(agent: str, episode: int, steps: int, rng) -> dict:
    """A finished CartPole-shaped episode of one agent (plain per-step JSON)."""
    obs = rng.uniform(-0.05, 0.05, (steps + 1, 4)).round(4).tolist()
    return {"agent_id": agent, "episode_id": str(episode), "obs": obs,
            "actions": rng.integers(0, 2, steps).tolist(), "rewards": [1.0] * steps,
            "is_terminated": True, "is_truncated": False}


def handshake(port: int):
    sock = raw_connect(port)
    raw_send(sock, {"type": "PING"})
    assert raw_recv(sock)["type"] == "PONG"
    raw_send(sock, {"type": "GET_CONFIG"})
    return sock, raw_recv(sock)


def sample(sock, agents: list[str], episode: int, rng) -> dict:
    """One EPISODES_AND_GET_STATE with one 16-step episode per agent; the SET_STATE reply."""
    frags = [cartpole_fragment(a, episode, 16, rng) for a in agents]
    raw_send(sock, {"type": "EPISODES_AND_GET_STATE", "episodes": frags})
    reply = raw_recv(sock)
    assert reply["type"] == "SET_STATE", reply
    return reply


def onnx_bytes(entry: dict) -> bytes:
    data = gzip.decompress(base64.b64decode(entry["onnx_file"]))
    assert hashlib.sha256(data).hexdigest() == entry["onnx_sha256"]
    return data


def test_two_policies_train_with_their_own_versions_checkpoint_and_resume(daemon_factory):
    d = daemon_factory(*TWO_POLICIES)
    sock, cfg = handshake(d.port)
    assert set(cfg["policies"]) == {"default", "red"} and cfg["policies"]["red"]["trainable"]
    assert cfg["policy_mapping"] == [["red_*", "red"]] and cfg["max_agents_per_connection"] >= 2
    rng, reply = np.random.default_rng(0), {}
    for episode in range(8):   # only red's agents: red trains, default does not move
        reply = sample(sock, ["red_1", "red_2", "red_3"], episode, rng)
    assert reply["policies"]["red"]["weights_seq_no"] >= 2 and reply["weights_seq_no"] == 0
    for episode in range(8, 14):  # both: each released by its own policy's updates
        reply = sample(sock, ["red_1", "blue_1"], episode, rng)
    red, default = reply["policies"]["red"]["weights_seq_no"], reply["weights_seq_no"]
    assert default >= 1 and red > default, (red, default)
    assert "default" not in reply["policies"]           # top level is the default policy
    raw_send(sock, {"type": "GET_STATE", "weights_seq_nos": {"red": red}})
    again = raw_recv(sock)                               # nothing trained since: same versions
    assert again["policies"]["red"] == {"weights_seq_no": red}  # the client holds that model
    assert again["weights_seq_no"] == default and "onnx_file" in again
    sock.close()
    status = d.status()
    assert status["policies"]["red"]["weights_seq_no"] >= red
    assert d.stop() == 0                                 # final checkpoint with both policies

    ckpt = store.latest_valid(store.checkpoints_dir(d.state_dir))
    assert checkpoint_policies(ckpt) == ["default", "red"]
    saved = ckpt.manifest["policies"]
    assert saved["red"] >= red and saved["default"] >= default
    d.proc = None
    d.start()                                            # resumes both
    sock, _ = handshake(d.port)
    raw_send(sock, {"type": "GET_STATE"})
    state = raw_recv(sock)
    assert state["weights_seq_no"] >= saved["default"]
    assert state["policies"]["red"]["weights_seq_no"] >= saved["red"]
    sock.close()
    assert d.stop() == 0
    d.proc = None
    d.args = TWO_POLICIES[:8]                            # red taken out of the config: named
    d.start()
    wait_for(lambda: '"checkpoint_policies_not_resumed"' in d.log(), 10, what="the warning")
    line = next(x for x in d.log().splitlines() if '"checkpoint_policies_not_resumed"' in x)
    assert '"policies": ["red"]' in line, line


def test_a_frozen_policy_never_changes_while_the_other_trains(daemon_factory, tmp_path):
    source = daemon_factory(*TWO_POLICIES, name="source")  # a trained policy to freeze
    sock, _ = handshake(source.port)
    rng = np.random.default_rng(1)
    for episode in range(8):
        sample(sock, ["blue_1", "blue_2"], episode, rng)
    sock.close()
    assert source.stop() == 0
    exported = export_policy(tmp_path / "opponent.onnx", source.state_dir)

    d = daemon_factory("--set", "sampling.env_steps_per_sample=64",
                       "--set", "sampling.train_batch_size=128", "--set", "ppo.minibatch_size=64",
                       "--set", "policies.opponent.trainable=false",
                       "--set", f'policies.opponent.load_from="{exported.onnx_path}"',
                       "--set", "policy_mapping.opp_*=opponent", name="frozen")
    sock, cfg = handshake(d.port)
    assert cfg["policies"]["opponent"]["trainable"] is False
    first = None
    for episode in range(16):
        reply = sample(sock, ["me", "opp_1"], episode, rng)
        opponent = reply["policies"]["opponent"]
        first = first or opponent
        assert opponent["weights_seq_no"] == 0
    assert reply["weights_seq_no"] >= 2                  # the default policy trained meanwhile
    assert onnx_bytes(first) == exported.onnx_path.read_bytes()
    sock.close()
    status = d.status()
    assert status["policies"]["opponent"]["weights_seq_no"] == 0
    assert status["policies"]["opponent"]["episodes"] >= 16   # counted, never trained on


def test_a_frozen_model_trained_elsewhere_plays_over_tcp_and_shared_memory(daemon_factory, tmp_path):
    from rlinkd.client_lib import connect_multi
    from tests.unit.test_frozen import foreign_model
    model = tmp_path / "elsewhere.onnx"
    model.write_bytes(foreign_model(2))            # logits = obs @ ones: prefers nothing
    d = daemon_factory("--set", "sampling.env_steps_per_sample=32",
                       "--set", "policies.opponent.trainable=false",
                       "--set", f'policies.opponent.load_from="{model}"',
                       "--set", "policy_mapping.opp_*=opponent", name="foreign")
    rng = np.random.default_rng(3)
    for address in (f"tcp://127.0.0.1:{d.port}", f"shm:{d.state_dir}"):
        client = connect_multi(address, seed=1)
        assert client.policy_for("opp_1") == "opponent"
        for t in range(40):
            obs = {a: rng.uniform(-0.05, 0.05, 4).astype(np.float32) for a in ("me", "opp_1")}
            actions = client.act(obs)
            assert set(actions) == {"me", "opp_1"} and actions["opp_1"] in (0, 1)
            client.step({"me": 1.0, "opp_1": 0.0}, obs, terminated={"me": t % 10 == 9,
                                                                     "opp_1": t % 10 == 9})
        client.close()
    status = d.status()
    assert status["policies"]["opponent"]["weights_seq_no"] == 0
    assert status["policies"]["opponent"]["episodes"] >= 6 and status["policies"]["default"]["episodes"] >= 6
