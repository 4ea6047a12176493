"""Episode fragments in canonical form: leaf columns, the float32 action vector, rewards.

``Fragment`` is what both transports agree on once a fragment is validated: the collector
makes one from each RLlink ``EpisodeFragment`` (``from_wire``), client_lib builds one from
the steps it recorded and either writes it into its shared-memory ring
(``protocol.records.fragment_records``) or sends it over TCP (``to_wire``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol.codec import EpisodeFragment
from rlinkd.client_lib.protocol.columns import Columns, action_vector, to_columns, to_wire
from rlinkd.client_lib.protocol.compact import COMPACT_MIN_BYTES, encode_compact
from rlinkd.client_lib.protocol.spaces import Space


@dataclass(frozen=True)
class Fragment:
    """T steps of one episode; ``obs`` columns have T+1 rows (the last is the observation
    after the last step), everything else T."""

    obs: Columns                 # leaf key -> [T+1, *record_shape], record dtype
    actions: np.ndarray          # [T, action_size] float32 (discrete: 0-based indices)
    rewards: np.ndarray          # [T] float64
    is_terminated: bool
    is_truncated: bool
    action_logp: np.ndarray | None = None         # [T]
    action_dist_inputs: np.ndarray | None = None  # [T, dist_size]
    agent_id: str | None = None    # None: a single-agent connection's only agent
    episode_id: str | None = None
    policy_id: str | None = None   # None: the policy mapping decides
    state_in: np.ndarray | None = None  # [ceil(T / L), S] float32: a recurrent policy's
    # state before steps 0, L, 2L, ... (L = max_seq_len; `protocol.recurrent`); None otherwise

    @property
    def num_steps(self) -> int:
        return len(self.rewards)

    def first_obs_equals(self, other: Columns, row: int) -> bool:
        """Whether this fragment's first observation is ``other``'s observation ``row``."""
        return all(key in other and np.array_equal(col[0], other[key][row])
                   for key, col in self.obs.items())

    def to_wire(self, obs_space: Space, act_space: Space, compact: bool) -> EpisodeFragment:
        """The RLlink form (plain per-step JSON, or columnar/compact when ``compact``)."""
        from rlinkd.client_lib.protocol.columns import action_columns
        actions = to_wire(action_columns(self.actions, act_space), act_space, compact)
        return EpisodeFragment(
            obs=to_wire(self.obs, obs_space, compact), actions=actions, rewards=self.rewards,
            is_terminated=self.is_terminated, is_truncated=self.is_truncated,
            action_logp=self.action_logp, action_dist_inputs=self.action_dist_inputs,
            agent_id=self.agent_id, episode_id=self.episode_id, policy_id=self.policy_id,
            state_in=_state_wire(self.state_in, compact))


def _state_wire(state_in: np.ndarray | None, compact: bool) -> Any:
    """``state_in`` as sent: compact when the server reads it and it is large enough."""
    if state_in is None or not compact or state_in.nbytes < COMPACT_MIN_BYTES:
        return state_in
    return encode_compact(np.ascontiguousarray(state_in, np.float32))


def from_wire(frag: EpisodeFragment, obs_space: Space, act_space: Space, where: str) -> Fragment:
    """Convert and validate a received fragment's observations and actions against the
    spaces; raises ``spaces.InvalidValue`` naming the leaf (``where`` prefixes the path).
    ``state_in`` passes as received (float64); the collector checks it against the policy."""
    t = frag.num_steps
    obs = to_columns(frag.obs, obs_space, t + 1, f"{where}.obs")
    actions = action_vector(to_columns(frag.actions, act_space, t, f"{where}.actions"), act_space)
    return Fragment(obs, actions, frag.rewards, frag.is_terminated, frag.is_truncated,
                    frag.action_logp, frag.action_dist_inputs, frag.agent_id, frag.episode_id,
                    frag.policy_id, frag.state_in)
