"""Many agents per connection against a real daemon: connect_multi over TCP and shared
memory (agents joining and leaving, per-agent episodes in the daemon's counters), a
VectorEnv through run_env, and the cooperative Rendezvous task learned with parameter
sharing (tests/tasks/rendezvous.py).
"""
from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

from rlinkd.client_lib import run_env
from rlinkd.client_lib.multi import connect_multi, connect_vector
from tests.helpers import concurrently, wait_for
from tests.tasks.rendezvous import (ACTION_SPACE_TOML, OBSERVATION_SPACE_TOML, Rendezvous,
                                    returns)

pytestmark = pytest.mark.process


def address(d, transport: str) -> str:
    return f"tcp://127.0.0.1:{d.port}" if transport == "tcp" else f"shm:{d.state_dir}"


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_agents_join_and_leave_over_one_connection(shared_daemon, transport):
    daemon = shared_daemon
    before = daemon.status()
    client = connect_multi(address(daemon, transport), seed=0)
    rng = np.random.default_rng(0)
    obs = {f"car-{i}": rng.uniform(-0.05, 0.05, 4).astype(np.float32) for i in range(3)}
    ended, steps = 0, 0
    while client.steps_synced < 2 * client.env_steps_per_sample:
        actions = client.act(obs)
        assert set(actions) == set(obs) and all(a in (0, 1) for a in actions.values())
        terminated = {a: bool(rng.random() < 0.05) for a in actions}
        client.step({a: 1.0 for a in actions}, obs, terminated)
        steps += len(actions)
        ended += sum(terminated.values())
        obs = {a: o for a, o in obs.items() if not terminated[a]}
        while len(obs) < 3:  # newcomers (fresh ids) and returning ids both start episodes
            obs[f"car-{rng.integers(6)}"] = rng.uniform(-0.05, 0.05, 4).astype(np.float32)
    assert client.weights_seq_nos()["default"] > before["weights_seq_no"]
    client.close()
    status = wait_for(lambda: (s := daemon.status())["env_steps"] >= before["env_steps"] + steps and s,
                      20, what="every agent step ingested")
    assert status["env_steps"] == before["env_steps"] + steps, (before, status)
    assert status["protocol_errors"] == before["protocol_errors"], (before, status)
    assert status["episodes"] >= before["episodes"] + ended, (before, status)


def test_run_env_drives_a_vector_env(shared_daemon):
    before = shared_daemon.status()
    env = gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")
    stats = run_env(env, f"tcp://127.0.0.1:{shared_daemon.port}", steps=2048, seed=1)
    assert stats.steps == 2048 and stats.episodes > 0
    status = wait_for(lambda: (s := shared_daemon.status())["env_steps"] >= before["env_steps"] + 2048
                      and s, 20, what="steps ingested")
    assert status["episodes"] >= before["episodes"] + stats.episodes, (before, status)
    assert status["protocol_errors"] == before["protocol_errors"], (before, status)


def test_vector_client_over_shared_memory(shared_daemon):
    before = shared_daemon.status()
    client = connect_vector(f"shm:{shared_daemon.state_dir}", 16, seed=2)
    env = gym.make_vec("CartPole-v1", num_envs=16, vectorization_mode="sync")
    run_env(env, client, steps=2 * client.env_steps_per_sample, seed=2)
    client.close()
    steps = 2 * client.env_steps_per_sample
    status = wait_for(lambda: (s := shared_daemon.status())["env_steps"] >= before["env_steps"] + steps
                      and s, 20, what="steps ingested")
    assert status["weights_seq_no"] > before["weights_seq_no"], (before, status)
    assert status["protocol_errors"] == before["protocol_errors"], (before, status)


CONFIG = f"""
[env]
observation_space = {OBSERVATION_SPACE_TOML}
action_space = {ACTION_SPACE_TOML}

[sampling]
env_steps_per_sample = 1024
train_batch_size = 2048

[ppo]
lr = 0.001
minibatch_size = 512
ent_coef = 0.01
"""
TRAIN_S = 120.0  # a ceiling: ~15-30 s on an idle machine, far more under load
TARGET_RETURN = 12.0  # per agent episode: random ~0.5, "always right" ~4.5, optimum ~17


def learn_rendezvous(client, deadline: float) -> tuple[float, int]:
    """``client`` plays Rendezvous in ~5 s chunks, each followed by a greedy evaluation with
    the client's own current weights, until that reaches TARGET_RETURN or ``deadline``;
    (the last greedy return, the agent steps played)."""
    def greedy(obs):  # the client's current weights, most likely action, nothing recorded
        ids = list(obs)
        dist = client.book.get("default").net.dist_inputs(np.stack([obs[a] for a in ids]))
        return dict(zip(ids, np.argmax(dist, axis=1).tolist()))

    steps, score = 0, 0.0
    while time.monotonic() < deadline and score < TARGET_RETURN:
        chunk_end = min(deadline, time.monotonic() + 5.0)
        steps += run_env(Rendezvous(), client, seed=steps,
                         should_stop=lambda s, end=chunk_end: time.monotonic() > end).steps
        score = returns(greedy, episodes=30)
    return score, steps


def test_rendezvous_is_learned_with_parameter_sharing(daemon_factory, tmp_path):
    """One policy shared by every agent, learned in one run from a TCP and a shared-memory
    connect_multi client at once: each client's greedy return, with the weights it
    received over its own transport, reaches the target."""
    config = tmp_path / "rendezvous.toml"
    config.write_text(CONFIG)
    d = daemon_factory("--config", str(config))
    clients = {t: connect_multi(address(d, t), seed=i) for i, t in enumerate(("tcp", "shm"))}
    deadline = time.monotonic() + TRAIN_S
    results = concurrently({t: lambda c=c: learn_rendezvous(c, deadline) for t, c in clients.items()})
    status = d.status()
    seqs = {t: c.weights_seq_nos()["default"] for t, c in clients.items()}
    for client in clients.values():
        client.close()
    print(", ".join(f"{t}: greedy return {score:.2f} after {steps} agent steps, weights {seqs[t]}"
                    for t, (score, steps) in results.items()))
    assert status["protocol_errors"] == 0, status
    for transport, (score, steps) in results.items():  # (both played and trained: a sample each)
        assert steps >= 1024 and seqs[transport] > 0, (transport, results, seqs)
        assert score >= TARGET_RETURN, (transport, results, seqs, status["learner"])
