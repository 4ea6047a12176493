"""``MultiAgentClient``: many agents (and several policies) over one connection.

    client = connect_multi("tcp://127.0.0.1:5555")
    actions = client.act({"red_0": obs0, "blue_0": obs1})      # one forward per policy
    client.step({"red_0": 1.0, "blue_0": 0.0}, next_obs, terminated={"blue_0": True})
    ...
    client.close()

Every agent id has its own episodes (a fresh ``episode_id`` each) and its own step buffer,
like ``Agent``. Agents appear in any ``act`` and leave when their episode ends
(terminated/truncated); the next ``act`` with that id starts a new episode. Once
``env_steps_per_sample`` steps (all agents together) are collected, one
EPISODES_AND_GET_STATE (or, over shared memory, one write per policy ring and one
SAMPLE_READY) sends them: every ended episode, then every episode in progress cut at this
point (it continues in the next send, its first observation repeating the last). The
weights that come back replace the local policies' weights.

Each agent acts with the policy SET_CONFIG's ``policy_mapping`` gives its id; ``act`` runs
one forward pass and one action draw per policy over the rows of all its agents.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlinkd.client_lib.agent import FragmentBuffer
from rlinkd.client_lib.links import Sends
from rlinkd.client_lib.policy import forward
from rlinkd.client_lib.multi.book import (EpisodeIds, LocalPolicy, PolicyBook, SlotPool,
                                          check_agent_id, check_multi_config)
from rlinkd.client_lib.protocol.columns import Columns, obs_columns, to_columns
from rlinkd.client_lib.protocol.spaces import InvalidValue


@dataclass
class AgentEpisode:
    """The episode in progress of one agent id."""

    agent_id: str
    policy: str
    episode_id: str
    slot: int
    buffer: FragmentBuffer = field(default_factory=FragmentBuffer)
    pending: tuple | None = None  # (action vector, logp, dist row, state or None) of the last act
    state: np.ndarray | None = None  # recurrent policy: [S], the state for the next act

    def fragment(self, terminated: bool, truncated: bool):
        return self.buffer.to_fragment(terminated, truncated, self.agent_id, self.episode_id,
                                       self.policy)


class MultiAgentClient:
    """Agents of one simulator on one connection (``connect_multi`` makes one)."""

    def __init__(self, link, explore: bool = True, seed: int | None = None) -> None:
        self.link = link
        cfg = link.open_policies()
        try:
            self.max_agents = check_multi_config(cfg, link.describe())
        except ValueError:
            link.close()
            raise
        self.env_steps_per_sample = cfg.env_steps_per_sample
        self.explore = explore
        self.book = PolicyBook(link, cfg, seed)
        self.episodes: dict[str, AgentEpisode] = {}
        self.done: Sends = []  # ended episodes' fragments, in the order they ended
        self.slots = SlotPool()
        self.ids = EpisodeIds()
        self.steps_since_send = 0
        self.steps_synced = 0

    def policy_for(self, agent_id: str) -> str:
        """The name of the policy ``agent_id`` acts with."""
        return self.book.name_for(check_agent_id(agent_id))

    # ------------------------------------------------------------ act
    def act(self, obs: Mapping[str, Any], explore: bool | None = None) -> dict[str, Any]:
        """Actions (native forms, as ``Agent.act``) for every agent in ``obs``. An id without
        an episode in progress starts one. ValueError (nothing recorded) for an invalid id,
        an agent that already has a pending action, or more agents than the server allows;
        ``spaces.InvalidValue`` naming the agent for an observation outside its space."""
        self._check_act(obs)
        explore = self.explore if explore is None else explore
        chosen = []
        for name, ids in self._by_policy(obs).items():
            local = self.book.get(name)
            x = self._columns(local, ids, obs, "obs")
            state = self._states(local, ids)
            dist, state_out = forward(local.net, x, state)
            actions, logp = local.chooser.choose_batch(dist, explore, getattr(local.net, "epsilon", None))
            chosen.append((local, ids, x, dist, actions, logp, state, state_out))
        out: dict[str, Any] = {}
        for local, ids, x, dist, actions, logp, state, state_out in chosen:
            native = local.chooser.to_env_rows(actions)
            for i, agent_id in enumerate(ids):
                ep = self.episodes.get(agent_id) or self._start(agent_id, local)
                if not ep.buffer.obs:
                    ep.buffer.obs.append({k: v[i:i + 1] for k, v in x.items()})
                ep.pending = (actions[i], float(logp[i]), dist[i], None if state is None else state[i])
                ep.state = None if state_out is None else state_out[i]
                out[agent_id] = native[i]
        return out

    def _states(self, local: LocalPolicy, ids: list[str]) -> np.ndarray | None:
        """The agents' states before this act [len(ids), S]: zeros for an agent starting an
        episode (a new id, or one whose episode ended); None for a feed-forward policy."""
        states = local.zero_states(len(ids))
        if states is not None:
            for i, agent_id in enumerate(ids):
                ep = self.episodes.get(agent_id)
                if ep is not None and ep.state is not None:
                    states[i] = ep.state
        return states

    def _check_act(self, obs: Mapping[str, Any]) -> None:
        new = 0
        for agent_id in obs:
            check_agent_id(agent_id)
            ep = self.episodes.get(agent_id)
            if ep is None:
                new += 1
                if len(self.episodes) + new > self.max_agents:
                    raise ValueError(f"act(): agent {agent_id!r} would exceed the server's "
                                     f"max_agents_per_connection ({self.max_agents})")
            elif ep.pending is not None:
                raise ValueError(f"act(): agent {agent_id!r} already has a pending action "
                                 "(call step() first)")

    def _start(self, agent_id: str, local: LocalPolicy) -> AgentEpisode:
        ep = AgentEpisode(agent_id, local.name, self.ids.next(), self.slots.acquire(),
                          FragmentBuffer(max_seq_len=local.max_seq_len))
        self.episodes[agent_id] = ep
        return ep

    def _by_policy(self, agents) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for agent_id in agents:
            ep = self.episodes.get(agent_id)
            name = ep.policy if ep is not None else self.book.name_for(agent_id)
            groups.setdefault(name, []).append(agent_id)
        return groups

    @staticmethod
    def _columns(local: LocalPolicy, ids: list[str], values: Mapping[str, Any], what: str) -> Columns:
        """Columns [len(ids), ...] of the agents' values, validated in one pass; on failure,
        InvalidValue naming the first agent whose value does not fit."""
        try:
            return to_columns([values[a] for a in ids], local.obs_space, len(ids), what)
        except InvalidValue:
            for agent_id in ids:
                obs_columns([values[agent_id]], local.obs_space, 1, f"{what}[{agent_id!r}]")
            raise

    # ------------------------------------------------------------ step
    def step(self, rewards: Mapping[str, float], next_obs: Mapping[str, Any],
             terminated: Mapping[str, bool] | None = None,
             truncated: Mapping[str, bool] | None = None) -> None:
        """Record the outcome of the last ``act`` for every agent with a pending action (all
        of them, keyed by agent id; missing terminated/truncated entries mean False). An
        agent whose episode ended leaves (its slot is freed). May send a sample and install
        newer weights. ValueError (nothing recorded) when the keys do not match the pending
        agents; InvalidValue naming the agent for an observation outside its space."""
        terminated, truncated = terminated or {}, truncated or {}
        self._check_step(rewards, next_obs, terminated, truncated)
        rows = {}
        for name, ids in self._by_policy(rewards).items():
            x = self._columns(self.book.get(name), ids, next_obs, "next_obs")
            rows.update({a: {k: v[i:i + 1] for k, v in x.items()} for i, a in enumerate(ids)})
        for agent_id, reward in rewards.items():
            self._record(agent_id, float(reward), rows[agent_id],
                         bool(terminated.get(agent_id, False)), bool(truncated.get(agent_id, False)))
        self.steps_since_send += len(rewards)
        if self.steps_since_send >= self.env_steps_per_sample:
            self.sync()

    def _check_step(self, rewards, next_obs, terminated, truncated) -> None:
        for agent_id in rewards:
            ep = self.episodes.get(agent_id) if isinstance(agent_id, str) else None
            if ep is None or ep.pending is None:
                raise ValueError(f"step(): agent {str(agent_id)[:80]!r} has no pending action "
                                 "(call act() first)")
            if agent_id not in next_obs:
                raise ValueError(f"step(): no next_obs for agent {agent_id!r}")
        for agent_id, ep in self.episodes.items():
            if ep.pending is not None and agent_id not in rewards:
                raise ValueError(f"step(): agent {agent_id!r} has a pending action but no reward "
                                 "(every agent that acted must step)")
        for what, keyed in (("next_obs", next_obs), ("terminated", terminated),
                            ("truncated", truncated)):
            for agent_id in keyed:
                if agent_id not in rewards:
                    raise ValueError(f"step(): {what} names agent {str(agent_id)[:80]!r}, which "
                                     "has no reward")

    def _record(self, agent_id: str, reward: float, obs_row: Columns, terminated: bool,
                truncated: bool) -> None:
        ep = self.episodes[agent_id]
        assert ep.pending is not None, "checked by _check_step"
        pending, ep.pending = ep.pending, None
        ep.buffer.record(pending, reward, obs_row)
        if terminated or truncated:
            self.done.append((ep.slot, ep.fragment(terminated, truncated)))
            self.slots.release(ep.slot)
            del self.episodes[agent_id]

    def truncate(self) -> None:
        """End every episode in progress as truncated at its last recorded step (an agent
        without steps yet just leaves). For a driver that resets its env while agents are
        mid-episode. ValueError if an agent has a pending action (step it first)."""
        for agent_id, ep in self.episodes.items():
            if ep.pending is not None:
                raise ValueError(f"truncate(): agent {agent_id!r} has a pending action")
        for ep in self.episodes.values():
            if ep.buffer.actions:
                self.done.append((ep.slot, ep.fragment(False, True)))
            self.slots.release(ep.slot)
        self.episodes = {}

    # ------------------------------------------------------------ send
    def sync(self) -> None:
        """Send what was collected and install the weights that come back (blocks, with
        reconnects, like ``Agent.sync``)."""
        sends = self._take()
        if not sends:
            return
        self.book.install(self.link.exchange(sends, self.book.held(), get_state=True))
        self.steps_synced += sum(f.num_steps for _, f in sends)
        self.steps_since_send = 0

    def _take(self) -> Sends:
        """Ended episodes (in the order they ended), then every episode in progress cut here
        (its buffer restarts from its last observation)."""
        sends, self.done = self.done, []
        for ep in self.episodes.values():
            if ep.buffer.actions:
                sends.append((ep.slot, ep.fragment(False, False)))
                ep.buffer = ep.buffer.restart()
        return sends

    def close(self) -> None:
        """Send any remaining steps (without waiting for weights) and disconnect."""
        try:
            self.link.exchange(self._take(), self.book.held(), get_state=False)
        except (ConnectionError, OSError):
            pass
        self.link.close()

    @property
    def agents(self) -> list[str]:
        """Agent ids with an episode in progress."""
        return list(self.episodes)

    def weights_seq_nos(self) -> dict[str, int]:
        """{policy: weights version} of the policies in use."""
        return self.book.held()


__all__ = ["AgentEpisode", "MultiAgentClient"]
