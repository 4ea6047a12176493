"""The agents of one connection, as the collector sees them (pure; no I/O).

Every fragment names its agent (``agent_id``; none: the connection's single agent, key "")
and may name its policy (``policy_id``; else the policy mapping decides). ``AgentRules``
checks a whole message first — policy known, observation inside that policy's spaces, the
agent limit, an ended ``episode_id`` not reused, a continued episode keeping its policy — and
raises ``InvalidEpisode`` naming the agent before anything is counted (all or nothing);
``account`` then updates the connection's agents one fragment at a time. Only agents with
an episode in progress are kept, so a connection's memory is bounded by the agent limit.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from rlinkd.client_lib.protocol.agents import PolicyMapping
from rlinkd.client_lib.protocol.codec import EpisodeFragment
from rlinkd.client_lib.protocol.fragments import Fragment
from rlinkd.daemon.collector.ingest import (EpisodeTracker, InvalidEpisode, Limits, PolicyInfo,
                                           validate_fragment)


@dataclass
class AgentState:
    """One agent of a connection while its episode is open (cut, to be continued)."""

    policy: str
    tracker: EpisodeTracker = field(default_factory=EpisodeTracker)


@dataclass(frozen=True)
class Checked:
    """One validated fragment of a message, before anything is counted."""

    agent: str          # "" when the fragment has no agent_id
    policy: str
    frag: Fragment
    episode_id: str | None


class AgentRules:
    """The per-agent checks and bookkeeping of ``CollectorCore`` (one per collector)."""

    def __init__(self, policies: dict[str, PolicyInfo], mapping: PolicyMapping,
                 max_agents: int, limits: Limits) -> None:
        self.policies, self.mapping = policies, mapping
        self.max_agents, self.limits = max_agents, limits

    def check_all(self, agents: dict[str, AgentState], ended: OrderedDict,
                  episodes) -> list[Checked]:
        """Every fragment checked against its agent's policy, the agent limit (``agents``:
        the connection's open episodes) and the episode ids seen ending (``ended``)."""
        checked, known = [], set(agents)
        ending: set[tuple[str, str]] = set()
        for i, wire in enumerate(episodes):
            c = self._check(agents, ended, wire, i, ending)
            if c.agent not in known:
                known.add(c.agent)
                if len(known) > self.max_agents:
                    raise InvalidEpisode(f"episodes[{i}]: agent {c.agent!r} is one more than "
                                         f"server.max_agents_per_connection={self.max_agents}")
            if c.episode_id is not None and (c.frag.is_terminated or c.frag.is_truncated):
                ending.add((c.agent, c.episode_id))
            checked.append(c)
        return checked

    def _check(self, agents: dict[str, AgentState], ended: OrderedDict, wire: EpisodeFragment,
               i: int, ending: set) -> Checked:
        agent = wire.agent_id or ""
        where = f"episodes[{i}] (agent {agent!r})" if agent else f"episodes[{i}]"
        policy = wire.policy_id or self.mapping.policy_for(wire.agent_id)
        if policy not in self.policies:
            raise InvalidEpisode(f"{where}: unknown policy {policy!r} (known: "
                                 f"{', '.join(self.policies)})")
        key = (agent, wire.episode_id)
        if wire.episode_id is not None and (key in ended or key in ending):
            raise InvalidEpisode(f"{where}: episode {wire.episode_id!r} already ended")
        frag = validate_fragment(wire, self.policies[policy].spaces, self.limits, where)
        state = agents.get(agent)
        if (state is not None and state.policy != policy and state.tracker.last_obs is not None
                and frag.first_obs_equals(state.tracker.last_obs, -1)):
            raise InvalidEpisode(f"{where}: continues an episode of policy {state.policy!r} "
                                 f"with policy {policy!r}")
        return Checked(agent, policy, frag, wire.episode_id)

    def account(self, agents: dict[str, AgentState], ended: OrderedDict,
                c: Checked) -> list[tuple[float, int]]:
        """Count one checked fragment into its agent's episode; the (return, length) of the
        episodes it completes. An ended agent is forgotten (its episode id remembered, at
        most 4 x the agent limit of them)."""
        state = agents.get(c.agent)
        if state is None or state.policy != c.policy:
            state = AgentState(c.policy)
        done = state.tracker.add(c.frag)
        if c.frag.is_terminated or c.frag.is_truncated:
            agents.pop(c.agent, None)
            if c.episode_id is not None:
                ended[(c.agent, c.episode_id)] = None
                while len(ended) > 4 * self.max_agents:
                    ended.popitem(last=False)
        else:
            agents[c.agent] = state
        return done
