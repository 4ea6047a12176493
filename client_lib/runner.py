"""``run_env``: drive any gymnasium environment through the agent API.

The simplest simulator: ``run_env(gym.make("CartPole-v1"), "tcp://127.0.0.1:5555",
steps=100_000)``. It resets, asks the agent for actions (local inference), steps
the env, reports outcomes, and returns what happened (client-side counts).

Three kinds of env, told apart by their attributes (no import of gymnasium.vector or
pettingzoo here):

- a gymnasium ``Env`` → one ``Agent`` (``connect``);
- a gymnasium ``VectorEnv`` (``num_envs``, ``single_observation_space``) → one
  ``VectorClient`` (``connect_vector``), all copies in one call per step; any autoreset
  mode: same-step (final observations from ``info["final_obs"]``), next-step or disabled
  (ended copies are reset at once with ``reset(options={"reset_mask": ...})``, gymnasium
  >= 1.1);
- a PettingZoo ``ParallelEnv`` (``possible_agents``, no ``agent_selection``) → one
  ``MultiAgentClient`` (``connect_multi``); agents may join and leave; an agent that drops
  out of ``env.agents`` without terminating counts as truncated, and episodes a previous
  run left open are truncated when the env is reset. ``steps`` counts agent steps and
  ``episodes`` agent episodes (as the daemon counts them).
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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


@dataclass
class _Loop:
    """Limits and callbacks shared by the drivers."""

    steps: int | None
    episodes: int | None
    on_episode: Callable[[RunStats, float], Any] | None
    should_stop: Callable[[RunStats], bool] | None
    stats: RunStats = field(default_factory=RunStats)
    stopped: bool = False

    def running(self) -> bool:
        s = self.stats
        return not self.stopped and (self.steps is None or s.steps < self.steps) and (
            self.episodes is None or s.episodes < self.episodes)

    def episode(self, episode_return: float) -> None:
        """Count one finished episode; may set ``stopped``."""
        self.stats.episodes += 1
        self.stats.returns.append(episode_return)
        if self.on_episode is not None:
            self.on_episode(self.stats, episode_return)
        if self.should_stop is not None and self.should_stop(self.stats):
            self.stopped = True


def run_env(env: Any, address: Any = "tcp://127.0.0.1:5555", *, steps: int | None = None,
            episodes: int | None = None, explore: bool = True, seed: int | None = None,
            on_episode: Callable[[RunStats, float], Any] | None = None,
            should_stop: Callable[[RunStats], bool] | None = None, **connect_kwargs) -> RunStats:
    """Run ``env`` until ``steps`` env steps or ``episodes`` episodes (or forever).

    ``address`` may be an existing client (Agent, VectorClient or MultiAgentClient, to
    match the env). ``on_episode(stats, episode_return)`` is called after each episode;
    ``should_stop(stats)`` is checked after each episode. The client is closed at the end
    only if this call created it.
    """
    loop = _Loop(steps, episodes, on_episode, should_stop)
    if hasattr(env, "num_envs") and hasattr(env, "single_observation_space"):
        driver: Callable = _run_vector
    elif hasattr(env, "possible_agents") and not hasattr(env, "agent_selection"):
        driver = _run_parallel
    else:
        driver = _run_single
    client, own = _client(env, driver, address, explore, seed, connect_kwargs)
    try:
        driver(env, client, loop, seed)
    finally:
        if own:
            client.close()
    return loop.stats


def _client(env, driver, address, explore, seed, connect_kwargs) -> tuple[Any, bool]:
    if not isinstance(address, str):
        return address, False
    if driver is _run_vector:
        from rlinkd.client_lib.multi import connect_vector
        return connect_vector(address, env.num_envs, explore=explore, seed=seed, **connect_kwargs), True
    if driver is _run_parallel:
        from rlinkd.client_lib.multi import connect_multi
        return connect_multi(address, explore=explore, seed=seed, **connect_kwargs), True
    return connect(address, observation_space=env.observation_space, action_space=env.action_space,
                   explore=explore, seed=seed, **connect_kwargs), True


def _run_single(env, agent: Agent, loop: _Loop, seed: int | None) -> None:
    agent.truncate()  # the env restarts: an episode an earlier run left open ends here
    obs, _ = env.reset(seed=seed)
    ep_return = 0.0
    while loop.running():
        action = agent.act(obs)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        agent.step(reward, next_obs, terminated, truncated)
        loop.stats.steps += 1
        ep_return += float(reward)
        obs = next_obs
        if terminated or truncated:
            loop.episode(ep_return)
            obs, _ = env.reset()
            ep_return = 0.0


def _run_vector(env, client, loop: _Loop, seed: int | None) -> None:
    mode = env.metadata.get("autoreset_mode", "NextStep") if hasattr(env, "metadata") else "NextStep"
    same_step = getattr(mode, "value", mode) == "SameStep"
    client.truncate()  # the env restarts: episodes an earlier run left open end here
    obs, _ = env.reset(seed=seed)
    returns = np.zeros(env.num_envs)
    while loop.running():
        next_obs, rewards, terminated, truncated, info = env.step(client.act(obs))
        done = np.asarray(terminated) | np.asarray(truncated)
        final = _with_final_obs(next_obs, info, done) if same_step and done.any() else next_obs
        client.step(rewards, final, terminated, truncated)
        loop.stats.steps += env.num_envs
        returns += rewards
        obs = next_obs
        if done.any():
            for i in np.flatnonzero(done).tolist():
                loop.episode(float(returns[i]))
            returns[done] = 0.0
            if not same_step:
                obs, _ = env.reset(options={"reset_mask": done})


def _with_final_obs(batch, info: dict, done: np.ndarray):
    """The batch with the ended copies' rows replaced by ``info["final_obs"]`` (same-step
    autoreset returns the next episode's first observation in their place)."""
    rows = np.flatnonzero(done)
    return _replace_rows(batch, rows, [info["final_obs"][i] for i in rows])


def _replace_rows(batch, rows: np.ndarray, values: list):
    if isinstance(batch, dict):
        return {k: _replace_rows(v, rows, [x[k] for x in values]) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_replace_rows(v, rows, [x[i] for x in values]) for i, v in enumerate(batch))
    out = np.array(batch, copy=True)
    out[rows] = np.stack([np.asarray(v) for v in values])
    return out


def _run_parallel(env, client, loop: _Loop, seed: int | None) -> None:
    client.truncate()  # the env restarts: episodes an earlier run left open end here
    obs, _ = env.reset(seed=seed)
    returns: dict[str, float] = {}
    while loop.running():
        if not obs:
            obs, _ = env.reset()
            continue
        actions = client.act(obs)
        next_obs, rewards, terminated, truncated, _ = env.step(actions)
        live = set(env.agents)
        r = {a: float(rewards.get(a, 0.0)) for a in actions}
        term = {a: bool(terminated.get(a, False)) for a in actions}
        trunc = {a: bool(truncated.get(a, False)) or (a not in live and not term[a]) for a in actions}
        client.step(r, {a: next_obs.get(a, obs[a]) for a in actions}, term, trunc)
        loop.stats.steps += len(actions)
        for a in actions:
            returns[a] = returns.get(a, 0.0) + r[a]
            if term[a] or trunc[a]:
                loop.episode(returns.pop(a))
        obs = {a: next_obs[a] for a in env.agents if a in next_obs}
