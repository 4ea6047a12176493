"""client_lib against a real daemon: run_env, the agent API, reconnect across a restart."""
from __future__ import annotations

import threading

import gymnasium as gym
import pytest

from rlinkd.client_lib import connect, run_env
from tests.helpers import free_port, wait_for

pytestmark = pytest.mark.process



def test_run_env_trains_and_counts(daemon):
    stats = run_env(gym.make("CartPole-v1"), f"tcp://127.0.0.1:{daemon.port}", steps=3000, seed=1)
    assert stats.steps == 3000 and stats.episodes > 0
    status = wait_for(lambda: (s := daemon.status())["env_steps"] >= 2560 and s, 10,
                      what="steps ingested")
    assert status["weights_seq_no"] >= 5  # 512-step samples, each trained on-policy


def test_agent_api_greedy_and_sampled_actions(daemon):
    agent = connect(f"tcp://127.0.0.1:{daemon.port}")
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    assert agent.act(obs, explore=False) == agent.act(obs, explore=False)
    agent.pending = None
    sampled = {agent.act(obs) for _ in range(200)}
    assert sampled == {0, 1}  # a fresh policy is close to uniform
    agent.close()


def test_agent_reconnects_across_a_daemon_restart_without_losing_the_episode(daemon_factory):
    port = str(free_port())
    first = daemon_factory("--port", port, name="s")
    agent = connect(f"tcp://127.0.0.1:{port}", reconnect_timeout_s=60)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    for _ in range(agent.env_steps_per_sample):  # one full sample, trained on
        obs, _ = _one_step(agent, env, obs)
    seq_before = agent.weights_seq_no
    assert seq_before >= 1
    for _ in range(100):  # an episode in progress, unsent
        obs, _ = _one_step(agent, env, obs)
    assert first.stop() == 0
    restarted = threading.Event()

    def restart() -> None:
        first.proc = None
        first.start()  # same state dir and port: resumes from the final checkpoint
        restarted.set()

    threading.Thread(target=restart).start()
    for _ in range(agent.env_steps_per_sample - 100):  # step() blocks until reconnected
        obs, _ = _one_step(agent, env, obs)
    assert restarted.wait(60)
    assert agent.link.reconnects >= 1
    assert agent.weights_seq_no > seq_before  # monotonic across the restart
    status = wait_for(lambda: (s := first.status())["env_steps"] >= 2 * agent.env_steps_per_sample
                      and s, 10, what="resumed counters")
    assert status["env_steps"] == 2 * agent.env_steps_per_sample
    agent.close()


def _one_step(agent, env, obs):
    action = agent.act(obs)
    obs2, reward, terminated, truncated, _ = env.step(action)
    agent.step(reward, obs2, terminated, truncated)
    if terminated or truncated:
        obs2, _ = env.reset()
    return obs2, terminated or truncated
