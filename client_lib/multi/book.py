"""What every many-agent client keeps besides its steps: policies, agent slots, episode ids.

``PolicyBook`` holds one local policy per policy name in use (its spaces from SET_CONFIG, its
weights from the link, an ``ActionChooser``), fetched on first use and replaced when a send
brings newer weights. ``SlotPool`` hands out agent slots (the shared-memory record's
``stream_id``), ``EpisodeIds`` fresh episode ids. Pure bookkeeping over a link; no I/O here
except through ``link.policy``.
"""
from __future__ import annotations

import heapq
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlinkd.client_lib.links import LinkConfig
from rlinkd.client_lib.policy import ActionChooser, state_size
from rlinkd.client_lib.protocol.agents import id_error
from rlinkd.client_lib.protocol.spaces import Space


class MultiAgentUnsupported(ValueError):
    """The server does not support many agents per connection (no ``max_agents_per_connection``
    in SET_CONFIG: an RLlib server, or an rlinkd older than protocol 3)."""


def check_multi_config(cfg: LinkConfig, where: str) -> int:
    """The server's agent limit; MultiAgentUnsupported when it has none."""
    if cfg.max_agents_per_connection is None:
        raise MultiAgentUnsupported(
            f"{where}: the server does not support many agents per connection (its SET_CONFIG "
            "has no max_agents_per_connection; RLlib servers and rlinkd before protocol 3 do "
            "not): use client_lib.connect (one agent per connection) instead")
    return cfg.max_agents_per_connection


def check_agent_id(agent_id: Any) -> str:
    """``agent_id`` if usable on the wire, else ValueError naming it."""
    error = id_error(agent_id, f"agent id {str(agent_id)[:80]!r}")
    if error:
        raise ValueError(error)
    return agent_id


@dataclass
class LocalPolicy:
    """One policy this client acts with: spaces, current weights (``net``), action chooser."""

    name: str
    obs_space: Space
    act_space: Space
    net: Any  # OnnxPolicy | BoardPolicy: dist_inputs(columns) -> [N, D], weights_seq_no
    chooser: ActionChooser
    max_seq_len: int = 0  # a recurrent policy's fragment state grid L (0: feed-forward)

    @property
    def weights_seq_no(self) -> int:
        return self.net.weights_seq_no

    @property
    def state_size(self) -> int:
        """S of the policy's state (0: feed-forward)."""
        return state_size(self.net)

    def zero_states(self, rows: int) -> np.ndarray | None:
        """The state of ``rows`` agents starting an episode (None: feed-forward)."""
        return np.zeros((rows, self.state_size), np.float32) if self.state_size else None


class PolicyBook:
    """Local policies by name, created on first use; the agent → policy mapping, memoised."""

    def __init__(self, link, cfg: LinkConfig, seed: int | None) -> None:
        self.link, self.cfg = link, cfg
        self.rng = np.random.default_rng(seed)  # one stream for all choosers: reproducible
        self.local: dict[str, LocalPolicy] = {}
        self._names: dict[str, str] = {}

    def name_for(self, agent_id: str) -> str:
        """The policy ``agent_id`` acts with (SET_CONFIG's policy_mapping)."""
        name = self._names.get(agent_id)
        if name is None:
            name = self._names[agent_id] = self.cfg.mapping.policy_for(agent_id)
        return name

    def get(self, name: str) -> LocalPolicy:
        """The local policy ``name``; fetches its weights through the link on first use
        (shared memory: attaches its ring). ValueError for a policy SET_CONFIG does not list."""
        local = self.local.get(name)
        if local is None:
            info = self.cfg.policies.get(name)
            if info is None:
                raise ValueError(f"policy {name!r} is not one the server declared "
                                 f"({sorted(self.cfg.policies)})")
            local = LocalPolicy(name, info.obs_space, info.act_space, self.link.policy(name),
                                ActionChooser(info.act_space, rng=self.rng, box_dist=info.box_dist),
                                info.max_seq_len)
            self.local[name] = local
        return local

    def held(self) -> dict[str, int]:
        """{policy: weights version acted with} for every local policy."""
        return {name: p.weights_seq_no for name, p in self.local.items()}

    def install(self, new: dict[str, Any]) -> None:
        """Newer weights from ``link.exchange`` (policies not in use are ignored)."""
        for name, net in new.items():
            if name in self.local:
                self.local[name].net = net


class SlotPool:
    """Agent slots 0, 1, 2, ...: the lowest free one is handed out; a slot is released when
    its agent's episode ends (records of one slot stay in order in the ring, so the next
    episode on that slot follows the ended one)."""

    def __init__(self) -> None:
        self._free: list[int] = []
        self._next = 0

    def acquire(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        self._next += 1
        return self._next - 1

    def release(self, slot: int) -> None:
        heapq.heappush(self._free, slot)


class EpisodeIds:
    """Episode ids unique per client: a random 8-hex-digit prefix and a counter (at most 26
    characters, well inside the wire's 64)."""

    def __init__(self) -> None:
        self.prefix = os.urandom(4).hex()
        self.count = 0

    def next(self) -> str:
        self.count += 1
        return f"{self.prefix}-{self.count}"
