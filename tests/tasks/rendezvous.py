"""Rendezvous: a cooperative task whose team changes during the episode.

A line of ``CELLS`` cells; one of them is the meeting cell, drawn at the start of each
episode and shown to everyone. Each agent stands on a cell and moves left, stays or moves
right (clipped at the ends). Every step, each present agent receives the same TEAM reward:
1 if every present agent stands on the meeting cell, else 0. No agent can earn anything
alone: one straggler zeroes the whole team's reward.

The team changes: an episode starts with agents "a0" and "a1" at random cells; agent "a2"
joins at a random cell at a random step in [4, 10) and "a0" leaves (terminated) at a random
step in [12, 18); the episode ends (truncated) after ``EPISODE_STEPS`` steps. Agent ids are
reused across episodes (each id starts a new episode per env episode).

Observation (``Box(0, 1, [2*CELLS + 1])`` float32): one-hot own cell, one-hot meeting cell,
and the fraction of the team on the meeting cell. Action: ``Discrete(3)`` (0 left, 1 stay,
2 right). All agents share one policy ("default": parameter sharing).

What to expect, per agent episode (``returns()`` below measures it): agents that walk to the
meeting cell and stay earn ~15 (a0: ~11, a1: ~19, a2: ~11 of their 12-24 steps; the team
waits at most ``CELLS - 1`` steps for a newcomer); a random policy earns ~0.4, and any policy
ignoring its observation, such as "always right" (the meeting cell is the right end one
episode in ``CELLS``), ~3. The API is PettingZoo's ParallelEnv (``possible_agents``,
``agents``, ``reset``, ``step`` with dicts, ``observation_space(agent)``,
``action_space(agent)``) without requiring pettingzoo.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np

CELLS = 5
EPISODE_STEPS = 24
JOIN_STEPS = (4, 10)
LEAVE_STEPS = (12, 18)
OBS_SIZE = 2 * CELLS + 1

OBSERVATION_SPACE_TOML = f'{{ type = "Box", shape = [{OBS_SIZE}], low = 0.0, high = 1.0 }}'
ACTION_SPACE_TOML = '{ type = "Discrete", n = 3 }'


class Rendezvous:
    """PettingZoo-style ParallelEnv (see the module docstring)."""

    metadata = {"name": "rendezvous_v0", "is_parallelizable": True}  # noqa: RUF012
    possible_agents = ("a0", "a1", "a2")

    def __init__(self) -> None:
        self._obs_space = gym.spaces.Box(0.0, 1.0, (OBS_SIZE,), np.float32)
        self._act_space = gym.spaces.Discrete(3)
        self.rng = np.random.default_rng()
        self.agents: list[str] = []
        self.pos: dict[str, int] = {}
        self.goal, self.t, self.join_at, self.leave_at = 0, 0, 0, 0

    @property
    def unwrapped(self) -> Rendezvous:
        return self

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @property
    def max_num_agents(self) -> int:
        return len(self.possible_agents)

    def close(self) -> None:
        """Nothing to release (ParallelEnv API)."""

    def observation_space(self, agent: str) -> gym.spaces.Box:
        return self._obs_space

    def action_space(self, agent: str) -> gym.spaces.Discrete:
        return self._act_space

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.goal = int(self.rng.integers(CELLS))
        self.join_at = int(self.rng.integers(*JOIN_STEPS))
        self.leave_at = int(self.rng.integers(*LEAVE_STEPS))
        self.pos = {a: int(self.rng.integers(CELLS)) for a in ("a0", "a1")}
        self.agents = ["a0", "a1"]
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: dict):
        for agent in self.agents:
            move = int(actions[agent]) - 1
            self.pos[agent] = min(max(self.pos[agent] + move, 0), CELLS - 1)
        self.t += 1
        team = float(all(self.pos[a] == self.goal for a in self.agents))
        rewards = {a: team for a in self.agents}
        terminated = {a: a == "a0" and self.t == self.leave_at for a in self.agents}
        truncated = {a: self.t >= EPISODE_STEPS for a in self.agents}
        obs = self._observe()  # everyone who acted sees the outcome (leavers included)
        self.agents = [a for a in self.agents if not (terminated[a] or truncated[a])]
        self.pos = {a: self.pos[a] for a in self.agents}
        if self.t == self.join_at and self.agents:
            self.pos["a2"] = int(self.rng.integers(CELLS))
            self.agents.append("a2")
            obs["a2"] = self._observe()["a2"]  # a newcomer: observed, not yet rewarded
            rewards["a2"], terminated["a2"], truncated["a2"] = 0.0, False, False
        return obs, rewards, terminated, truncated, {a: {} for a in obs}

    def _observe(self) -> dict[str, np.ndarray]:
        at_goal = sum(self.pos[a] == self.goal for a in self.pos) / max(len(self.pos), 1)
        out = {}
        for agent, cell in self.pos.items():
            x = np.zeros(OBS_SIZE, np.float32)
            x[cell] = 1.0
            x[CELLS + self.goal] = 1.0
            x[-1] = at_goal
            out[agent] = x
        return out


def returns(policy, episodes: int = 50, seed: int = 7) -> float:
    """Mean return per agent episode of ``policy(obs_dict) -> action_dict`` (evaluation:
    nothing is recorded)."""
    env, totals = Rendezvous(), []
    obs, _ = env.reset(seed=seed)
    for _ in range(episodes):
        ep: dict[str, float] = {}
        while env.agents:
            obs, rewards, terminated, truncated, _ = env.step(policy(obs))
            for agent, r in rewards.items():
                ep[agent] = ep.get(agent, 0.0) + r
                if terminated[agent] or truncated[agent]:
                    totals.append(ep.pop(agent))
            obs = {a: obs[a] for a in env.agents}
        obs, _ = env.reset()
    return float(np.mean(totals))


def oracle(obs: dict) -> dict:
    """Walk to the meeting cell and stay: the cooperative optimum."""
    return {a: int(np.sign(np.argmax(x[CELLS:2 * CELLS]) - np.argmax(x[:CELLS]))) + 1
            for a, x in obs.items()}
