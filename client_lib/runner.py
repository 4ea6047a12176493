"""``run_env``: drive any gymnasium environment through the agent API.

The simplest simulator: ``run_env(gym.make("CartPole-v1"), "tcp://127.0.0.1:5555",
steps=100_000)``. It resets, asks the agent for actions (local inference), steps
the env, reports outcomes, and returns what happened (client-side counts).
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlinkd.client_lib.agent import Agent, connect


@dataclass
class RunStats:
    """Client-side counts of one run_env call."""

    steps: int = 0
    episodes: int = 0
    returns: deque = field(default_factory=lambda: deque(maxlen=100))
    started_at: float = field(default_factory=time.monotonic)

    def mean_return(self) -> float | None:
        return sum(self.returns) / len(self.returns) if self.returns else None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_at


def run_env(env: Any, address: str | Agent = "tcp://127.0.0.1:5555", *, steps: int | None = None,
            episodes: int | None = None, explore: bool = True, seed: int | None = None,
            on_episode: Callable[[RunStats, float], Any] | None = None,
            should_stop: Callable[[RunStats], bool] | None = None, **connect_kwargs) -> RunStats:
    """Run ``env`` until ``steps`` env steps or ``episodes`` episodes (or forever).

    ``address`` may be an existing Agent. ``on_episode(stats, episode_return)`` is
    called after each episode; ``should_stop(stats)`` is checked after each episode.
    The agent is closed at the end only if this call created it.
    """
    if isinstance(address, Agent):
        agent, own = address, False
    else:
        agent, own = connect(address, observation_space=env.observation_space,
                             action_space=env.action_space, explore=explore, seed=seed,
                             **connect_kwargs), True
    stats = RunStats()
    try:
        obs, _ = env.reset(seed=seed)
        ep_return = 0.0
        while (steps is None or stats.steps < steps) and (episodes is None or stats.episodes < episodes):
            action = agent.act(obs)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            agent.step(reward, next_obs, terminated, truncated)
            stats.steps += 1
            ep_return += float(reward)
            obs = next_obs
            if terminated or truncated:
                stats.episodes += 1
                stats.returns.append(ep_return)
                if on_episode is not None:
                    on_episode(stats, ep_return)
                if should_stop is not None and should_stop(stats):
                    break
                obs, _ = env.reset()
                ep_return = 0.0
    finally:
        if own:
            agent.close()
    return stats
