"""Composite spaces end to end (real daemon): a Dict observation (a small uint8 image + a
distractor vector) and a MultiDiscrete action, learned over TCP with compact arrays and over
shared memory at once, on a task whose right answer is visible only in the image
(tests/tasks/spot.py)."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib import connect, run_env
from tests.helpers import concurrently
from tests.tasks.spot import ACTION_SPACE_TOML, OBSERVATION_SPACE_TOML, FindTheSpot

pytestmark = pytest.mark.process

CONFIG = f"""
[env]
observation_space = {OBSERVATION_SPACE_TOML}
action_space = {ACTION_SPACE_TOML}

[sampling]
env_steps_per_sample = 256
train_batch_size = 512

[ppo]
lr = 0.001
num_epochs = 6
minibatch_size = 128
ent_coef = 0.01
"""
BUDGET_STEPS = 40_000
TARGET_REWARD = 0.85   # per step; ignoring the image earns ~0.42, reading it 1.0


def greedy_reward(agent, episodes: int = 40) -> float:
    env, total, steps = FindTheSpot(), 0.0, 0
    obs, _ = env.reset(seed=123)
    for _ in range(episodes):
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(agent.act(obs, explore=False))
            agent.pending = None  # evaluation only: these steps are not recorded
            total, steps, done = total + reward, steps + 1, terminated or truncated
        obs, _ = env.reset()
    return total / steps


def learn_spot(agent) -> tuple[float, int, float]:
    """``agent`` plays FindTheSpot until the mean reward of its last 2,000 steps reaches
    TARGET_REWARD (checked every 2,000) or BUDGET_STEPS; (its greedy reward, the steps
    played, that mean)."""
    env, recent = FindTheSpot(), []
    obs, _ = env.reset(seed=0)
    for step in range(BUDGET_STEPS):
        action = agent.act(obs)
        assert isinstance(action, np.ndarray) and action.shape == (2,)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        agent.step(reward, next_obs, terminated, truncated)
        recent = [*recent[-1999:], reward]
        obs = next_obs if not (terminated or truncated) else env.reset()[0]
        if step % 2000 == 1999 and np.mean(recent) >= TARGET_REWARD:
            break
    return greedy_reward(agent), step + 1, float(np.mean(recent))


def test_dict_image_observation_and_multidiscrete_action_learn(daemon_factory, tmp_path):
    """One run, a TCP and a shared-memory client at once, each until its own greedy reward
    reaches the target: over TCP the image travels as a compact array; over shared memory
    as uint8 record bytes (the ring's layout keeps the leaf's dtype)."""
    config = tmp_path / "spot.toml"
    config.write_text(CONFIG)
    d = daemon_factory("--config", str(config))
    agents = {"tcp": connect(f"tcp://127.0.0.1:{d.port}", seed=0), "shm": connect(f"shm:{d.state_dir}", seed=1)}
    assert all(agent.link.config.compact_arrays for agent in agents.values())  # rlinkd announces it
    assert agents["shm"].link.layout.obs_fields[0][:2] == ("image", "|u1")
    results = concurrently({t: lambda a=a: learn_spot(a) for t, a in agents.items()})
    status = d.status()
    seqs = {t: a.weights_seq_no for t, a in agents.items()}
    for agent in agents.values():
        agent.close()
    assert status["protocol_errors"] == 0, status
    print(", ".join(f"{t}: greedy reward {score:.3f} after {steps} steps, weights {seqs[t]}"
                    for t, (score, steps, _mean) in results.items()))
    for transport, (score, steps, _mean) in results.items():  # (both played and trained)
        assert steps >= 2000 and seqs[transport] > 0, (transport, results, seqs)
        assert score >= TARGET_REWARD, (transport, results, status["learner"])


def test_run_env_drives_a_dict_observation_env(daemon_factory, tmp_path):
    config = tmp_path / "spot.toml"
    config.write_text(CONFIG)
    d = daemon_factory("--config", str(config))
    stats = run_env(FindTheSpot(), f"tcp://127.0.0.1:{d.port}", steps=600, seed=3)
    assert stats.steps == 600 and stats.episodes == 600 // 8
    assert d.status()["env_steps"] >= 512  # the samples sent (the rest goes at close)
